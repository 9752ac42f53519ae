"""The sender's digest cache: a hit only while the file is provably unchanged, and
never a reason for a send to fail."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import blake3

import hostagent.manifest as manifest
from hostagent.manifest import CACHE_ENV, cache_dir, cached_digests
from hostagent.dirs import DirSource
from hostagent.net import FileSource
from hostagent.sender import file_digests
from lab.models import make_model, make_model_dir

CHUNK = 64 * 1024


def _counted(source: FileSource | DirSource) -> list[int]:
    """Count the source's reads from now on (in the one-element list returned)."""
    reads = [0]
    real = source.read

    def counting(offset: int, length: int) -> bytes:
        reads[0] += 1
        return real(offset, length)

    source.read = counting  # type: ignore[method-assign]
    return reads


def _digests(path: str, directory: str | None) -> tuple[tuple[bytes, bytes], bool, int]:
    """(digests, hit, reads of the file it took)."""
    source = FileSource(path)
    reads = _counted(source)
    try:
        digests, hit = cached_digests(path, CHUNK, lambda: file_digests(source, CHUNK), directory)
    finally:
        source.close()
    return digests, hit, reads[0]


def test_second_send_of_an_unchanged_file_reads_nothing(tmp_path) -> None:
    model = make_model(tmp_path / "m.bin", 5 * CHUNK + 17, seed=1)
    cache = str(tmp_path / "cache")
    first, hit, reads = _digests(str(model.path), cache)
    assert not hit and reads == 6
    assert first[1].hex() == model.digest and len(first[0]) == 6 * 16
    assert first[0][:16] == blake3.blake3(model.path.read_bytes()[:CHUNK]).digest(length=16)
    again, hit, reads = _digests(str(model.path), cache)
    assert hit and reads == 0 and again == first


def test_a_changed_file_is_digested_again(tmp_path) -> None:
    model = make_model(tmp_path / "m.bin", 3 * CHUNK, seed=1)
    cache = str(tmp_path / "cache")
    first, _, _ = _digests(str(model.path), cache)
    st = os.stat(model.path)
    with open(model.path, "r+b") as handle:  # same size, mtime put back: only ctime tells
        handle.write(b"changed")
    os.utime(model.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    second, hit, reads = _digests(str(model.path), cache)
    assert not hit and reads == 3 and second[0][:16] != first[0][:16] and second[0][16:] == first[0][16:]
    third, hit, _ = _digests(str(model.path), cache)
    assert hit and third == second  # the entry now describes the new version


def test_other_chunk_size_and_damaged_entries_are_misses(tmp_path) -> None:
    model = make_model(tmp_path / "m.bin", 2 * CHUNK, seed=2)
    cache = tmp_path / "cache"
    first, _, _ = _digests(str(model.path), str(cache))
    source = FileSource(str(model.path))
    try:
        other, hit = cached_digests(str(model.path), CHUNK // 2, lambda: file_digests(source, CHUNK // 2),
                                    str(cache))
    finally:
        source.close()
    assert not hit and len(other[0]) == 4 * 16
    for entry in cache.iterdir():
        entry.write_bytes(b"\x92garbage")
    again, hit, reads = _digests(str(model.path), str(cache))
    assert not hit and reads == 2 and again == first


def test_no_cache_or_an_unwritable_one_still_digests(tmp_path) -> None:
    model = make_model(tmp_path / "m.bin", CHUNK + 1, seed=3)
    digests, hit, reads = _digests(str(model.path), None)
    assert not hit and reads == 2 and digests[1].hex() == model.digest
    blocker = tmp_path / "file-not-dir"
    blocker.write_bytes(b"")
    digests, hit, reads = _digests(str(model.path), str(blocker / "cache"))
    assert not hit and reads == 2 and digests[1].hex() == model.digest


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "x"))
    assert cache_dir() == str(tmp_path / "x")
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == str(tmp_path / "xdg" / "modelcast")


def test_the_cache_keeps_only_the_most_recently_used_entries(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(manifest, "MAX_ENTRIES", 2)
    cache = tmp_path / "cache"
    paths = [str(make_model(tmp_path / f"m{i}.bin", 1000 + i, seed=i).path) for i in range(3)]
    _digests(paths[0], str(cache))
    _digests(paths[1], str(cache))
    entries = sorted(cache.iterdir())
    for age, entry in enumerate(entries):  # make the order of use unambiguous
        os.utime(entry, ns=(age * 10**9, age * 10**9))
    _, hit, _ = _digests(paths[0], str(cache))  # a hit: m0 becomes the most recent
    assert hit
    _digests(paths[2], str(cache))  # a third entry: the least recently used (m1) goes
    assert len(list(cache.iterdir())) == 2
    assert _digests(paths[0], str(cache))[1] and _digests(paths[2], str(cache))[1]
    assert not _digests(paths[1], str(cache))[1]


def _dir_digests(root: Path, cache: str, only: Optional[list[str]] = None) -> tuple[tuple[bytes, bytes], bool, int]:
    """(digests, hit, chunk reads) of a directory's content (``only``: those files, as a
    part of a model is sent)."""
    source = DirSource(str(root), only=only)
    reads = _counted(source)
    try:
        digests, hit = cached_digests(str(root), CHUNK, lambda: file_digests(source, CHUNK), cache,
                                      [e.path for e in source.space.entries])
    finally:
        source.close()
    return digests, hit, reads[0]


def test_a_directory_is_digested_once_while_each_of_its_files_is_unchanged(tmp_path) -> None:
    """A model directory sent again reads nothing; a file rewritten in place (its
    directory's mtime does not move) or a part of the directory sent on its own is a
    miss, never the whole directory's digests."""
    root = make_model_dir(tmp_path / "model", seed=5, files=12, big=2, big_size=3 * CHUNK)
    cache = str(tmp_path / "cache")
    first, hit, reads = _dir_digests(root, cache)
    assert not hit and reads > 0
    again, hit, reads = _dir_digests(root, cache)
    assert hit and reads == 0 and again == first
    small = next(p for p in sorted(root.rglob("*")) if p.is_file() and 0 < p.stat().st_size < CHUNK)
    dir_mtime = os.stat(root).st_mtime_ns
    st = os.stat(small)
    with open(small, "r+b") as handle:  # same size, mtime put back: only its ctime tells
        handle.write(b"X")
    os.utime(small, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(root).st_mtime_ns == dir_mtime
    changed, hit, _ = _dir_digests(root, cache)
    assert not hit and changed[1] != first[1]
    part = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())[:3]
    sub, hit, _ = _dir_digests(root, cache, only=part)
    assert not hit and sub[1] != changed[1]
    assert _dir_digests(root, cache, only=part)[:2] == (sub, True)
