"""One transfer over several lanes (``--lanes K``): several cores for one file.

A Python sender or receiver is bound by one core well below a fast NIC's rate. With K
lanes the file is cut into K chunk-aligned slices, and each slice is sent and received
as its own session -- its own sender process, socket and group port (``PORT + i``), its
own receiver process writing into the slice of the one output file -- so the K lanes
run on K cores. Every lane's manifest names the whole file (its whole-file digest) and
says which lane it is and where its slice starts (``wire.Manifest.lane``), so a receiver
lane never takes another lane's data. The result is one file, verified when every lane
verified its slice, and one summary: counters summed over the lanes, times the slowest
lane's. A lane that fails fails the transfer at once (the other lanes are stopped) with
the lane named in the error.

The transfer has the content id the file has sent whole (``hostagent.tree``): every lane's
manifest pages carry the whole file's size and digests root (``wire.Manifest.id_root``),
so each receiver lane refuses a wrong ``--expect`` at its first page, before it writes;
the lanes write into the file's temporary beside OUT, and the whole file becomes OUT --
renamed, never copied -- only once the lanes' digests, put together, hash to that id
(``whole_id``).

Lanes are processes forked from the caller (no second interpreter start); each reports
its events, progress and result back over one queue. Only with a ``group`` (ADDR:PORT)
for now: with a controller every lane would need a port of its own in the group.
"""

from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing
import os
import queue as queues
import signal
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

from .events import TransferFinished
from .net import STATE_SUFFIX, parse_group
from .tree import content_id, digests_root
from .wire import CHUNK_DIGEST_LEN, MAX_LANES

R = TypeVar("R")
Emit = Callable[[object], None]
_WAIT = 0.05  # seconds between checks for lanes that died without a word
_LAST_WORDS = 0.5  # a lane's process gone this long without its result: it died
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class LaneError(Exception):
    """A lane could not run (bad lane options, a lane that raised or died): one line."""


@dataclass(frozen=True)
class Lane:
    """Lane ``index`` of ``count``: ``length`` bytes of the file from ``offset``, with
    the whole file's chunk digests cut to them (and its whole-file digest, the name), and
    the whole file's (size, digests root) its pages carry for the content id."""

    index: int
    count: int
    offset: int
    length: int
    digests: tuple[bytes, bytes]
    whole: tuple[int, bytes]


def plan(size: int, chunk_size: int, count: int, digests: tuple[bytes, bytes]) -> list[Lane]:
    """The lanes of a file: whole chunks each, as even as chunks allow (a file of fewer
    chunks than lanes leaves the last lanes empty, which the protocol carries)."""
    chunk_digests, file_digest = digests
    chunks = -(-size // chunk_size)
    per = -(-chunks // count)
    whole = (size, digests_root(chunk_digests))
    lanes = []
    for index in range(count):
        first, last = min(chunks, index * per), min(chunks, (index + 1) * per)
        offset, end = min(size, first * chunk_size), min(size, last * chunk_size)
        cut = chunk_digests[first * CHUNK_DIGEST_LEN : last * CHUNK_DIGEST_LEN]
        lanes.append(Lane(index, count, offset, end - offset, (cut, file_digest), whole))
    return lanes


def whole_id(size: int, chunk_size: int, file_digest: bytes, lane_digests: list[bytes]) -> str:
    """The content id of the file the lanes received: its size, chunk size and digest with
    every lane's chunk digests (as each lane's manifest pages brought them) in lane order
    -- the id the file has sent without lanes."""
    return content_id(b"", size, chunk_size, file_digest, b"".join(lane_digests))


def lane_group(group: str, index: int) -> str:
    """Lane ``index``'s ADDR:PORT: the group's port plus the lane index."""
    addr, port = parse_group(group)
    if port + index > 65535:
        raise LaneError(f"lane {index} would need port {port + index}: use a lower group port")
    return f"{addr}:{port + index}"


def state_path(out: str, index: int) -> str:
    """Lane ``index``'s resume record beside OUT."""
    return f"{out}{STATE_SUFFIX}.lane{index}"


def check(count: int, group: Optional[str], controller: Optional[str]) -> None:
    """Refuse lane options that cannot work, before anything starts."""
    if not 1 <= count <= MAX_LANES:
        raise LaneError(f"lanes must be 1..{MAX_LANES}, got {count}")
    if controller:
        raise LaneError("lanes need a group ADDR:PORT (not yet with a controller)")
    for index in range(count):
        lane_group(group or "", index)


# ----------------------------------------------------------------------------- merging


def _summed(results: list[Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: sum(getattr(r, name) for r in results) for name in names}


def _counted(dicts: Any) -> dict[str, int]:
    total: Counter = Counter()
    for d in dicts:
        total.update(d)
    return dict(total)


def _slowest_lane(times: Any) -> list[float]:
    """Each receiver's completion over the lanes: the k-th to finish in every lane
    paired up, its slowest lane's time."""
    lists = [sorted(t) for t in times]
    return [max(ts) for ts in zip(*lists)] if lists else []


def merge_send(by_lane: dict[int, Any], failed: Optional[int], count: int, size: int, group: str, elapsed: float,
               cpu_s: float) -> Any:
    """One ``SendResult`` for the transfer (lanes stopped after ``failed`` are missing
    from ``by_lane``): a receiver host is ok when all its lanes are; counters summed."""
    results = list(by_lane.values())
    by_host: dict[str, list[Any]] = {}
    for result in results:
        for report in result.receivers:
            by_host.setdefault(report.addr, []).append(report)
    receivers = []
    for addr, reports in sorted(by_host.items()):
        ok = failed is None and len(reports) == len(results) and all(r.ok for r in reports)
        error = None if ok else next((r.error for r in reports if r.error), "stopped: another lane failed")
        receivers.append(dataclasses.replace(reports[0], ok=ok, error=error, loss=max(r.loss for r in reports)))
    lowest = [r.lowest_rate_mbit for r in results if r.lowest_rate_mbit is not None]
    streams = [r.stream_s for r in results if r.stream_s is not None]
    finished = TransferFinished(failed is None, tuple(int(r.id, 16) for r in receivers if r.ok),
                                tuple(int(r.id, 16) for r in receivers if not r.ok),
                                max(r.finished.missing for r in results))
    return dataclasses.replace(
        results[0], ok=failed is None, bytes=size, group=group, seconds=round(elapsed, 3),
        goodput_mbit=round(size * 8 / elapsed / 1e6, 1) if elapsed > 0 else 0.0,
        lowest_rate_mbit=min(lowest) if lowest else None, loss_verdicts=_counted(r.loss_verdicts for r in results),
        receivers=receivers, stream_s=max(streams) if streams else None,
        completed_s=_slowest_lane(r.completed_s for r in results), never_seen=finished.missing,
        authenticated=all(r.authenticated for r in results), gso=all(r.gso for r in results),
        dropped=_counted(r.dropped for r in results), peak_rss_mb=max(r.peak_rss_mb for r in results),
        cpu_s=round(sum(r.cpu_s for r in results) + cpu_s, 3), finished=finished, lanes=count,
        error=None if failed is None else f"lane {failed}: {by_lane[failed].error}",
        **_summed(results, ("datagrams_sent", "bytes_sent", "repair_bytes", "repair_bytes_unicast",
                            "repair_bytes_multicast", "nacks", "rate_decreases", "repairs_parity", "repairs_unicast",
                            "repairs_multicast", "gso_datagrams", "send_buffer_drops", "final_rate_mbit")))


def merge_receive(by_lane: dict[int, Any], error: Optional[str], count: int, size: int, group: str,
                  elapsed: float, cpu_s: float) -> Any:
    """One ``ReceiveResult`` for the transfer (``error``: why it is not verified)."""
    results = list(by_lane.values())
    verify = [r.verify_s for r in results if r.verify_s is not None]
    return dataclasses.replace(
        results[0], ok=error is None, digest_ok=error is None, bytes=size, error=error, group=group,
        file_digest=results[0].file_digest if error is None else None, seconds=round(elapsed, 3),
        goodput_mbit=round(size * 8 / max(verify) / 1e6, 1) if error is None and verify and max(verify) > 0 else 0.0,
        verify_s=max(verify) if error is None and verify else None, gro=all(r.gro for r in results),
        dropped=_counted(r.dropped for r in results), peak_rss_mb=max(r.peak_rss_mb for r in results),
        cpu_s=round(sum(r.cpu_s for r in results) + cpu_s, 3), lanes=count,
        **_summed(results, ("datagrams_received", "bytes_received", "nacks", "repairs_received", "duplicates",
                            "resumed_chunks", "nacks_suppressed", "parity_received", "fec_recovered", "nack_seqs",
                            "gro_batches", "coalesced", "early_held")))


def merge_progress(on_progress: Optional[Callable[[Any], None]]) -> Optional[Callable[[dict[int, Any]], None]]:
    """The callers' progress callback fed the lanes' latest progress, summed (the
    verified count: the lane that is furthest behind)."""
    if on_progress is None:
        return None

    def merged(latest: dict[int, Any]) -> None:
        parts = list(latest.values())
        values = {f.name: (min if f.name == "verified" else max if f.name == "expected" else sum)(
            getattr(p, f.name) for p in parts) for f in dataclasses.fields(parts[0])}
        on_progress(dataclasses.replace(parts[0], **values))

    return merged


# ----------------------------------------------------------------------------- processes


def run(lanes: list[Any], one: Callable[[Any, Emit, Optional[Callable[[Any], None]]], R], emit: Emit,
        progress: Optional[Callable[[dict[int, Any]], None]], ok: Callable[[R], bool]) -> tuple[dict[int, R], Optional[int]]:
    """``one(lane, emit, progress)`` for every lane, each in a forked process; their
    events reach ``emit`` and their progress ``progress`` here, in this process. Returns
    the lanes' results and the lane that failed (None: none did; ``ok`` judges). A lane
    that fails stops the others (missing from the results); one that raises or dies is
    a LaneError naming it."""
    ctx = multiprocessing.get_context("fork")
    channel = ctx.Queue()
    procs = {}
    for index, lane in enumerate(lanes):
        procs[index] = ctx.Process(target=_child, args=(index, lane, one, channel, progress is not None, os.getpid()),
                                   name=f"modelcast-lane{index}", daemon=True)
        procs[index].start()
    results: dict[int, R] = {}
    latest: dict[int, Any] = {}
    failure: Optional[str] = None
    dead_since: dict[int, float] = {}  # lanes gone without a result; their last words may be on the way
    try:
        while len(results) < len(lanes) and failure is None:
            now = time.monotonic()
            for i, proc in procs.items():
                if i not in results and not proc.is_alive() and now - dead_since.setdefault(i, now) > _LAST_WORDS:
                    failure = f"lane {i} died (exit status {proc.exitcode})"
            try:
                kind, index, value = channel.get(timeout=_WAIT)
            except queues.Empty:
                continue
            if kind == "event":
                emit(value)
            elif kind == "progress" and progress is not None:
                latest[index] = value
                progress(latest)
            elif kind == "error":
                failure = f"lane {index}: {value}"
            else:
                results[index] = value
                if not ok(value):
                    break  # a failed lane fails the transfer: stop the others now
    finally:
        for index, proc in procs.items():
            if proc.is_alive() and index not in results:
                proc.terminate()
        for proc in procs.values():
            proc.join(5)
    if failure is not None:
        raise LaneError(failure)
    return results, next((i for i, r in sorted(results.items()) if not ok(r)), None)


def _die_with_parent(parent: int) -> None:
    """A lane whose command is killed (SIGKILL: no cleanup ran) must not run on alone:
    the kernel sends it SIGTERM when its parent goes (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it went before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def _child(index: int, lane: Any, one: Callable[..., Any], channel: Any, want_progress: bool, parent: int) -> None:
    """A lane's process: run it, report everything over ``channel``."""
    try:  # named for ps/top (and the tests): modelcast-lane0, -lane1...
        with open("/proc/self/comm", "w") as comm:
            comm.write(f"modelcast-lane{index}"[:15])
    except OSError:
        pass
    _die_with_parent(parent)

    def emit(event: object) -> None:
        channel.put(("event", index, event))

    def progress(value: object) -> None:
        channel.put(("progress", index, value))

    try:
        channel.put(("done", index, one(lane, emit, progress if want_progress else None)))
    except OSError as exc:
        channel.put(("error", index, exc.strerror or str(exc)))
    except Exception as exc:  # TransferError, ControllerError...: one line for the caller
        channel.put(("error", index, str(exc) or type(exc).__name__))
    channel.close()
    channel.join_thread()
