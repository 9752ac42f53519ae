"""Repair planning for the sender (sans-IO): which NACKed ranges to repair, how, when.

NACKs arriving within one aggregation window are merged: a range missed by one receiver
is repaired by unicast to it, a range missed by ``multicast_threshold`` or more
receivers by one multicast. With a threshold of 2 a second asker (in this window, or one
recently repaired by unicast) escalates to multicast at once, so the repair arrives
before most receivers' NACK timers fire and suppresses them.

With ``fec_k`` set, the window is first swept per FEC block (k consecutive datagrams of
a chunk): when several receivers miss *different* datagrams of one block, m parity
shares are multicast instead (m chosen to minimise m + the leftovers of receivers that
need more than m; see ``fec.plan_shares``). One share repairs a different single loss
at every receiver, which is what makes independent loss at large group sizes cheap.
``fec_overhead`` additionally sends parity with the stream, before anyone asks.
With ``fec_anticipate``, each window also sizes the parity of every block streamed since
the last window for the whole group, from the loss rates the receivers report (the
largest loss in a block grows with the group): those receivers never have to NACK.
Requests inside the FEC block still being streamed wait until the block is complete, so
the sweep sees every receiver's losses in it.

Repairs that serve the group (multicast, parity) go first; per-receiver unicast repairs
then take turns, one datagram per receiver, so one lagging receiver's backlog never holds
back the repairs of the others. Every group repair is charged, when queued, to the
receivers that asked for it (``take_charges``; the sender splits its cost among them,
``pacing.PeerBudget``): a multicast is no free lunch for whoever asks for it.

The planner only decides; ``Sender`` builds the datagrams for what ``next_repair`` and
``next_proactive`` hand out. No clock and no socket: every call takes ``now``.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Protocol, Union

import hostagent.fec as fec
from .common import Layout
from .rangeset import RangeSet
from .wire import DATA_HEADER_LEN

_SHARE_MAP_LIMIT = 1 << 16  # blocks whose next share index is remembered


class PeerState(Protocol):
    """What the planner reads of a receiver the sender knows."""

    loss: float  # first-transmission loss it reported in its last NACK
    loss_over: int  # datagrams that figure averaged over when reported (0: none reported)
    completed: bool
    failed: bool


@dataclass(frozen=True)
class PlainRepair:
    """Send data datagram ``seq`` again: to the group, or by unicast to ``receiver_id``."""

    seq: int
    receiver_id: Optional[int]  # None: multicast


@dataclass(frozen=True)
class ParityRepair:
    """Multicast parity share ``index`` of one FEC block. ``remaining`` is this share and
    the rest of its job, in order, so the sender can encode them all in one pass."""

    chunk: int
    block: int
    first: int  # the block's sequence range [first, end)
    end: int
    index: int
    remaining: tuple[int, ...]


Repair = Union[PlainRepair, ParityRepair]


@dataclass
class _ParityJob:
    chunk: int
    block: int
    count: int
    indices: Optional[tuple[int, ...]] = None  # chosen when the job reaches the queue head (or when queued)
    sent: int = 0


class RepairPlanner:
    """NACK aggregation, the repair queue and FEC parity choices of one sending session."""

    def __init__(
        self,
        layout: Layout,
        rng: random.Random,
        *,
        multicast_threshold: int,
        repair_holdoff: Optional[float],
        shared_loss_memory: float,
        min_nack_window: float,
        fec_k: int,
        fec_overhead: float,
        fec_anticipate: bool,
        loss_horizon: int = 1024,
    ) -> None:
        """``repair_holdoff``: ignore requests for seqs multicast this recently (None:
        one NACK window); ``shared_loss_memory``: how long a unicast repair counts as
        one asker. The FEC settings mean what they do in ``SenderConfig``."""
        self.layout = layout
        self._rng = rng
        self._threshold = multicast_threshold
        self._holdoff = repair_holdoff
        self._memory = shared_loss_memory
        self._min_window = min_nack_window
        self._anticipate = fec_anticipate
        self._keep = 1.0 - 1.0 / max(1, loss_horizon)  # receivers' loss EWMA weight per datagram
        self._anticipated_to = 0  # blocks ending at or before this seq were sized for the group
        self.deadline: Optional[float] = None  # when the open NACK window closes

        # NACK aggregation and repair queue
        self._window: dict[int, RangeSet] = {}
        self._window_any = RangeSet()  # union of this window's requests
        self._repairs: deque[Union[list, _ParityJob]] = deque()  # group repairs: [None, start, end] or parity
        self._unicast: dict[int, deque[list]] = {}  # receiver -> its [receiver, start, end] ranges, in order
        self._turns: deque[int] = deque()  # receivers with unicast repairs queued, next first
        self._queued_mc = RangeSet()
        self._queued_uc: dict[int, RangeSet] = {}
        self._recent_mc: deque[tuple[float, int, int]] = deque()
        self._recent_mc_set = RangeSet()
        self._recent_uc: deque[tuple[float, int, int, int]] = deque()  # (time, rid, start, end)
        self._recent_uc_set = RangeSet()  # unicast-repaired lately: a second asker means shared loss
        self._recent_uc_by: dict[int, RangeSet] = {}
        self._charges: list[tuple[tuple[int, ...], int]] = []  # (askers, datagrams) queued for the group

        # FEC
        self._fec_k = fec_k
        self._fec_overhead = fec_overhead
        self._parity_pending: dict[int, int] = {}  # block first seq -> shares queued, unsent
        self._next_share: dict[int, int] = {}  # block first seq -> next on-demand share index
        self._proactive: deque[_ParityJob] = deque()  # parity jobs riding with the stream
        self._fec_credit = 0.0
        # Blocks where parity was recently counted on to repair a receiver: if it asks
        # again there (lost the shares, or cannot decode), serve it plain instead.
        self._parity_for: dict[int, RangeSet] = {}
        self._parity_for_log: deque[tuple[float, int, int, int]] = deque()  # (time, rid, first, end)
        # Share indices [k_eff, k_eff + reserve) belong to proactive parity.
        self._share_reserve = (int(fec_overhead * fec_k) + 2) if fec_overhead else 0

    # ------------------------------------------------------------------ requests

    @property
    def queued(self) -> bool:
        """Repairs (plain or parity) wait to be sent."""
        return bool(self._repairs or self._turns)

    @property
    def proactive_queued(self) -> bool:
        return bool(self._proactive)

    def nack(self, rid: int, ranges: Iterable[tuple[int, int]], now: float, nack_window: float) -> None:
        """One receiver's request, its ranges already clipped to what has been sent.
        Ranges multicast within the holdoff are ignored (the repair is on its way)."""
        requests = self._window.setdefault(rid, RangeSet())
        self._expire_recent(now, nack_window)
        for start, end in ranges:
            for s, e in self._recent_mc_set.missing(start, end) if self._recent_mc_set else [(start, end)]:
                self._request(rid, requests, s, e)
        if not requests:
            del self._window[rid]

    def open_window(self, deadline: float, congested: bool = False) -> None:
        """Start the aggregation window (closing at ``deadline``) if requests wait, or for
        a congestion signal alone (every request may have gone straight to multicast:
        closing the window is what applies the rate decrease)."""
        if self.deadline is None and (self._window or congested):
            self.deadline = deadline

    def take_charges(self) -> list[tuple[tuple[int, ...], int]]:
        """The group repairs queued since the last call: (the receivers that asked,
        datagrams), for the sender to charge to them."""
        charges, self._charges = self._charges, []
        return charges

    def forget(self, rid: int) -> None:
        """The receiver finished or gave up: drop its queued unicast repairs."""
        self._queued_uc.pop(rid, None)
        if self._unicast.pop(rid, None) is not None:
            self._turns.remove(rid)

    def _request(self, rid: int, requests: RangeSet, start: int, end: int) -> None:
        """Record one receiver's request. With a threshold of 2, a second asker (in this
        window, or one we recently repaired by unicast) makes the loss shared: multicast
        at once instead of waiting for the window, so the repair arrives before most
        receivers' NACK timers fire and suppresses them. (With FEC on, everything waits
        for the window: a per-block sweep of all askers picks parity or plain repair.)"""
        if self._threshold <= 2 and not self._fec_k:
            own = self._recent_uc_by.get(rid)
            for known in (self._window_any, self._recent_uc_set):
                if not known:
                    continue
                parts = known.covered(start, end)
                if known is self._recent_uc_set and own:
                    # Re-asking for our own lost unicast repair is not a second asker.
                    parts = [p for s, e in parts for p in own.missing(s, e)]
                for s, e in parts:
                    askers = {rid}  # everyone who asked for it in this window pays its share
                    for other_rid, other in self._window.items():
                        if other.count_in(s, e):
                            askers.add(other_rid)
                            other.discard(s, e)
                    self._queue_repair_split(s, e, askers, shared=True)
                    self._window_any.discard(s, e)
            # Whatever is now queued for multicast needs no per-receiver record.
            for s, e in self._queued_mc.missing(start, end) if self._queued_mc else [(start, end)]:
                requests.add(s, e)
                self._window_any.add(s, e)
            return
        requests.add(start, end)

    # ------------------------------------------------------------------ the window sweep

    def close_window(
        self, now: float, peers: Mapping[int, PeerState], next_seq: int, rate: float, nack_window: float,
        congested: bool = False,
    ) -> None:
        """Sweep all receivers' requests: shared ranges go multicast once (or as parity),
        the rest unicast. ``next_seq`` is the stream position, ``rate`` the pacing rate
        (bits/s; it says when the block being streamed will be complete); ``congested``:
        the loss reported looks like congestion (no parity is sent unasked then)."""
        self.deadline = None
        self._expire_recent(now, nack_window)
        window, self._window = self._window, {}
        self._window_any = RangeSet()
        if self._fec_k:
            window = self._defer_open_block(window, now, next_seq, rate, nack_window)
            if self._anticipate:
                self._anticipate_group(peers, next_seq, congested)
            window = self._plan_parity(window, now, peers, next_seq)
        points: list[tuple[int, int, int]] = []  # (position, +1/-1, receiver)
        for rid, ranges in window.items():
            for s, e in ranges:
                points.append((s, 1, rid))
                points.append((e, -1, rid))
        points.sort(key=lambda p: (p[0], p[1]))
        active: set[int] = set()
        prev = None
        for pos, kind, rid in points:
            if prev is not None and active and pos > prev:
                self._queue_repair(prev, pos, active)
            if kind == 1:
                active.add(rid)
            else:
                active.discard(rid)
            prev = pos

    def _defer_open_block(
        self, window: dict[int, RangeSet], now: float, nxt: int, rate: float, nack_window: float
    ) -> dict[int, RangeSet]:
        """Keep requests inside the FEC block still being streamed for the next window:
        the other receivers' losses in that block are not known yet, and once they are,
        one parity share may serve them all (receivers of a small group NACK at once, so
        without this their requests would mostly go out as separate plain repairs)."""
        if nxt >= self.layout.total_seq:
            return window
        cut = fec.block_of(self.layout, nxt, self._fec_k)[2]
        if cut >= nxt:
            return window  # the stream stands at a block boundary: nothing is open
        kept: dict[int, RangeSet] = {}
        for rid, ranges in window.items():
            if ranges.count_in(cut, nxt):
                held = self._window.setdefault(rid, RangeSet())
                for s, e in ranges.covered(cut, nxt):
                    held.add(s, e)
                ranges.discard(cut, nxt)
            if ranges:
                kept[rid] = ranges
        if self._window:
            # Closes once the block is complete (or a window later, to check again).
            left = (self.layout.total_seq if cut >= self.layout.total_seq else
                    fec.block_of(self.layout, nxt, self._fec_k)[3]) - nxt
            eta = left * (self.layout.payload_size + DATA_HEADER_LEN) * 8 / rate
            self.deadline = now + min(eta, nack_window) + self._min_window
        return kept

    def _queue_repair(self, start: int, end: int, receivers: set[int]) -> None:
        threshold = self._threshold
        if self._fec_k and threshold <= 2 and len(receivers) < threshold and self._recent_uc_set:
            # FEC mode skips _request's early escalation; do it here: a range recently
            # repaired by unicast to someone *else* is a shared loss.
            own = RangeSet()
            for rid in receivers:
                for s, e in self._recent_uc_by.get(rid, ()):
                    own.add(s, e)
            parts = [p for s, e in self._recent_uc_set.covered(start, end) for p in own.missing(s, e)]
            for s, e, inside in _alternate(start, end, parts):
                self._queue_repair_split(s, e, receivers, shared=inside)
            return
        if threshold > 2 and len(receivers) + 1 >= threshold and self._recent_uc_set:
            # (threshold <= 2 escalates as NACKs arrive, in _request)
            # Parts someone else recently needed too: the loss is shared, go multicast.
            for s, e, inside in _alternate(start, end, self._recent_uc_set.missing(start, end)):
                self._queue_repair_split(s, e, receivers, shared=not inside)
            return
        self._queue_repair_split(start, end, receivers, shared=False)

    def _queue_repair_split(self, start: int, end: int, receivers: set[int], shared: bool) -> None:
        if shared or len(receivers) >= self._threshold:
            for s, e in self._queued_mc.missing(start, end):
                self._queued_mc.add(s, e)
                self._repairs.append([None, s, e])
                self._charges.append((tuple(receivers), e - s))
            return
        for rid in receivers:
            queued = self._queued_uc.setdefault(rid, RangeSet())
            for s, e in queued.missing(start, end):
                if self._queued_mc.contains_range(s, e):
                    continue
                queued.add(s, e)
                own = self._unicast.get(rid)
                if own is None:
                    own = self._unicast[rid] = deque()
                    self._turns.append(rid)
                own.append([rid, s, e])

    def _expire_recent(self, now: float, nack_window: float) -> None:
        holdoff = self._holdoff if self._holdoff is not None else nack_window
        while self._recent_mc and now - self._recent_mc[0][0] > holdoff:
            _, s, e = self._recent_mc.popleft()
            self._recent_mc_set.discard(s, e)
        while self._recent_uc and now - self._recent_uc[0][0] > self._memory:
            _, rid, s, e = self._recent_uc.popleft()
            self._recent_uc_set.discard(s, e)
            own = self._recent_uc_by.get(rid)
            if own is not None:
                own.discard(s, e)
                if not own:
                    del self._recent_uc_by[rid]

    # ------------------------------------------------------------------ handing out

    def next_repair(self, now: float, peers: Mapping[int, PeerState]) -> Optional[Repair]:
        """The next repair datagram to send: group repairs in queue order, then one
        unicast datagram for the receiver whose turn it is; leftovers of receivers that
        finished or gave up are skipped."""
        if self._repairs:
            entry = self._repairs[0]
            if isinstance(entry, _ParityJob):
                share = self._pop_share(self._repairs, proactive=False)
                left = self._parity_pending.get(share.first, 0) - 1
                if left > 0:
                    self._parity_pending[share.first] = left
                else:
                    self._parity_pending.pop(share.first, None)
                return share
            _, seq, end = entry
            entry[1] += 1
            if entry[1] >= end:
                self._repairs.popleft()
            self._queued_mc.discard(seq)
            self._recent_mc.append((now, seq, seq + 1))
            self._recent_mc_set.add(seq)
            return PlainRepair(seq, None)
        while self._turns:
            rid = self._turns.popleft()
            own = self._unicast[rid]
            entry = own[0]
            seq, end = entry[1], entry[2]
            entry[1] += 1
            if entry[1] >= end:
                own.popleft()
            if own:
                self._turns.append(rid)
            else:
                del self._unicast[rid]
            queued = self._queued_uc.get(rid)
            peer = peers.get(rid)
            if queued is None or peer is None or peer.completed or peer.failed:
                continue  # receiver finished or gave up: skip its leftovers
            queued.discard(seq)
            self._recent_uc.append((now, rid, seq, seq + 1))
            self._recent_uc_set.add(seq)
            self._recent_uc_by.setdefault(rid, RangeSet()).add(seq)
            return PlainRepair(seq, rid)
        return None

    def stream_sent(self, seq: int) -> None:
        """A first transmission left. After the last datagram of a block, with
        ``fec_overhead``, the block is owed ``fec_overhead * k_eff`` proactive shares."""
        if not self._fec_overhead:
            return
        chunk, block, first, end = fec.block_of(self.layout, seq, self._fec_k)
        if seq != end - 1:
            return
        self._fec_credit += self._fec_overhead * (end - first)
        count = int(self._fec_credit)
        if count:
            self._fec_credit -= count
            self._proactive.append(_ParityJob(chunk, block, min(count, self._share_reserve)))

    def next_proactive(self) -> Optional[ParityRepair]:
        return self._pop_share(self._proactive, proactive=True) if self._proactive else None

    def _pop_share(self, queue: deque, proactive: bool) -> ParityRepair:
        """Next share of the parity job at the head of ``queue`` (indices chosen on first
        use: proactive shares take the reserved ones, on-demand shares fresh ones)."""
        job: _ParityJob = queue[0]
        first, end = fec.block_bounds(self.layout, job.chunk, job.block, self._fec_k)
        if job.indices is None:
            k_eff = end - first
            job.indices = (tuple(range(k_eff, k_eff + job.count)) if proactive
                           else self._share_indices(first, k_eff, job.count))
        remaining = job.indices[job.sent:]
        job.sent += 1
        if job.sent >= len(job.indices):
            queue.popleft()
        return ParityRepair(job.chunk, job.block, first, end, remaining[0], remaining)

    # ------------------------------------------------------------------ FEC

    def _plan_parity(
        self, window: dict[int, RangeSet], now: float, peers: Mapping[int, PeerState], next_seq: int
    ) -> dict[int, RangeSet]:
        """Per FEC block of this window's requests: queue parity where it is cheaper
        than per-datagram repair and take the covered requests out of the window."""
        k = self._fec_k
        layout = self.layout
        log = self._parity_for_log
        while log and now - log[0][0] > self._memory:
            _, rid, first, end = log.popleft()
            served = self._parity_for.get(rid)
            if served is not None:
                served.discard(first, end)
                if not served:
                    del self._parity_for[rid]
        # Candidate blocks: those with a request boundary inside them. A block only ever
        # asked for whole (a late joiner, a blackout) is no cheaper with parity.
        blocks: dict[int, tuple[int, int, int]] = {}  # first -> (end, chunk, block)
        for ranges in window.values():
            for s, e in ranges:
                for seq in (s, e - 1):
                    chunk, block, first, end = fec.block_of(layout, seq, k)
                    if end <= next_seq and first not in blocks and (s > first or e < end):
                        blocks[first] = (end, chunk, block)
        if not blocks:
            return window
        firsts = sorted(blocks)
        ends = [blocks[f][0] for f in firsts]
        # needs[first][rid] = that receiver's requested seqs inside the block
        needs: dict[int, dict[int, list[tuple[int, int]]]] = {}
        for rid, ranges in window.items():
            served = self._parity_for.get(rid)
            for s, e in ranges:
                i = bisect_right(ends, s)
                while i < len(firsts) and firsts[i] < e:
                    f = firsts[i]
                    if served is None or f not in served:
                        needs.setdefault(f, {}).setdefault(rid, []).append((max(s, f), min(e, ends[i])))
                    i += 1
        active = [p for p in peers.values() if not (p.completed or p.failed)]
        group_loss = sum(p.loss for p in active)
        threshold = self._threshold
        for first, asks in needs.items():
            end, chunk, block = blocks[first]
            k_eff = end - first
            pending = self._parity_pending.get(first, 0)
            counts = {rid: sum(e - s for s, e in parts) - pending for rid, parts in asks.items()}
            wanting = {rid: r for rid, r in counts.items() if r > 0}
            if not wanting:  # shares already queued cover everyone
                for rid in asks:
                    window[rid].discard(first, end)
                continue
            span = fec.MAX_SHARES - k_eff - self._share_reserve
            m, cost = fec.plan_shares(wanting.values(), span)
            if m == 0:
                continue
            askers = [0] * k_eff
            for rid in wanting:
                for s, e in asks[rid]:
                    for seq in range(s, e):
                        askers[seq - first] += 1
            plain = sum(1 if c >= threshold else c for c in askers)
            others = k_eff * (group_loss - sum(peers[r].loss for r in asks if r in peers))
            anticipate = self._anticipate and others >= 0.5
            if not (cost < plain or (cost == plain and anticipate)):
                continue
            self._repairs.append(_ParityJob(chunk, block, m))
            self._charges.append((tuple(wanting), m))
            self._parity_pending[first] = pending + m
            for rid, parts in asks.items():
                window[rid].discard(first, end)
                self._parity_for.setdefault(rid, RangeSet()).add(first, end)
                log.append((now, rid, first, end))
                extra = counts[rid] - m  # needs more shares than the multicast brings
                for s, e in parts:
                    if extra <= 0:
                        break
                    take = min(extra, e - s)
                    window[rid].add(s, s + take)
                    extra -= take
        return {rid: ranges for rid, ranges in window.items() if ranges}

    def _anticipate_group(self, peers: Mapping[int, PeerState], next_seq: int, congested: bool) -> None:
        """Size the parity of every block streamed since the last window for the whole
        group, not for the few receivers whose NACK came first: queue, once per block,
        the shares that at least two receivers will almost surely need, judged from the
        loss rates the group reports (``expected_shares``). With independent loss the
        largest need in a block grows with the group (~4 of 32 at 1,024 receivers and
        2%); repairing it one NACK round at a time costs a round trip, a suppression
        backoff and a wave of NACKs per round. Receivers whose need these shares cover
        never NACK; only the few that need more (or lost a share) are left.

        Not while the loss looks like congestion: it is shared (the same datagrams, plain
        multicast repairs serve it) and the rate is being cut -- parity sent unasked
        would only add to the load. Those blocks are repaired on request."""
        start = self._anticipated_to
        if start >= next_seq:
            return
        if congested:
            self._anticipated_to = next_seq
            return
        losses = group_loss_rates(peers.values(), self._keep)
        if not losses:
            return  # nobody reported a loss figure yet: the next window decides
        counts: dict[int, int] = {}
        layout, k = self.layout, self._fec_k
        seq = start
        while seq < next_seq:
            chunk, block, first, end = fec.block_of(layout, seq, k)
            if end > next_seq:
                break  # still being streamed: sized once complete
            k_eff = end - first
            m = counts.get(k_eff)
            if m is None:
                m = counts[k_eff] = expected_shares(losses, k_eff, fec.MAX_SHARES - k_eff - self._share_reserve)
            if m > 0:
                job = _ParityJob(chunk, block, m)
                job.indices = self._share_indices(first, k_eff, m)
                self._repairs.append(job)
                self._parity_pending[first] = self._parity_pending.get(first, 0) + m
            seq = end
        self._anticipated_to = seq

    def _share_indices(self, first: int, k_eff: int, count: int) -> tuple[int, ...]:
        """Fresh share indices for a block, so shares from successive rounds combine.
        Blocks start at a random offset and the map is bounded: a forgotten block
        restarting somewhere else rarely repeats a share a receiver already holds."""
        base = k_eff + self._share_reserve
        span = fec.MAX_SHARES - base
        nxt = self._next_share.pop(first, None)
        if nxt is None:
            nxt = self._rng.randrange(span)
            if len(self._next_share) >= _SHARE_MAP_LIMIT:
                del self._next_share[next(iter(self._next_share))]
        indices = tuple(base + (nxt + i) % span for i in range(count))
        self._next_share[first] = (nxt + count) % span
        return indices


ANTICIPATE_CONFIDENCE = 0.75  # how sure the group must be to need a share before it is sent unasked
_MIN_LOSS_SPAN = 32  # a loss figure over fewer datagrams says little
_GROUP_WITNESSES = 2  # reports it takes before the silent are assumed to lose as the reporters do


def group_loss_rates(peers: Iterable[PeerState], keep: float) -> list[float]:
    """Each active receiver's first-transmission loss rate, from its last report.

    A receiver's figure is an EWMA that starts at 0 (``Receiver._measure_loss``), so a
    report over n datagrams reads ``1 - keep**n`` of the rate: divided back out here.
    That rate rests on the few losses behind it (L = rate * n), and a receiver reports
    because it lost something: each counts at a one-sigma lower bound, (L - sqrt(L)) / n,
    so one early loss in a short file does not make the whole group look lossy.
    Receivers with no usable report count at the median of those with one (the group's
    typical loss; one heavy straggler does not set it) once at least two reported: a
    single report is one receiver's loss, not the group's (one lossy receiver among clean
    ones is the only one to report, and taking its rate for everyone's sent parity to
    all for the losses of one), and the silent count as losing nothing. Empty: nobody
    reported."""
    known: list[float] = []
    unknown = 0
    for p in peers:
        if p.completed or p.failed:
            continue
        if p.loss_over < _MIN_LOSS_SPAN:
            unknown += 1
            continue
        lost = p.loss / (1.0 - keep ** p.loss_over) * p.loss_over
        known.append(min(1.0, max(0.0, lost - math.sqrt(lost)) / p.loss_over))
    if not known:
        return []
    typical = sorted(known)[len(known) // 2] if len(known) >= _GROUP_WITNESSES else 0.0
    return known + [typical] * unknown


def expected_shares(losses: Iterable[float], k_eff: int, limit: int,
                    confidence: float = ANTICIPATE_CONFIDENCE) -> int:
    """Parity shares a block of ``k_eff`` datagrams will need, judged before anyone asks:
    the largest m such that, with each receiver losing datagrams independently at its
    rate, at least two receivers lose m or more of the block with probability
    ``confidence``. (Two, not one: a share only one receiver needs is a unicast repair's
    job, and the fabric should not carry it to everyone.) At most ``limit``."""
    rates: dict[float, int] = {}
    for p in losses:
        if p > 0:
            rates[round(p, 4)] = rates.get(round(p, 4), 0) + 1
    if not rates:
        return 0
    tails = {p: _binomial_tails(k_eff, p) for p in rates}
    m = 0
    while m < limit:
        j = m + 1
        log_none, odds = 0.0, 0.0  # P(nobody needs >= j) in logs; sum of s / (1 - s)
        for p, n in rates.items():
            s = tails[p][j] if j < len(tails[p]) else 0.0
            if s >= 1.0:
                log_none, odds = -math.inf, math.inf
                break
            log_none += n * math.log1p(-s)
            odds += n * s / (1.0 - s)
        none = math.exp(log_none)
        if 1.0 - none - none * odds < confidence:
            break
        m = j
    return m


def _binomial_tails(k: int, p: float) -> list[float]:
    """``[P(X >= j) for j in 0..k]`` for X ~ Binomial(k, p), cut where it vanishes."""
    pmf = [math.comb(k, i) * p**i * (1 - p) ** (k - i) for i in range(k + 1)]
    tails = [0.0] * (k + 2)
    for i in range(k, -1, -1):
        tails[i] = tails[i + 1] + pmf[i]
    return tails[: k + 1]


def _alternate(start: int, end: int, parts: list[tuple[int, int]]) -> list[tuple[int, int, bool]]:
    """``[start, end)`` cut at the sorted, disjoint ``parts``: (s, e, inside-a-part) pieces
    in order, empty pieces left out."""
    pieces: list[tuple[int, int, bool]] = []
    pos = start
    for s, e in parts + [(end, end)]:
        if s > pos:
            pieces.append((pos, s, False))
        if e > s:
            pieces.append((s, e, True))
        pos = e
    return pieces
