"""A model directory as one virtual byte space, and a model's content id (pure: no I/O).

A directory is sent as one session: its regular files, sorted by path, back to back in
one byte space (a 30-byte ``config.json`` and the first bytes of a shard share a chunk,
so 40 tiny files cost no datagram round each). The entry list -- relative path, size and
permission bits per file; offsets follow from the order -- travels in every manifest
page as one canonical msgpack blob (``encode_entries``), so a receiver that hears any
page knows where every byte goes before it writes one.

A receiver trusts nothing in that list: ``decode_entries`` refuses absolute paths, ``..``
and ``.`` components, empty or duplicate names, a file that is also another's directory,
NUL bytes, modes beyond ``0o777``, too many entries or too long names, and sizes that do
not add up to the session's size. (That no component is a symlink is checked where the
files are created: ``hostagent.dirs`` opens every component with ``O_NOFOLLOW`` inside a
directory it made.)

Content id: ``blake3:<hex>`` of the canonical manifest: entries, size, chunk size, the
whole-content digest and the digest of all chunk digests. A receiver verifies every chunk
against the manifest's chunk digests (that is what makes the file; there is no second
whole-file pass), so the id must cover them: then what a receiver verified against an id
is exactly what was published, whoever else holds the session key. (So the id depends on
``--chunk-size``: the same bytes sent in other chunks are another manifest.)
"""

from __future__ import annotations

import bisect
import hmac
from dataclasses import dataclass
from typing import Iterator, Optional

import blake3
import msgpack

from .wire import CHUNK_DIGEST_LEN, FILE_DIGEST_LEN

MAX_ENTRIES = 4096
MAX_PATH_BYTES = 1024
MAX_COMPONENT_BYTES = 255
# The blob rides in every manifest page (one datagram, at most 64 KB): it must leave room
# for the page's other fields and some chunk digests.
MAX_ENTRIES_BYTES = 48 * 1024
ID_PREFIX = "blake3:"
_ID_CONTEXT = b"modelcast content id v1"


class UnsafeEntries(ValueError):
    """An entry list a receiver refuses (``reason`` labels the drop counter)."""

    reason = "bad_entries"


@dataclass(frozen=True, slots=True)
class Entry:
    """One file of a model directory: its path relative to the directory ("/"-separated),
    size in bytes and permission bits."""

    path: str
    size: int
    mode: int = 0o644


def encode_entries(entries: list[Entry]) -> bytes:
    """The canonical blob: entries sorted by path (the order of the byte space)."""
    ordered = sorted(entries, key=lambda e: e.path.encode())
    blob = msgpack.packb([[e.path, e.size, e.mode] for e in ordered], use_bin_type=True)
    if len(blob) > MAX_ENTRIES_BYTES or len(ordered) > MAX_ENTRIES:
        raise ValueError(f"{len(ordered)} files, {len(blob)} bytes of names: at most {MAX_ENTRIES} files "
                         f"and {MAX_ENTRIES_BYTES} bytes")
    check_entries(ordered)
    return blob


def decode_entries(blob: bytes, total_size: Optional[int] = None) -> list[Entry]:
    """Parse and check an entry list from a manifest (``UnsafeEntries`` on anything a
    receiver must not create); ``total_size``: the session's byte count they must fill."""
    if len(blob) > MAX_ENTRIES_BYTES:
        raise UnsafeEntries("entry list too large")
    try:
        raw = msgpack.unpackb(blob, raw=False, strict_map_key=True, use_list=True)
    except Exception:
        raise UnsafeEntries("entry list is not msgpack") from None
    if type(raw) is not list or not 1 <= len(raw) <= MAX_ENTRIES:
        raise UnsafeEntries("entry list shape")
    entries = []
    for item in raw:
        if type(item) is not list or len(item) != 3:
            raise UnsafeEntries("entry shape")
        path, size, mode = item
        if type(path) is not str or type(size) is not int or type(mode) is not int:
            raise UnsafeEntries("entry field types")
        entries.append(Entry(path, size, mode))
    check_entries(entries)
    if total_size is not None and sum(e.size for e in entries) != total_size:
        raise UnsafeEntries("entry sizes do not add up to the session's size")
    return entries


def check_entries(entries: list[Entry]) -> None:
    """Every rule of the module docstring; entries must already be in canonical order."""
    previous: Optional[bytes] = None
    files: set[str] = set()
    dirs: set[str] = set()
    for entry in entries:
        _check_path(entry.path)
        if not 0 <= entry.size < 1 << 63 or not 0 <= entry.mode <= 0o777:
            raise UnsafeEntries(f"size or mode of {entry.path!r}")
        key = entry.path.encode()
        if previous is not None and key <= previous:
            raise UnsafeEntries("entries not sorted or duplicated")
        previous = key
        parts = entry.path.split("/")
        parents = ["/".join(parts[:i]) for i in range(1, len(parts))]
        if entry.path in dirs or any(p in files for p in parents):
            raise UnsafeEntries(f"{entry.path!r} is both a file and a directory")
        files.add(entry.path)
        dirs.update(parents)


def _check_path(path: str) -> None:
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeEntries("path not UTF-8") from None
    if not encoded or len(encoded) > MAX_PATH_BYTES or "\0" in path or path.startswith("/"):
        raise UnsafeEntries(f"path {path[:64]!r}: empty, too long, NUL or absolute")
    for part in path.split("/"):
        if part in ("", ".", "..") or len(part.encode()) > MAX_COMPONENT_BYTES:
            raise UnsafeEntries(f"path {path[:64]!r}: empty, '.', '..' or too long component")


class Space:
    """Where each file's bytes sit in the session's byte space."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.starts: list[int] = []
        pos = 0
        for entry in entries:
            self.starts.append(pos)
            pos += entry.size
        self.size = pos

    def spans(self, offset: int, length: int) -> Iterator[tuple[int, int, int, int]]:
        """(entry index, offset in that file, offset in the range, length) of each piece
        of ``[offset, offset+length)``; empty files never appear."""
        end = min(offset + length, self.size)
        i = bisect.bisect_right(self.starts, offset) - 1
        pos = offset
        while pos < end:
            while self.entries[i].size == 0 or self.starts[i] + self.entries[i].size <= pos:
                i += 1
            start = self.starts[i]
            take = min(end, start + self.entries[i].size) - pos
            yield i, pos - start, pos - offset, take
            pos += take


def content_id(entries_blob: bytes, size: int, chunk_size: int, file_digest: bytes, chunk_digests: bytes) -> str:
    """``blake3:<hex>`` of a model's manifest (a single file: ``entries_blob`` empty);
    ``chunk_digests``: all of them, in chunk order."""
    if len(chunk_digests) % CHUNK_DIGEST_LEN:
        raise ValueError("digest length")
    return id_of_root(entries_blob, size, chunk_size, file_digest, digests_root(chunk_digests))


def digests_root(chunk_digests: bytes) -> bytes:
    """The digest of all chunk digests (in chunk order) that a content id covers: what a
    manifest page carries (``wire.Manifest.id_root``) so that a receiver checks the id at
    its first page, before the other pages came."""
    return blake3.blake3(chunk_digests).digest()


def id_of_root(entries_blob: bytes, size: int, chunk_size: int, file_digest: bytes, root: bytes) -> str:
    """``content_id`` from the ``digests_root`` of the chunk digests instead of the digests."""
    if len(file_digest) != FILE_DIGEST_LEN or len(root) != FILE_DIGEST_LEN:
        raise ValueError("digest length")
    canon = msgpack.packb([_ID_CONTEXT, entries_blob, size, chunk_size, file_digest, root], use_bin_type=True)
    return ID_PREFIX + blake3.blake3(canon).hexdigest()


def manifest_id(pages: list) -> str:
    """The content id of a whole manifest (``wire.Manifest`` pages covering every chunk)."""
    first = pages[0]
    digests = b"".join(p.digests for p in sorted(pages, key=lambda p: p.first_chunk))
    return content_id(first.entries, first.file_size, first.chunk_size, first.file_digest, digests)


def parse_content_id(text: str) -> bytes:
    """The 32 digest bytes of a ``blake3:<64 hex>`` id (ValueError otherwise)."""
    hexpart = text[len(ID_PREFIX):] if text.startswith(ID_PREFIX) else ""
    if len(hexpart) != 64:
        raise ValueError(f"content id must be {ID_PREFIX}<64 hex digits>: {text[:80]!r}")
    return bytes.fromhex(hexpart)


def matches_id(expected: bytes, entries_blob: bytes, size: int, chunk_size: int, file_digest: bytes,
               chunk_digests: bytes) -> bool:
    """Whether a manifest hashes to the expected id (constant-time compare)."""
    got = content_id(entries_blob, size, chunk_size, file_digest, chunk_digests)
    return hmac.compare_digest(parse_content_id(got), expected)
