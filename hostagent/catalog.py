"""A model split into parts, each verifiable against the model's id (pure: no I/O).

Selective distribution (issue 13 part 3) sends each part of a model -- a tensor-parallel
rank's shards, an MoE expert's files -- as its own directory session, so each part can
travel on its own group and tree. A part is an ordinary model directory: its content id
is ``hostagent.tree``'s id of its manifest (entries, size, chunk size, every chunk
digest), and a receiver holding that id already refuses any manifest that does not hash
to it (``recv --expect PART_ID``).

What ties the parts to one model is the catalog: a canonical msgpack list of the parts,
each ``[name, part content id, size, [paths]]``, sorted by name. The model's id is
``blake3:<hex>`` of the catalog (under its own context, so a catalog id is never a
manifest id). A receiver that knows the model id:

1. checks the catalog against it (``decode_catalog``: constant-time compare first, then
   every rule below), so every part id it then trusts was published with the model;
2. picks the parts its ``--include`` globs name (``select``);
3. holds each part's manifest to that part's id, and checks that the manifest's entry
   list is exactly the part's paths and size (``check_received``), so the parts merge into
   one directory without one part overwriting another's file.

``decode_catalog`` refuses: a blob that does not hash to the expected id, anything but
the exact shape, duplicate or unsorted part names, a malformed part id, a path the entry
list rules refuse (``tree.check_entries``: absolute, ``..``, NUL, ...), a file named by
two parts, a file that is another's directory across parts, an empty part, a size
outside ``[0, 2**63)``, more than ``MAX_PARTS`` parts or ``tree.MAX_ENTRIES`` files.

A single file and an unsplit directory keep their manifest id; the catalog id exists only
for a model published in parts.
"""

from __future__ import annotations

import fnmatch
import hmac
from dataclasses import dataclass
from typing import Iterable, Optional

import blake3
import msgpack

import hostagent.tree as tree
from .tree import Entry, UnsafeEntries

MAX_PARTS = 1024
MAX_CATALOG_BYTES = 1 << 20
MAX_NAME_BYTES = 255
_CATALOG_CONTEXT = b"modelcast catalog v1"


class BadCatalog(ValueError):
    """A catalog a receiver refuses (``reason`` labels the drop counter)."""

    reason = "bad_catalog"


class PartMismatch(ValueError):
    """A part's manifest that is not the part the catalog lists."""

    reason = "wrong_part"


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a model: its name (the sender's ``--part`` glob, or a file's path),
    content id (``blake3:<hex>`` of its manifest), byte count and files."""

    name: str
    content_id: str
    size: int
    paths: tuple[str, ...]


def split(entries: list[Entry], globs: list[str]) -> list[tuple[str, list[Entry]]]:
    """The sender's partition of a directory: one part per glob (``fnmatch`` on the
    relative path; a file goes to the first glob it matches), and one part per file no
    glob matches, named by its path. A glob that matches nothing is an error (a typo
    would otherwise silently send a model without that part)."""
    if len(set(globs)) != len(globs):
        raise ValueError("a --part glob is given twice")
    groups: dict[str, list[Entry]] = {g: [] for g in globs}
    for entry in entries:
        owner = next((g for g in globs if fnmatch.fnmatchcase(entry.path, g)), None)
        if owner is None:
            if entry.path in groups:
                raise ValueError(f"{entry.path!r} is both a file and a --part glob")
            groups[entry.path] = [entry]
        else:
            groups[owner].append(entry)
    empty = [g for g in globs if not groups[g]]
    if empty:
        raise ValueError(f"--part {empty[0]!r} matches no file")
    return sorted(groups.items(), key=lambda item: item[0].encode())


def encode_catalog(parts: list[Part]) -> bytes:
    """The canonical catalog blob (parts sorted by name); checked as a receiver would."""
    ordered = sorted(parts, key=lambda p: p.name.encode())
    blob = msgpack.packb([_CATALOG_CONTEXT, [[p.name, p.content_id, p.size, list(p.paths)] for p in ordered]],
                         use_bin_type=True)
    _check(ordered)
    if len(blob) > MAX_CATALOG_BYTES:
        raise ValueError(f"catalog of {len(blob)} bytes: at most {MAX_CATALOG_BYTES}")
    return blob


def catalog_id(blob: bytes) -> str:
    """The model's id: ``blake3:<hex>`` of its catalog."""
    return tree.ID_PREFIX + blake3.blake3(blob).hexdigest()


def decode_catalog(blob: bytes, expected: Optional[bytes]) -> list[Part]:
    """The parts of a catalog, checked (``BadCatalog``); ``expected``: the 32 digest bytes
    of the model id (``tree.parse_content_id``), None only where the catalog's source is
    trusted (the sender printing its own)."""
    if len(blob) > MAX_CATALOG_BYTES:
        raise BadCatalog("catalog too large")
    if expected is not None and not hmac.compare_digest(blake3.blake3(blob).digest(), expected):
        raise BadCatalog("catalog does not hash to the model id")
    try:
        raw = msgpack.unpackb(blob, raw=False, strict_map_key=True, use_list=True)
    except Exception:
        raise BadCatalog("catalog is not msgpack") from None
    if type(raw) is not list or len(raw) != 2 or raw[0] != _CATALOG_CONTEXT or type(raw[1]) is not list:
        raise BadCatalog("catalog shape")
    if not 1 <= len(raw[1]) <= MAX_PARTS:
        raise BadCatalog(f"catalog must list 1..{MAX_PARTS} parts")
    parts = []
    for item in raw[1]:
        if type(item) is not list or len(item) != 4:
            raise BadCatalog("part shape")
        name, cid, size, paths = item
        if (type(name) is not str or type(cid) is not str or type(size) is not int or type(paths) is not list
                or not all(type(p) is str for p in paths)):
            raise BadCatalog("part field types")
        parts.append(Part(name, cid, size, tuple(paths)))
    _check(parts)
    # Canonical form only: the same parts encode to one blob, so one model has one id.
    if encode_catalog(parts) != blob:
        raise BadCatalog("catalog not in canonical form")
    return parts


def _check(parts: list[Part]) -> None:
    """Every rule of the module docstring but the id; ``parts`` in canonical order."""
    previous: Optional[bytes] = None
    owner: dict[str, str] = {}
    for part in parts:
        key = part.name.encode("utf-8", "replace")
        if not part.name or len(key) > MAX_NAME_BYTES or "\0" in part.name:
            raise BadCatalog(f"part name {part.name[:64]!r}")
        if previous is not None and key <= previous:
            raise BadCatalog("parts not sorted or duplicated")
        previous = key
        try:
            tree.parse_content_id(part.content_id)
        except ValueError:
            raise BadCatalog(f"part {part.name[:64]!r}: malformed content id") from None
        if not 0 <= part.size < 1 << 63 or not part.paths:
            raise BadCatalog(f"part {part.name[:64]!r}: size or no files")
        if list(part.paths) != sorted(part.paths, key=str.encode):
            raise BadCatalog(f"part {part.name[:64]!r}: paths not sorted")
        for path in part.paths:
            if path in owner:
                raise BadCatalog(f"{path[:64]!r} is in two parts")
            owner[path] = part.name
    if len(owner) > tree.MAX_ENTRIES:
        raise BadCatalog(f"more than {tree.MAX_ENTRIES} files")
    try:  # all parts' files merge into one directory: the entry-list rules hold for the union
        tree.check_entries([Entry(p, 0) for p in sorted(owner, key=str.encode)])
    except UnsafeEntries as exc:
        raise BadCatalog(str(exc)) from None


def select(parts: list[Part], includes: Iterable[str]) -> list[Part]:
    """The parts a receiver's ``--include`` globs name: a part is included whole when a
    glob matches its name or any of its files (a part is verified as one manifest, so
    it cannot arrive in pieces). No globs: every part. A glob that names nothing is an
    error, so a typo does not pass as "received everything asked for"."""
    globs = list(includes)
    if not globs:
        return list(parts)
    chosen = []
    used: set[str] = set()
    for part in parts:
        hits = {g for g in globs if fnmatch.fnmatchcase(part.name, g)
                or any(fnmatch.fnmatchcase(p, g) for p in part.paths)}
        if hits:
            chosen.append(part)
            used |= hits
    missing = [g for g in globs if g not in used]
    if missing:
        raise ValueError(f"--include {missing[0]!r} names no part of the model")
    return chosen


def check_received(part: Part, content_id: Optional[str], entries: list[Entry]) -> None:
    """What arrived for a part is the part the catalog lists: it was received against the
    part's id (``content_id``: the id of the manifest the receiver verified), and its
    files are exactly the part's paths, adding up to its size (``PartMismatch``)."""
    if content_id is None or not hmac.compare_digest(tree.parse_content_id(content_id),
                                                     tree.parse_content_id(part.content_id)):
        raise PartMismatch(f"part {part.name!r}: not received against the part's id")
    if tuple(e.path for e in entries) != part.paths or sum(e.size for e in entries) != part.size:
        raise PartMismatch(f"part {part.name!r}: the files received are not the part's files in the catalog")
