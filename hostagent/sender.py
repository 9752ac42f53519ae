"""Sender state machine (sans-IO).

The sender streams every sequence number once to the group, repeating manifest pages
so late joiners can start, then serves repairs until every receiver verified the file,
failed, or the repair phase timed out. It orchestrates two policies that live in their
own modules: which NACKed ranges to repair and how (unicast, multicast or FEC parity) in
``repair.RepairPlanner``, and how fast datagrams may leave (token bucket, AIMD) in
``pacing.Pacer``. While streaming, repairs get at most ``repair_share`` of the sends.

Loss is not congestion; the group is not its slowest member. The rate is cut only when
``pacing.LossClassifier`` judges a window's loss reports to be congestion: loss reported
by more than ``congestion_quorum`` of the group at once, or drops at the sender's own
link (``send_dropped``) -- and once per congestion event: receivers' loss figures
average over ~``loss_horizon`` datagrams, so a cut on them waits until they took in that
many sent after the previous cut (``_fresh_reports``). One receiver's own loss, however
high, leaves the group's rate alone; that receiver is repaired (unicast or FEC parity) within the repair share while
the stream runs, and catches up after it -- or is reported failed as a straggler when
``linger_timeout`` after the stream it still has not verified the file.

Trust (docs/security.md, "Attackers on the data path"): only receivers the sender is told about
count. With ``allowed_receivers`` (the controller's receiver list: host addresses) a
datagram from any other host is dropped before it creates any state; without a list
every host may join, up to ``max_peers``. A peer's address is pinned at its first
datagram: another host using its id is dropped (a HELLO from the same host, new port, is
the receiver restarted and moves it). Repairs are bounded per peer (``max_nack_ranges``
per NACK; ``repair_budget`` times the file in total and ``repair_rate`` of the cap per
second, counting its unicast repairs and its share of the multicast and parity repairs
it asked for: ``pacing.PeerBudget``), a wrong-digest
COMPLETE fails that receiver only, and the transfer ends early only when every admitted
receiver is resolved: forged COMPLETEs cannot close it under the real receivers.

Like aioquic's QuicConnection it never touches a socket or a clock: feed it
``receive_datagram(data, addr, now)``, drain ``datagrams_to_send(now)``, and call
``handle_timer(now)`` at ``get_timer()``.
"""

from __future__ import annotations

import dataclasses
import hmac
import random
from collections import deque
from dataclasses import dataclass
from typing import Optional

import blake3

import hostagent.fec as fec
import hostagent.wire as wire
from .common import GROUP, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, Addr, ChunkSource, Dest, Layout, Stats
from .events import (
    ReceiverCompleted, ReceiverFailed, ReceiverJoined, SenderEvent, StreamFinished, TransferFinished,
)
from .pacing import LINK_OVERHEAD, LOSS_HORIZON, LossClassifier, Pacer, PeerBudget, RepairBudget, Verdict
from .repair import ParityRepair, RepairPlanner
from .tree import digests_root

_DIGESTS_PER_PAGE_BUDGET = 180  # bytes of a manifest page spent on fixed fields (with the id root's ~55)
_ENTRIES_PAGE_ROOM = 4096  # a page with a long entry list still carries ~250 chunk digests
_REPAIR_BURST = 16.0  # datagrams of unused repair share kept while streaming


@dataclass
class SenderConfig:
    chunk_size: int = 1024 * 1024
    payload_size: int = 1400
    rate_bps: float = 1e9  # hard cap
    initial_rate_fraction: float = 0.7  # start below the cap: switch buffers overrun on bursts
    min_rate_fraction: float = 0.05  # hard floor: only drops at the sender's own link go this low
    # Floor for cuts on loss that receivers report (None: the hard floor). Set it to a
    # rate the network is known to carry, and receivers that lose more than that are
    # repaired or fail as stragglers instead of slowing the group down.
    min_rate_bps: Optional[float] = None
    # Additive increase, as a fraction of the cap per aimd_interval without loss. Until
    # the first decrease the sender ramps fast (70% -> cap in ~30 ms): a start at
    # 70% is a precaution, not a measurement, and every slow ramp millisecond is lost
    # link time. After a real congestion signal it probes back more gently.
    ramp_increase_fraction: float = 1.0
    aimd_increase_fraction: float = 0.1
    aimd_decrease: float = 0.7
    aimd_interval: float = 0.1
    loss_tolerance: float = 0.02  # reported loss below this is noise, not congestion
    # Loss is the group's (congestion) only when more than this fraction of the receivers
    # taking part report loss above the tolerance at once; fewer: their own problem,
    # served by repair at the group's rate.
    congestion_quorum: float = 0.5
    loss_memory: float = 0.5  # seconds a receiver's loss report counts towards the quorum
    # Datagrams a receiver's loss report averages over (ReceiverConfig.loss_horizon, the
    # same constant): after a cut, the next waits until receivers took in this many more.
    loss_horizon: int = LOSS_HORIZON
    burst_bytes: int = 64 * 1024  # token bucket depth
    # Paced datagrams leave in groups of this many once the bucket allows the first (the
    # rest overdraw it, and the debt delays the next group: the same average rate). With
    # GSO it is how many datagrams one send carries, so every send is a full one: a
    # release of 8 would otherwise go out as a send of 7 and a lone datagram, which a
    # receiver's GRO hands over alone -- the slow path per datagram.
    send_quantum: int = 1
    nack_window: float = 0.02  # at nack_group_scale receivers or more; shorter below
    # Group size at which the NACK aggregation window (and the receivers' NACK backoff,
    # which scales the same way from the manifest's receivers hint) reach their full
    # length; below it both shrink with (N / nack_group_scale) ** 2. Few receivers have
    # little to suppress, and every repair round would otherwise cost the full window
    # plus the full backoff. (FEC aggregation does not suffer: requests inside the block
    # still being streamed wait for the block to complete, see repair.py.)
    nack_group_scale: int = 64
    min_nack_window: float = 0.002
    multicast_threshold: int = 2
    repair_holdoff: Optional[float] = None  # ignore NACKs for seqs multicast this recently
    shared_loss_memory: float = 1.0  # how long a unicast repair counts as one asker
    # Max fraction of the paced sends given to repairs while streaming: a lagging receiver
    # is served in parallel, and the stream (everyone else) keeps 1 - repair_share of the rate.
    repair_share: float = 0.1
    # Data datagrams between manifest pages while streaming -- until every expected
    # receiver said HELLO (each HELLO answers a page) to a manifest of one page: then
    # nobody expected needs a repeat, and one per manifest_interval is left for late joiners.
    manifest_every: int = 64
    manifest_interval: float = 0.25  # manifest page repeat when not streaming (and then)
    # Hold the data back (manifest pages only, every hold_interval) until the expected
    # receivers said HELLO, for at most this long: receivers of a controller learn the
    # transfer's key from its announcement a poll after the sender made it, and data
    # sent before they can check it is data they must ask for again. 0: no hold.
    start_wait: float = 0.0
    hold_interval: float = 0.02
    end_interval: float = 0.1
    expected_receivers: Optional[int] = None
    receiver_timeout: float = 5.0  # incomplete receiver silent this long after END: failed
    idle_timeout: float = 2.0  # all known receivers resolved and quiet this long: finish
    # Catch-up bound: how long receivers that have not verified the file when the stream
    # ends are still served; then each is reported failed ("straggler: ...").
    linger_timeout: float = 60.0
    max_datagram: int = 1472
    session_id: Optional[int] = None
    key: Optional[bytes] = None
    name: str = ""
    # Trust and bounds (docs/security.md, "Attackers on the data path"). Host addresses (the first
    # element of an Addr tuple) allowed to be receivers; None: any host (plain --group).
    allowed_receivers: Optional[frozenset[str]] = None
    max_peers: int = 4096  # beyond: new receiver ids are dropped and counted
    hello_expiry: float = 2.0  # a peer heard only by HELLO, silent this long, may be evicted for a new one
    # Ranges of one NACK taken in; the rest are ignored (bounded work per NACK). 1024 holds
    # a full standard-MTU NACK (~700 ranges); a jumbo one (~4400) is cut, and re-asked.
    max_nack_ranges: int = 1024
    # Repair bytes one peer may cost, as a multiple of the file's datagram bytes (plus a
    # margin of 64 datagrams): unicast repairs to it, and its share of every multicast
    # or parity repair it asked for. Beyond, its requests are ignored.
    repair_budget: float = 1.5
    # ... and how fast: bytes/s per peer as a fraction of the rate cap, in bursts of up
    # to repair_burst seconds at that rate. A request is cut to what the peer can
    # afford now (counted: repair_rate_limited); a real receiver asks again.
    repair_rate: float = 0.5
    repair_burst: float = 1.0
    # FEC: datagrams per parity block (0: off, plain per-datagram repair only).
    fec_k: int = 0
    fec_overhead: float = 0.0  # proactive parity shares per data datagram (e.g. 0.02)
    # One receiver asks for part of a block, but the others' reported loss says more
    # will: answer with (multicast) parity instead of unicast. Same cost to the sender.
    # And at each NACK window, every block streamed since the last one gets the shares
    # the group's reported loss says at least two receivers will need (repair.py).
    fec_anticipate: bool = True
    # This session is lane (index, count) of a striped transfer, sending the slice of the
    # file that starts at byte offset (hostagent.lanes); (0, 1, 0): the whole file.
    lane: tuple[int, int, int] = (0, 1, 0)

    def validate(self) -> None:
        """Refuse settings that would break the wire format or the pacing maths."""
        if not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk_size must be {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}")
        if not wire.MIN_PAYLOAD <= self.payload_size <= self.max_datagram - wire.DATA_HEADER_LEN - wire.MAC_LEN:
            raise ValueError("payload_size does not fit max_datagram")
        if self.rate_bps <= 0:
            raise ValueError("rate must be positive")
        if not 1 <= self.send_quantum <= 64:
            raise ValueError("send_quantum must be 1..64")
        if not 0 < self.initial_rate_fraction <= 1 or not 0 < self.min_rate_fraction <= 1:
            raise ValueError("rate fractions must be in (0, 1]")
        if self.min_rate_bps is not None and not 0 < self.min_rate_bps <= self.rate_bps:
            raise ValueError("min_rate must be positive and at most the rate cap")
        if not 0 <= self.congestion_quorum < 1 or self.loss_memory <= 0:
            raise ValueError("congestion_quorum must be in [0, 1) and loss_memory > 0")
        if not 0 <= self.repair_share <= 1 or self.linger_timeout <= 0:
            raise ValueError("repair_share must be in [0, 1] and linger_timeout > 0")
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
        if self.loss_horizon < 1:
            raise ValueError("loss_horizon must be >= 1")
        if self.max_peers < 1 or self.max_nack_ranges < 1 or self.repair_budget <= 0 or self.hello_expiry <= 0:
            raise ValueError("max_peers, max_nack_ranges, repair_budget and hello_expiry must be positive")
        if not 0 < self.repair_rate <= 1 or self.repair_burst <= 0:
            raise ValueError("repair_rate must be in (0, 1] and repair_burst > 0")
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
    loss_over: int = 0  # datagrams that figure averaged over (streamed since it joined)
    first_seq: int = 0  # stream position when it joined
    budget: Optional[PeerBudget] = None  # what its repairs may cost (set on admission)
    rejected: bool = False  # sent a COMPLETE with a wrong digest: failed, without failing the transfer


def _host(addr: Addr) -> object:
    """The host part of an address: (host, port) tuples compare by host."""
    return addr[0] if isinstance(addr, tuple) and addr else addr


def file_digests(source: ChunkSource, chunk_size: int) -> tuple[bytes, bytes]:
    """Read the file once: (every chunk's digest, concatenated; the whole-file digest)."""
    layout = Layout(source.size, chunk_size, chunk_size)
    whole = blake3.blake3()
    digests = bytearray()
    for chunk in range(layout.chunk_count):
        data = source.read(chunk * layout.chunk_size, layout.chunk_len(chunk))
        if len(data) != layout.chunk_len(chunk):
            raise ValueError("source returned a short read")
        whole.update(data)
        digests += wire.chunk_digest(data)
    return bytes(digests), whole.digest()


def check_chunk_count(size: int, chunk_size: int) -> None:
    """Receivers refuse a manifest of more than ``wire.MAX_CHUNK_COUNT`` chunks: say so
    before anything reads the file (ValueError)."""
    count = -(-size // chunk_size)
    if count > wire.MAX_CHUNK_COUNT:
        raise ValueError(f"{count} chunks of {chunk_size} bytes: at most "
                         f"{wire.MAX_CHUNK_COUNT}; use a larger chunk size")


def build_manifest_pages(source: ChunkSource, config: SenderConfig, session: int,
                         known: Optional[tuple[bytes, bytes]] = None, entries: bytes = b"",
                         whole: Optional[tuple[int, bytes]] = None) -> list[wire.Manifest]:
    """Digest the file (``file_digests``, unless ``known`` already holds its result, e.g.
    from hostagent.manifest's cache); split the digest list into pages that each fit in
    one datagram. ``entries``: a directory's entry list (``hostagent.tree``), carried in
    every page; a long one makes pages larger than a frame (IP fragments them), never
    more than one datagram. ``whole``: the (size, ``tree.digests_root``) the content id
    names when ``source`` is a slice of the content (a lane), carried in every page
    (``wire.Manifest.id_root``), as this file's own is when it takes several pages."""
    check_chunk_count(source.size, config.chunk_size)
    layout = Layout(source.size, config.chunk_size, config.payload_size)
    digests, file_digest = known if known is not None else file_digests(source, config.chunk_size)
    room = config.max_datagram
    if entries:
        room = min(wire.MAX_DATAGRAM, max(room, len(entries) + _ENTRIES_PAGE_ROOM))
    budget = room - wire.HEADER_LEN - wire.MAC_LEN - _DIGESTS_PER_PAGE_BUDGET
    budget -= len(config.name.encode()) + (len(entries) + 5 if entries else 0)
    per_page = max(1, budget // wire.CHUNK_DIGEST_LEN)
    page_count = max(1, -(-layout.chunk_count // per_page))
    if whole is None and page_count > 1:
        whole = (layout.file_size, digests_root(digests))
    pages = []
    for index in range(page_count):
        first = index * per_page
        last = min(layout.chunk_count, first + per_page)
        pages.append(
            wire.Manifest(
                session, layout.file_size, layout.chunk_size, layout.payload_size,
                layout.chunk_count, file_digest, index, page_count, first,
                bytes(digests[first * wire.CHUNK_DIGEST_LEN : last * wire.CHUNK_DIGEST_LEN]),
                config.name, lane=config.lane, entries=entries, id_root=whole or (0, b""),
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
        rng = rng or random.Random()
        self.session = config.session_id if config.session_id is not None else rng.getrandbits(64)
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
        self._hold_until: Optional[float] = now + config.start_wait if config.start_wait > 0 else None
        self._last_end = -1e18
        self._budget = RepairBudget(config.repair_share, _REPAIR_BURST)

        initial = config.initial_rate_fraction
        if config.min_rate_bps is not None:  # a floor above the start: start there
            initial = max(initial, config.min_rate_bps / config.rate_bps)
        self._pacer = Pacer(
            config.rate_bps, now, initial_fraction=initial,
            min_fraction=config.min_rate_fraction, ramp_increase=config.ramp_increase_fraction,
            increase=config.aimd_increase_fraction, decrease=config.aimd_decrease,
            interval=config.aimd_interval, burst_bytes=config.burst_bytes, max_datagram=config.max_datagram,
        )
        self._repair = RepairPlanner(
            self.layout, rng, multicast_threshold=config.multicast_threshold,
            repair_holdoff=config.repair_holdoff, shared_loss_memory=config.shared_loss_memory,
            min_nack_window=config.min_nack_window, fec_k=config.fec_k, fec_overhead=config.fec_overhead,
            fec_anticipate=config.fec_anticipate, loss_horizon=config.loss_horizon,
        )
        self._parity_cache: dict[tuple[int, int, int], bytes] = {}  # encoded shares of queued jobs
        self._loss = LossClassifier(
            quorum=config.congestion_quorum, tolerance=config.loss_tolerance, memory=config.loss_memory,
        )
        # Datagrams the receivers' loss figures took in since the last rate cut (None:
        # never cut): first transmissions, and after the stream the repairs.
        self._since_cut: Optional[int] = None

        # receivers
        self.peers: dict[int, _Peer] = {}
        self._allowed = config.allowed_receivers
        self._open: set[int] = set()  # admitted, neither completed nor failed
        self._n_completed = 0
        self._fresh: dict[int, None] = {}  # heard only by HELLO, oldest first: evictable
        self._sweep_at: Optional[float] = None  # earliest possible receiver timeout (after the stream)
        self.peer_sweeps = 0  # timeout sweeps over the open peers (each visits at most max_peers)
        self._repair_cap = int(config.repair_budget * (
            self.layout.file_size + self.layout.total_seq * (wire.DATA_HEADER_LEN + wire.MAC_LEN))) \
            + 64 * config.max_datagram
        self._peer_rate = config.repair_rate * config.rate_bps / 8  # bytes/s
        self._datagram_bytes = config.payload_size + wire.DATA_HEADER_LEN + wire.MAC_LEN
        self._last_activity = now
        self.finished = False
        self.closed = False

    # ------------------------------------------------------------------ public API

    def receive_datagram(self, data: bytes, addr: Addr, now: float) -> None:
        """Process one datagram from a receiver; garbage is counted and dropped."""
        self.stats.datagrams_in += 1
        self.stats.bytes_in += len(data)
        if wire.data_session(data) is not None:  # data is never for a sender: not worth its tag
            self.stats.drops["unexpected_type"] += 1
            return
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
            self._peer(msg.receiver_id, addr, now, hello=True)
        else:
            # Our own multicast looped back, or another sender: not for us.
            self.stats.drops["unexpected_type"] += 1

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Dest]]:
        """Everything that may leave now: control first, then paced repairs/data."""
        out = self._control
        self._control = []
        if self.closed:
            return self._account(out)
        pacer = self._pacer
        pacer.refill(now)
        if self._stream_done_at is not None and now >= self._last_end + self.config.end_interval:
            out.append((self._end(False), GROUP))
            self._last_end = now
        quantum, more = self.config.send_quantum, True
        while more and pacer.may_send:
            group: list[tuple[bytes, Dest]] = []
            while len(group) < quantum:
                item = self._next_paced(now)
                if item is None:
                    more = False
                    break
                pacer.spend(len(item[0]) + LINK_OVERHEAD)
                if quantum > 1 and item[0][3] != wire.T_DATA and item[0][3] != wire.T_REPAIR:
                    out.append(item)  # (a manifest page goes ahead, not into the middle of a send)
                else:
                    group.append(item)
            out.extend(group)
        if (self._next_seq >= self.layout.total_seq and self._stream_done_at is None
                and not self._repair.proactive_queued):
            self._stream_done_at = now
            self._sweep_at = now + self.config.receiver_timeout
            self._events.append(StreamFinished(self.layout.total_seq))
            out.append((self._end(False), GROUP))
            self._last_end = now
        return self._account(out)

    def send_dropped(self, count: int, now: float) -> None:
        """The socket layer could not send ``count`` datagrams (send buffer or link full):
        congestion at the one link every datagram crosses, whatever receivers report.
        The rate is cut when the window this opens closes."""
        if count <= 0 or self.closed:
            return
        self._loss.send_dropped(count)
        self._pacer.congested = True  # hold the rate increase until the verdict
        self._repair.open_window(now + self.nack_window, True)

    def get_timer(self) -> Optional[float]:
        """Earliest time at which handle_timer or datagrams_to_send has work."""
        if self.closed:
            return None
        times: list[float] = []
        if self._repair.deadline is not None:
            times.append(self._repair.deadline)
        if self._hold_until is not None:
            times.append(min(self._hold_until, self._last_manifest + self.config.hold_interval))
        elif self._has_paced_work():
            times.append(self._pacer.next_send_at())
        if self._stream_done_at is None:
            times.append(self._last_manifest + self.config.manifest_interval)
        else:
            times.append(self._last_end + self.config.end_interval)
            times.append(self._last_manifest + self.config.manifest_interval)
            times.append(self._stream_done_at + self.config.linger_timeout)
            if not self._open:
                times.append(self._last_activity + self.config.idle_timeout)
            elif self._sweep_at is not None:
                times.append(self._sweep_at)
        return min(times)

    def handle_timer(self, now: float) -> None:
        """Close the NACK window, time out stragglers, finish when everyone is done."""
        if self.closed:
            return
        if self._repair.deadline is not None and now >= self._repair.deadline:
            self._close_window(now)
        if self._stream_done_at is None and now >= self._last_manifest + self.config.manifest_interval:
            self._queue_manifest_page(now)
        if self._stream_done_at is not None:
            if now >= self._last_manifest + self.config.manifest_interval:
                self._queue_manifest_page(now)
            self._check_stragglers(now)

    def next_event(self) -> Optional[SenderEvent]:
        return self._events.popleft() if self._events else None

    def set_expected_receivers(self, count: int) -> None:
        """Receivers that must verify before the session may end early: a caller that
        admits late joiners (``modelcast serve``) raises it as it admits them, so the
        session waits for one whose HELLO came before it was admitted (and was dropped)."""
        self.config.expected_receivers = max(count, self._n_completed)

    def end_now(self, now: float) -> None:
        """End the session before its stream is over, as if everyone were done: the
        caller knows nobody needs the rest (``modelcast serve``: every receiver the
        round serves verified). The closing END tells the others."""
        self._finish(now)

    def set_allowed_receivers(self, hosts: Optional[frozenset[str]]) -> None:
        """The receiver list changed (a late joiner joined through the controller): admit
        datagrams from these hosts from now on. Peers already admitted stay (a receiver
        leaves the controller's group once it verified the file)."""
        self._allowed = hosts

    @property
    def allowed_receivers(self) -> Optional[frozenset[str]]:
        """Hosts admitted as receivers (None: any)."""
        return self._allowed

    @property
    def completed(self) -> list[int]:
        return sorted(p.receiver_id for p in self.peers.values() if p.completed)

    @property
    def rate(self) -> float:
        """Current pacing rate, bits/s."""
        return self._pacer.rate

    @property
    def lowest_rate(self) -> Optional[float]:
        """The pacing rate after the deepest cut so far, bits/s (None: never cut)."""
        return self._pacer.lowest_cut

    @property
    def loss_verdicts(self) -> dict[str, int]:
        """Closed NACK windows by what their loss meant: none, local (one receiver's own
        problem, repaired), group or link (congestion: the rate was cut, at most once
        per interval)."""
        return {v.value: n for v, n in self._loss.verdicts.items()}

    @property
    def stream_done_at(self) -> Optional[float]:
        """When the last first transmission left (None: still streaming)."""
        return self._stream_done_at

    @property
    def stream_position(self) -> int:
        """Sequence numbers sent once so far (first-pass progress)."""
        return self._next_seq

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

    def _peer(self, rid: int, addr: Addr, now: float, hello: bool = False) -> Optional[_Peer]:
        """The admitted peer ``rid`` for a datagram from ``addr``, or None (dropped and
        counted): a host not on the list, a known id from another host (or, except in a
        HELLO, from another port of its host), a full peer table."""
        peer = self.peers.get(rid)
        if peer is not None:
            if peer.addr != addr:
                if not (hello and _host(peer.addr) == _host(addr)):
                    self.stats.drops["peer_addr_mismatch"] += 1
                    return None
                peer.addr = addr  # the receiver restarted on its host: new socket, same id
            if not hello:
                self._fresh.pop(rid, None)
            elif rid in self._fresh:
                del self._fresh[rid]
                self._fresh[rid] = None  # youngest again
            peer.last_heard = now
            self._last_activity = now
            return peer
        if self._allowed is not None and _host(addr) not in self._allowed:
            self.stats.drops["unlisted_receiver"] += 1
            return None
        if len(self.peers) >= self.config.max_peers and not self._evict_one(now):
            self.stats.drops["peer_table_full"] += 1
            return None
        self._last_activity = now
        peer = self.peers[rid] = _Peer(rid, addr, now, first_seq=self._next_seq, budget=PeerBudget(
            self._repair_cap, self._peer_rate, self._peer_rate * self.config.repair_burst, now,
            unit=self._datagram_bytes))
        self._open.add(rid)
        if hello:
            self._fresh[rid] = None
        if self._stream_done_at is not None:
            deadline = now + self.config.receiver_timeout
            self._sweep_at = deadline if self._sweep_at is None else min(self._sweep_at, deadline)
        self._events.append(ReceiverJoined(rid, addr))
        return peer

    def _evict_one(self, now: float) -> bool:
        """Make room: forget the peer heard longest ago only by HELLO, if it has been
        silent ``hello_expiry`` (a flood of invented ids cannot push out working peers)."""
        if not self._fresh:
            return False
        rid = next(iter(self._fresh))
        peer = self.peers[rid]
        if now < peer.last_heard + self.config.hello_expiry:
            return False
        del self._fresh[rid]
        del self.peers[rid]
        self._open.discard(rid)
        self._repair.forget(rid)
        self._loss.forget(rid)
        self.stats.drops["peer_evicted"] += 1
        return True

    def _resolved(self, peer: _Peer) -> None:
        self._open.discard(peer.receiver_id)
        self._fresh.pop(peer.receiver_id, None)

    def _on_complete(self, msg: wire.Complete, addr: Addr, now: float) -> None:
        peer = self._peer(msg.receiver_id, addr, now)
        if peer is None:
            return
        if not hmac.compare_digest(msg.file_digest, self.file_digest):
            # A real receiver verifies before it says COMPLETE: this one is broken or
            # forged. It fails alone; the transfer's verdict rests on the others.
            if not (peer.failed or peer.completed):
                peer.rejected = True
                self._fail(peer, "digest mismatch")
            return
        self._control.append((self._encode(wire.CompleteAck(self.session, msg.receiver_id)), peer.addr))
        if not peer.completed:
            peer.completed = True
            peer.failed = False
            peer.rejected = False
            self._n_completed += 1
            self._resolved(peer)
            self._repair.forget(peer.receiver_id)
            self._events.append(ReceiverCompleted(peer.receiver_id, peer.addr))
            self._maybe_finish(now)

    def _check_stragglers(self, now: float) -> None:
        assert self._stream_done_at is not None
        cfg = self.config
        if self._sweep_at is not None and now >= self._sweep_at and self._open:
            # Only the open peers, and only when one may have timed out.
            self.peer_sweeps += 1
            earliest: Optional[float] = None
            for rid in list(self._open):
                peer = self.peers[rid]
                deadline = max(peer.last_heard, self._stream_done_at) + cfg.receiver_timeout
                if now >= deadline:
                    self._fail(peer, "timed out")
                elif earliest is None or deadline < earliest:
                    earliest = deadline
            self._sweep_at = earliest
        if now >= self._stream_done_at + cfg.linger_timeout:
            for rid in list(self._open):
                self._fail(self.peers[rid], f"straggler: not verified {cfg.linger_timeout:g} s after the stream ended")
            self._finish(now)
            return
        if not self._open and now >= self._last_activity + cfg.idle_timeout:
            self._finish(now)

    def _fail(self, peer: _Peer, reason: str) -> None:
        peer.failed = True
        self._resolved(peer)
        self._repair.forget(peer.receiver_id)
        self._loss.forget(peer.receiver_id)
        self._events.append(ReceiverFailed(peer.receiver_id, reason))

    def _maybe_finish(self, now: float) -> None:
        """End early once the expected number verified and no admitted receiver is
        still at work: COMPLETEs from invented ids never close the session under the
        real receivers."""
        expected = self.config.expected_receivers
        if (expected is not None and not self._open and self._n_completed >= expected
                and self._stream_done_at is not None):
            self._finish(now)

    def _finish(self, now: float) -> None:
        if self.finished:
            return
        self.finished = True
        completed = tuple(self.completed)
        failed = tuple(sorted(p.receiver_id for p in self.peers.values() if p.failed))
        expected = self.config.expected_receivers
        missing = max(0, expected - len(self.peers)) if expected is not None else 0
        # A wrong-digest COMPLETE fails its sender, not the transfer.
        counted = any(p.failed and not p.rejected for p in self.peers.values())
        ok = not counted and (len(completed) >= expected if expected is not None else bool(completed))
        self._events.append(TransferFinished(ok, completed, failed, missing))
        closing = self._end(True)
        self._control.extend([(closing, GROUP)] * 3)  # cheap insurance against loss
        self.closed = True

    # ------------------------------------------------------------------ NACKs

    def _on_nack(self, msg: wire.Nack, addr: Addr, now: float) -> None:
        peer = self._peer(msg.receiver_id, addr, now)
        if peer is None:
            return
        self.stats.nacks_received += 1
        if peer.completed or peer.failed:
            return
        peer.loss = msg.loss_permille / 1000
        peer.loss_over = self._next_seq - peer.first_seq
        asked = msg.ranges
        if len(asked) > self.config.max_nack_ranges:
            # Bounded work per NACK; a real receiver asks again for the rest.
            self.stats.drops["nack_ranges_cut"] += 1
            asked = asked[: self.config.max_nack_ranges]
        limit = self._next_seq  # cannot repair what has not been sent yet
        ranges = [(start, min(end, limit)) for start, end in asked if min(end, limit) > start]
        ranges = self._affordable(peer, ranges, now)
        # The receiver measures loss of first transmissions since its last NACK, so this
        # is recent loss, not a late joiner catching up. Whether it is congestion (the
        # group's) or this receiver's own is judged when the window closes.
        if self._loss.report(peer.receiver_id, peer.loss, now, bool(ranges)) and self._loss.shared(
                now, self._taking_part()):
            self._pacer.congested = True  # looks like the group's: hold the rate increase until the verdict
        window = self.nack_window
        self._repair.nack(msg.receiver_id, ranges, now, window)
        self._charge_group_repairs(now)
        self._repair.open_window(now + window, self._loss.pending)

    def _affordable(self, peer: _Peer, ranges: list[tuple[int, int]], now: float) -> list[tuple[int, int]]:
        """The leading part of ``ranges`` the peer's repair budget still covers."""
        budget = peer.budget
        assert budget is not None
        if not ranges:
            return ranges
        if budget.exhausted:
            self.stats.drops["repair_budget_spent"] += 1
            return []
        left = int(budget.affordable(now) // self._datagram_bytes)
        kept: list[tuple[int, int]] = []
        for start, end in ranges:
            if left <= 0:
                break
            kept.append((start, min(end, start + left)))
            left -= kept[-1][1] - start
        if sum(e - s for s, e in kept) < sum(e - s for s, e in ranges):
            self.stats.drops["repair_rate_limited"] += 1
        return kept

    def _charge_group_repairs(self, now: float) -> None:
        """The multicast and parity repairs just queued, their cost split among the
        receivers that asked for them (once per queued range, not per datagram)."""
        for askers, datagrams in self._repair.take_charges():
            share = datagrams * self._datagram_bytes / len(askers)
            for rid in askers:
                peer = self.peers.get(rid)
                if peer is not None and peer.budget is not None:
                    peer.budget.charge(share, now)

    def _close_window(self, now: float) -> None:
        """Plan the repairs of the window's requests, then judge its loss reports: only
        congestion cuts the rate, and loss the receivers report never takes it below
        ``min_rate_bps`` (drops at our own link may)."""
        pacer = self._pacer
        self._repair.close_window(now, self.peers, self._next_seq, pacer.rate, self.nack_window, pacer.congested)
        self._charge_group_repairs(now)
        verdict = self._loss.verdict(now, self._taking_part())
        # Only congestion cuts; one receiver's own loss is repaired at the group's rate.
        pacer.congested = verdict in (Verdict.GROUP, Verdict.LINK)
        floor = self.config.min_rate_bps if verdict is Verdict.GROUP else None
        fresh = verdict is Verdict.LINK or self._fresh_reports()
        if pacer.window_closed(now, floor, may_cut=fresh):
            self.stats.rate_decreases += 1
            self._since_cut = 0
        elif verdict is Verdict.GROUP and not fresh:
            # The group still reports the loss the last cut answered: no cut, and no
            # increase either until its figures caught up (``_took_in``).
            pacer.congested = True

    def _fresh_reports(self) -> bool:
        """Can the receivers' loss reports show loss newer than the last cut? Each
        averages over ~``loss_horizon`` datagrams, so one shared burst (a switch that
        stalled for 20 ms) keeps the whole group above the tolerance for that many
        datagrams -- longer, in seconds, the lower the rate. Read as new congestion
        window after window, it cut the rate towards the floor (9-81 cuts for one
        stall, 2-8x the transfer time in the simulator). One cut per congestion event:
        the next waits until the receivers took in that many datagrams sent after the
        cut. Drops at our own link are fresh news and cut at once."""
        return self._since_cut is None or self._since_cut >= self.config.loss_horizon

    def _took_in(self) -> None:
        """One more datagram in the receivers' loss figures (a first transmission; after
        the stream, a repair): once they hold ``loss_horizon`` sent after the last cut,
        the rate may grow again, and be cut again if the group still reports loss."""
        if self._since_cut is not None and self._since_cut < self.config.loss_horizon:
            self._since_cut += 1
            if self._since_cut == self.config.loss_horizon:
                self._pacer.congested = False

    def _taking_part(self) -> int:
        """Receivers the congestion quorum counts: all not failed (verified ones too),
        or the expected number if more (some have not said hello yet)."""
        failed = len(self.peers) - len(self._open) - self._n_completed
        expected = (self.config.expected_receivers or 0) - failed
        return max(1, len(self.peers) - failed, expected)

    # ------------------------------------------------------------------ paced sends

    def _has_paced_work(self) -> bool:
        return self._repair.queued or self._repair.proactive_queued or self._next_seq < self.layout.total_seq

    def _holding(self, now: float) -> bool:
        """Still waiting for the expected receivers' HELLOs before the first data?"""
        if self._hold_until is None:
            return False
        if now >= self._hold_until or len(self.peers) >= (self.config.expected_receivers or 1):
            self._hold_until = None
            return False
        return True

    def _next_paced(self, now: float) -> Optional[tuple[bytes, Dest]]:
        if self._holding(now):
            if now >= self._last_manifest + self.config.hold_interval or not self.stats.manifests_sent:
                return self._manifest_page(now), GROUP
            return None
        share = self._repair.next_proactive()
        if share is not None:
            raw = self._parity(share)
            self.stats.parity_proactive += 1
            self.stats.parity_bytes_proactive += len(raw)
            return raw, GROUP
        streaming = self._next_seq < self.layout.total_seq
        if streaming and self._since_manifest >= self.config.manifest_every and self._manifest_wanted(now):
            self._since_manifest = 0
            return self._manifest_page(now), GROUP
        if self._repair.queued and (not streaming or self._budget.allows):
            item = self._pop_repair(now)
            if item is not None:
                if streaming:
                    self._budget.sent(repair=True)
                else:
                    self._took_in()
                return item
        if not streaming:
            return None
        seq = self._next_seq
        self._next_seq += 1
        self._since_manifest += 1
        self._budget.sent(repair=False)
        self._took_in()
        data = self._data(seq, repair=False, multicast=True)
        self.stats.data_sent += 1
        self.stats.data_bytes_sent += len(data)
        self._repair.stream_sent(seq)
        return data, GROUP

    def _manifest_wanted(self, now: float) -> bool:
        """A manifest page is due in the stream: someone expected may still lack the
        manifest (not every expected receiver said HELLO, or it has pages a HELLO does
        not vouch for), or a late joiner's manifest_interval has passed. At 150 Mbit/s
        and MTU 1500 the repeats every 64 datagrams were 1.6% of the datagrams sent."""
        expected = self.config.expected_receivers
        if len(self.pages) > 1 or not expected or len(self.peers) < expected:
            return True
        return now >= self._last_manifest + self.config.manifest_interval

    def _pop_repair(self, now: float) -> Optional[tuple[bytes, Dest]]:
        repair = self._repair.next_repair(now, self.peers)
        if repair is None:
            return None
        if isinstance(repair, ParityRepair):
            raw = self._parity(repair)
            self.stats.repairs_parity += 1
            self.stats.repair_bytes_parity += len(raw)
            return raw, GROUP
        if repair.receiver_id is None:
            raw = self._data(repair.seq, repair=True, multicast=True)
            self.stats.repairs_multicast += 1
            self.stats.repair_bytes_multicast += len(raw)
            return raw, GROUP
        peer = self.peers[repair.receiver_id]
        raw = self._data(repair.seq, repair=True, multicast=False)
        self.stats.repairs_unicast += 1
        self.stats.repair_bytes_unicast += len(raw)
        assert peer.budget is not None
        peer.budget.charge(len(raw), now)
        if peer.budget.exhausted:
            self._repair.forget(peer.receiver_id)  # budget spent: its queue goes too
        return raw, peer.addr

    # ------------------------------------------------------------------ building datagrams

    def _data(self, seq: int, repair: bool, multicast: bool) -> bytes:
        chunk, offset, length = self.layout.locate(seq)
        payload = self._source.read(chunk * self.layout.chunk_size + offset, length)
        return wire.data_datagram(self.session, seq, chunk, offset, payload, repair, multicast, self._key)

    def _parity(self, share: ParityRepair) -> bytes:
        """One parity datagram; a job's shares are encoded together, on its first share."""
        key = (share.chunk, share.block, share.index)
        if key not in self._parity_cache:
            encoded = self._parity_datagrams(share.chunk, share.block, share.first, share.end, share.remaining)
            for index, raw in zip(share.remaining, encoded):
                self._parity_cache[(share.chunk, share.block, index)] = raw
        return self._parity_cache.pop(key)

    def _parity_datagrams(self, chunk: int, block: int, first: int, end: int, indices: tuple[int, ...]) -> list[bytes]:
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
                wire.Parity(self.session, chunk, block, self.config.fec_k, fec.MAX_SHARES, index, share), self._key
            )
            for index, share in zip(indices, shares)
        ]

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
