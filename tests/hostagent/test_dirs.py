"""Model directories and content ids without a network (issue 13 parts 1 and 2): the
entry list's rules against hostile manifests (hypothesis), the byte space's mapping, a
whole directory through the simulated network under loss into real temporary
directories (renamed into place only once verified, modes kept), a symlink planted in
the temporary directory refused, and ``--expect``: a manifest that does not hash to the
expected id is counted and never accepted, whoever MAC'd it."""

from __future__ import annotations

import os
import random
import shutil
import stat
from pathlib import Path

import blake3
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostagent.wire as wire
from hostagent import tree
from hostagent.common import MemorySource
from hostagent.dirs import DirSink, DirSource, PathSink, scan, tmp_path
from hostagent.events import Failed
from hostagent.receiver import Receiver, ReceiverConfig
from hostagent.sender import build_manifest_pages, file_digests
from hostagent.tree import Entry, Space, UnsafeEntries
from lab.models import make_model_dir, tree_of
from lab.netsim import Sim
from tests.support.agents import sender_config

KEY = wire.derive_key(b"dirs test")

_name = st.text(st.characters(codec="utf-8", exclude_characters="/\0", exclude_categories=("Cs",)),
                min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))


@st.composite
def safe_entries(draw: st.DrawFn) -> list[Entry]:
    paths = draw(st.sets(st.lists(_name, min_size=1, max_size=3).map("/".join), min_size=1, max_size=20))
    # Drop any path that is another's parent directory (a file cannot be both).
    paths = {p for p in paths if not any(q.startswith(p + "/") for q in paths)}
    entries = [Entry(p, draw(st.integers(0, 5000)), draw(st.integers(0, 0o777))) for p in paths]
    return sorted(entries, key=lambda e: e.path.encode())


@given(safe_entries())
def test_entry_lists_round_trip_and_the_byte_space_is_exactly_the_files(entries: list[Entry]) -> None:
    blob = tree.encode_entries(entries)
    assert tree.decode_entries(blob, sum(e.size for e in entries)) == entries
    space = Space(entries)
    covered = [0] * len(entries)
    pos = 0
    for i, foff, roff, n in space.spans(0, space.size):
        assert roff == pos and foff == covered[i] and n > 0
        covered[i] += n
        pos += n
    assert covered == [e.size for e in entries] and pos == space.size


HOSTILE = [
    "/etc/passwd", "../escape", "a/../../b", "a/./b", "./a", "a//b", "a/", "", "a\0b",
    "x" * 256, "/".join(["d"] * 600), "..",
]


@settings(max_examples=200)
@given(safe_entries(), st.sampled_from(HOSTILE), st.integers(0, 20))
def test_a_manifest_naming_a_hostile_path_is_refused_and_creates_nothing(
        entries: list[Entry], bad: str, where: int) -> None:
    raw = [[e.path, e.size, e.mode] for e in entries]
    raw.insert(min(where, len(raw)), [bad, 1, 0o644])
    blob = msgpack.packb(raw, use_bin_type=True)
    with pytest.raises(UnsafeEntries):
        tree.decode_entries(blob)
    sink = _RecordingSink()
    receiver = Receiver(sink, ReceiverConfig(key=KEY), 0.0)
    size = sum(r[1] for r in raw)
    page = wire.Manifest(7, size, 1024, 512, -(-size // 1024), bytes(32), 0, 1, 0, b"", "m", 1, entries=blob)
    receiver.receive_datagram(wire.encode(page, KEY), ("s", 1), 0.0)
    assert receiver.manifest is None and sink.begun == 0
    assert receiver.stats.drops["bad_entries"] == 1


@pytest.mark.parametrize("raw", [
    [["a", 1, 0o644], ["a", 1, 0o644]],  # duplicate
    [["a", 1, 0o644], ["a/b", 1, 0o644]],  # a file that is also a directory
    [["b", 1, 0o644], ["a", 1, 0o644]],  # not canonical order
    [["a", 1, 0o4755]],  # setuid
    [["a", -1, 0o644]],
    [["a", 1]],
    [],
    [["p%d" % i, 0, 0o644] for i in range(tree.MAX_ENTRIES + 1)],
])
def test_malformed_entry_lists_are_refused(raw: list) -> None:
    with pytest.raises(UnsafeEntries):
        tree.decode_entries(msgpack.packb(raw, use_bin_type=True))


def test_sizes_must_fill_the_session() -> None:
    blob = tree.encode_entries([Entry("a", 10), Entry("b", 5)])
    assert len(tree.decode_entries(blob, 15)) == 2
    with pytest.raises(UnsafeEntries):
        tree.decode_entries(blob, 16)


class _RecordingSink:
    def __init__(self) -> None:
        self.begun = 0

    def begin(self, manifest: wire.Manifest) -> None:
        self.begun += 1

    def write(self, offset: int, data: bytes) -> None:
        raise AssertionError("nothing may be written")

    def read(self, offset: int, length: int) -> bytes:
        raise AssertionError("nothing may be read")

    def save_state(self, state: bytes) -> None:
        pass


def _dir_sim(src: Path, loss: float, receivers: int, sinks: list, seed: int = 1) -> tuple[Sim, DirSource]:
    source = DirSource(str(src))
    cfg = sender_config(expected_receivers=receivers, key=KEY, chunk_size=16 * 1024, session_id=99)
    digests = file_digests(source, cfg.chunk_size)
    pages = build_manifest_pages(source, cfg, 99, digests, source.entries_blob)
    data = source.read(0, source.size)
    lossy = random.Random(seed)
    sim = Sim(data, cfg, seed=seed, loss=lambda now, s, d, b: lossy.random() < loss,
              source=source, manifest=pages, sink_factory=lambda: sinks.pop(0))
    return sim, source


def test_a_40_file_directory_arrives_under_loss_and_appears_only_once_verified(tmp_path: Path) -> None:
    src = make_model_dir(tmp_path / "src")
    outs = [tmp_path / f"out{i}" for i in range(3)]
    sinks = [PathSink(str(o)) for o in outs]
    sim, source = _dir_sim(src, 0.05, 3, list(sinks))
    for _ in outs:
        sim.add_receiver()
    sim.run(until=120)
    try:
        want = tree_of(src)
        assert len(want) == 40 and len(source.space.entries) == 40
        for out, sink, rec in zip(outs, sinks, sim.receivers):
            assert rec.receiver is not None and rec.receiver.complete
            assert rec.receiver.stats.drops.get("bad_entries", 0) == 0
            assert sink.is_dir and not out.exists(), "nothing at OUT before it is renamed into place"
            assert Path(tmp_path, f".{out.name}.modelcast-tmp").is_dir()
            sink.finish(source.size)
            assert tree_of(out) == want  # every byte and every mode
            assert not Path(tmp_path, f".{out.name}.modelcast-tmp").exists()
            assert not Path(str(out) + ".modelcast-state").exists()
    finally:
        source.close()
        for sink in sinks:
            sink.close()


def test_packed_small_files_cost_what_the_same_bytes_as_one_file_cost(tmp_path: Path) -> None:
    """40 files, 37 of them tiny: the same data datagrams as one file of the same bytes
    (no datagram round per file), and within 2% of its bytes on the wire."""
    src = make_model_dir(tmp_path / "src")
    sink = PathSink(str(tmp_path / "out"))
    sim, source = _dir_sim(src, 0.0, 1, [sink])
    sim.add_receiver()
    sim.run(until=60)
    try:
        assert sim.receivers[0].receiver.complete
        one = Sim(source.read(0, source.size), sender_config(expected_receivers=1, key=KEY, chunk_size=16 * 1024))
        one.add_receiver()
        one.run(until=60)
        assert one.receivers[0].receiver.complete
        d, f = sim.sender.stats, one.sender.stats
        assert d.data_sent == f.data_sent == sim.sender.layout.total_seq
        assert d.bytes_out <= 1.02 * f.bytes_out, (d.bytes_out, f.bytes_out)
    finally:
        source.close()
        sink.close()


def test_finish_replaces_an_older_model_in_one_step(tmp_path: Path) -> None:
    src = make_model_dir(tmp_path / "src", files=6, big=1, big_size=5000)
    out = tmp_path / "model"
    (out / "stale").mkdir(parents=True)
    (out / "stale" / "old.bin").write_bytes(b"old")
    sink = PathSink(str(out))
    sim, source = _dir_sim(src, 0.0, 1, [sink])
    sim.add_receiver()
    sim.run(until=60)
    try:
        assert sim.receivers[0].receiver.complete
        assert (out / "stale" / "old.bin").exists(), "the old model stays until the new one is whole"
        sink.finish(source.size)
        assert tree_of(out) == tree_of(src)
    finally:
        source.close()
        sink.close()


def test_a_leftover_temporary_directory_of_another_model_is_cleared(tmp_path: Path) -> None:
    """No record of this model: whatever an earlier attempt left (here a file where this
    model has a directory) is removed, and the model arrives whole."""
    src = make_model_dir(tmp_path / "src", files=12, big=1, big_size=20_000)
    out = tmp_path / "model"
    stale = Path(tmp_path_of(out))
    stale.mkdir()
    (stale / "tokenizer").write_bytes(b"a file where the new model has a directory")
    sink = PathSink(str(out))
    sim, source = _dir_sim(src, 0.0, 1, [sink])
    sim.add_receiver()
    sim.run(until=60)
    try:
        assert sim.receivers[0].receiver.complete
        sink.finish(source.size)
        assert tree_of(out) == tree_of(src)
    finally:
        source.close()
        sink.close()


def test_a_symlink_planted_in_the_temporary_directory_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "model"
    tmp = Path(tmp_path_of(out))
    tmp.mkdir()
    (tmp / "tokenizer").symlink_to(outside)
    with pytest.raises(OSError):
        DirSink(str(out), [Entry("config.json", 3), Entry("tokenizer/vocab.json", 4)])
    (tmp / "tokenizer").unlink()
    (tmp / "config.json").unlink()  # (created by the attempt above, inside the temporary directory)
    (tmp / "config.json").symlink_to(outside / "victim")
    with pytest.raises(OSError):
        DirSink(str(out), [Entry("config.json", 3)])
    assert list(outside.iterdir()) == []


def tmp_path_of(out: Path) -> str:
    return tmp_path(str(out))


def test_scan_sends_symlinked_files_and_refuses_symlinked_directories(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_bytes(b"weights")
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "model.safetensors").symlink_to(blobs / "abc")  # a Hugging Face cache snapshot
    assert scan(str(snap)) == [Entry("model.safetensors", 7, stat.S_IMODE((blobs / "abc").stat().st_mode))]
    (snap / "sub").symlink_to(blobs, target_is_directory=True)
    with pytest.raises(ValueError):
        scan(str(snap))


def test_content_id_names_exactly_the_published_model() -> None:
    blob = tree.encode_entries([Entry("a", 3), Entry("b/c", 4, 0o600)])
    digest = blake3.blake3(b"abcdefg").digest()
    chunks = wire.chunk_digest(b"abcdefg")
    cid = tree.parse_content_id(tree.content_id(blob, 7, 1024, digest, chunks))
    assert tree.content_id(blob, 7, 1024, digest, chunks).startswith("blake3:")
    assert tree.matches_id(cid, blob, 7, 1024, digest, chunks)
    other = tree.encode_entries([Entry("a", 3), Entry("b/c", 4, 0o644)])  # only a mode differs
    assert not tree.matches_id(cid, other, 7, 1024, digest, chunks)
    assert not tree.matches_id(cid, blob, 7, 1024, blake3.blake3(b"abcdefh").digest(), chunks)
    # The chunk digests are what a receiver checks the bytes against: forged ones are
    # another manifest, even with the right whole-content digest.
    assert not tree.matches_id(cid, blob, 7, 1024, digest, wire.chunk_digest(b"forged!"))
    assert not tree.matches_id(cid, blob, 7, 2048, digest, chunks)
    for bad in ("sha256:" + "0" * 64, "blake3:abc", "blake3:" + "g" * 64):
        with pytest.raises(ValueError):
            tree.parse_content_id(bad)


def test_expect_refuses_every_manifest_that_does_not_hash_to_the_id(tmp_path: Path) -> None:
    """Two receivers hold the session key; one expects the published id and one an id
    of another model: the second counts every manifest page and never starts."""
    src = make_model_dir(tmp_path / "src", files=8, big=1, big_size=40_000)
    sinks = [PathSink(str(tmp_path / "right")), PathSink(str(tmp_path / "wrong"))]
    sim, source = _dir_sim(src, 0.0, 2, list(sinks))
    assert len(sim.sender.pages) == 1
    page = sim.sender.pages[0]
    published = tree.manifest_id(sim.sender.pages)
    forged = tree.content_id(page.entries, page.file_size, page.chunk_size, bytes(32), page.digests)
    sim.add_receiver(ReceiverConfig(content_id=tree.parse_content_id(published)))
    wrong = sim.add_receiver(ReceiverConfig(content_id=tree.parse_content_id(forged), idle_timeout=3.0))
    sim.run(until=20)
    try:
        assert sim.receivers[0].receiver.complete
        assert wrong.receiver is not None and wrong.receiver.manifest is None and not wrong.receiver.complete
        assert wrong.receiver.stats.drops["wrong_content_id"] >= 1
        assert sinks[1].inner is None and not os.path.exists(tmp_path / ".wrong.modelcast-tmp")
    finally:
        source.close()
        for sink in sinks:
            sink.close()


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_manifest_of_many_pages_naming_another_id_is_refused_at_the_first_page_heard(tmp_path: Path,
                                                                                        kind: str) -> None:
    """Whichever page of a many-page manifest a receiver hears first names the content id
    (``id_root``): a receiver expecting another id refuses it there -- nothing created,
    the data that follows not written, the sender's real id known for the error -- and a
    receiver expecting the published id starts from that one page."""
    if kind == "directory":
        source = DirSource(str(make_model_dir(tmp_path / "src", files=6, big=1, big_size=700_000)))
        entries = source.entries_blob
    else:
        source, entries = MemorySource(random.Random(3).randbytes(700_000)), b""  # type: ignore[assignment]
    cfg = sender_config(expected_receivers=1, key=KEY, chunk_size=1024, session_id=7, max_datagram=1200)
    pages = build_manifest_pages(source, cfg, 7, file_digests(source, cfg.chunk_size), entries)
    published = tree.manifest_id(pages)
    assert len(pages) >= 3 and all(p.id_root == pages[0].id_root for p in pages)
    data = wire.encode(wire.Data(7, 0, 0, 0, source.read(0, 1024)), KEY)
    wrong = "blake3:" + "5f1c" * 16
    out = tmp_path / "out"
    sink, right = PathSink(str(out)), PathSink(str(tmp_path / "right"))
    refusing = Receiver(sink, ReceiverConfig(key=KEY, content_id=tree.parse_content_id(wrong)), 0.0)
    taking = Receiver(right, ReceiverConfig(key=KEY, content_id=tree.parse_content_id(published)), 0.0)
    try:
        for receiver in (refusing, taking):
            receiver.receive_datagram(wire.encode(pages[2], KEY), ("10.0.0.1", 5000), 0.1)  # a late joiner's first
            receiver.receive_datagram(data, ("10.0.0.1", 5000), 0.2)
        assert refusing.manifest is None and refusing.stats.drops["wrong_content_id"] == 1
        assert refusing.offered_content_id == published
        assert refusing.have.count == 0 and sink.inner is None
        assert not out.exists() and not (tmp_path / ".out.modelcast-tmp").exists()
        assert taking.manifest is not None and taking.have.count == 1 and taking.stats.drops.total() == 0
    finally:
        if isinstance(source, DirSource):
            source.close()
        sink.close()
        right.close()


@pytest.mark.parametrize("forge", ["chunk digest", "none"])
def test_a_manifest_of_many_pages_is_held_to_the_id_once_its_last_page_lands(tmp_path: Path, forge: str) -> None:
    """A manifest of several pages: its first page names the published id (``id_root``),
    but only all pages' digests prove it. A sender holding the key that forges one chunk's
    digest (and sends data matching it) while its pages claim the published root fails the
    receiver that expects the published id before anything completes; unforged, the
    same receiver completes, and reports the id it verified."""
    src = make_model_dir(tmp_path / "src", files=6, big=1, big_size=700_000)
    source = DirSource(str(src))
    cfg = sender_config(expected_receivers=1, key=KEY, chunk_size=1024, session_id=5, max_datagram=1200)
    digests, whole = file_digests(source, cfg.chunk_size)
    published = tree.manifest_id(build_manifest_pages(source, cfg, 5, (digests, whole), source.entries_blob))
    claimed = (source.size, tree.digests_root(digests))
    data = bytearray(source.read(0, source.size))
    if forge == "chunk digest":  # chunk 30 says other bytes, and those bytes are what is sent
        data[30 * 1024] ^= 0xFF
        digests = digests[: 30 * 16] + wire.chunk_digest(bytes(data[30 * 1024 : 31 * 1024])) + digests[31 * 16 :]
    pages = build_manifest_pages(source, cfg, 5, (digests, whole), source.entries_blob, whole=claimed)
    assert len(pages) >= 3
    sink = PathSink(str(tmp_path / "out"))
    sim = Sim(bytes(data), cfg, manifest=pages, sink_factory=lambda: sink)
    rec = sim.add_receiver(ReceiverConfig(content_id=tree.parse_content_id(published), idle_timeout=3.0))
    sim.run(until=30)
    try:
        receiver = rec.receiver
        assert receiver is not None
        if forge == "none":
            assert receiver.complete and receiver.content_id() == published
        else:
            assert not receiver.complete and receiver.failed
            assert receiver.stats.drops["wrong_content_id"] == 1
            assert Failed("manifest does not match the expected content id") in rec.events
            assert not (tmp_path / "out").exists()
    finally:
        source.close()
        sink.close()


def test_a_single_file_manifest_is_encoded_as_before() -> None:
    page = wire.Manifest(1, 2048, 1024, 512, 2, bytes(32), 0, 1, 0, bytes(32), "f", 3)
    body = wire.encode(page)[wire.HEADER_LEN:]
    assert len(msgpack.unpackb(body)) == 11
    assert wire.decode(wire.encode(page)) == page
    with_entries = wire.Manifest(1, 2048, 1024, 512, 2, bytes(32), 0, 1, 0, bytes(32), "f", 3, entries=b"\x91")
    assert wire.decode(wire.encode(with_entries)) == with_entries


# ----------------------------------------------------------------------------- shared output directories


@pytest.mark.parametrize("forge", ["chunk digest", "none"])
def test_a_single_file_is_received_beside_out_and_renamed_only_once_verified(tmp_path: Path, forge: str) -> None:
    """A single file of a manifest of many pages, into an OUT that holds a good copy: a
    forged chunk digest fails the receiver when the last page lands -- and OUT, never
    opened, still holds the good copy; unforged, OUT holds the old copy until the new one
    is renamed over it, and then nothing else is left beside it."""
    data = bytes(random.Random(4).randbytes(300_000))
    cfg = sender_config(expected_receivers=1, key=KEY, chunk_size=1024, session_id=6, max_datagram=1200)
    source = MemorySource(data)
    digests, whole = file_digests(source, cfg.chunk_size)
    published = tree.manifest_id(build_manifest_pages(source, cfg, 6, (digests, whole)))
    claimed = (len(data), tree.digests_root(digests))  # (the forger's pages claim the published id)
    sent = bytearray(data)
    if forge == "chunk digest":
        sent[40 * 1024] ^= 0xFF
        digests = digests[: 40 * 16] + wire.chunk_digest(bytes(sent[40 * 1024 : 41 * 1024])) + digests[41 * 16 :]
    pages = build_manifest_pages(source, cfg, 6, (digests, whole), whole=claimed)
    assert len(pages) >= 3
    out = tmp_path / "model.bin"
    out.write_bytes(b"GOOD" * 1000)
    sink = PathSink(str(out))
    sim = Sim(bytes(sent), cfg, manifest=pages, sink_factory=lambda: sink)
    rec = sim.add_receiver(ReceiverConfig(content_id=tree.parse_content_id(published), idle_timeout=3.0))
    sim.run(until=30)
    try:
        assert out.read_bytes() == b"GOOD" * 1000
        if forge == "none":
            assert rec.receiver is not None and rec.receiver.complete
            sink.finish(len(data))
            assert out.read_bytes() == data
            assert sorted(os.listdir(tmp_path)) == ["model.bin"]
        else:
            assert rec.receiver is not None and rec.receiver.failed and not rec.receiver.complete
            assert Failed("manifest does not match the expected content id") in rec.events
    finally:
        sink.close()


def _plant(kind: str, path: Path, files: Path) -> None:
    """What a local attacker leaves at ``path``: a copy of ``files`` in a directory of
    another user's (uid 65534) or writable by everyone, or a symlink to such a copy."""
    target = path if kind != "symlink" else path.parent / "attacker"
    shutil.copytree(files, target)
    for top, dirs, names in os.walk(target):
        for name in [top, *(os.path.join(top, n) for n in dirs + names)]:
            os.chmod(name, 0o777 if os.path.isdir(name) else 0o666)
            if kind == "another user's":
                os.chown(name, 65534, 65534)
    if kind == "symlink":
        path.symlink_to(target, target_is_directory=True)


PLANTED = ["another user's", "writable by everyone", "symlink"]


@pytest.mark.parametrize("kind", PLANTED)
def test_a_planted_temporary_directory_and_record_are_ignored(tmp_path: Path, kind: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """In a shared directory a local user plants ``.model.modelcast-tmp`` (the model's own
    files, so a reused one would verify) and a record claiming every chunk. The receiver
    uses neither, warns naming both, and the attacker's swap of a file in the planted
    directory after verification changes nothing at OUT."""
    if kind == "another user's" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    src = make_model_dir(tmp_path / "src", files=8, big=1, big_size=60_000)
    shared = tmp_path / "shm"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    out = shared / "model"
    planted = Path(tmp_path_of(out))
    _plant(kind, planted, src)
    source = DirSource(str(src))
    record = Path(str(out) + ".modelcast-state")
    whole = file_digests(source, 16 * 1024)[1]
    chunks = -(-source.size // (16 * 1024))
    record.write_bytes(msgpack.packb({"v": 1, "digest": whole, "size": source.size, "chunk": 16 * 1024,
                                      "verified": [[0, chunks]], "complete": False, "rid": 7}))
    if kind == "another user's":
        os.chown(record, 65534, 65534)
    else:
        record.chmod(0o666)
    source.close()
    sink = PathSink(str(out))
    sim, source = _dir_sim(src, 0.0, 1, [sink])
    rec = sim.add_receiver()
    with caplog.at_level("WARNING", logger="modelcast.agent"):
        rec.receiver = Receiver(sink, rec.config, 0.0, state=sink.load_state())
        sim.run(until=60)
    try:
        receiver = rec.receiver
        assert receiver.complete and receiver.resumed_chunks == 0 and receiver.stats.corrupt_chunks == 0
        warned = " ".join(r.getMessage() for r in caplog.records)
        assert str(planted) in warned and str(record) in warned
        (planted / "config.json").write_bytes(b'{"evil": true}')  # the swap, after verification
        sink.finish(source.size)
        assert tree_of(out) == tree_of(src)
        assert (planted / "config.json").read_bytes() == b'{"evil": true}', "the planted directory is left alone"
        assert record.exists() and os.lstat(planted).st_uid == (65534 if kind == "another user's" else os.geteuid())
        sink.close()  # (this run's records were kept in a private directory: gone now)
        left = {"model", planted.name, record.name} | ({"attacker"} if kind == "symlink" else set())
        assert {p.name for p in shared.iterdir()} == left
    finally:
        source.close()
        sink.close()


def test_the_records_temporary_never_follows_or_reuses_what_is_planted(tmp_path: Path) -> None:
    """A symlink planted where a record's temporary file used to be written (OUT's record
    name + ``.tmp``) pointing at a victim file: records are written and the victim is
    untouched; no temporary is left once the model is in place."""
    src = make_model_dir(tmp_path / "src", files=4, big=1, big_size=200_000)
    out = tmp_path / "model"
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    Path(str(out) + ".modelcast-state.tmp").symlink_to(victim)
    sink = PathSink(str(out))
    sim, source = _dir_sim(src, 0.05, 1, [sink])
    sim.add_receiver()
    sim.run(until=60)
    try:
        assert sim.receivers[0].receiver.complete
        sink.finish(source.size)
        assert sink.record_stats[0] > 0
        assert victim.read_bytes() == b"precious" and tree_of(out) == tree_of(src)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            ["src", "model", "victim", "model.modelcast-state.tmp"])
    finally:
        source.close()
        sink.close()


def test_parallel_settling_does_every_item_once_and_raises_the_first_error() -> None:
    """A directory's files are made durable on several threads at once: each exactly
    once, and a failing fsync (a full or broken disk) still fails the finish."""
    from hostagent.dirs import _in_parallel

    seen: list[int] = []
    _in_parallel(seen.append, range(100), threads=8)
    assert sorted(seen) == list(range(100))

    def fail_on_7(item: int) -> None:
        if item == 7:
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        _in_parallel(fail_on_7, range(40), threads=8)


def test_a_finished_directory_has_every_size_and_mode_however_it_was_settled(tmp_path) -> None:
    """The parallel finish trims stale bytes and sets every file's mode, as one by one."""
    entries = [Entry(f"d{i % 3}/f{i}", 100 + i, 0o640 if i % 2 else 0o755) for i in range(24)]
    out = tmp_path / "model"
    sink = DirSink(str(out), entries)
    space = Space(entries)
    sink.write(0, bytes(range(256)) * (space.size // 256 + 1))  # (past the end: more than the space)
    os.pwrite(sink.fds[5], b"stale tail", entries[5].size)  # an older, longer file's bytes
    sink.finish(space.size)
    sink.close()
    for e in entries:
        st_ = os.stat(out / e.path)
        assert st_.st_size == e.size and stat.S_IMODE(st_.st_mode) == e.mode, e
