"""Selective distribution without a network (issue 13 part 3): a model published in
parts, each part verifiable against the model's id. The catalog's rules against hostile
catalogs (hypothesis: any changed byte breaks the id; a hostile publisher's catalog that
does hash to its id is still refused when parts overlap, escape the directory or are not
canonical), ``--include`` picking whole parts, each part's id equal to the id its own
directory session has, a part's manifest held to the part's id on the simulated network
(another part's manifest is refused, whoever MAC'd it), and verified parts merged into
one directory."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import blake3
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostagent.wire as wire
from hostagent import catalog, tree
from hostagent.api import ReceiveOptions, TransferError
from hostagent.parts import describe_parts, receive_parts
from hostagent.catalog import BadCatalog, Part, PartMismatch
from hostagent.cli import main
from hostagent.dirs import DirSource, PathSink, merge_parts
from hostagent.receiver import ReceiverConfig
from hostagent.sender import build_manifest_pages, file_digests
from hostagent.tree import Entry
from lab.models import make_moe_dir, tree_of
from lab.netsim import Sim
from tests.support.agents import sender_config

KEY = wire.derive_key(b"catalog test")
CHUNK = 16 * 1024


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, list[Part]]:
    root = make_moe_dir(tmp_path_factory.mktemp("moe") / "model")
    globs = [f"experts/expert-{i:02d}.*" for i in range(8)]
    blob, parts = describe_parts(str(root), globs, CHUNK)
    return root, blob, parts


def _id(blob: bytes) -> bytes:
    return tree.parse_content_id(catalog.catalog_id(blob))


def test_a_model_in_parts_has_one_id_and_every_file_in_exactly_one_part(moe: tuple[Path, bytes, list[Part]]) -> None:
    root, blob, parts = moe
    # 8 expert parts, plus config.json and dense.safetensors as parts of their own.
    assert [p.name for p in parts] == ["config.json", "dense.safetensors"] + [f"experts/expert-{i:02d}.*" for i in range(8)]
    files = [p for part in parts for p in part.paths]
    assert sorted(files) == sorted(tree_of(root)) and len(files) == len(set(files))
    assert sum(p.size for p in parts) == sum(len(b) for b, _ in tree_of(root).values())
    assert catalog.decode_catalog(blob, _id(blob)) == parts
    again, _ = describe_parts(str(root), [f"experts/expert-{i:02d}.*" for i in reversed(range(8))], CHUNK)
    assert again == blob, "the same parts give the same catalog, whatever order the globs came in"
    other, _ = describe_parts(str(root), [f"experts/expert-{i:02d}.*" for i in range(8)], 2 * CHUNK)
    assert catalog.catalog_id(other) != catalog.catalog_id(blob), "part ids (and so the model id) cover the chunk size"
    assert catalog.catalog_id(blob).startswith("blake3:") and len(parts[0].content_id) == len(catalog.catalog_id(blob))


def test_each_part_id_is_the_id_its_own_directory_session_has(moe: tuple[Path, bytes, list[Part]]) -> None:
    root, _, parts = moe
    for part in parts[:3]:
        source = DirSource(str(root), only=part.paths)
        try:
            cfg = sender_config(key=KEY, chunk_size=CHUNK, session_id=3)
            pages = build_manifest_pages(source, cfg, 3, file_digests(source, CHUNK), source.entries_blob)
            assert tree.manifest_id(pages) == part.content_id
            catalog.check_received(part, tree.manifest_id(pages), tree.decode_entries(pages[0].entries))
        finally:
            source.close()


def test_include_takes_whole_parts_by_name_or_file_and_refuses_a_glob_naming_nothing(
        moe: tuple[Path, bytes, list[Part]]) -> None:
    _, _, parts = moe
    picked = catalog.select(parts, ["experts/expert-03.safetensors", "experts/expert-05.*"])
    assert [p.name for p in picked] == ["experts/expert-03.*", "experts/expert-05.*"]
    assert [p.name for p in catalog.select(parts, ["*.json"])] == ["config.json"]
    assert catalog.select(parts, []) == parts
    with pytest.raises(ValueError, match="names no part"):
        catalog.select(parts, ["experts/expert-3.*"])


def test_split_refuses_a_part_glob_that_matches_nothing() -> None:
    entries = [Entry("a.bin", 1), Entry("b.bin", 2)]
    assert catalog.split(entries, ["*.bin"]) == [("*.bin", entries)]
    with pytest.raises(ValueError, match="matches no file"):
        catalog.split(entries, ["*.bin", "*.safetensors"])


@settings(max_examples=200)
@given(st.data())
def test_any_changed_byte_of_a_catalog_breaks_the_model_id(data: st.DataObject) -> None:
    parts = [Part("a", "blake3:" + "1" * 64, 5, ("a",)), Part("b/*", "blake3:" + "2" * 64, 9, ("b/x", "b/y"))]
    blob = catalog.encode_catalog(parts)
    expected = _id(blob)
    pos = data.draw(st.integers(0, len(blob) - 1))
    flip = data.draw(st.integers(1, 255))
    forged = blob[:pos] + bytes([blob[pos] ^ flip]) + blob[pos + 1:]
    with pytest.raises(BadCatalog, match="does not hash"):
        catalog.decode_catalog(forged, expected)
    with pytest.raises(BadCatalog, match="does not hash"):
        catalog.decode_catalog(blob + b"\0", expected)
    assert catalog.decode_catalog(blob, expected) == parts


_CID = "blake3:" + "ab" * 32
_HOSTILE = {
    "a file in two parts": [["p", _CID, 1, ["x"]], ["q", _CID, 1, ["x"]]],
    "a path escaping the directory": [["p", _CID, 1, ["../etc/passwd"]]],
    "an absolute path": [["p", _CID, 1, ["/etc/passwd"]]],
    "a NUL in a path": [["p", _CID, 1, ["a\0b"]]],
    "a file that is another part's directory": [["p", _CID, 1, ["x"]], ["q", _CID, 1, ["x/y"]]],
    "duplicate part names": [["p", _CID, 1, ["x"]], ["p", _CID, 1, ["y"]]],
    "unsorted parts": [["q", _CID, 1, ["x"]], ["p", _CID, 1, ["y"]]],
    "unsorted paths": [["p", _CID, 2, ["y", "x"]]],
    "an empty part": [["p", _CID, 0, []]],
    "an empty name": [["", _CID, 1, ["x"]]],
    "a malformed part id": [["p", "sha256:" + "ab" * 32, 1, ["x"]]],
    "a short part id": [["p", "blake3:abc", 1, ["x"]]],
    "a negative size": [["p", _CID, -1, ["x"]]],
    "a size as text": [["p", _CID, "1", ["x"]]],
    "a path as bytes": [["p", _CID, 1, [b"x"]]],
    "an extra field": [["p", _CID, 1, ["x"], 0]],
    "no parts": [],
}


@pytest.mark.parametrize("why", sorted(_HOSTILE))
def test_a_catalog_that_hashes_to_its_id_but_is_hostile_is_refused(why: str) -> None:
    """A hostile publisher controls the id too: what it may not do is make a receiver
    write outside the directory, or one part overwrite another's file."""
    blob = msgpack.packb([b"modelcast catalog v1", _HOSTILE[why]], use_bin_type=True)
    with pytest.raises(BadCatalog):
        catalog.decode_catalog(blob, _id(blob))


@pytest.mark.parametrize("blob", [
    b"", b"\xc1", msgpack.packb([b"modelcast catalog v0", [["p", _CID, 1, ["x"]]]]),
    msgpack.packb({"parts": []}), msgpack.packb([b"modelcast catalog v1", [["p", _CID, 1, ["x"]]], 1]),
    # Canonical form only: the same catalog with an int widened is another blob (another id).
    msgpack.packb([b"modelcast catalog v1", [["p", _CID, 1, ["x"]]]], use_bin_type=True).replace(b"\x01\x91", b"\xcd\x00\x01\x91"),
])
def test_malformed_or_non_canonical_catalogs_are_refused(blob: bytes) -> None:
    with pytest.raises(BadCatalog):
        catalog.decode_catalog(blob, _id(blob))


def _part_sim(root: Path, part: Part, sinks: list, session: int, loss: float = 0.0) -> tuple[Sim, DirSource]:
    source = DirSource(str(root), only=part.paths)
    cfg = sender_config(expected_receivers=len(sinks), key=KEY, chunk_size=CHUNK, session_id=session)
    pages = build_manifest_pages(source, cfg, session, file_digests(source, CHUNK), source.entries_blob)
    lossy = random.Random(session)
    sim = Sim(source.read(0, source.size), cfg, seed=session, loss=lambda now, s, d, b: lossy.random() < loss,
              source=source, manifest=pages, sink_factory=lambda: sinks.pop(0))
    return sim, source


def test_a_part_is_received_only_against_its_id_and_parts_merge_into_one_directory(
        moe: tuple[Path, bytes, list[Part]], tmp_path: Path) -> None:
    """A receiver that asked for experts 3 and 5 checks the catalog against the model id,
    receives each part under 5% loss holding it to the part's id, and gets exactly those
    files in one directory. A sender with the session key that sends expert 4's part to a
    receiver expecting expert 3's id gets nothing accepted."""
    root, blob, _ = moe
    wanted = catalog.select(catalog.decode_catalog(blob, _id(blob)), ["experts/expert-03.*", "experts/expert-05.*"])
    staged = []
    for n, part in enumerate(wanted):
        out = tmp_path / f"part{n}"
        sink = PathSink(str(out))
        sim, source = _part_sim(root, part, [sink], session=10 + n, loss=0.05)
        rec = sim.add_receiver(ReceiverConfig(content_id=tree.parse_content_id(part.content_id)))
        sim.run(until=60)
        try:
            assert rec.receiver is not None and rec.receiver.complete
            assert rec.receiver.content_id() == part.content_id
            sink.finish(source.size)
        finally:
            source.close()
            sink.close()
        staged.append(str(out))
    merge_parts(str(tmp_path / "model"), staged)
    want = {p: v for p, v in tree_of(root).items() if p in {q for part in wanted for q in part.paths}}
    assert tree_of(tmp_path / "model") == want and len(want) == 2
    assert not any(Path(p).exists() for p in staged) and not (tmp_path / ".model.modelcast-tmp").exists()

    four = next(p for p in catalog.decode_catalog(blob, None) if p.name == "experts/expert-04.*")
    sink = PathSink(str(tmp_path / "wrong"))
    sim, source = _part_sim(root, four, [sink], session=20)
    rec = sim.add_receiver(ReceiverConfig(content_id=tree.parse_content_id(wanted[0].content_id), idle_timeout=3.0))
    sim.run(until=20)
    try:
        assert rec.receiver is not None and rec.receiver.manifest is None and not rec.receiver.complete
        assert rec.receiver.stats.drops["wrong_content_id"] >= 1
        assert not (tmp_path / "wrong").exists() and not (tmp_path / ".wrong.modelcast-tmp").exists()
    finally:
        source.close()
        sink.close()


def test_what_arrived_must_be_the_listed_part(moe: tuple[Path, bytes, list[Part]]) -> None:
    root, _, parts = moe
    three, four = parts[5], parts[6]
    source = DirSource(str(root), only=four.paths)
    try:
        cfg = sender_config(key=KEY, chunk_size=CHUNK, session_id=4)
        pages = build_manifest_pages(source, cfg, 4, file_digests(source, CHUNK), source.entries_blob)
    finally:
        source.close()
    got, entries = tree.manifest_id(pages), tree.decode_entries(pages[0].entries)
    with pytest.raises(PartMismatch, match="not received against the part's id"):
        catalog.check_received(three, got, entries)
    with pytest.raises(PartMismatch, match="not received against"):
        catalog.check_received(four, None, entries)
    # The right id, but a catalog (hostile, or out of date) listing other files or another
    # size for it: merging would put bytes under names the manifest never had.
    with pytest.raises(PartMismatch, match="not the part's files"):
        catalog.check_received(Part(four.name, four.content_id, four.size, ("experts/other.safetensors",)), got, entries)
    with pytest.raises(PartMismatch, match="not the part's files"):
        catalog.check_received(Part(four.name, four.content_id, four.size + 1, four.paths), got, entries)
    catalog.check_received(four, got, entries)


def test_merge_refuses_two_parts_with_one_file(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x").write_bytes(name.encode())
    with pytest.raises(FileExistsError):
        merge_parts(str(tmp_path / "out"), [str(tmp_path / "a"), str(tmp_path / "b")])
    assert not (tmp_path / "out").exists()


def test_cli_publishes_a_catalog_and_a_receiver_checks_it_and_picks_its_parts(
        moe: tuple[Path, bytes, list[Part]], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root, blob, parts = moe
    path = tmp_path / "catalog.bin"
    args = ["catalog", str(root), "--chunk-size", str(CHUNK), "--write", str(path), "--json"]
    for i in range(8):
        args += ["--part", f"experts/expert-{i:02d}.*"]
    assert main(args) == 0
    published = json.loads(capsys.readouterr().out)
    assert published["model_id"] == catalog.catalog_id(blob) and path.read_bytes() == blob
    assert [p["content_id"] for p in published["parts"]] == [p.content_id for p in parts]
    assert main(["catalog", "--check", str(path), "--expect", published["model_id"],
                 "--include", "experts/expert-01.*", "--include", "config.json", "--json"]) == 0
    picked = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in picked["parts"]] == ["config.json", "experts/expert-01.*"]
    other = "blake3:" + blake3.blake3(b"another model").hexdigest()
    assert main(["catalog", "--check", str(path), "--expect", other]) == 1
    assert "does not hash to the model id" in capsys.readouterr().err


def test_a_receiver_refuses_a_catalog_of_another_model_before_joining_anything(
        moe: tuple[Path, bytes, list[Part]], tmp_path: Path) -> None:
    """No controller call is made (the URL is unreachable) and nothing is created."""
    _, blob, _ = moe
    other = "blake3:" + blake3.blake3(b"another model").hexdigest()
    opts = ReceiveOptions(controller="http://127.0.0.1:9", source="127.0.0.1", expect=other)
    with pytest.raises(TransferError, match="does not hash to the model id"):
        receive_parts(str(tmp_path / "model"), blob, [], opts)
    with pytest.raises(TransferError, match="names no part"):
        receive_parts(str(tmp_path / "model"), blob, ["experts/nine.*"],
                      dataclasses.replace(opts, expect=catalog.catalog_id(blob)))
    with pytest.raises(TransferError, match="on-complete"):
        receive_parts(str(tmp_path / "model"), blob, [],
                      dataclasses.replace(opts, expect=catalog.catalog_id(blob), on_complete="true"))
    assert list(tmp_path.iterdir()) == []


def test_include_without_a_catalog_and_part_without_a_controller_are_refused(
        moe: tuple[Path, bytes, list[Part]], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root, _, _ = moe
    assert main(["recv", "--group", "232.1.1.1:5000", "--insecure", "--source", "127.0.0.1",
                 "--out", str(tmp_path / "m"), "--include", "*.json"]) == 1
    assert "--include picks parts of a catalog" in capsys.readouterr().err
    assert main(["send", str(root), "--group", "232.1.1.1:5000", "--insecure", "--part", "experts/*"]) == 1
    assert "--part needs --controller" in capsys.readouterr().err
