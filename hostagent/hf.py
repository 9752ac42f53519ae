"""Hugging Face names and the Hugging Face cache layout (``modelcast serve hf://ORG/NAME``,
``modelcast fetch hf://ORG/NAME[@REVISION]``; docs/ml-stack.md).

A model in the cache is ``<cache>/models--ORG--NAME/`` holding ``blobs/<name>`` (the
files' contents, named as the hub names them: the sha256 of an LFS file, the git blob
sha1 of a small one), ``snapshots/<commit>/<path>`` (relative symlinks into ``blobs``)
and ``refs/<branch>`` (the commit the branch points at). Loaders (transformers, vLLM,
``snapshot_download(..., local_files_only=True)``) read that layout and nothing else.

Serving resolves a name offline with ``huggingface_hub``'s cache API (``scan_cache_dir``)
to a snapshot and serves that directory as any other (its symlinks are followed), under
its content id; the offer also carries the name, the commit, the branches pointing at it
and which files are LFS (their blobs named by sha256). Fetching asks the controller for
the offers of a name and revision, receives the snapshot's files -- verified against the
content id as any fetch -- into a staging directory inside the repository's folder, then
installs them: blobs first (each named from its own bytes, so a name always matches its
content), the snapshot built under a temporary name and renamed into ``snapshots/``, the
ref written last. A fetch that dies at any point leaves no snapshot and no ref a loader
would follow (at most blobs nothing links to, which loaders ignore), and the next fetch
resumes from the staging directory's record.

``huggingface_hub`` is needed only to serve (it is imported when a name is resolved);
fetching writes the layout with the standard library (``hostagent.hffetch`` runs it).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from .api import TransferError
from .dirs import _replace_dir

__all__ = ["HF_SCHEME", "HfRef", "LocalSnapshot", "blob_name", "find_snapshot", "hub_cache",
           "install_snapshot", "is_hf", "parse_hf", "pick_offer", "repo_folder", "resolve_local",
           "write_ref"]

HF_SCHEME = "hf://"
DEFAULT_REVISION = "main"  # the hub's default branch: what a name without @REVISION means
INCOMING = ".modelcast-incoming"  # inside a repository's folder: staging, the temporary snapshot, the lock
_NAME_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO = re.compile(rf"^(?:{_NAME_PART}/)?{_NAME_PART}$")
_REVISION = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_REVISION = 256
_READ = 1 << 20


@dataclass(frozen=True)
class HfRef:
    """``hf://REPO[@REVISION]``: a repository id (``org/name`` or ``name``) and a branch,
    tag or commit (None: the default branch)."""

    repo: str
    revision: Optional[str] = None

    @property
    def wanted(self) -> str:
        return self.revision or DEFAULT_REVISION

    def __str__(self) -> str:
        return HF_SCHEME + self.repo + (f"@{self.revision}" if self.revision else "")


def is_hf(text: str) -> bool:
    return text.startswith(HF_SCHEME)


def parse_hf(text: str) -> HfRef:
    """``hf://ORG/NAME[@REVISION]`` -> HfRef; ValueError naming what is wrong. Names follow
    the hub's rules (letters, digits, ``._-``; no ``--`` or ``..``); a revision may hold
    ``/`` (``refs/pr/1``) but no empty or dot-dot part, since it becomes a path under
    ``refs/``."""
    if not is_hf(text):
        raise ValueError(f"{text!r:.80} is not an {HF_SCHEME}ORG/NAME[@REVISION] name")
    body = text[len(HF_SCHEME):]
    repo, at, revision = body.partition("@")
    if not _REPO.match(repo) or "--" in repo or ".." in repo:
        raise ValueError(f"{repo!r:.120} is not a Hugging Face model id (ORG/NAME or NAME: letters, digits, "
                         "'.', '_', '-', no '--' or '..')")
    if at and not valid_revision(revision):
        raise ValueError(f"{revision!r:.120} is not a revision (a branch, tag or commit)")
    return HfRef(repo, revision if at else None)


def valid_revision(revision: str) -> bool:
    return (0 < len(revision) <= MAX_REVISION and bool(_REVISION.match(revision))
            and not any(part in ("", ".", "..") for part in revision.split("/")))


def is_commit(revision: str) -> bool:
    return bool(_COMMIT.match(revision))


def hub_cache(explicit: Optional[str] = None, env: Optional[dict[str, str]] = None) -> str:
    """The Hugging Face cache directory as huggingface_hub finds it: ``explicit``
    (``--hf-cache``), else ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``."""
    env = os.environ if env is None else env
    if explicit:
        return os.path.expanduser(explicit)
    if env.get("HF_HUB_CACHE"):
        return os.path.expanduser(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return os.path.join(os.path.expanduser(env["HF_HOME"]), "hub")
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "huggingface", "hub")


def repo_folder(cache: str, repo: str) -> str:
    """``<cache>/models--ORG--NAME`` (huggingface_hub's ``repo_folder_name``)."""
    return os.path.join(cache, "--".join(["models", *repo.split("/")]))


# ----------------------------------------------------------------------------- serving


@dataclass(frozen=True)
class LocalSnapshot:
    """A snapshot found in the local cache: what ``serve`` offers."""

    repo: str
    commit: str
    refs: tuple[str, ...]  # the branches and tags pointing at it
    path: str  # snapshots/<commit>
    lfs: tuple[str, ...]  # files whose blob is named by its sha256 (the others: git blob sha1)

    def offer_hf(self) -> dict[str, Any]:
        """The offer's ``hf`` object (the controller's OfferCreate schema)."""
        return {"commit": self.commit, "refs": sorted(self.refs), "lfs": sorted(self.lfs)}


def resolve_local(ref: HfRef, cache: str) -> LocalSnapshot:
    """``ref`` in the cache at ``cache``, resolved offline with huggingface_hub's cache
    API: a commit names its snapshot, a branch or tag the snapshot its ref points at.
    TransferError saying what is missing (with the cache's own warnings about it)."""
    try:
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound
    except ImportError:
        raise TransferError("serving hf:// names needs huggingface_hub (pip install huggingface-hub)") from None
    try:
        info = scan_cache_dir(cache)
    except (CacheNotFound, ValueError) as exc:
        raise TransferError(f"no Hugging Face cache at {cache}: {exc}") from None
    repos = [r for r in info.repos if r.repo_type == "model" and r.repo_id == ref.repo]
    if not repos:
        folder = repo_folder(cache, ref.repo)
        why = [str(w) for w in info.warnings if folder in str(w)]
        raise TransferError(f"{ref.repo} is not in the Hugging Face cache {cache}"
                            + (f": {why[0]}" if why else " (give --hf-cache or set HF_HUB_CACHE / HF_HOME)"))
    wanted = ref.wanted
    for rev in repos[0].revisions:
        if rev.commit_hash == wanted or wanted in rev.refs:
            root = str(rev.snapshot_path)
            lfs = tuple(sorted(os.path.relpath(str(f.file_path), root).replace(os.sep, "/")
                               for f in rev.files if _SHA256.match(f.blob_path.name)))
            return LocalSnapshot(ref.repo, rev.commit_hash, tuple(sorted(rev.refs)), root, lfs)
    held = sorted(f"{r.commit_hash[:12]} ({', '.join(sorted(r.refs)) or 'no ref'})" for r in repos[0].revisions)
    raise TransferError(f"{ref} is not in the Hugging Face cache {cache}: it holds {', '.join(held) or 'no snapshot'}")


# ----------------------------------------------------------------------------- fetching


def pick_offer(offers: Iterable[Any], ref: HfRef) -> Optional[dict]:
    """The offer to fetch ``ref`` from (pure): among the offers of its name whose commit is
    the revision or whose refs hold it, the content offered by the most servers (a branch
    two servers hold at different commits: the commit more of them hold), then the
    earliest offered. Its ``model`` is the content id every source of it serves."""
    wanted = ref.wanted
    usable = [o for o in offers if isinstance(o, dict) and o.get("name") == ref.repo and isinstance(o.get("hf"), dict)
              and isinstance(o.get("model"), str) and _matches(o["hf"], wanted)]
    if not usable:
        return None
    sources = Counter(o["model"] for o in usable)
    first: dict[str, int] = {}
    for o in usable:
        oid = o.get("id") if isinstance(o.get("id"), int) else 1 << 62
        first[o["model"]] = min(first.get(o["model"], oid), oid)
    model = min(sources, key=lambda m: (-sources[m], first[m], m))
    return min((o for o in usable if o["model"] == model),
               key=lambda o: o.get("id") if isinstance(o.get("id"), int) else 1 << 62)


def _matches(hf: dict, revision: str) -> bool:
    refs = hf.get("refs")
    return hf.get("commit") == revision or (isinstance(refs, list) and revision in refs)


def blob_name(path: str, lfs: bool) -> str:
    """The name the hub gives the blob of the file at ``path``: the sha256 of its bytes for
    an LFS file, else git's blob sha1 (``git hash-object``: sha1 of ``blob <size>\\0``
    and the bytes)."""
    with open(path, "rb") as f:
        if lfs:
            h = hashlib.sha256()
        else:
            h = hashlib.sha1(usedforsecurity=False)
            h.update(b"blob %d\0" % os.fstat(f.fileno()).st_size)
        while block := f.read(_READ):
            h.update(block)
    return h.hexdigest()


def _files(root: str) -> list[str]:
    """Every regular file under ``root``, relative, '/'-separated, sorted."""
    out = []
    for top, _, names in os.walk(root):
        for name in names:
            out.append(os.path.relpath(os.path.join(top, name), root).replace(os.sep, "/"))
    return sorted(out)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare_repo(folder: str) -> None:
    """The repository's folder with ``blobs``, ``refs``, ``snapshots`` (an empty one is a
    repository with no revision to the cache's scan, not a corrupted one) and staging."""
    for sub in ("blobs", "refs", "snapshots", INCOMING):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)


def install_snapshot(folder: str, commit: str, staged: str, lfs: Iterable[str],
                     step: Callable[[str], None] = lambda what: None) -> str:
    """Move the verified files of ``staged`` into ``folder``'s cache layout: each into
    ``blobs/<its hub name>``, then ``snapshots/<commit>`` built beside it under a
    temporary name (relative symlinks at the same depth) and renamed into place in one
    step (exchanged with an older snapshot of that commit). ``staged`` is emptied.
    ``step`` is called before each stage (tests kill the install there). Returns the
    snapshot's path."""
    if not is_commit(commit):
        raise ValueError(f"{commit!r:.60} is not a commit hash")
    lfs = set(lfs)
    blobs, snapshots = os.path.join(folder, "blobs"), os.path.join(folder, "snapshots")
    names: dict[str, str] = {}
    files = _files(staged)
    if not files:
        raise ValueError(f"{staged}: no files to install")
    for rel in files:
        src = os.path.join(staged, *rel.split("/"))
        names[rel] = blob_name(src, rel in lfs)
    step("blobs")
    for rel, name in names.items():
        os.replace(os.path.join(staged, *rel.split("/")), os.path.join(blobs, name))
    _fsync_dir(blobs)
    step("snapshot")
    tmp = os.path.join(folder, INCOMING, f"{commit}.snapshot")
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    os.mkdir(tmp)
    for rel, name in names.items():
        link = os.path.join(tmp, *rel.split("/"))
        os.makedirs(os.path.dirname(link), exist_ok=True)
        # relative to the link's directory, as huggingface_hub makes them; tmp is as deep
        # below the repository's folder as snapshots/<commit>, so it holds after the rename
        os.symlink(os.path.relpath(os.path.join(blobs, name), os.path.dirname(link)), link)
    for top, _, _ in os.walk(tmp):
        _fsync_dir(top)
    step("rename")
    _replace_dir(tmp, os.path.join(snapshots, commit))
    shutil.rmtree(staged, ignore_errors=True)
    return os.path.join(snapshots, commit)


def write_ref(folder: str, revision: str, commit: str) -> None:
    """``refs/<revision>`` holds ``commit`` (no newline, as the hub writes it), replaced in
    one step."""
    if not valid_revision(revision) or is_commit(revision):
        raise ValueError(f"{revision!r:.60} is not a branch or tag name")
    path = os.path.join(folder, "refs", *revision.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(commit)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def find_snapshot(folder: str, commit: str, files: int, size: int) -> Optional[str]:
    """The snapshot of ``commit`` already in the cache if it is whole: ``files`` files
    (every link resolving) of ``size`` bytes in all, as the offer says; else None."""
    path = os.path.join(folder, "snapshots", commit)
    if not os.path.isdir(path):
        return None
    have = _files(path)
    try:
        total = sum(os.stat(os.path.join(path, *rel.split("/"))).st_size for rel in have)
    except OSError:  # a link whose blob is gone
        return None
    return path if len(have) == files and total == size else None
