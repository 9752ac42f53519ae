"""Receiver state machine (sans-IO).

Writes fragments straight to the sink at their file offset (so lost fragments never pin
a chunk in memory), verifies each chunk against the manifest digest when its last
fragment lands, and NACKs gaps after a randomised backoff. The backoff follows an
exponential distribution truncated at ``nack_backoff`` (Nonnenmacher & Biersack) with
a group-size hint from the sender, so when a loss is shared by the whole group only a
few receivers NACK before the multicast repair arrives and suppresses the rest. Both
the backoff and the sender's aggregation window shrink quadratically for groups below
``nack_group_scale``, where there is little to suppress. A NACKed range is asked for
again after an adaptive timeout (smoothed NACK-to-repair delay, Jacobson style; short
once END says the stream is over), never while its repairs are visibly still arriving.

Every detected gap carries its own timer (as in SRM), so a gap that another receiver
already got repaired by multicast is simply found filled when its timer fires; a single
shared timer would let new gaps ride on old timers and fire in lockstep.

Timers fire at most once per ``nack_tick``: gaps due within a tick go out together
(a receiver at 50% loss has a gap every other datagram). A NACKed range is asked for
again after at most ``nack_retry``, or as soon as the sender, which serves a request in
order, has served a later seq of the same request -- so a receiver at heavy loss keeps
talking to the sender (never silent past its ``receiver_timeout``) and, once END says
the stream is over, asks for everything it misses within a few ticks: catch-up runs
near the sender's rate instead of in generations of retry timeouts.

Loss reports: the sender cuts its rate only for loss a quorum of the group reports,
but NACK suppression leaves only a few receivers NACKing a loss they all share. So
while the stream runs, a receiver whose first-transmission loss (a per-datagram
average over ~``loss_horizon`` datagrams) is above ``loss_report_threshold`` also sends
a NACK without ranges every ``loss_report_interval`` -- at once when a gap takes it
there -- never suppressed: one small datagram per lossy receiver per interval.

PARITY shares are kept per FEC block while the block has holes; as soon as data plus
shares reach the block's k, the missing datagrams are rebuilt (``hostagent.fec``) and
written like any fragment, so the chunk digest still decides what is good. A NACK asks
only for as many datagrams of a block as the held shares do not already cover.

Work is bounded by what arrives, not by what a peer claims: the wire refuses manifests
with tiny chunks or huge chunk counts, chunk digests are stored per page received, held
parity shares are capped in bytes, and the NACK bookkeeping is kept incrementally.

Resume: a record of the verified chunks is handed to the sink at most
``state_save_interval`` after progress (the sink makes the data durable first). A
restarted receiver treats the chunks its record claims as held but re-hashes each
before it counts (a slice per timer call, interleaved with receiving); a claim that does
not match is re-fetched. A record only ever claims chunks that matched their digests, so
no failure can poison the next run.
"""

from __future__ import annotations

import heapq
import hmac
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Optional

import msgpack

import hostagent.fastrun as fastrun
import hostagent.fec as fec
import hostagent.tree as tree
import hostagent.wire as wire
from .common import RESUME_INTERVAL, Addr, ChunkSink, Layout, Stats, read_view, write_parts
from .events import ChunkCorrupt, Failed, FileComplete, ManifestReceived, ReceiverEvent
from .pacing import LOSS_HORIZON
from .rangeset import RangeSet

STATE_VERSION = 1
# Parity shares held while their blocks have holes, in bytes (payload plus a fixed
# charge per share for its bookkeeping): forged or surplus shares past this are dropped
# and counted (``parity_overflow``), so they cannot grow memory beyond it; a block that
# loses its shares this way is still repaired by NACK.
MAX_PARITY_BYTES = 32 * 1024 * 1024
PARITY_SHARE_OVERHEAD = 256
DIGEST_SEGMENT = 1024  # chunk digests are stored in segments of this many chunks (16 KiB)
_PAGES_KEPT = 1024  # manifest pages remembered for their repeats (~9 MB at jumbo frames; past it, checked anew)
# DATA that arrives before the first manifest page (a receiver that lost the first page, or
# joined late) is held, up to this many bytes, and taken once a page arrives, instead of
# dropped and asked for again. Pages come every ``SenderConfig.manifest_every`` (64) data
# datagrams, ~0.6 MB at jumbo frames: 4 MiB covers several lost pages in a row.
EARLY_BYTES = 4 << 20


@dataclass
class ReceiverConfig:
    receiver_id: Optional[int] = None  # None: random 64-bit id
    session_id: Optional[int] = None  # None: lock onto the first session whose manifest arrives
    # The file the announced transfer sends (None: any): a manifest of another is refused,
    # so a replayed earlier transfer cannot be "completed" (docs/security.md).
    file_digest: Optional[bytes] = None
    # The model's content id (``hostagent.tree``, ``recv --expect``; None: any): a manifest
    # that does not hash to it is refused, whoever MAC'd it.
    content_id: Optional[bytes] = None
    key: Optional[bytes] = None
    # Upper bound of the random NACK delay. Must exceed the sender's aggregation window
    # plus a round trip, or the first multicast repair comes too late to suppress anyone.
    nack_backoff: float = 0.08  # at nack_group_scale receivers or more
    # The backoff shrinks with (hint / nack_group_scale) ** 2 below this many receivers:
    # with few receivers there is little to suppress, and each repair round would
    # otherwise wait the full backoff (the sender's aggregation window scales alike).
    nack_group_scale: int = 64
    min_nack_backoff: float = 0.003  # lets a slightly reordered datagram fill its gap first
    nack_retry: float = 0.6  # re-request what is still missing after at most this long ...
    min_nack_retry: float = 0.03  # ... or sooner: a few measured NACK-to-repair delays
    loss_horizon: int = LOSS_HORIZON  # datagrams the reported loss rate averages over
    max_nacks_per_round: int = 4  # NACK datagrams per timer expiry; the rest waits
    # NACK rounds at most this often: gaps falling due within one tick go out together,
    # so a receiver with a gap every other datagram fires hundreds, not tens of
    # thousands, of timers per second.
    nack_tick: float = 0.003
    # While the stream runs and this receiver's first-transmission loss is above
    # loss_report_threshold, it tells the sender so every loss_report_interval in a NACK
    # without ranges, never suppressed: suppression leaves only a few NACKs for a loss the
    # whole group shares, and the sender's congestion quorum counts every lossy receiver.
    loss_report_threshold: float = 0.02
    loss_report_interval: float = 0.25
    complete_interval: float = 0.2
    complete_attempts: int = 20
    # Sender silent this long: give up. Only news counts as hearing from it: a manifest
    # page refused, or one already taken, does not (a liar repeating it cannot hold us).
    idle_timeout: float = 10.0
    # Give up at this time (the clock of ``now``) whatever arrives (None: never): a fetch
    # attempt's hard bound, so a source that trickles, lies or stalls cannot hold it.
    deadline: Optional[float] = None
    max_datagram: int = 1472
    max_parity_bytes: int = MAX_PARITY_BYTES
    # The resume record is saved at most this long after progress (newly verified chunks),
    # so a crash loses at most this much of the transfer. The sink makes the data durable
    # before the record that claims it (FileSink: fdatasync, off the receive loop).
    state_save_interval: float = RESUME_INTERVAL
    # Chunks a resume record claims are re-hashed before they count (a crash may have
    # left them torn, the disk may have lost them): this many bytes per call of
    # handle_timer, interleaved with receiving, instead of one pass before joining.
    resume_check_bytes: int = 4 * 1024 * 1024
    # Lane (index, count) of a striped transfer this receiver takes (hostagent.lanes):
    # manifests of any other lane are dropped; the sink learns the lane's file offset.
    lane: tuple[int, int] = (0, 1)


def offered_id(page: wire.Manifest) -> Optional[str]:
    """The content id a manifest page names on its own: a one-page manifest's (it holds
    every digest), else the one its ``id_root`` commits to -- a lane's: the whole file's
    (None: a page of several without one, from a sender before ``id_root``)."""
    size, root = page.id_root
    if root:
        return tree.id_of_root(page.entries, size, page.chunk_size, page.file_digest, root)
    if page.lane[1] == 1 and page.first_chunk == 0 and len(page.digests) == page.chunk_count * wire.CHUNK_DIGEST_LEN:
        return tree.content_id(page.entries, page.file_size, page.chunk_size, page.file_digest, page.digests)
    return None


class _Digests:
    """The chunk digests of the manifest pages that arrived, in segments allocated as
    pages land: memory follows what was received, not the chunk count a manifest claims."""

    def __init__(self) -> None:
        self._segments: dict[int, bytearray] = {}
        self.known = RangeSet()  # chunks whose digest arrived

    def add(self, first: int, digests: bytes) -> None:
        size = wire.CHUNK_DIGEST_LEN
        pos, end = first, first + len(digests) // size
        while pos < end:
            seg, slot = divmod(pos, DIGEST_SEGMENT)
            n = min(end - pos, DIGEST_SEGMENT - slot)
            buf = self._segments.get(seg)
            if buf is None:
                buf = self._segments[seg] = bytearray(DIGEST_SEGMENT * size)
            lo = (pos - first) * size
            buf[slot * size : (slot + n) * size] = digests[lo : lo + n * size]
            pos += n
        self.known.add(first, end)

    def get(self, chunk: int) -> bytes:
        seg, slot = divmod(chunk, DIGEST_SEGMENT)
        size = wire.CHUNK_DIGEST_LEN
        return bytes(self._segments[seg][slot * size : (slot + 1) * size])


class _ParityStore:
    """Parity shares per FEC block (first seq -> (block end, share index -> payload)),
    bounded in bytes (``ReceiverConfig.max_parity_bytes``), not in blocks."""

    def __init__(self, limit: int) -> None:
        self.blocks: dict[int, tuple[int, dict[int, bytes]]] = {}
        self.limit = limit
        self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self.blocks)

    def add(self, first: int, end: int, index: int, payload: bytes) -> Optional[bool]:
        """Hold a share: True if new, False if a duplicate, None if over the byte limit."""
        entry = self.blocks.get(first)
        if entry is not None and index in entry[1]:
            return False
        cost = len(payload) + PARITY_SHARE_OVERHEAD
        if self.bytes + cost > self.limit:
            return None
        if entry is None:
            entry = self.blocks[first] = (end, {})
        entry[1][index] = payload
        self.bytes += cost
        return True

    def pop(self, first: int) -> Optional[tuple[int, dict[int, bytes]]]:
        entry = self.blocks.pop(first, None)
        if entry is not None:
            self.bytes -= sum(len(p) + PARITY_SHARE_OVERHEAD for p in entry[1].values())
        return entry

    def clear(self) -> None:
        self.blocks.clear()
        self.bytes = 0


class Receiver:
    """Receives one file from one sender session."""

    def __init__(
        self,
        sink: ChunkSink,
        config: ReceiverConfig,
        now: float,
        state: Optional[bytes] = None,
        rng: Optional[random.Random] = None,
    ) -> None:
        self.config = config
        self._rng = rng or random.Random()
        self._resume = _parse_state(state)
        # A restarted receiver keeps its id, so the sender sees one receiver that
        # resumed, not a failed one plus a stranger.
        saved_id = self._resume.get("rid") if self._resume else None
        if config.receiver_id is not None:
            self.receiver_id = config.receiver_id
        elif type(saved_id) is int and 0 <= saved_id < 1 << 64:
            self.receiver_id = saved_id
        else:
            self.receiver_id = self._rng.getrandbits(64)
        self._sink = sink
        self._stream = wire.StreamDigest()  # the chunk being written in order, hashed as it goes
        self._key = config.key
        self.stats = Stats()
        self._events: deque[ReceiverEvent] = deque()
        self._out: list[tuple[bytes, Addr]] = []

        self.session: Optional[int] = config.session_id
        self.sender_addr: Optional[Addr] = None
        self.layout: Optional[Layout] = None
        self.manifest: Optional[wire.Manifest] = None
        self._digests = _Digests()
        # Manifest pages taken, by tag, as received (a keyed transfer): the sender repeats
        # its pages through the stream (~2 per chunk), and an exact repeat of a taken
        # page changes nothing but the sender's last sign of life -- so it costs a
        # comparison, not a MAC check and a decode (~50 us each).
        self._pages: dict[bytes, bytes] = {}
        self._early: list[tuple[bytes, Addr]] = []  # DATA before the first page (EARLY_BYTES)
        self._early_bytes = 0
        self.have = RangeSet()  # sequence numbers written
        self.verified = RangeSet()  # chunks whose digest checked out
        self._unverified = RangeSet()  # complete chunks waiting for their manifest page
        self._claimed = RangeSet()  # chunks a resume record claims, not re-hashed yet
        self.resumed_chunks = 0
        self._highest = -1  # highest first-transmission seq seen
        self._total_seq: Optional[int] = None  # from END
        self._group_hint = 1
        self._last_heard = now
        self._other_lanes: int | None = None  # a lane count heard that is not ours
        self._unsaved_since: Optional[float] = None  # first verification not in the record yet

        self._gap_timers: list[tuple[float, int, int, bool]] = []  # heap of (deadline, start, end, retry)
        # NACKs still awaiting repair: [sent at, retry due at, ranges, last repair datagram
        # for it at (None: nothing yet; -1.0: only parity shares of its blocks so far),
        # highest seq served for it so far (-1: none), last repair or share for it at (None)]
        self._rounds: deque[list] = deque()
        # Kept as rounds come and go, not rebuilt per timer (at 50% loss that rebuild was
        # most of the receiver's CPU): the union of the rounds' ranges (disjoint: a round
        # asks only for what no live round asks for) and the earliest retry due.
        self._requested = RangeSet()
        self._rounds_due = math.inf
        self._loss = 0.0  # first-transmission loss, per-datagram EWMA over ~loss_horizon
        self._loss_pos: Optional[int] = None  # highest seq the estimate accounts for
        self._last_loss_sent = -1e18  # last NACK or loss report (both carry the loss)
        self._last_round = -1e18  # last NACK round (see nack_tick)
        self.loss_reports_sent = 0
        self._repair_srtt: Optional[float] = None  # NACK -> repair delay, smoothed
        self._repair_rttvar = 0.0
        self._repair_min: Optional[float] = None  # fastest NACK -> repair seen
        self._gap_s = 0.0  # smoothed time between arriving data datagrams (sender pace)
        self._last_data_at: Optional[float] = None


        # FEC: shares held per block; nominal k of the sender
        self._parity = _ParityStore(config.max_parity_bytes)
        self._fec_k = 0
        self._fec_chunks: set[int] = set()  # chunks holding rebuilt data not yet verified

        self.complete = False
        self._id_ok = False  # the manifest hashed to config.content_id (see _id_checked)
        self.offered_content_id: Optional[str] = None  # the id a manifest page refused for it names
        self.failed = False
        self.acked = False
        self._complete_at: Optional[float] = None
        self._complete_tries = 0

    # ------------------------------------------------------------------ public API

    def receive_datagram(self, data: bytes | memoryview, addr: Addr, now: float) -> None:
        """Process one datagram; bad, foreign or duplicate input is counted and dropped.

        ``data`` may be a view into the caller's receive buffer: it is only read during
        this call (a DATA payload goes straight to the sink, anything kept is copied)."""
        stats = self.stats
        stats.datagrams_in += 1
        stats.bytes_in += len(data)
        if self.failed:
            stats.drops["after_failure"] += 1
            return
        if self._pages and len(data) > wire.HEADER_LEN and data[3] == wire.T_MANIFEST:
            if self._pages.get(bytes(data[-wire.MAC_LEN :])) == bytes(data):
                return  # (a repeat: no news, so not a sign of life either)
        claimed = wire.data_session(data)
        if claimed is not None and claimed != self.session:  # (before its tag: see data_session)
            if self.session is None:
                self._hold_early(data, addr)
            else:
                stats.drops["wrong_session"] += 1
            return
        fields = wire.parse_data(data, self._key)
        if fields is not None:  # the hot path: no message object, no payload copy
            session, seq, chunk, offset, payload, repair, _ = fields
            if session != self.session:
                stats.drops["no_manifest" if self.session is None else "wrong_session"] += 1
                return
            if self.layout is None:  # (the session was announced, its first page not seen)
                self._hold_early(data, addr)
                return
            if self.sender_addr is None:
                self.sender_addr = addr
            self._last_heard = now
            self._on_data(seq, chunk, offset, payload, repair, now)
            return
        try:
            msg = wire.decode(data, self._key)
        except wire.WireError as exc:
            self.stats.drops[exc.reason] += 1
            return
        if isinstance(msg, wire.Manifest) and msg.lane[:2] != self.config.lane:
            self.stats.drops["wrong_lane"] += 1  # another lane's session (or lanes vs none)
            if msg.lane[1] != self.config.lane[1]:
                self._other_lanes = msg.lane[1]
            return
        if isinstance(msg, wire.Manifest):
            if self.session is None or msg.session == self.session:
                self._take_manifest(msg, data, addr, now)
            else:
                self.stats.drops["wrong_session"] += 1
            return
        if self.session is None:
            self.stats.drops["no_manifest"] += 1
            return
        if msg.session != self.session:
            self.stats.drops["wrong_session"] += 1
            return
        if self.sender_addr is None and isinstance(msg, (wire.Data, wire.End)):
            self.sender_addr = addr
        self._last_heard = now
        if isinstance(msg, wire.Data):
            self._on_data(msg.seq, msg.chunk, msg.offset, msg.payload, msg.repair, now)
        elif isinstance(msg, wire.End):
            self._on_end(msg, now)
        elif isinstance(msg, wire.Parity):
            self._on_parity(msg, now)
        elif isinstance(msg, wire.CompleteAck):
            if msg.receiver_id == self.receiver_id:
                self.acked = True
        else:
            self.stats.drops["unexpected_type"] += 1

    def _take_manifest(self, msg: wire.Manifest, data: bytes | memoryview, addr: Addr, now: float) -> None:
        """A manifest page of this session (or the first of any, when none was announced).
        Only a page that is news -- the first, or one with digests not known yet -- locks
        the session, names the sender and counts as hearing from it; a refused page or a
        repeat leaves the receiver as it was, so a source sending nothing else cannot
        hold it past ``idle_timeout`` (docs/security.md, "Receivers")."""
        stats = self.stats
        drops = stats.drops.total()
        before = self.session, self.sender_addr
        self.session, self.sender_addr = msg.session, self.sender_addr or addr
        news = self._on_manifest(msg, now)
        if self.manifest is None:  # (refused: still open to the transfer announced, or any, from anyone)
            self.session, self.sender_addr = before
        if not news:
            return
        self._last_heard = now
        if (self._key is not None and self.manifest is not None and stats.drops.total() == drops
                and len(self._pages) < _PAGES_KEPT):
            count = len(msg.digests) // wire.CHUNK_DIGEST_LEN
            if self._digests.known.contains_range(msg.first_chunk, msg.first_chunk + count):
                self._pages[bytes(data[-wire.MAC_LEN :])] = bytes(data)
        if self._early and self.layout is not None:
            self._take_early(now)

    def _hold_early(self, data: bytes | memoryview, addr: Addr) -> None:
        """DATA before the first manifest page: kept (a copy: ``data`` may be the reader's
        buffer) while there is room, unchecked -- it is checked like any datagram when
        taken -- else dropped as before."""
        if self._early_bytes + len(data) > EARLY_BYTES or self.failed:
            self.stats.drops["no_manifest"] += 1
            return
        self._early.append((bytes(data), addr))
        self._early_bytes += len(data)
        self.stats.early_held += 1

    def _take_early(self, now: float) -> None:
        """The held DATA, now that a page gave the session and the layout: each taken as
        if it arrived now (another session's is dropped then, as it would have been)."""
        early, self._early, self._early_bytes = self._early, [], 0
        before = self.stats.drops.total()
        for raw, addr in early:
            self.stats.datagrams_in -= 1  # (counted when it arrived)
            self.stats.bytes_in -= len(raw)
            self.receive_datagram(raw, addr, now)
        self.stats.early_dropped += self.stats.drops.total() - before

    def expect(self, session: int, file_digest: Optional[bytes], key: bytes) -> bool:
        """A transfer announced after this receiver started (see ``ReceiverConfig``):
        from now on only its datagrams count. Refused (False) once a manifest locked the
        receiver onto a transfer: it finishes that one."""
        if self.manifest is not None:
            return False
        self.session = session
        self.config.file_digest = file_digest
        self._key = self.config.key = key
        return True

    def receive_batch(self, data: memoryview, seg: int, addr: Addr, now: float) -> None:
        """A GRO super-packet: datagrams of ``seg`` bytes back to back (the last may be
        shorter), all from ``addr``; ``seg`` <= 0 means one datagram. Same outcome as
        ``receive_datagram`` on each in turn, but a run of new, in-order first
        transmissions of one chunk costs one vectored write and one range insert. A
        datagram that ends a run (a loss before the next, a repair, a manifest page at
        the end of a GSO send, a forgery) is taken alone and the next run goes on."""
        n = len(data)
        if seg <= 0 or seg >= n:
            self.receive_datagram(data, addr, now)
            return
        key = self._key
        tail = wire.MAC_LEN if key is not None else 0
        while n > seg:
            if (self.layout is not None and not (self.failed or self.complete or self._parity)
                    and wire.data_session(data) == self.session):
                # The clean stream: one run per read -- or per stretch of joined reads
                # between a loss (or a repair, a forgery) and the next.
                run = fastrun.verify_run(data, seg, key, True)
                if run is not None and run[4] > 1:
                    _, first, chunk, offset, count, _, _ = run
                    took = min(n, count * seg)
                    if not self._fresh_run(run):  # (held already, or not where the layout says)
                        for off in range(0, took, seg):
                            self.receive_datagram(data[off : min(off + seg, took)], addr, now)
                    else:
                        piece = data[:took]
                        if piece.readonly:  # (a caller's bytes: the payloads where they are)
                            payloads = [piece[off + wire.DATA_HEADER_LEN : min(off + seg, took) - tail]
                                        for off in range(0, took, seg)]
                        else:  # (the reader's buffer: one piece to write and hash)
                            payloads = [piece[: fastrun.compact_run(piece, seg, tail)]]
                        self._on_data_run(first, first + count - 1, chunk, offset, payloads, took, addr, now)
                    data, n = data[took:], n - took
                    continue
            # the datagram in front starts no run: it alone, the careful way
            self.receive_datagram(data[:seg], addr, now)
            data, n = data[seg:], n - seg
        if n:
            self.receive_datagram(data, addr, now)

    def _fresh_run(self, run: fastrun.RunHead) -> bool:
        """``verify_run``'s run is what ``_on_data`` would take datagram by datagram:
        this session, where the layout puts it, and none of it held yet. (Consecutive seqs with
        contiguous payloads, all but the last as long as the first, lie where the
        layout says once the first is a full fragment and the last is in place.)"""
        layout = self.layout
        assert layout is not None
        session, first, chunk, offset, count, size, last_size = run
        last = first + count - 1
        if session != self.session or last >= layout.total_seq or size != layout.payload_size:
            return False
        locate = layout.locate
        if locate(first) != (chunk, offset, size):
            return False
        if locate(last) != (chunk, offset + (last - first) * size, last_size):
            return False
        return not self.have.count_in(first, last + 1)

    def _on_data_run(self, first: int, last: int, chunk: int, offset: int, payloads: list[memoryview],
                     nbytes: int, addr: Addr, now: float) -> None:
        """A run of fresh first-transmission fragments ``first..last`` of ``chunk``
        (``fastrun.verify_run``'s): what ``_on_data`` does to each, done once."""
        layout = self.layout
        assert layout is not None
        stats = self.stats
        k = last - first + 1
        stats.datagrams_in += k
        stats.bytes_in += nbytes
        if self.sender_addr is None:
            self.sender_addr = addr
        self._last_heard = now
        if self._last_data_at is not None and now - self._last_data_at < 0.05:
            self._gap_s += 0.05 * (now - self._last_data_at - self._gap_s)
        for _ in range(k - 1):  # the rest arrived at the same instant (as _on_data would)
            self._gap_s -= 0.05 * self._gap_s
        self._last_data_at = now
        stats.data_received += k
        if self._loss_pos is None:
            self._loss_pos = first - 1  # joined here: earlier seqs are not loss
        gap = first > self._highest + 1
        if gap:
            self._add_gap(now, self._highest + 1, first)
            self._measure_loss(gap_to=first)
        self._highest = max(self._highest, last)
        if gap:
            self._maybe_report(now)
        write_parts(self._sink, chunk * layout.chunk_size + offset, payloads)
        self._stream.wrote(chunk, offset, payloads)
        self.have.add(first, last + 1)
        start, end = layout.chunk_seqs(chunk)
        if self.have.contains_range(start, end):
            self._verify_chunk(chunk, now)
            self._check_done(now)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        out, self._out = self._out, []
        self.stats.datagrams_out += len(out)
        self.stats.bytes_out += sum(len(d) for d, _ in out)
        return out

    def get_timer(self) -> Optional[float]:
        if self.failed or (self.complete and (self.acked or self._complete_at is None)):
            return None
        if self.complete:
            return self._complete_at
        times = [self._last_heard + self.config.idle_timeout]
        if self.config.deadline is not None:
            times.append(self.config.deadline)
        if self._unsaved_since is not None:
            times.append(self._unsaved_since + self.config.state_save_interval)
        if self._claims_due():
            times.append(self._last_heard)  # now: re-hash the next slice of claimed chunks
        if self._gap_timers or self._rounds:
            times.append(max(self._nack_due(), self._last_round + self.config.nack_tick))
        report = self._report_due()
        if report is not None:
            times.append(report)
        return min(times)

    def handle_timer(self, now: float) -> None:
        if self.failed:
            return
        if self.complete:
            if not self.acked and self._complete_at is not None and now >= self._complete_at:
                self._send_complete(now)
            return
        if self.config.deadline is not None and now >= self.config.deadline:
            self._fail("deadline passed before the content was verified")
            return
        if now >= self._last_heard + self.config.idle_timeout:
            if self.session is None and self._other_lanes is not None:
                self._fail(f"sender silent on this lane: heard a sender striping over "
                           f"{self._other_lanes} lane(s), this receiver takes "
                           f"{self.config.lane[1]} (start both with the same --lanes)")
            else:
                self._fail("sender silent")
            return
        if self._claims_due():
            self._check_claims(now)
            if self.complete or self.failed:
                return
        self._maybe_save(now)
        if (self._gap_timers or self._rounds) and now >= max(self._nack_due(), self._last_round + self.config.nack_tick):
            self._fire_nack(now)
        self._maybe_report(now)

    def next_event(self) -> Optional[ReceiverEvent]:
        return self._events.popleft() if self._events else None

    def snapshot_state(self) -> bytes:
        """Resume record: which chunks of which file are already verified on disk."""
        if self.manifest is None:
            return b""
        return msgpack.packb(
            {
                "v": STATE_VERSION,
                "digest": self.manifest.file_digest,
                "size": self.manifest.file_size,
                "chunk": self.manifest.chunk_size,
                "verified": self._held_for_record().to_list(),
                "complete": self.complete,
                "rid": self.receiver_id,
            }
        )

    def _held_for_record(self) -> RangeSet:
        """Verified chunks, plus the previous record's claims not re-hashed yet (a crash
        during the re-check must not forget them; they are checked again next time)."""
        if not self._claimed:
            return self.verified
        held = self.verified.copy()
        for s, e in self._claimed:
            held.add(s, e)
        return held

    @property
    def bytes_to_come(self) -> int:
        """What the first pass still has to bring this receiver, in bytes (all of the
        file until its manifest came): how long holding between reads can pay off."""
        layout = self.layout
        if layout is None:
            return 1 << 62
        return layout.payload_size * max(0, layout.total_seq - max(self._highest + 1, 0))

    @property
    def missing_seqs(self) -> int:
        return 0 if self.layout is None else self.layout.total_seq - self.have.count

    # ------------------------------------------------------------------ handlers

    def _on_manifest(self, msg: wire.Manifest, now: float) -> bool:
        """Take a page; True when it was news: the first page taken, or digests not
        known yet (refused pages and repeats are not)."""
        expected = self.config.file_digest
        if self.manifest is None and expected is not None and not hmac.compare_digest(msg.file_digest, expected):
            self.stats.drops["wrong_file"] += 1
            return False
        if self.manifest is None and not self._acceptable(msg):
            return False
        started = self.manifest is None
        if started:
            self._start(msg, now)
        elif not hmac.compare_digest(msg.file_digest, self.manifest.file_digest) or (
            msg.file_size, msg.chunk_size, msg.payload_size, msg.entries, msg.id_root
        ) != (self.manifest.file_size, self.manifest.chunk_size, self.manifest.payload_size, self.manifest.entries,
              self.manifest.id_root):
            self.stats.drops["manifest_mismatch"] += 1
            return False
        self._group_hint = max(self._group_hint, msg.receivers_hint)
        count = len(msg.digests) // wire.CHUNK_DIGEST_LEN
        if count == 0 or self._digests.known.contains_range(msg.first_chunk, msg.first_chunk + count):
            return started
        self._digests.add(msg.first_chunk, msg.digests)
        if not self._id_checked() and self.failed:
            return True
        for start, end in self._unverified.covered(msg.first_chunk, msg.first_chunk + count):
            s, e = max(start, msg.first_chunk), min(end, msg.first_chunk + count)
            for chunk in range(s, e):
                self._unverified.discard(chunk)
                self._verify_chunk(chunk, now)
        self._check_done(now)
        return True

    def _acceptable(self, msg: wire.Manifest) -> bool:
        """The first manifest's checks beyond the wire's: a directory's entry list is
        safe to create (``hostagent.tree``), and the page names the expected content id
        (``offered_id``) -- before anything is created or written. Refusals are counted,
        never accepted."""
        if msg.entries:
            try:
                tree.decode_entries(msg.entries, msg.file_size)
            except tree.UnsafeEntries as exc:
                self.stats.drops[exc.reason] += 1
                return False
        expected = self.config.content_id
        offered = offered_id(msg) if expected is not None else None
        if offered is not None and not hmac.compare_digest(tree.parse_content_id(offered), expected):  # type: ignore[arg-type]
            self.stats.drops["wrong_content_id"] += 1
            self.offered_content_id = offered  # what the sender offers instead, for the caller's error (recv --expect)
            return False
        return True

    def _id_checked(self) -> bool:
        """With an expected content id: whether the whole manifest (every digest page)
        is known and hashes to it. A manifest that does not -- its first page named the
        id, its digests do not add up to it: a sender holding the key lied -- fails the
        receiver the moment its last page lands, before anything completes
        (``_check_done`` waits for this); its data is never accepted (what the record
        claims is re-hashed next time anyway). A lane's digests are a slice of the file's:
        whoever holds every lane's checks them (``chunk_digests``, hostagent.lanes)."""
        if self.config.content_id is None or self._id_ok or self.config.lane[1] > 1:
            return True
        layout, manifest = self.layout, self.manifest
        if layout is None or manifest is None or self.failed or self._digests.known.count < layout.chunk_count:
            return False
        found = self.content_id()
        if found is not None and hmac.compare_digest(tree.parse_content_id(found), self.config.content_id):
            self._id_ok = True
            return True
        self.stats.drops["wrong_content_id"] += 1
        self._fail("manifest does not match the expected content id")
        return False

    def content_id(self) -> Optional[str]:
        """``blake3:<hex>`` of the manifest received (None until every page arrived)."""
        digests, manifest = self.chunk_digests(), self.manifest
        if digests is None or manifest is None:
            return None
        return tree.content_id(manifest.entries, manifest.file_size, manifest.chunk_size, manifest.file_digest, digests)

    def chunk_digests(self) -> Optional[bytes]:
        """Every chunk digest the manifest's pages brought, in chunk order (None until all came)."""
        layout = self.layout
        if layout is None or self._digests.known.count < layout.chunk_count:
            return None
        return b"".join(self._digests.get(c) for c in range(layout.chunk_count))

    def _start(self, msg: wire.Manifest, now: float) -> None:
        begin = getattr(self._sink, "begin", None)
        if begin is not None:  # a sink that lays out its files now (hostagent.dirs)
            begin(msg)
        self.manifest = msg
        set_base = getattr(self._sink, "set_base", None)
        if set_base is not None:
            set_base(msg.lane[2])  # a lane's slice: its offset 0 is this byte of the file
        layout = self.layout = Layout(msg.file_size, msg.chunk_size, msg.payload_size)
        resume = self._resume
        if (
            resume is not None
            and resume.get("digest") == msg.file_digest
            and resume.get("size") == msg.file_size
            and resume.get("chunk") == msg.chunk_size
        ):
            # Claimed chunks count as held (not NACKed) but not as verified: each is
            # re-hashed (_check_claims) once its digest is known; a mismatch re-fetches it.
            for s, e in RangeSet.from_list(resume.get("verified", [])):
                e = min(e, layout.chunk_count)
                if s < e:
                    self._claimed.add(s, e)
                    self.have.add(layout.chunk_seqs(s)[0], layout.chunk_seqs(e - 1)[1])
            self.resumed_chunks = self._claimed.count
        self._events.append(
            ManifestReceived(msg.session, msg.name, msg.file_size, layout.chunk_count, self.resumed_chunks)
        )
        self._send(wire.Hello(msg.session, self.receiver_id))
        if self.have.count:
            self._highest = max(self._highest, max(e for _, e in self.have) - 1)
        self._check_done(now)

    def _on_data(self, seq: int, chunk: int, offset: int, payload: bytes | memoryview, repair: bool,
                 now: float) -> None:
        layout = self.layout
        if layout is None:
            self.stats.drops["no_manifest"] += 1
            return
        if seq >= layout.total_seq or layout.locate(seq) != (chunk, offset, len(payload)):
            self.stats.drops["inconsistent"] += 1
            return
        if self._last_data_at is not None and now - self._last_data_at < 0.05:
            self._gap_s += 0.05 * (now - self._last_data_at - self._gap_s)
        self._last_data_at = now
        if repair:
            self.stats.repairs_received += 1
            if seq not in self.have:
                if self._total_seq is not None:
                    self._count_repairs(delivered=1)
                if self._rounds:
                    self._sample_repair(now, seq, seq + 1, served=True)
        else:
            self.stats.data_received += 1
            if self._loss_pos is None:
                self._loss_pos = seq - 1  # joined here: earlier seqs are not loss
            if seq > self._highest + 1:
                self._add_gap(now, self._highest + 1, seq)
                self._measure_loss(gap_to=seq)
                self._highest = seq
                self._maybe_report(now)
            self._highest = max(self._highest, seq)
        if seq in self.have or self.complete:
            self.stats.duplicates += 1
            return
        self._sink.write(chunk * layout.chunk_size + offset, payload)
        self._stream.wrote(chunk, offset, (payload,))
        self.have.add(seq)
        if self._parity:
            first = fec.block_of(layout, seq, self._fec_k)[2]
            if first in self._parity.blocks:
                self._try_decode(first)  # one more data share may complete the block
        start, end = layout.chunk_seqs(chunk)
        if self.have.contains_range(start, end):
            self._verify_chunk(chunk, now)
            self._check_done(now)

    def _on_parity(self, msg: wire.Parity, now: float) -> None:
        layout = self.layout
        if layout is None:
            self.stats.drops["no_manifest"] += 1
            return
        first, end = fec.block_bounds(layout, msg.chunk, msg.block, msg.k)
        if (
            end <= first
            or msg.index < end - first
            or len(msg.payload) != fec.symbol_size(layout, first)
        ):
            self.stats.drops["bad_parity"] += 1
            return
        if msg.k != self._fec_k:
            # The sender's block size changed (or first share): old shares index other blocks.
            self._parity.clear()
            self._fec_k = msg.k
        self.stats.parity_received += 1
        if self.complete or self.have.contains_range(first, end):
            self.stats.parity_unneeded += 1
            return
        held = self._parity.add(first, end, msg.index, msg.payload)
        if held is None:
            self.stats.drops["parity_overflow"] += 1
            return
        if not held:
            self.stats.duplicates += 1
            return
        if self._total_seq is not None:
            self._count_repairs(delivered=1)
        if self._rounds:
            self._sample_repair(now, first, end)
        chunk = msg.chunk
        if self._try_decode(first):
            start, stop = layout.chunk_seqs(chunk)
            if self.have.contains_range(start, stop):
                self._verify_chunk(chunk, now)
                self._check_done(now)

    def _try_decode(self, first: int) -> bool:
        """Rebuild a block's missing datagrams once data + shares reach k; True if done."""
        layout = self.layout
        assert layout is not None
        end, shares = self._parity.blocks[first]
        k_eff = end - first
        missing = k_eff - self.have.count_in(first, end)
        if missing == 0:
            self._parity.pop(first)
            return False
        if len(shares) < missing:
            return False
        self._parity.pop(first)
        chunk, offset, _ = layout.locate(first)
        base = chunk * layout.chunk_size + offset
        _, last_off, last_len = layout.locate(end - 1)
        raw = self._sink.read(base, last_off + last_len - offset)
        size = fec.symbol_size(layout, first)
        step = layout.payload_size
        use: dict[int, bytes] = {}
        holes: list[int] = []
        for i in range(k_eff):
            if first + i in self.have:
                if len(use) < k_eff - missing:
                    use[i] = fec.pad(raw[i * step : (i + 1) * step], size)
            else:
                holes.append(i)
        for index in sorted(shares)[:missing]:
            use[index] = shares[index]
        try:
            symbols = fec.decode(k_eff, use)
        except ValueError:
            self.stats.drops["bad_parity"] += 1
            return False
        for i in holes:
            seq = first + i
            length = layout.locate(seq)[2]
            self._sink.write(base + i * step, symbols[i][:length])
            self.have.add(seq)
        self._stream.forget(chunk)
        self._fec_chunks.add(chunk)
        self.stats.fec_decodes += 1
        self.stats.fec_recovered += len(holes)
        return True

    def _on_end(self, msg: wire.End, now: float) -> None:  # noqa: C901
        self._group_hint = max(1, msg.receivers_hint)
        if self.complete:
            if msg.closing:
                self.acked = True  # the sender is gone; nobody left to tell
            return
        if self.layout is not None and msg.total_seq != self.layout.total_seq:
            self.stats.drops["inconsistent"] += 1
            return
        if msg.closing:
            self._fail("sender closed before the file was complete")
            return
        first_end = self._total_seq is None
        self._total_seq = msg.total_seq
        if self.layout is None:
            return
        if first_end and self._rounds:
            # Tail timeouts apply from now on (see _retry_delay): bring forward the
            # retries of requests still out.
            retry = self._retry_delay()
            for r in self._rounds:
                r[1] = min(r[1], max(now, r[0] + retry))
            self._rounds_due = min((r[1] for r in self._rounds), default=math.inf)
        if msg.total_seq > self._highest + 1:
            self._add_gap(now, self._highest + 1, msg.total_seq)  # lost tail
            self._highest = msg.total_seq - 1
        elif self.have.count < msg.total_seq and not self._gap_timers:
            # Safety net: something is missing yet nothing is scheduled (e.g. fragments
            # dropped before the manifest arrived when no later gap exposed them).
            self._add_gap(now, 0, msg.total_seq)

    # ------------------------------------------------------------------ verification

    def _verify_chunk(self, chunk: int, now: float) -> None:
        layout = self.layout
        assert layout is not None
        if chunk in self.verified:
            return
        if chunk not in self._digests.known:
            self._unverified.add(chunk)
            return
        length = layout.chunk_len(chunk)
        digest = self._stream.digest(chunk, length)
        if digest is None:  # not streamed in order: hash what the file holds
            digest = wire.chunk_digest(read_view(self._sink, chunk * layout.chunk_size, length))
        rebuilt = chunk in self._fec_chunks
        self._fec_chunks.discard(chunk)
        if hmac.compare_digest(digest, self._digests.get(chunk)):
            self.verified.add(chunk)
            if self._unsaved_since is None:
                self._unsaved_since = now
            self._maybe_save(now)
            return
        # Corrupt (forged or damaged fragment or parity share, or a chunk a resume record
        # claimed that is not what the disk holds): forget the whole chunk, and any
        # shares held for it, and ask again.
        self.stats.corrupt_chunks += 1
        if rebuilt:
            self.stats.drops["corrupt_parity"] += 1
        start, end = layout.chunk_seqs(chunk)
        self.have.discard(start, end)
        if self._parity and self._fec_k:
            for first in range(start, end, self._fec_k):
                self._parity.pop(first)
        self._events.append(ChunkCorrupt(chunk))
        self._add_gap(now, start, end)

    def _check_done(self, now: float) -> None:
        layout = self.layout
        if layout is None or self.complete or self.verified.count < layout.chunk_count or not self._id_checked():
            return
        assert self.manifest is not None
        # Every chunk matched the (authenticated) manifest's digest for it, and those
        # digests cover every byte: the file is the one the sender described. A second
        # whole-file pass would double the receiver's hashing for nothing.
        digest = self.manifest.file_digest
        self.complete = True
        # Gaps whose NACK never went out because a repair filled them first.
        self.stats.nacks_suppressed += sum(1 for t in self._gap_timers if not t[3])
        self._gap_timers.clear()
        self._parity.clear()
        self._save_state()
        self._events.append(FileComplete(digest))
        self._send_complete(now)

    def _send_complete(self, now: float) -> None:
        assert self.manifest is not None
        if self._complete_tries >= self.config.complete_attempts:
            self._complete_at = None
            return
        self._complete_tries += 1
        self._send(wire.Complete(self.manifest.session, self.receiver_id, self.manifest.file_digest))
        self._complete_at = now + self._complete_retry()

    def _complete_retry(self) -> float:
        """How long to wait for COMPLETE_ACK before saying COMPLETE again: a few of the
        fastest round trips measured (NACK to repair), else a quarter of
        ``complete_interval``, doubling with each attempt up to ``complete_interval``.
        The sender ends the session only once every receiver's COMPLETE is in, so one
        COMPLETE lost (2% loss, 1,024 receivers: ~20 of them) held the whole group's
        end for a full interval."""
        cfg = self.config
        first = cfg.complete_interval / 4 if self._repair_min is None else 4 * self._repair_min
        first = min(cfg.complete_interval, max(cfg.nack_tick, first))
        return min(cfg.complete_interval, first * 2 ** (self._complete_tries - 1))

    def _check_claims(self, now: float) -> None:
        """Re-hash chunks a resume record claims, whose digests are known, up to
        ``resume_check_bytes`` per call (in file order); a mismatch is re-fetched like any corrupt chunk."""
        layout = self.layout
        assert layout is not None
        budget = self.config.resume_check_bytes
        while budget > 0 and self._claimed:
            s, e = next(iter(self._claimed))
            known = self._digests.known.covered(s, e)
            if not known:
                return  # the first claimed run's page has not come yet (pages repeat)
            chunk = known[0][0]
            self._claimed.discard(chunk)
            budget -= layout.chunk_len(chunk)
            corrupt = self.stats.corrupt_chunks
            self._verify_chunk(chunk, now)
            if self.stats.corrupt_chunks > corrupt:
                self.resumed_chunks -= 1
        self._check_done(now)

    def _claims_due(self) -> bool:
        """A claimed chunk can be re-hashed now (its digest page arrived)."""
        if not self._claimed or self.layout is None:
            return False
        s, e = next(iter(self._claimed))
        return bool(self._digests.known.count_in(s, e))

    def _maybe_save(self, now: float) -> None:
        if self._unsaved_since is not None and now >= self._unsaved_since + self.config.state_save_interval:
            self._save_state()

    def _save_state(self, record: Optional[bytes] = None) -> None:
        self._unsaved_since = None
        self._sink.save_state(self.snapshot_state() if record is None else record)

    def _fail(self, reason: str) -> None:
        """Stop. The record is saved for a restart to resume from: it claims only chunks
        that matched their digests (claims are re-hashed before they count), so a
        restart cannot fail the same way forever."""
        if not self.failed:
            self.failed = True
            self._gap_timers.clear()
            self._save_state()
            self._events.append(Failed(reason))

    # ------------------------------------------------------------------ NACKs

    def _backoff(self) -> float:
        """Truncated exponential delay: with N receivers sharing a loss, expected NACKs
        before suppression stay O(1) instead of O(N)."""
        lam = math.log(self._group_hint) + 1.0
        u = self._rng.random()
        return self._backoff_span() / lam * math.log1p(u * math.expm1(lam))

    def _backoff_span(self) -> float:
        cfg = self.config
        scale = min(1.0, self._group_hint / max(1, cfg.nack_group_scale)) ** 2
        return max(cfg.min_nack_backoff, cfg.nack_backoff * scale)

    def _retry_delay(self) -> float:
        """How long a NACKed range waits for its repair before it is asked for again:
        a few smoothed NACK-to-repair delays (Jacobson's RTO) plus one backoff span,
        within [min_nack_retry, nack_retry]; before any measurement, two backoff spans
        (a span exceeds the sender's aggregation window plus a round trip, see
        ``ReceiverConfig.nack_backoff``)."""
        cfg = self.config
        if self._repair_srtt is None:
            rto = 2 * self._backoff_span()
        else:
            rto = self._repair_srtt + 4 * self._repair_rttvar + self._backoff_span()
        rto = min(cfg.nack_retry, max(cfg.min_nack_retry, rto))
        if self._repair_min is not None and self._total_seq is not None:
            # The stream is over (END): the sender no longer holds requests back for the FEC
            # block being streamed (which is what spreads the delays measured so far), and
            # the link is idle, so a lost repair is re-asked for after a few of the
            # fastest round trips instead of the streaming-time timeout -- plus a fresh
            # suppression backoff rather than the whole span: catch-up goes in rounds (at
            # 50% loss, a dozen), and a full span per round would dwarf the time
            # the sender needs to send the repairs.
            rto = min(rto, 2 * self._repair_min + self._backoff() + 0.005)
        return rto

    def _sample_repair(self, now: float, start: int, end: int, served: bool = False) -> None:
        """A repair for [start, end) arrived (``served``: a datagram it asked for, not
        just a parity share of its block): time it against the oldest NACK round that
        asked for any of it."""
        if not self._requested.count_in(start, end):
            return  # no round asked for it
        for entry in self._rounds:
            sent_at, _, ranges, last, _, _ = entry
            if ranges.count_in(start, end):
                entry[5] = now
                if self._total_seq is not None:
                    self._rounds_due = min(self._rounds_due, now + self._quiet())
                if served and start > entry[4]:
                    self._served_past(now, entry, start)
                if last is not None:
                    entry[3] = now if served else last
                    return  # later repairs of one request also measure its size; not a delay
                entry[3] = now if served else -1.0
                sample = now - sent_at
                self._repair_min = sample if self._repair_min is None else min(self._repair_min, sample)
                if self._repair_srtt is None:
                    self._repair_srtt, self._repair_rttvar = sample, sample / 2
                else:
                    self._repair_rttvar = 0.75 * self._repair_rttvar + 0.25 * abs(self._repair_srtt - sample)
                    self._repair_srtt = 0.875 * self._repair_srtt + 0.125 * sample
                return

    def _served_past(self, now: float, entry: list, seq: int) -> None:
        """The sender serves a request in order, and it just served ``seq``: what the
        request asked for below it and is still missing was lost on the way (as a gap
        in first transmissions is). Take it out of the request and ask again after one
        tick (room for a little reordering), not when the whole request has drained --
        at 50% loss that made catch-up crawl in generations of retry timeouts. If the
        sender still has it queued after all, it ignores the repeat."""
        ranges: RangeSet = entry[2]
        for s, e in ranges.covered(entry[4] + 1, seq):
            for gs, ge in self.have.missing(s, e):
                self._add_gap(now, gs, ge, delay=self.config.nack_tick)
                if self._total_seq is not None:
                    self._count_repairs(lost=ge - gs)
        for s, e in ranges.covered(0, seq):
            self._requested.discard(s, e)
        ranges.discard(0, seq)
        entry[4] = seq

    def _add_gap(self, now: float, start: int, end: int, delay: Optional[float] = None) -> None:
        if end > start:
            when = now + (self._backoff() if delay is None else delay)
            heapq.heappush(self._gap_timers, (when, start, end, delay is not None))

    def _nack_due(self) -> float:
        """When the next gap timer or round retry falls due."""
        return min(self._gap_timers[0][0] if self._gap_timers else math.inf, self._rounds_due)

    def _fire_nack(self, now: float) -> None:
        """Gaps whose timers expired: NACK what is still missing and not already asked for."""
        layout = self.layout
        if layout is None or self.complete:
            self._gap_timers.clear()
            return
        self._last_round = now
        due = self._expire_rounds(now) if now >= self._rounds_due else RangeSet()
        requested = self._requested
        retry_delay: Optional[float] = None
        while self._gap_timers and now >= self._gap_timers[0][0]:
            _, start, end, retry = heapq.heappop(self._gap_timers)
            if self.have.contains_range(start, end):
                if not retry:
                    self.stats.nacks_suppressed += 1  # repaired (for someone else) before we asked
                continue
            if retry and requested and requested.count_in(start, end):
                if retry_delay is None:
                    retry_delay = self._retry_delay()
                self._add_gap(now, start, end, delay=retry_delay)  # still being served
                continue
            due.add(start, end)
        wanted: list[tuple[int, int]] = []
        for ds, de in due:
            for gs, ge in self.have.missing(ds, de):
                wanted.extend(requested.missing(gs, ge) if requested else [(gs, ge)])
        if self._parity and wanted:
            wanted = self._credit_parity(wanted, requested)
        keyed = self._key is not None
        for _ in range(self.config.max_nacks_per_round):
            if not wanted:
                break
            fit = max(1, wire.nack_fit(wanted, self.config.max_datagram, keyed))
            sent, wanted = wanted[:fit], wanted[fit:]
            self._send_nack(now, sent)
        # Did not fit this round. Once the stream is over, the rest goes at the next
        # tick: these gaps already waited out their backoff, and asking at up to
        # max_nacks_per_round full NACKs per tick keeps the idle sender busy (a new
        # backoff each time limited catch-up to a few NACKs per backoff span).
        after_end = self._total_seq is not None
        for s, e in wanted:
            self._add_gap(now, s, e, delay=self.config.nack_tick if after_end else None)

    def _expire_rounds(self, now: float) -> RangeSet:
        """Rounds whose retry fell due: what they asked for is due again (the caller
        NACKs what is still missing). Each round expires when its own retry falls due
        (the retry delay adapts, so rounds need not expire in the order they were sent)
        -- unless its repairs are still arriving: a big request is being served, not lost.
        Once the stream is over, a round whose repairs came and then stopped for
        ``_quiet`` is due at once: the sender answered it (parity shares of its blocks,
        in one burst each) and what is still missing was lost on the way or needs one
        more share. Waiting out the retry timeout for that was most of the tail after
        the stream at large group sizes."""
        quiet = self._quiet()
        after_end = self._total_seq is not None
        keep: deque[list] = deque()
        due = RangeSet()
        next_due = math.inf
        for r in self._rounds:
            if now >= r[1] and r[3] is not None and now - r[3] < quiet and r[2].count > 1:
                r[1] = now + self._retry_delay()
            answered = after_end and r[5] is not None and now - r[5] >= quiet
            if now < r[1] and not answered:
                keep.append(r)
                due_at = r[1] if not after_end or r[5] is None else min(r[1], r[5] + quiet)
                next_due = min(next_due, due_at)
                continue
            for s, e in r[2]:
                self._requested.discard(s, e)
                due.add(s, e)
        self._rounds = keep
        self._rounds_due = next_due
        return due

    def _quiet(self) -> float:
        """A pause in a request's repairs that says the sender is done with it: several
        datagram times at the sender's pace, at least 10 ms."""
        return max(0.01, 8 * self._gap_s)

    def _credit_parity(self, wanted: list[tuple[int, int]], requested: RangeSet) -> list[tuple[int, int]]:
        """A block with p shares held and r holes needs only r - p more datagrams (any
        of them), so ask for no more than that, less what is already on request; the
        rest get rebuilt when those arrive."""
        asked = RangeSet(wanted)
        for first, (end, shares) in self._parity.blocks.items():
            inside = asked.count_in(first, end)
            if not inside:
                continue
            allowed = self.have.missing_count(first, end) - len(shares)
            if requested:
                allowed -= sum(self.have.missing_count(s, e) for s, e in requested.covered(first, end))
            surplus = inside - max(0, allowed)
            for s, e in reversed(asked.covered(first, end)):
                if surplus <= 0:
                    break
                cut = min(surplus, e - s)
                asked.discard(e - cut, e)
                surplus -= cut
        return asked.ranges()

    def _measure_loss(self, gap_to: Optional[int] = None) -> float:
        """Bring the loss estimate up to the highest first transmission seen (received
        since the last update, so each counts as a delivery), then, for a gap just found
        below ``gap_to``, count each of its seqs as a loss. A per-datagram EWMA over
        ~loss_horizon datagrams: random 1% loss must not read as more than the sender's
        2% tolerance, yet a burst shows at once, not diluted over the time since the
        last NACK (a receiver that never NACKs still knows its loss)."""
        pos = self._loss_pos
        if pos is None:
            return self._loss
        keep = 1.0 - 1.0 / max(1, self.config.loss_horizon)
        if self._highest > pos:
            self._loss *= keep ** (self._highest - pos)
            pos = self._highest
        if gap_to is not None and gap_to - 1 > pos:
            self._loss = 1.0 - (1.0 - self._loss) * keep ** (gap_to - 1 - pos)
            pos = gap_to - 1
        self._loss_pos = pos
        return self._loss

    def _count_repairs(self, delivered: int = 0, lost: int = 0) -> None:
        """After the stream only repairs arrive: the loss figure follows theirs (same
        EWMA; a useful parity share counts as delivered, a repair the sender served past
        as lost), so NACKs tell the sender about the path now -- a catch-up that overruns
        a bottleneck still reads as congestion, and a burst during the stream fades out of
        the figure as repairs arrive instead of staying in it for good."""
        keep = 1.0 - 1.0 / max(1, self.config.loss_horizon)
        self._loss = 1.0 - (1.0 - self._loss * keep ** delivered) * keep ** lost

    def _report_due(self) -> Optional[float]:
        """When the next loss report is due (None: not lossy, or the stream is over)."""
        if (self._total_seq is not None or self.layout is None or self.complete
                or self._loss <= self.config.loss_report_threshold):
            return None
        return self._last_loss_sent + self.config.loss_report_interval

    def _maybe_report(self, now: float) -> None:
        """Send a loss report (a NACK without ranges) if one is due and the loss, brought
        up to date, is still above the threshold."""
        due = self._report_due()
        if due is None or now < due or self._measure_loss() <= self.config.loss_report_threshold:
            return
        assert self.session is not None
        self._send(wire.Nack(self.session, self.receiver_id, (), round(1000 * self._loss)))
        self._last_loss_sent = now
        self.loss_reports_sent += 1

    def _send_nack(self, now: float, ranges: list[tuple[int, int]]) -> None:
        loss = round(1000 * self._measure_loss())
        assert self.session is not None
        self._send(wire.Nack(self.session, self.receiver_id, tuple(ranges), loss))
        self._last_loss_sent = now
        self.stats.nacks_sent += 1
        asked = sum(e - s for s, e in ranges)
        self.stats.nack_seqs_requested += asked
        # A big request (a late joiner, a restart) takes a while to be served: add the time
        # to send what is outstanding at the sender's pace (data's arrival pace with this
        # receiver's own loss taken out), doubled while the stream still takes most sends.
        # Never longer than nack_retry: a receiver at 50% loss would otherwise wait
        # seconds, go silent past the sender's receiver_timeout and be failed while it
        # still needs repairs. (The sender ignores a range it already has queued, and
        # a request whose repairs are visibly arriving is not re-asked: see _fire_nack.)
        for s, e in ranges:
            self._requested.add(s, e)
        outstanding = self._requested.count
        pace = self._gap_s * (1.0 - min(0.9, self._loss))
        serve = (2 if self._total_seq is None else 1) * outstanding * pace
        retry = min(self.config.nack_retry, self._retry_delay() + serve)
        self._rounds.append([now, now + retry, RangeSet(ranges), None, -1, None])
        self._rounds_due = min(self._rounds_due, now + retry)  # then ask again for what is missing

    def _send(self, msg: wire.Message) -> None:
        if self.sender_addr is None:
            return
        self._out.append((wire.encode(msg, self._key), self.sender_addr))




def _parse_state(state: Optional[bytes]) -> Optional[dict]:
    """A damaged resume record means "start over", never a crash."""
    if not state:
        return None
    try:
        obj = msgpack.unpackb(state, raw=False)
    except Exception:
        return None
    if not isinstance(obj, dict) or obj.get("v") != STATE_VERSION:
        return None
    verified = obj.get("verified")
    if not isinstance(verified, list) or len(verified) % 2 or not all(type(x) is int and x >= 0 for x in verified):
        return None
    return obj
