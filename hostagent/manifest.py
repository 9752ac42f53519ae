"""The sender's manifest digests (per-chunk and whole-file BLAKE3), cached by file identity.

Digesting a file is one full read before the first datagram can leave: ~0.3 s per GB
here, a minute for a 100 GB checkpoint. A model is usually sent many times unchanged, so
the digests are kept in a small cache entry per (file, chunk size) and reused while the
file is provably the same version: same device, inode, size, mtime and ctime (ctime moves
on every write and cannot be set back by a user, so an edit in place that restores the
mtime is still seen). A file that changes while it is being digested is not cached.
Anything wrong with an entry (unreadable, other version, other file) means "compute".

The cache lives in ``$MODELCAST_CACHE_DIR``, else ``$XDG_CACHE_HOME/modelcast``, else
``~/.cache/modelcast``; failing to write it never fails a send. It keeps the
``MAX_ENTRIES`` most recently used entries (files come and go; entries must not).
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

import blake3
import msgpack

from .wire import CHUNK_DIGEST_LEN, FILE_DIGEST_LEN

CACHE_VERSION = 1
CACHE_ENV = "MODELCAST_CACHE_DIR"
MAX_ENTRIES = 256
_PREFIX, _SUFFIX = "manifest-", ".msgpack"

Digests = tuple[bytes, bytes]  # (chunk digests, CHUNK_DIGEST_LEN bytes each; whole-file digest)


def cache_dir() -> str:
    """Where cache entries go (see the module docstring)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "modelcast")


def _identity(path: str, files: Optional[Sequence[str]] = None) -> list:
    """The version of ``path``; with ``files`` (a directory's content: these files under
    it, in this order), every one's, in the directory's place their total size (``_load``
    counts chunks from it). A directory's own mtime does not move when a file in it is
    rewritten; each file's does."""
    if files is None:
        st = os.stat(path)
        return [os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    each = [[rel, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            for rel in files for st in (os.stat(os.path.join(path, rel)),)]
    return [os.path.realpath(path), 0, 0, sum(f[3] for f in each), 0, 0, each]


def _entry_path(directory: str, path: str, chunk_size: int, files: Optional[Sequence[str]] = None) -> str:
    """One entry per (file, chunk size), or per (directory, its files, chunk size): a
    changed file replaces its own entry."""
    key = f"{os.path.realpath(path)}\0{chunk_size}" + ("".join(f"\0{rel}" for rel in files) if files else "")
    name = blake3.blake3(key.encode()).hexdigest(length=16)
    return os.path.join(directory, f"{_PREFIX}{name}{_SUFFIX}")


def _load(entry: str, identity: list, chunk_size: int) -> Optional[Digests]:
    try:
        with open(entry, "rb") as handle:
            obj = msgpack.unpackb(handle.read(), raw=False)
    except (OSError, ValueError, msgpack.UnpackException):
        return None
    if not isinstance(obj, dict) or obj.get("v") != CACHE_VERSION or obj.get("id") != identity:
        return None
    digests, whole = obj.get("digests"), obj.get("file_digest")
    chunks = -(-identity[3] // chunk_size)
    if obj.get("chunk") != chunk_size or type(digests) is not bytes or type(whole) is not bytes:
        return None
    if len(digests) != chunks * CHUNK_DIGEST_LEN or len(whole) != FILE_DIGEST_LEN:
        return None
    return digests, whole


def _store(entry: str, identity: list, chunk_size: int, digests: Digests) -> None:
    blob = msgpack.packb({"v": CACHE_VERSION, "id": identity, "chunk": chunk_size,
                          "digests": digests[0], "file_digest": digests[1]}, use_bin_type=True)
    try:
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        tmp = f"{entry}.{os.getpid()}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(blob)
        os.replace(tmp, entry)  # readers see the old entry or the new one, never half
    except OSError:
        return
    _prune(os.path.dirname(entry))


def _prune(directory: str) -> None:
    """Drop the least recently used entries beyond MAX_ENTRIES (a hit refreshes an
    entry's mtime)."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith(_PREFIX) and n.endswith(_SUFFIX)]
        if len(names) <= MAX_ENTRIES:
            return
        aged = sorted(names, key=lambda n: os.stat(os.path.join(directory, n)).st_mtime_ns)
        for name in aged[: len(names) - MAX_ENTRIES]:
            os.unlink(os.path.join(directory, name))
    except OSError:
        pass  # another sender pruned at the same time: fine either way


def cached_digests(path: str, chunk_size: int, compute: Callable[[], Digests],
                   directory: Optional[str], files: Optional[Sequence[str]] = None) -> tuple[Digests, bool]:
    """``compute()``'s digests of ``path``, from the cache in ``directory`` while the file
    is unchanged (``directory`` None: no cache); returns (digests, whether it was a hit).
    ``files``: ``path`` is a directory whose content is these files (relative paths, in
    the content's order), each of which must be unchanged."""
    if directory is None:
        return compute(), False
    before = _identity(path, files)
    entry = _entry_path(directory, path, chunk_size, files)
    hit = _load(entry, before, chunk_size)
    if hit is not None:
        try:
            os.utime(entry)  # recently used: pruned last
        except OSError:
            pass
        return hit, True
    digests = compute()
    if _identity(path, files) == before:
        _store(entry, before, chunk_size, digests)
    return digests, False
