"""Model directories on disk: the sender's multi-file source and the receiver's sinks.

``DirSource`` reads the session's byte space (``hostagent.tree.Space``) from the files of
a directory. ``DirSink`` writes it into a temporary directory next to the output,
``PARENT/.NAME.modelcast-tmp/``, every component opened with ``O_NOFOLLOW`` below a
directory it created itself (a symlink planted there is refused, nothing lands outside),
and renames it into place only after every chunk and the whole content verified
(``finish``): a loader never sees a half-written model. A single file is received the
same way (``TmpFileSink``: into that directory, renamed to OUT once verified), so OUT is
never opened before the content is known to be the one asked for. The resume record is
the single file's one (``OUT.modelcast-state``, made durable after the data it claims, by
the same writer thread), so a restarted receiver fetches only what it does not hold, per
file. ``PathSink`` is what ``recv --out PATH`` uses: a file or a directory, as the
manifest says; a temporary directory that the resume record does not describe (another
model's, or no record) is emptied first, so it holds only what the record speaks for.

Output directories may be shared (``/dev/shm``), so the temporary directory and the
record are used only when they are this user's own (``own_tmp``, ``read_record``): a
directory this user created, or one it owns that nobody else may write to, opened with
``O_NOFOLLOW`` and checked again through the descriptor; a record that is a regular file
this user owns. Anything else found there -- another user's, a symlink, writable by
others -- is ignored with a warning naming it (``modelcast.agent`` logger): the data then
goes to a fresh private directory beside it, the records to a private one removed when the
run ends (that run cannot be resumed), and what was planted is never read or written.
"""

from __future__ import annotations

import errno
import os
import resource
import stat
import threading
from typing import Callable, Iterable, Optional

import msgpack

from . import tree
from .net import STATE_SUFFIX, FileSink, _RecordWriter, pwritev_all
from .tree import Entry, Space
from .wire import Manifest

TMP_SUFFIX = ".modelcast-tmp"
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RENAME_EXCHANGE = 2
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _warn(message: str, *args: object) -> None:
    """A warning on the agent's logger. (logging and tempfile load where they are used,
    on paths a transfer rarely takes: every agent process's start-up counts.)"""
    import logging

    logging.getLogger("modelcast.agent").warning(message, *args)


def _mkdtemp(prefix: str, dir: str) -> str:
    import tempfile

    return tempfile.mkdtemp(prefix=prefix, dir=dir)


def scan(root: str) -> list[Entry]:
    """The regular files under ``root`` in canonical order. A symlink to a file is sent as
    that file (a Hugging Face cache snapshot is symlinks into its blobs); a symlinked
    directory or any other kind of file is refused rather than silently left out."""
    entries = []
    for top, dirs, files in os.walk(root, followlinks=False):
        for name in dirs:
            if os.path.islink(os.path.join(top, name)):
                raise ValueError(f"{os.path.join(top, name)}: a symlinked directory (not sent)")
        for name in files:
            full = os.path.join(top, name)
            st = os.stat(full)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{full}: not a regular file")
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            entries.append(Entry(rel, st.st_size, stat.S_IMODE(st.st_mode) & 0o777))
    if not entries:
        raise ValueError(f"{root}: no files to send")
    return sorted(entries, key=lambda e: e.path.encode())


def _room_for(files: int) -> None:
    """Every file stays open for the transfer: raise the soft descriptor limit if needed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = files + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            raise OSError(24, f"{files} files need {want} descriptors, the limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class _Files:
    """Positional I/O over a byte space kept in one open descriptor per file."""

    space: Space
    fds: list[int]
    label: str

    def read(self, offset: int, length: int) -> bytes:
        pieces = [os.pread(self.fds[i], n, foff) for i, foff, _, n in self.space.spans(offset, length)]
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _path(self, index: int) -> str:
        return os.path.join(self.label, self.space.entries[index].path)

    def _close_all(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class DirSource(_Files):
    """ChunkSource over a directory (``scan``); ``entries_blob`` goes in the manifest.
    ``only``: the files of one part (``hostagent.catalog``), each path exactly once."""

    def __init__(self, root: str, only: Optional[Iterable[str]] = None) -> None:
        entries = scan(root)
        if only is not None:
            wanted = set(only)
            entries = [e for e in entries if e.path in wanted]
            if len(entries) != len(wanted):
                raise ValueError(f"{root}: a part names a file that is not there")
        self.entries_blob = tree.encode_entries(entries)
        self.space = Space(entries)
        self.label = root
        self.fds = []
        _room_for(len(entries))
        try:
            for entry in entries:
                self.fds.append(os.open(os.path.join(root, entry.path), os.O_RDONLY | os.O_CLOEXEC))
        except BaseException:
            self._close_all()
            raise

    @property
    def size(self) -> int:
        return self.space.size

    def close(self) -> None:
        self._close_all()


def tmp_path(out: str) -> str:
    """Where a directory is assembled before it is renamed to ``out``."""
    parent, name = os.path.split(os.path.abspath(out))
    return os.path.join(parent, f".{name}{TMP_SUFFIX}")


def _own(st: os.stat_result) -> bool:
    """This user's, and nobody else may write to it (or replace what is in it)."""
    return st.st_uid == os.geteuid() and not st.st_mode & _OTHERS_WRITE


def _own_dir(path: str) -> bool:
    st = os.lstat(path)  # (a symlink is not a directory here)
    return stat.S_ISDIR(st.st_mode) and _own(st)


def own_tmp(out: str, fresh: bool = False) -> tuple[str, int, bool]:
    """The temporary directory for ``out``, as this user's own (module docstring):
    ``tmp_path(out)`` created 0700, or kept when it is already this user's own
    (emptied first when ``fresh``); anything else there is left alone with a warning and
    a fresh private directory beside it is used. Returns its path, a descriptor of it
    (opened ``O_NOFOLLOW`` and checked, so a directory swapped in between the check and
    the open is refused: ``EPERM``) and whether it is that fallback."""
    path = tmp_path(out)
    if fresh and os.path.lexists(path) and _own_dir(path):
        _rmtree(path)
    fallback = False
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not _own_dir(path):
            _warn("ignoring %s: not this user's own directory (another user's, a symlink, or writable "
                  "by others); receiving into a private directory beside it", path)
            path, fallback = _mkdtemp(prefix=os.path.basename(path) + ".", dir=os.path.dirname(path)), True
    fd = os.open(path, _NOFOLLOW_DIR)
    if not _own(os.fstat(fd)):
        os.close(fd)
        raise OSError(errno.EPERM, "temporary directory changed owner or mode while being opened", path)
    return path, fd, fallback


def read_record(path: str) -> Optional[bytes]:
    """The resume record at ``path`` when it is this user's own regular file (None when
    there is none); another user's, a symlink or anything else is ignored with a warning
    (``RecordNotOwn``), so a planted record claims nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise RecordNotOwn(path) from None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not (stat.S_ISREG(st.st_mode) and _own(st)):
            raise RecordNotOwn(path)
        return handle.read()


class RecordNotOwn(Exception):
    """A resume record this user may not trust (``read_record``)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class DirSink(_Files):
    """ChunkSink writing a model directory under ``tmp_path(out)`` (module docstring)."""

    def __init__(self, out: str, entries: list[Entry], fresh: bool = False,
                 state_path: Optional[str] = None) -> None:
        self.out = os.path.abspath(out)
        self.state_path = state_path or self.out + STATE_SUFFIX
        self.space = Space(entries)
        self.fds = []
        self._dirty: set[int] = set()
        self._lock = threading.Lock()
        _room_for(len(entries))
        # an earlier attempt's files, when kept: the resume record says what of them counts
        self.tmp, self._root, self.fallback = own_tmp(out, fresh)
        self.label = self.tmp
        try:
            for index in range(len(entries)):
                self.fds.append(self._create(index))
        except BaseException:
            self._close_all()
            os.close(self._root)
            raise
        self._records = _RecordWriter(-1, self.tmp, self.state_path, sync=self._sync)

    def _create(self, index: int) -> int:
        """Open (creating) one file below the root, never through a symlink."""
        parts = self.space.entries[index].path.split("/")
        dfd = self._root
        try:
            for part in parts[:-1]:
                try:
                    os.mkdir(part, 0o755, dir_fd=dfd)
                except FileExistsError:
                    pass
                nxt = os.open(part, _NOFOLLOW_DIR, dir_fd=dfd)
                if dfd != self._root:
                    os.close(dfd)
                dfd = nxt
            fd = os.open(parts[-1], os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         0o600, dir_fd=dfd)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self._path(index)) from None
        finally:
            if dfd != self._root:
                os.close(dfd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(21, "not a regular file", self._path(index))
        return fd

    def _mark(self, fd: int) -> None:
        if fd not in self._dirty:
            with self._lock:
                self._dirty.add(fd)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        for i, foff, roff, n in self.space.spans(offset, len(view)):
            fd = self.fds[i]
            try:
                done = os.pwrite(fd, view[roff : roff + n], foff)
                while done < n:
                    done += os.pwrite(fd, view[roff + done : roff + n], foff + done)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, self._path(i)) from None
            self._mark(fd)

    def write_many(self, offset: int, parts: list[memoryview]) -> None:
        """Consecutive pieces: one ``pwritev`` when they fall in one file (the usual case)."""
        want = sum(len(p) for p in parts)
        spans = list(self.space.spans(offset, want))
        if len(spans) != 1:
            self.write(offset, b"".join(parts))
            return
        i, foff, _, _ = spans[0]
        fd = self.fds[i]
        pwritev_all(fd, parts, foff, self._path(i))
        self._mark(fd)

    def _sync(self) -> None:
        """The writer thread: make every file written since the last record durable."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        for fd in dirty:
            os.fdatasync(fd)

    def save_state(self, state: bytes) -> None:
        if self._records.error is not None:
            raise self._records.error
        self._records.submit(state)

    @property
    def record_stats(self) -> tuple[int, float]:
        return self._records.saves, self._records.sync_s

    def finish(self, size: int) -> None:
        """Verified: trim and chmod every file, make the tree durable, rename it into place
        (atomically exchanged with an existing ``out``, which is then removed), drop the
        resume record."""
        self._records.close()
        entries = self.space.entries

        def settle(index: int) -> None:
            fd = self.fds[index]
            os.ftruncate(fd, entries[index].size)
            os.fchmod(fd, entries[index].mode)
            os.fsync(fd)

        _in_parallel(settle, range(len(entries)))
        self._prune({e.path for e in entries})
        _fsync_tree(self.tmp)
        self._close_all()
        os.close(self._root)
        self._root = -1
        _replace_dir(self.tmp, self.out)
        try:
            os.unlink(self.state_path)
        except FileNotFoundError:
            pass

    def _prune(self, wanted: set[str]) -> None:
        """Remove what an earlier attempt left that this model does not have."""
        for top, dirs, files in os.walk(self.tmp, topdown=False):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
                full = os.path.join(top, name)
                if os.path.relpath(full, self.tmp).replace(os.sep, "/") not in wanted:
                    os.unlink(full)
            if top != self.tmp and not os.listdir(top):
                os.rmdir(top)

    def close(self) -> None:
        """Write the last record handed over; the files stay for a restart to resume
        (not in a fallback directory: no restart finds it)."""
        self._records.close()
        self._close_all()
        if self._root >= 0:
            os.close(self._root)
            self._root = -1
        if self.fallback:
            _rmtree(self.tmp, ignore_errors=True)


SYNC_THREADS = 16  # fsyncs at once when a directory is made durable


def _in_parallel(work: Callable[[int], None], items: Iterable[int], threads: int = SYNC_THREADS) -> None:
    """``work(item)`` for every item, on up to ``threads`` threads; the first error is
    raised once all are done. For fsyncs: issued one after another, each waits for its
    own journal commit (40 files: 40-160 ms on a virtual disk here); issued together, the
    file system commits them in a few (~20 ms)."""
    todo = list(items)
    if len(todo) <= 1 or threads <= 1:
        for item in todo:
            work(item)
        return
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                item = todo.pop()
            try:
                work(item)
            except BaseException as exc:  # (re-raised in the caller's thread)
                with lock:
                    errors.append(exc)

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(min(threads, len(todo)))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def _fsync_tree(root: str) -> None:
    def sync(top: str) -> None:
        fd = os.open(top, _NOFOLLOW_DIR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    tops = [top for top, _, _ in os.walk(root)]
    _in_parallel(lambda i: sync(tops[i]), range(len(tops)))


def _rmtree(path: str, ignore_errors: bool = False) -> None:
    """``shutil.rmtree``, loaded when first needed: an empty directory (a verified file's
    temporary once the file is renamed out, the common case) goes by one rmdir, without
    loading shutil and its compression modules at the end of every receive (~4 ms
    before the receiver's exit)."""
    try:
        os.rmdir(path)
        return
    except OSError:
        pass  # (not empty, or not there: rmtree says which, or ignores it)
    import shutil

    shutil.rmtree(path, ignore_errors=ignore_errors)


def _replace_dir(tmp: str, out: str) -> None:
    """``tmp`` becomes ``out`` in one step: rename, or an atomic exchange with what is
    there (renameat2 RENAME_EXCHANGE), so ``out`` is always the old or the new model."""
    parent = os.path.dirname(out)
    if os.path.lexists(out):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.renameat2(-100, os.fsencode(tmp), -100, os.fsencode(out), _RENAME_EXCHANGE) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), out)
        if os.path.isdir(tmp) and not os.path.islink(tmp):
            _rmtree(tmp)
        else:
            os.unlink(tmp)
    else:
        os.rename(tmp, out)
    fd = os.open(parent, _NOFOLLOW_DIR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def merge_parts(out: str, parts: list[str]) -> None:
    """Verified parts (each a directory received on its own group) become one model
    directory at ``out`` in one step: their files are moved into ``.NAME.modelcast-tmp``
    (``own_tmp``, emptied), which then replaces ``out`` as a whole directory does. The
    catalog has already checked that no two parts name one file (``hostagent.catalog``);
    a clash is still refused."""
    tmp, fd, _ = own_tmp(out, fresh=True)
    try:
        os.fchmod(fd, 0o755)
    finally:
        os.close(fd)
    for part in parts:
        for entry in scan(part):
            dest = os.path.join(tmp, entry.path)
            if os.path.lexists(dest):
                raise FileExistsError(f"{entry.path}: in two parts")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.rename(os.path.join(part, entry.path), dest)
    _fsync_tree(tmp)
    _replace_dir(tmp, out)
    for part in parts:
        _rmtree(part)


def rename_into_place(path: str, out: str, tmp: str) -> None:
    """A verified file at ``path``, in ``tmp`` (``own_tmp``), becomes ``out`` in one step
    (``_replace_dir``); ``tmp`` is removed."""
    _replace_dir(path, out)
    _rmtree(tmp, ignore_errors=True)


class TmpFileSink(FileSink):
    """A single file received as a directory is: into this user's own temporary
    directory (``own_tmp``), renamed to ``out`` only once verified (``finish``). ``out``
    is never opened, so a transfer that fails -- or a manifest of many pages whose id
    can only be checked when its last page lands -- leaves what was there untouched."""

    def __init__(self, out: str, fresh: bool = False, state_path: Optional[str] = None) -> None:
        self.out = os.path.abspath(out)
        self.tmp, fd, self.fallback = own_tmp(out, fresh)
        os.close(fd)  # (the file is opened by name below it: nobody else may write there)
        super().__init__(os.path.join(self.tmp, os.path.basename(self.out)), state_path or self.out + STATE_SUFFIX)

    def finish(self, size: int) -> None:
        """Verified: trim, make durable, rename into place (an existing ``out`` exchanged
        and removed, as a directory's), drop the record and the temporary directory."""
        super().finish(size)
        rename_into_place(self.path, self.out, self.tmp)

    def close(self) -> None:
        super().close()
        if self.fallback:  # (no restart finds it)
            _rmtree(self.tmp, ignore_errors=True)


class PathSink:
    """``recv --out PATH``: a ``TmpFileSink`` for a file, a ``DirSink`` for a directory,
    chosen when the first manifest arrives (``begin``; the receiver writes nothing before).
    Both keep their resume record at ``PATH.modelcast-state`` when it is this user's own
    (``read_record``); otherwise in a private directory removed at the end."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.state_path = out + STATE_SUFFIX
        self.inner: Optional[TmpFileSink | DirSink] = None
        self._record: Optional[bytes] = None
        self._read = False
        self._records_dir: Optional[str] = None  # the private one, when the record at state_path is not ours

    def begin(self, manifest: Manifest) -> None:
        fresh = not self._resumes(manifest)  # an earlier attempt's files of another model: start clean
        state_path = os.path.join(self._records_dir, "record") if self._records_dir else None
        if manifest.entries:
            inner: TmpFileSink | DirSink = DirSink(self.out, tree.decode_entries(manifest.entries, manifest.file_size),
                                                   fresh, state_path)
        else:
            inner = TmpFileSink(self.out, fresh, state_path)
        self.inner = inner
        # The hot path goes straight to the real sink.
        self.write: Callable = inner.write  # type: ignore[assignment]
        self.write_many: Callable = inner.write_many  # type: ignore[assignment]
        self.read: Callable = inner.read  # type: ignore[assignment]
        self.save_state: Callable = inner.save_state  # type: ignore[assignment]
        if hasattr(inner, "read_view"):  # a file: hash chunks from one reused buffer
            self.read_view: Callable = inner.read_view

    def _resumes(self, manifest: Manifest) -> bool:
        """Whether the resume record is of this model (what the receiver resumes from)."""
        try:
            record = msgpack.unpackb(self.load_state() or b"", raw=False)
        except Exception:
            return False
        return isinstance(record, dict) and (record.get("digest"), record.get("size"), record.get("chunk")) == (
            manifest.file_digest, manifest.file_size, manifest.chunk_size)

    def save_state(self, state: bytes) -> None:
        """Before a manifest there is nothing to record (a receiver failing early)."""

    def write(self, offset: int, data: bytes | memoryview) -> None:
        raise RuntimeError("PathSink written before its manifest")

    read = write_many = write  # (replaced by the real sink's in begin)

    @property
    def is_dir(self) -> bool:
        return isinstance(self.inner, DirSink)

    def load_state(self) -> Optional[bytes]:
        """The record at ``PATH.modelcast-state`` if it is this user's own (read once)."""
        if not self._read:
            self._read = True
            try:
                self._record = read_record(self.state_path)
            except RecordNotOwn:
                _warn("ignoring resume record %s: not this user's own regular file; this run keeps its "
                      "records elsewhere and cannot be resumed", self.state_path)
                self._records_dir = _mkdtemp(prefix=f".{os.path.basename(self.out)}.modelcast-state.",
                                             dir=os.path.dirname(os.path.abspath(self.out)))
        return self._record

    @property
    def record_stats(self) -> tuple[int, float]:
        return self.inner.record_stats if self.inner is not None else (0, 0.0)

    def finish(self, size: int) -> None:
        assert self.inner is not None
        self.inner.finish(size)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
        if self._records_dir is not None:
            _rmtree(self._records_dir, ignore_errors=True)
