"""Selective distribution (``send DIR --part GLOB``, ``recv --catalog FILE --include
GLOB``): a model directory sent in parts, one controller group per part named by the
part's content id, so each part has its own tree and a link carries only the parts that
receivers below it asked for. What is verified against what is ``hostagent.catalog``;
this module runs the transfers (``hostagent.api``) and merges what arrived.

The sender sends the parts one after another, each once, each to the receivers that
joined its group by then; a part whose group has no receiver is not sent at all. So
receivers join first (their groups wait for the sender for ``--timeout`` seconds).
A receiver joins the groups of all its parts at once (one receive per part, in
threads, each into ``.OUT.part-<id>`` next to OUT, resumable like any receive), holds
each part to its id, and renames the merged directory into place only when every part
it asked for verified.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import hostagent.catalog as catalog
import hostagent.tree as tree
from .api import (
    OnEvent, ReceiveOptions, ReceiveResult, SendOptions, SendResult, TransferError, _client, _ipv4, _own_address, _send,
    receive,
)
from .control import ControllerError
from .dirs import DirSource, merge_parts, scan
from .sender import file_digests


def describe_parts(root: str, globs: list[str], chunk_size: int = SendOptions.chunk_size) -> tuple[bytes, list[catalog.Part]]:
    """A model directory published in parts: the catalog blob (its id,
    ``catalog.catalog_id``, is the model's) and each part with its own content id -- the
    id its directory session has when sent in ``chunk_size`` chunks. Reads every byte once."""
    parts = []
    for name, entries in catalog.split(scan(root), globs):
        source = DirSource(root, only=[e.path for e in entries])
        try:
            digests, whole = file_digests(source, chunk_size)
            cid = tree.content_id(source.entries_blob, source.size, chunk_size, whole, digests)
            parts.append(catalog.Part(name, cid, source.size, tuple(e.path for e in source.space.entries)))
        finally:
            source.close()
    return catalog.encode_catalog(parts), parts


@dataclass
class PartReport:
    """One part in a ``--json`` summary: which group carried it, and what it cost."""

    name: str
    content_id: str
    bytes: int
    files: int
    group: Optional[str] = None  # "ADDR:PORT"; None: not sent (no receiver asked for it)
    group_id: Optional[int] = None
    receivers: int = 0  # that verified it (sender) / 1 if this receiver did
    bytes_on_wire: int = 0  # sent (sender, incl. repairs) / received (receiver)
    ok: bool = False
    error: Optional[str] = None


@dataclass
class PartsResult:
    """What ``send --part`` / ``recv --catalog`` print with ``--json``."""

    ok: bool
    model_id: str
    bytes: int  # of the parts sent (sender) or asked for (receiver), each counted once
    bytes_on_wire: int  # sum over the parts of bytes_on_wire
    seconds: float
    parts: list[PartReport] = field(default_factory=list)
    out: Optional[str] = None  # the receiver's merged directory
    error: Optional[str] = None

    def summary(self) -> dict:
        """The JSON summary object."""
        return dataclasses.asdict(self)


def send_parts(path: str, globs: list[str], options: SendOptions, *, on_event: Optional[OnEvent] = None) -> PartsResult:
    """Send the directory ``path`` in parts (``catalog.split``), each part once, on its
    own group; the catalog (``describe_parts``) is what receivers check against the id."""
    if not options.controller:
        raise TransferError("--part needs --controller: each part travels on its own group")
    if not os.path.isdir(path) or options.lanes != 1:
        raise TransferError("--part splits a model directory (and not with --lanes)")
    emit = on_event or (lambda event: None)
    started = time.monotonic()
    blob, parts = describe_parts(path, globs, options.chunk_size)
    interface = _ipv4(options.interface)
    client = _client(options)
    src_ip = _ipv4(options.ip or _own_address(interface))
    reports = []
    for part in parts:
        report = PartReport(part.name, part.content_id, part.size, len(part.paths))
        reports.append(report)
        info = client.create_group(part.content_id, src_ip)
        wanted = sum(1 for state in (info.get("receivers") or {}).values() if state != "unreachable")
        if not wanted:
            report.ok = True  # nobody asked for it: not sending it is the right outcome
            continue
        opts = dataclasses.replace(options, model=part.content_id, receivers=wanted, receiver_ips=())
        source = DirSource(path, only=part.paths)
        try:
            result: SendResult = _send(path, opts, source, interface, emit, None)
        except (TransferError, ControllerError) as exc:  # this part failed; the others still go
            report.error = str(exc)
            continue
        finally:
            source.close()
        report.group, report.group_id = result.group, result.group_id
        report.receivers = sum(1 for r in result.receivers if r.ok)
        report.bytes_on_wire, report.ok, report.error = result.bytes_sent, result.ok, result.error
    failed = [r for r in reports if not r.ok]
    return PartsResult(
        ok=not failed, model_id=catalog.catalog_id(blob), bytes=sum(r.bytes for r in reports if r.group),
        bytes_on_wire=sum(r.bytes_on_wire for r in reports), seconds=time.monotonic() - started, parts=reports,
        error=f"part {failed[0].name!r}: {failed[0].error}" if failed else None)


def receive_parts(out: str, catalog_blob: bytes, includes: list[str], options: ReceiveOptions, *,
                  on_event: Optional[OnEvent] = None) -> PartsResult:
    """Check the catalog against ``options.expect`` (the model id), receive the parts
    ``includes`` names (all parts: none given), each held to its own id on its own group,
    and rename them merged into ``out`` once all verified."""
    if not options.expect or not options.controller:
        raise TransferError("--catalog needs --expect MODEL_ID and --controller")
    if options.on_complete or options.lanes != 1 or options.metrics_port is not None:
        raise TransferError("--catalog does not take --on-complete, --lanes or --metrics-port yet")
    started = time.monotonic()
    try:
        parts = catalog.select(catalog.decode_catalog(catalog_blob, tree.parse_content_id(options.expect)), includes)
    except ValueError as exc:
        raise TransferError(str(exc)) from None
    out = os.path.abspath(out)
    # Named by the part's id: a restarted receiver finds each part's resume record again,
    # whatever else it now asks for.
    staging = [os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.part-{_short(p.content_id)}")
               for p in parts]
    results: list[Optional[ReceiveResult]] = [None] * len(parts)
    errors: list[Optional[str]] = [None] * len(parts)
    emit = _locked(on_event)

    def one(i: int) -> None:
        opts = dataclasses.replace(options, expect=parts[i].content_id, model=None)
        try:
            results[i] = receive(staging[i], opts, on_event=emit)
        except Exception as exc:  # reported per part; the others keep going
            errors[i] = str(exc) or type(exc).__name__

    threads = [threading.Thread(target=one, args=(i,), name=f"part{i}") for i in range(len(parts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reports = []
    for part, result, error, where in zip(parts, results, errors, staging):
        report = PartReport(part.name, part.content_id, part.size, len(part.paths))
        if result is not None:
            report.group, report.bytes_on_wire = result.group, result.bytes_received
            error = result.error if not result.ok else None
            if error is None:
                try:
                    catalog.check_received(part, result.content_id, scan(where))
                except catalog.PartMismatch as exc:
                    error = str(exc)
        report.ok, report.error, report.receivers = error is None, error, int(error is None)
        reports.append(report)
    failed = [r for r in reports if not r.ok]
    if not failed:
        merge_parts(out, staging)
    return PartsResult(
        ok=not failed, model_id=options.expect, bytes=sum(p.size for p in parts),
        bytes_on_wire=sum(r.bytes_on_wire for r in reports), seconds=time.monotonic() - started, parts=reports,
        out=out if not failed else None, error=f"part {failed[0].name!r}: {failed[0].error}" if failed else None)


def _short(content_id: str) -> str:
    return content_id[len(tree.ID_PREFIX):][:16]


def _locked(on_event: Optional[OnEvent]) -> OnEvent:
    """One callback for several receive threads: called by one at a time."""
    lock = threading.Lock()

    def emit(event: object) -> None:
        if on_event is not None:
            with lock:
                on_event(event)  # type: ignore[arg-type]

    return emit
