"""Sender state machine (sans-IO).

The sender streams every sequence number once to the group, repeating manifest pages
so late joiners can start, then serves repairs. NACKs arriving within one aggregation
window are merged: a range missed by one receiver is repaired by unicast to it, a range
missed by ``multicast_threshold`` or more receivers by one multicast. Pacing is a token
bucket whose rate follows AIMD below a hard cap.

With ``fec_k`` set, the window is first swept per FEC block (k consecutive datagrams of
a chunk): when several receivers miss *different* datagrams of one block, m parity
shares are multicast instead (m chosen to minimise m + the leftovers of receivers that
need more than m; see ``fec.plan_shares``). One share repairs a different single loss
at every receiver, which is what makes independent loss at large group sizes cheap.
``fec_overhead`` additionally sends parity with the stream, before anyone asks.
Requests inside the FEC block still being streamed wait until the block is complete, so
the sweep sees every receiver's losses in it.

Like aioquic's QuicConnection it never touches a socket or a clock: feed it
``receive_datagram(data, addr, now)``, drain ``datagrams_to_send(now)``, and call
``handle_timer(now)`` at ``get_timer()``.
"""

from __future__ import annotations

import dataclasses
import random
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Optional

import blake3

from . import fec, wire
from .common import (
    GROUP, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, Addr, ChunkSource, Dest, Layout, ReceiverCompleted,
    ReceiverFailed, ReceiverJoined, SenderEvent, Stats, StreamFinished, TransferFinished,
)
from .rangeset import RangeSet

_DIGESTS_PER_PAGE_BUDGET = 120  # bytes of a manifest page spent on fixed fields


@dataclass
class SenderConfig:
    chunk_size: int = 1024 * 1024
    payload_size: int = 1400
    rate_bps: float = 1e9  # hard cap
    initial_rate_fraction: float = 0.7  # start below the cap: switch buffers overrun on bursts
    min_rate_fraction: float = 0.05
    # Additive increase, as a fraction of the cap per aimd_interval without loss. Until
    # the first decrease the sender ramps fast (70% -> cap in ~30 ms): a start at
    # 70% is a precaution, not a measurement, and every slow ramp millisecond is lost
    # link time. After a real congestion signal it probes back more gently.
    ramp_increase_fraction: float = 1.0
    aimd_increase_fraction: float = 0.1
    aimd_decrease: float = 0.7
    aimd_interval: float = 0.1
    loss_tolerance: float = 0.02  # reported loss below this is noise, not congestion
    burst_bytes: int = 64 * 1024  # token bucket depth
    nack_window: float = 0.075  # at nack_group_scale receivers or more; shorter below
    # Group size at which the NACK aggregation window (and the receivers' NACK backoff,
    # which scales the same way from the manifest's receivers hint) reach their full
    # length; below it both shrink with (N / nack_group_scale) ** 2. Few receivers have
    # little to suppress, and every repair round would otherwise cost the full window
    # plus the full backoff. (FEC aggregation does not suffer: requests inside the block
    # still being streamed wait for the block to complete, see _defer_open_block.)
    nack_group_scale: int = 64
    min_nack_window: float = 0.002
    multicast_threshold: int = 2
    repair_holdoff: Optional[float] = None  # ignore NACKs for seqs multicast this recently
    shared_loss_memory: float = 1.0  # how long a unicast repair counts as one asker
    repair_share: float = 0.5  # max fraction of sends given to repairs while streaming
    manifest_every: int = 64  # data datagrams between manifest pages while streaming
    manifest_interval: float = 0.25  # manifest page repeat when not streaming
    end_interval: float = 0.1
    expected_receivers: Optional[int] = None
    receiver_timeout: float = 5.0  # incomplete receiver silent this long after END: failed
    idle_timeout: float = 2.0  # all known receivers resolved and quiet this long: finish
    linger_timeout: float = 60.0  # hard bound on the repair phase
    max_datagram: int = 1472
    session_id: Optional[int] = None
    key: Optional[bytes] = None
    name: str = ""
    # FEC: datagrams per parity block (0: off, plain per-datagram repair only).
    fec_k: int = 0
    fec_overhead: float = 0.0  # proactive parity shares per data datagram (e.g. 0.02)
    # One receiver asks for part of a block, but the others' reported loss says more
    # will: answer with (multicast) parity instead of unicast. Same cost to the sender.
    fec_anticipate: bool = True

    def validate(self) -> None:
        """Refuse settings that would break the wire format or the pacing maths."""
        if not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk_size must be {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}")
        if not 64 <= self.payload_size <= self.max_datagram - wire.DATA_HEADER_LEN - wire.MAC_LEN:
            raise ValueError("payload_size does not fit max_datagram")
        if self.rate_bps <= 0:
            raise ValueError("rate must be positive")
        if not 0 < self.initial_rate_fraction <= 1 or not 0 < self.min_rate_fraction <= 1:
            raise ValueError("rate fractions must be in (0, 1]")
        if self.multicast_threshold < 1:
            raise ValueError("multicast_threshold must be >= 1")
        if self.ramp_increase_fraction < 0 or self.aimd_increase_fraction < 0 or self.aimd_interval <= 0:
            raise ValueError("rate increases must be >= 0 and aimd_interval > 0")
        if self.nack_group_scale < 1 or self.min_nack_window <= 0:
            raise ValueError("nack_group_scale must be >= 1 and min_nack_window > 0")
        if not 0 <= self.fec_k <= fec.MAX_K:
            raise ValueError(f"fec_k must be 0..{fec.MAX_K}")
        if not 0 <= self.fec_overhead <= 1 or (self.fec_overhead and not self.fec_k):
            raise ValueError("fec_overhead must be in [0, 1] and needs fec_k")
        if fec.MAX_SHARES - self.fec_k - (int(self.fec_overhead * self.fec_k) + 2) < 32:
            # keep share indices free for several on-demand repair rounds per block
            raise ValueError("fec_overhead too large for fec_k")


@dataclass
class _Peer:
    receiver_id: int
    addr: Addr
    last_heard: float
    completed: bool = False
    failed: bool = False
    loss: float = 0.0  # first-transmission loss it reported in its last NACK


def build_manifest_pages(source: ChunkSource, config: SenderConfig, session: int) -> list[wire.Manifest]:
    """Read the file once to digest every chunk and the whole file; split the digest
    list into pages that each fit in one datagram."""
    layout = Layout(source.size, config.chunk_size, config.payload_size)
    whole = blake3.blake3()
    digests = bytearray()
    for chunk in range(layout.chunk_count):
        data = source.read(chunk * layout.chunk_size, layout.chunk_len(chunk))
        if len(data) != layout.chunk_len(chunk):
            raise ValueError("source returned a short read")
        whole.update(data)
        digests += wire.chunk_digest(data)
    file_digest = whole.digest()
    budget = config.max_datagram - wire.HEADER_LEN - wire.MAC_LEN - _DIGESTS_PER_PAGE_BUDGET
    budget -= len(config.name.encode())
    per_page = max(1, budget // wire.CHUNK_DIGEST_LEN)
    page_count = max(1, -(-layout.chunk_count // per_page))
    pages = []
    for index in range(page_count):
        first = index * per_page
        last = min(layout.chunk_count, first + per_page)
        pages.append(
            wire.Manifest(
                session, layout.file_size, layout.chunk_size, layout.payload_size,
                layout.chunk_count, file_digest, index, page_count, first,
                bytes(digests[first * wire.CHUNK_DIGEST_LEN : last * wire.CHUNK_DIGEST_LEN]),
                config.name,
            )
        )
    return pages


class Sender:
    """One file, one session, many receivers."""

    def __init__(
        self,
        source: ChunkSource,
        config: SenderConfig,
        now: float,
        rng: Optional[random.Random] = None,
        manifest: Optional[list[wire.Manifest]] = None,
    ) -> None:
        config.validate()
        self.config = config
        self._rng = rng or random.Random()
        self.session = config.session_id if config.session_id is not None else self._rng.getrandbits(64)
        self._source = source
        self.layout = Layout(source.size, config.chunk_size, config.payload_size)
        self.pages = manifest or build_manifest_pages(source, config, self.session)
        self.file_digest = self.pages[0].file_digest
        self.stats = Stats()
        self._key = config.key
        self._events: deque[SenderEvent] = deque()
        self._control: list[tuple[bytes, Dest]] = []

        # streaming
        self._next_seq = 0
        self._since_manifest = config.manifest_every  # send a manifest page first
        self._page_cursor = 0
        self._last_manifest = now
        self._stream_done_at: Optional[float] = None
        self._last_end = -1e18
        self._sends_streaming = 0
        self._repairs_streaming = 0

        # pacing
        self.rate = config.rate_bps * config.initial_rate_fraction
        self._tokens = float(min(config.burst_bytes, config.max_datagram))
        self._last_refill = now
        self._last_decrease = -1e18
        self._congested = False

        # NACK aggregation and repair queue
        self._window_deadline: Optional[float] = None
        self._window: dict[int, RangeSet] = {}
        self._window_any = RangeSet()  # union of this window's requests
        self._repairs: deque[list] = deque()  # [dest_receiver_id or None, start, end]
        self._queued_mc = RangeSet()
        self._queued_uc: dict[int, RangeSet] = {}
        self._recent_mc: deque[tuple[float, int, int]] = deque()
        self._recent_mc_set = RangeSet()
        self._recent_uc: deque[tuple[float, int, int, int]] = deque()  # (time, rid, start, end)
        self._recent_uc_set = RangeSet()  # unicast-repaired lately: a second asker means shared loss
        self._recent_uc_by: dict[int, RangeSet] = {}

        # FEC
        self._fec_k = config.fec_k
        self._parity_pending: dict[int, int] = {}  # block first seq -> shares queued, unsent
        self._next_share: dict[int, int] = {}  # block first seq -> next on-demand share index
        self._proactive: deque[list] = deque()  # parity jobs riding with the stream
        self._fec_credit = 0.0
        # Blocks where parity was recently counted on to repair a receiver: if it asks
        # again there (lost the shares, or cannot decode), serve it plain instead.
        self._parity_for: dict[int, RangeSet] = {}
        self._parity_for_log: deque[tuple[float, int, int, int]] = deque()  # (time, rid, first, end)
        # Share indices [k_eff, k_eff + reserve) belong to proactive parity.
        self._share_reserve = (int(config.fec_overhead * config.fec_k) + 2) if config.fec_overhead else 0

        # receivers
        self.peers: dict[int, _Peer] = {}
        self._last_activity = now
        self.finished = False
        self.closed = False

    # ------------------------------------------------------------------ public API

    def receive_datagram(self, data: bytes, addr: Addr, now: float) -> None:
        """Process one datagram from a receiver; garbage is counted and dropped."""
        self.stats.datagrams_in += 1
        self.stats.bytes_in += len(data)
        try:
            msg = wire.decode(data, self._key)
        except wire.WireError as exc:
            self.stats.drops[exc.reason] += 1
            return
        if msg.session != self.session:
            self.stats.drops["wrong_session"] += 1
            return
        if isinstance(msg, wire.Nack):
            self._on_nack(msg, addr, now)
        elif isinstance(msg, wire.Complete):
            self._on_complete(msg, addr, now)
        elif isinstance(msg, wire.Hello):
            self._peer(msg.receiver_id, addr, now)
        else:
            # Our own multicast looped back, or another sender: not for us.
            self.stats.drops["unexpected_type"] += 1

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Dest]]:
        """Everything that may leave now: control first, then paced repairs/data."""
        out = self._control
        self._control = []
        if self.closed:
            return self._account(out)
        self._refill(now)
        if self._stream_done_at is not None and now >= self._last_end + self.config.end_interval:
            out.append((self._end(False), GROUP))
            self._last_end = now
        while self._tokens > -1e-6:
            item = self._next_paced(now)
            if item is None:
                break
            self._tokens -= len(item[0])
            out.append(item)
        if self._next_seq >= self.layout.total_seq and self._stream_done_at is None and not self._proactive:
            self._stream_done_at = now
            self._events.append(StreamFinished(self.layout.total_seq))
            out.append((self._end(False), GROUP))
            self._last_end = now
        return self._account(out)

    def get_timer(self) -> Optional[float]:
        """Earliest time at which handle_timer or datagrams_to_send has work."""
        if self.closed:
            return None
        times: list[float] = []
        if self._window_deadline is not None:
            times.append(self._window_deadline)
        if self._has_paced_work():
            bps = self.rate / 8
            times.append(self._last_refill + max(0.0, -self._tokens) / bps + 1e-9)
        if self._stream_done_at is None:
            times.append(self._last_manifest + self.config.manifest_interval)
        else:
            times.append(self._last_end + self.config.end_interval)
            times.append(self._last_manifest + self.config.manifest_interval)
            times.append(self._stream_done_at + self.config.linger_timeout)
            if all(p.completed or p.failed for p in self.peers.values()):
                times.append(self._last_activity + self.config.idle_timeout)
            for peer in self.peers.values():
                if not (peer.completed or peer.failed):
                    times.append(max(peer.last_heard, self._stream_done_at) + self.config.receiver_timeout)
        return min(times)

    def handle_timer(self, now: float) -> None:
        """Close the NACK window, time out stragglers, finish when everyone is done."""
        if self.closed:
            return
        if self._window_deadline is not None and now >= self._window_deadline:
            self._close_window(now)
        if self._stream_done_at is None and now >= self._last_manifest + self.config.manifest_interval:
            self._queue_manifest_page(now)
        if self._stream_done_at is not None:
            if now >= self._last_manifest + self.config.manifest_interval:
                self._queue_manifest_page(now)
            self._check_stragglers(now)

    def next_event(self) -> Optional[SenderEvent]:
        return self._events.popleft() if self._events else None

    @property
    def completed(self) -> list[int]:
        return sorted(p.receiver_id for p in self.peers.values() if p.completed)

    @property
    def group_size(self) -> int:
        """Receivers known or expected (the manifest's receivers hint)."""
        return max(len(self.peers), self.config.expected_receivers or 0, 1)

    @property
    def nack_window(self) -> float:
        """Aggregation window: full length for large groups, quadratically shorter for
        small ones (receivers' NACK backoff shrinks the same way)."""
        cfg = self.config
        scale = min(1.0, self.group_size / max(1, cfg.nack_group_scale)) ** 2
        return max(cfg.min_nack_window, cfg.nack_window * scale)

    # ------------------------------------------------------------------ receivers

    def _peer(self, rid: int, addr: Addr, now: float) -> _Peer:
        self._last_activity = now
        peer = self.peers.get(rid)
        if peer is None:
            peer = self.peers[rid] = _Peer(rid, addr, now)
            self._events.append(ReceiverJoined(rid, addr))
        peer.addr = addr
        peer.last_heard = now
        return peer

    def _on_complete(self, msg: wire.Complete, addr: Addr, now: float) -> None:
        peer = self._peer(msg.receiver_id, addr, now)
        if msg.file_digest != self.file_digest:
            if not peer.failed:
                peer.failed = True
                self._events.append(ReceiverFailed(peer.receiver_id, "digest mismatch"))
            return
        self._control.append((self._encode(wire.CompleteAck(self.session, msg.receiver_id)), addr))
        if not peer.completed:
            peer.completed = True
            peer.failed = False
            self._queued_uc.pop(peer.receiver_id, None)
            self._events.append(ReceiverCompleted(peer.receiver_id, addr))
            self._maybe_finish(now)

    def _check_stragglers(self, now: float) -> None:
        assert self._stream_done_at is not None
        cfg = self.config
        for peer in self.peers.values():
            if peer.completed or peer.failed:
                continue
            if now >= max(peer.last_heard, self._stream_done_at) + cfg.receiver_timeout:
                self._fail(peer, "timed out")
        if now >= self._stream_done_at + cfg.linger_timeout:
            for peer in self.peers.values():
                if not (peer.completed or peer.failed):
                    self._fail(peer, "linger timeout")
            self._finish(now)
            return
        resolved = all(p.completed or p.failed for p in self.peers.values())
        if resolved and now >= self._last_activity + cfg.idle_timeout:
            self._finish(now)

    def _fail(self, peer: _Peer, reason: str) -> None:
        peer.failed = True
        self._queued_uc.pop(peer.receiver_id, None)
        self._events.append(ReceiverFailed(peer.receiver_id, reason))

    def _maybe_finish(self, now: float) -> None:
        expected = self.config.expected_receivers
        if expected is not None and len(self.completed) >= expected and self._stream_done_at is not None:
            self._finish(now)

    def _finish(self, now: float) -> None:
        if self.finished:
            return
        self.finished = True
        completed = tuple(self.completed)
        failed = tuple(sorted(p.receiver_id for p in self.peers.values() if p.failed))
        expected = self.config.expected_receivers
        missing = max(0, expected - len(self.peers)) if expected is not None else 0
        ok = not failed and (len(completed) >= expected if expected is not None else bool(completed))
        self._events.append(TransferFinished(ok, completed, failed, missing))
        closing = self._end(True)
        self._control.extend([(closing, GROUP)] * 3)  # cheap insurance against loss
        self.closed = True

    # ------------------------------------------------------------------ NACKs

    def _on_nack(self, msg: wire.Nack, addr: Addr, now: float) -> None:
        peer = self._peer(msg.receiver_id, addr, now)
        self.stats.nacks_received += 1
        if peer.completed or peer.failed:
            return
        peer.loss = msg.loss_permille / 1000
        limit = self._next_seq  # cannot repair what has not been sent yet
        requests = self._window.setdefault(msg.receiver_id, RangeSet())
        self._expire_recent(now)
        for start, end in msg.ranges:
            end = min(end, limit)
            if end <= start:
                continue
            if msg.loss_permille > self.config.loss_tolerance * 1000:
                # The receiver measures loss of first transmissions since its last NACK,
                # so this is recent loss, not a late joiner catching up.
                self._congested = True
            for s, e in self._recent_mc_set.missing(start, end) if self._recent_mc_set else [(start, end)]:
                self._request(msg.receiver_id, requests, s, e)
        if not requests:
            del self._window[msg.receiver_id]
        # Open a window also for a congestion signal alone (every request may have gone
        # straight to multicast): closing it applies the decrease and clears the flag,
        # which would otherwise stay latched and stop the additive increase for good.
        if self._window_deadline is None and (self._window or self._congested):
            self._window_deadline = now + self.nack_window

    def _request(self, rid: int, requests: RangeSet, start: int, end: int) -> None:
        """Record one receiver's request. With a threshold of 2, a second asker (in this
        window, or one we recently repaired by unicast) makes the loss shared: multicast
        at once instead of waiting for the window, so the repair arrives before most
        receivers' NACK timers fire and suppresses them. (With FEC on, everything waits
        for the window: a per-block sweep of all askers picks parity or plain repair.)"""
        if self.config.multicast_threshold <= 2 and not self._fec_k:
            own = self._recent_uc_by.get(rid)
            for known in (self._window_any, self._recent_uc_set):
                if not known:
                    continue
                parts = known.covered(start, end)
                if known is self._recent_uc_set and own:
                    # Re-asking for our own lost unicast repair is not a second asker.
                    parts = [p for s, e in parts for p in own.missing(s, e)]
                for s, e in parts:
                    self._queue_repair_split(s, e, {rid}, shared=True)
                    for other in self._window.values():
                        other.discard(s, e)
                    self._window_any.discard(s, e)
            # Whatever is now queued for multicast needs no per-receiver record.
            for s, e in self._queued_mc.missing(start, end) if self._queued_mc else [(start, end)]:
                requests.add(s, e)
                self._window_any.add(s, e)
            return
        requests.add(start, end)

    def _close_window(self, now: float) -> None:
        """Sweep all receivers' requests: shared ranges go multicast once, the rest unicast."""
        self._window_deadline = None
        self._expire_recent(now)
        window, self._window = self._window, {}
        self._window_any = RangeSet()
        if self._fec_k:
            window = self._defer_open_block(window, now)
            window = self._plan_parity(window, now)
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
        if self._congested and now - self._last_decrease >= self.config.aimd_interval:
            self._refill(now)
            floor = self.config.rate_bps * self.config.min_rate_fraction
            self.rate = max(floor, self.rate * self.config.aimd_decrease)
            self._last_decrease = now
            self.stats.rate_decreases += 1
        self._congested = False

    def _defer_open_block(self, window: dict[int, RangeSet], now: float) -> dict[int, RangeSet]:
        """Keep requests inside the FEC block still being streamed for the next window:
        the other receivers' losses in that block are not known yet, and once they are,
        one parity share may serve them all (receivers of a small group NACK at once, so
        without this their requests would mostly go out as separate plain repairs)."""
        nxt = self._next_seq
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
            eta = left * (self.layout.payload_size + wire.DATA_HEADER_LEN) * 8 / self.rate
            self._window_deadline = now + min(eta, self.nack_window) + self.config.min_nack_window
        return kept

    def _queue_repair(self, start: int, end: int, receivers: set[int]) -> None:
        threshold = self.config.multicast_threshold
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
        if shared or len(receivers) >= self.config.multicast_threshold:
            for s, e in self._queued_mc.missing(start, end):
                self._queued_mc.add(s, e)
                self._repairs.append([None, s, e])
            return
        for rid in receivers:
            queued = self._queued_uc.setdefault(rid, RangeSet())
            for s, e in queued.missing(start, end):
                if self._queued_mc.contains_range(s, e):
                    continue
                queued.add(s, e)
                self._repairs.append([rid, s, e])

    def _expire_recent(self, now: float) -> None:
        holdoff = self.config.repair_holdoff if self.config.repair_holdoff is not None else self.nack_window
        while self._recent_mc and now - self._recent_mc[0][0] > holdoff:
            _, s, e = self._recent_mc.popleft()
            self._recent_mc_set.discard(s, e)
        while self._recent_uc and now - self._recent_uc[0][0] > self.config.shared_loss_memory:
            _, rid, s, e = self._recent_uc.popleft()
            self._recent_uc_set.discard(s, e)
            own = self._recent_uc_by.get(rid)
            if own is not None:
                own.discard(s, e)
                if not own:
                    del self._recent_uc_by[rid]

    # ------------------------------------------------------------------ pacing

    def _refill(self, now: float) -> None:
        elapsed = now - self._last_refill
        if elapsed <= 0:
            return
        cfg = self.config
        if not self._congested and now - self._last_decrease >= cfg.aimd_interval and self.rate < cfg.rate_bps:
            # Additive increase, proportional to elapsed clean time, never above the cap.
            step = cfg.ramp_increase_fraction if self.stats.rate_decreases == 0 else cfg.aimd_increase_fraction
            self.rate = min(cfg.rate_bps, self.rate + cfg.rate_bps * step * elapsed / cfg.aimd_interval)
        self._tokens = min(float(cfg.burst_bytes), self._tokens + elapsed * self.rate / 8)
        self._last_refill = now

    def _has_paced_work(self) -> bool:
        return bool(self._repairs) or bool(self._proactive) or self._next_seq < self.layout.total_seq

    def _next_paced(self, now: float) -> Optional[tuple[bytes, Dest]]:
        if self._proactive:
            raw = self._pop_parity(self._proactive)
            self.stats.parity_proactive += 1
            self.stats.parity_bytes_proactive += len(raw)
            return raw, GROUP
        streaming = self._next_seq < self.layout.total_seq
        if streaming and self._since_manifest >= self.config.manifest_every:
            self._since_manifest = 0
            return self._manifest_page(now), GROUP
        take_repair = bool(self._repairs) and (
            not streaming or self._repairs_streaming <= self.config.repair_share * self._sends_streaming
        )
        if take_repair:
            item = self._pop_repair(now)
            if item is not None:
                if streaming:
                    self._repairs_streaming += 1
                    self._sends_streaming += 1
                return item
        if not streaming:
            return None
        seq = self._next_seq
        self._next_seq += 1
        self._since_manifest += 1
        self._sends_streaming += 1
        data = self._data(seq, repair=False, multicast=True)
        self.stats.data_sent += 1
        self.stats.data_bytes_sent += len(data)
        if self.config.fec_overhead:
            self._maybe_proactive(seq)
        return data, GROUP

    def _pop_repair(self, now: float) -> Optional[tuple[bytes, Dest]]:
        while self._repairs:
            entry = self._repairs[0]
            if entry[0] is _PARITY_JOB:
                first = fec.block_bounds(self.layout, entry[1], entry[2], self._fec_k)[0]
                raw = self._pop_parity(self._repairs)
                left = self._parity_pending.get(first, 0) - 1
                if left > 0:
                    self._parity_pending[first] = left
                else:
                    self._parity_pending.pop(first, None)
                self.stats.repairs_parity += 1
                self.stats.repair_bytes_parity += len(raw)
                return raw, GROUP
            rid, seq, end = entry
            entry[1] += 1
            if entry[1] >= end:
                self._repairs.popleft()
            if rid is None:
                self._queued_mc.discard(seq)
                raw = self._data(seq, repair=True, multicast=True)
                self._recent_mc.append((now, seq, seq + 1))
                self._recent_mc_set.add(seq)
                self.stats.repairs_multicast += 1
                self.stats.repair_bytes_multicast += len(raw)
                return raw, GROUP
            queued = self._queued_uc.get(rid)
            peer = self.peers.get(rid)
            if queued is None or peer is None or peer.completed or peer.failed:
                continue  # receiver finished or gave up: skip its leftovers
            queued.discard(seq)
            self._recent_uc.append((now, rid, seq, seq + 1))
            self._recent_uc_set.add(seq)
            self._recent_uc_by.setdefault(rid, RangeSet()).add(seq)
            raw = self._data(seq, repair=True, multicast=False)
            self.stats.repairs_unicast += 1
            self.stats.repair_bytes_unicast += len(raw)
            return raw, peer.addr
        return None

    # ------------------------------------------------------------------ FEC

    def _plan_parity(self, window: dict[int, RangeSet], now: float) -> dict[int, RangeSet]:
        """Per FEC block of this window's requests: queue parity where it is cheaper
        than per-datagram repair and take the covered requests out of the window."""
        k = self._fec_k
        layout = self.layout
        log = self._parity_for_log
        while log and now - log[0][0] > self.config.shared_loss_memory:
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
                    if end <= self._next_seq and first not in blocks and (s > first or e < end):
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
        active = [p for p in self.peers.values() if not (p.completed or p.failed)]
        group_loss = sum(p.loss for p in active)
        threshold = self.config.multicast_threshold
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
            others = k_eff * (group_loss - sum(self.peers[r].loss for r in asks if r in self.peers))
            anticipate = self.config.fec_anticipate and others >= 0.5
            if not (cost < plain or (cost == plain and anticipate)):
                continue
            self._repairs.append([_PARITY_JOB, chunk, block, m, None])
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

    def _maybe_proactive(self, seq: int) -> None:
        """After the last datagram of a block: owe it fec_overhead * k_eff shares."""
        chunk, block, first, end = fec.block_of(self.layout, seq, self._fec_k)
        if seq != end - 1:
            return
        self._fec_credit += self.config.fec_overhead * (end - first)
        count = int(self._fec_credit)
        if count:
            self._fec_credit -= count
            self._proactive.append([_PARITY_JOB, chunk, block, min(count, self._share_reserve), None])

    def _pop_parity(self, queue: deque[list]) -> bytes:
        """Next share of the parity job at the head of ``queue`` (encoded on first use)."""
        entry = queue[0]
        if entry[4] is None:
            _, chunk, block, count, _ = entry
            first, end = fec.block_bounds(self.layout, chunk, block, self._fec_k)
            k_eff = end - first
            if queue is self._proactive:
                indices = list(range(k_eff, k_eff + count))
            else:
                indices = self._share_indices(first, k_eff, count)
            entry[4] = deque(self._parity_datagrams(chunk, block, first, end, indices))
        raw = entry[4].popleft()
        if not entry[4]:
            queue.popleft()
        return raw

    def _share_indices(self, first: int, k_eff: int, count: int) -> list[int]:
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
        indices = [base + (nxt + i) % span for i in range(count)]
        self._next_share[first] = (nxt + count) % span
        return indices

    def _parity_datagrams(self, chunk: int, block: int, first: int, end: int, indices: list[int]) -> list[bytes]:
        layout = self.layout
        size = fec.symbol_size(layout, first)
        base = chunk * layout.chunk_size
        lo = layout.locate(first)[1]
        _, last_off, last_len = layout.locate(end - 1)
        raw = self._source.read(base + lo, last_off + last_len - lo)
        step = layout.payload_size
        symbols = [fec.pad(raw[i : i + step], size) for i in range(0, len(raw), step)]
        shares = fec.encode(symbols, indices)
        return [
            wire.encode_parity(
                wire.Parity(self.session, chunk, block, self._fec_k, fec.MAX_SHARES, index, share), self._key
            )
            for index, share in zip(indices, shares)
        ]

    # ------------------------------------------------------------------ building datagrams

    def _data(self, seq: int, repair: bool, multicast: bool) -> bytes:
        chunk, offset, length = self.layout.locate(seq)
        payload = self._source.read(chunk * self.layout.chunk_size + offset, length)
        return wire.encode_data(wire.Data(self.session, seq, chunk, offset, payload, repair, multicast), self._key)

    def _manifest_page(self, now: float) -> bytes:
        page = self.pages[self._page_cursor]
        hint = min(max(len(self.peers), self.config.expected_receivers or 0), 2**32 - 1)
        if page.receivers_hint != hint:
            page = self.pages[self._page_cursor] = dataclasses.replace(page, receivers_hint=hint)
        self._page_cursor = (self._page_cursor + 1) % len(self.pages)
        self._last_manifest = now
        self.stats.manifests_sent += 1
        return self._encode(page)

    def _queue_manifest_page(self, now: float) -> None:
        self._control.append((self._manifest_page(now), GROUP))

    def _end(self, closing: bool) -> bytes:
        hint = max(len(self.peers), self.config.expected_receivers or 0)
        return self._encode(wire.End(self.session, self.layout.total_seq, min(hint, 2**32 - 1), closing))

    def _encode(self, msg: wire.Message) -> bytes:
        return wire.encode(msg, self._key)

    def _account(self, out: list[tuple[bytes, Dest]]) -> list[tuple[bytes, Dest]]:
        self.stats.datagrams_out += len(out)
        self.stats.bytes_out += sum(len(d) for d, _ in out)
        return out


_PARITY_JOB = object()  # marks a parity entry in the repair queue
_SHARE_MAP_LIMIT = 1 << 16


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
