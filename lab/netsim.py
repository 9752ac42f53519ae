"""In-memory network for exercising the sans-IO sender and receivers together.

Virtual time only: an event heap of deliveries and endpoint timers, a fixed one-way
latency, and loss decided by caller-supplied functions, so a test scenario is a few
lambdas and its outcome is reproducible from a seed. Two effects of real networks that
lambdas do not capture are built in: a tail-drop ``Bottleneck`` on the sender's link (a
``tc tbf`` qdisc, a switch port: datagrams queue, and drop when its buffer is full) and
``stall`` (a switch that forwards nothing for a moment -- a userspace datapath off the
CPU -- so every receiver loses the same burst). Used by the tests and handy for
trying parameter changes without a lab.

Built to reach ~1000 receivers (``bench_scale``): one heap event per multicast datagram
(not per receiver), timers re-armed lazily (an endpoint's timer only goes on the heap
when it moves earlier; a timer firing early is harmless because ``handle_timer`` checks
its own deadlines), and ``SourceBackedSink`` keeps per-receiver memory to a few ranges.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field
from typing import Callable, Optional

from hostagent.common import GROUP, ChunkSink, ChunkSource, MemorySink, MemorySource, Stats
from hostagent.rangeset import RangeSet
from hostagent.receiver import Receiver, ReceiverConfig
from hostagent.sender import Sender, SenderConfig

SENDER_ADDR = ("sender", 1)

# (now, src, dst, datagram) -> True to drop
LossFn = Callable[[float, object, object, bytes], bool]
# (now, datagram) -> True to drop for everyone (loss between sender and first switch)
SharedLossFn = Callable[[float, bytes], bool]


@dataclass
class SimReceiver:
    addr: tuple[str, int]
    config: ReceiverConfig
    rng: random.Random
    join_at: float = 0.0
    down: list[tuple[float, float]] = field(default_factory=list)  # restart windows
    sink: ChunkSink = field(default_factory=MemorySink)
    receiver: Optional[Receiver] = None
    events: list = field(default_factory=list)
    past_stats: list[Stats] = field(default_factory=list)  # stats of pre-restart instances
    nack_seqs_after_restart: Optional[int] = None
    missing_at_restart: Optional[int] = None

    def up(self, now: float) -> bool:
        if self.receiver is None:
            return False
        return not self.down or not any(s <= now < e for s, e in self.down)


@dataclass
class Bottleneck:
    """A FIFO link of ``rate_bps`` with a ``limit_bytes`` tail-drop buffer, between the
    sender and everyone else: datagrams leave it in order at its rate (the backlog is
    queueing delay) and one that does not fit in the buffer is dropped for every
    receiver. ``dropped`` counts those."""

    rate_bps: float
    limit_bytes: int
    busy_until: float = 0.0
    dropped: int = 0

    def admit(self, now: float, size: int) -> Optional[float]:
        """When a datagram of ``size`` bytes entering now has left the link (None: dropped)."""
        backlog = max(0.0, self.busy_until - now) * self.rate_bps / 8
        if backlog + size > self.limit_bytes:
            self.dropped += 1
            return None
        self.busy_until = max(now, self.busy_until) + size * 8 / self.rate_bps
        return self.busy_until


def stall(start: float, length: float) -> SharedLossFn:
    """Shared loss: everything the sender sends in ``[start, start + length)`` is lost
    for every receiver (a switch that stopped forwarding for ``length`` seconds)."""
    return lambda now, datagram: start <= now < start + length


class SourceBackedSink:
    """A ChunkSink that stores only what differs from the known source file.

    Writes equal to the source are recorded as byte ranges; anything else (forged or
    damaged data) is kept verbatim, so reads return exactly what was written and the
    receiver's digest checks stay honest, at a few hundred bytes per receiver instead of
    a copy of the file."""

    def __init__(self, source: bytes) -> None:
        self._source = source
        self._good = RangeSet()  # bytes written and equal to the source
        self._other: dict[int, bytes] = {}  # offset -> written bytes that differ
        self.state: bytes | None = None
        self.writes = 0

    def write(self, offset: int, data: bytes) -> None:
        self.writes += 1
        end = offset + len(data)
        for off in [o for o in self._other if o < end and o + len(self._other[o]) > offset]:
            del self._other[off]  # protocol writes are fragment aligned: same extent
        if self._source[offset:end] == data:
            self._good.add(offset, end)
        else:
            self._good.discard(offset, end)
            self._other[offset] = bytes(data)

    def read(self, offset: int, length: int) -> bytes:
        end = offset + length
        out = bytearray(length)
        for s, e in self._good.covered(offset, end):
            out[s - offset : e - offset] = self._source[s:e]
        for off, data in self._other.items():
            s, e = max(off, offset), min(off + len(data), end)
            if s < e:
                out[s - offset : e - offset] = data[s - off : e - off]
        return bytes(out)

    def save_state(self, state: bytes) -> None:
        self.state = state

    @property
    def data(self) -> bytes:
        """The whole file as written so far (zeros where nothing was)."""
        size = max([len(self._source) if self._good else 0] + [o + len(d) for o, d in self._other.items()])
        size = max(size, max((e for _, e in self._good), default=0))
        return self.read(0, size)




class Sim:
    """One sender, many receivers, stepped virtual time."""

    def __init__(
        self,
        data: bytes,
        sender_config: SenderConfig,
        latency: float = 0.001,
        seed: int = 0,
        loss: Optional[LossFn] = None,
        shared_loss: Optional[SharedLossFn] = None,
        duplicate: Optional[LossFn] = None,
        sink_factory: Optional[Callable[[], ChunkSink]] = None,
        source: Optional[ChunkSource] = None,
        manifest: Optional[list] = None,
        bottleneck: Optional[Bottleneck] = None,
    ) -> None:
        """``source``/``manifest``: send those instead of ``data`` from memory (e.g. a
        model directory, ``hostagent.dirs.DirSource``); ``data`` is then its bytes.
        ``bottleneck``: every datagram the sender sends crosses it first."""
        self.data = data
        self.now = 0.0
        self.latency = latency
        self.rng = random.Random(seed)
        self.loss = loss or (lambda *a: False)
        self.shared_loss = shared_loss or (lambda *a: False)
        self.duplicate = duplicate or (lambda *a: False)
        self.bottleneck = bottleneck
        self.sender = Sender(source or MemorySource(data), sender_config, 0.0, rng=random.Random(seed),
                             manifest=manifest)
        self.sender_events: list = []
        self.receivers: list[SimReceiver] = []
        self._heap: list = []
        self._counter = itertools.count()
        self._timer_version: dict[object, int] = {}
        self._timer_at: dict[object, float] = {}  # when each endpoint's live timer event fires
        self.multicast_sent = 0
        self.sink_factory = sink_factory or MemorySink

    # ------------------------------------------------------------------ setup

    def add_receiver(
        self,
        config: Optional[ReceiverConfig] = None,
        join_at: float = 0.0,
        down: Optional[tuple[float, float]] = None,
    ) -> SimReceiver:
        index = len(self.receivers)
        config = config or ReceiverConfig()
        if config.receiver_id is None:
            config.receiver_id = 1000 + index
        if config.key is None:
            config.key = self.sender.config.key
        rec = SimReceiver(("rx", index), config, random.Random(self.rng.getrandbits(32)), join_at,
                          sink=self.sink_factory())
        if down is not None:
            rec.down.append(down)
            self._push(down[0], "down", rec)
            self._push(down[1], "restart", rec)
        self.receivers.append(rec)
        if join_at <= self.now:
            rec.receiver = Receiver(rec.sink, rec.config, self.now, rng=rec.rng)
        else:
            self._push(join_at, "join", rec)
        return rec

    def inject(self, at: float, rec: SimReceiver, data: bytes, src: object = SENDER_ADDR) -> None:
        """Deliver an arbitrary datagram (forged, truncated...) to a receiver."""
        self._push(at, "deliver", (rec.addr, data, src))

    def inject_to_sender(self, at: float, data: bytes, src: object) -> None:
        self._push(at, "deliver", (SENDER_ADDR, data, src))

    # ------------------------------------------------------------------ running

    def run(self, until: float = 60.0, max_events: int = 5_000_000) -> None:
        self._flush_sender()
        events = 0
        while self._heap:
            when, _, kind, obj = heapq.heappop(self._heap)
            if when > until:
                heapq.heappush(self._heap, (when, next(self._counter), kind, obj))
                break
            self.now = max(self.now, when)
            events += 1
            if events > max_events:
                raise RuntimeError("simulation did not settle")
            self._handle(kind, obj)
            if self.done:
                return
        # Nothing left before ``until``: the time passed all the same. (Left behind, a
        # caller stepping ``run(until=sim.now + dt)`` through a quiet stretch longer than
        # dt stepped in place forever.)
        self.now = max(self.now, until)

    @property
    def done(self) -> bool:
        if not self.sender.closed:
            return False
        return all(r.receiver is not None and (r.receiver.complete or r.receiver.failed) for r in self.receivers)

    def _handle(self, kind: str, obj: object) -> None:
        now = self.now
        if kind == "mdeliver":
            data, recs = obj  # type: ignore[misc]
            for rec in recs:
                if rec.up(now):
                    rec.receiver.receive_datagram(data, SENDER_ADDR, now)
                    self._flush_receiver(rec)
        elif kind == "deliver":
            dst, data, src = obj  # type: ignore[misc]
            if dst == SENDER_ADDR:
                self.sender.receive_datagram(data, src, now)
                self._flush_sender()
                return
            rec = self.receivers[dst[1]]
            if rec.up(now):
                assert rec.receiver is not None
                rec.receiver.receive_datagram(data, src, now)
                self._flush_receiver(rec)
        elif kind == "timer":
            key, version = obj  # type: ignore[misc]
            if self._timer_version.get(key) != version:
                return
            self._timer_at.pop(key, None)
            if key == "sender":
                self.sender.handle_timer(now)
                self._flush_sender()
            else:
                rec = self.receivers[key]
                if rec.up(now):
                    assert rec.receiver is not None
                    rec.receiver.handle_timer(now)
                    self._flush_receiver(rec)
        elif kind == "join":
            rec = obj  # type: ignore[assignment]
            rec.receiver = Receiver(rec.sink, rec.config, now, rng=rec.rng)
            self._flush_receiver(rec)
        elif kind == "down":
            rec = obj
            self._timer_version[rec.addr[1]] = -1
            self._timer_at.pop(rec.addr[1], None)
        elif kind == "restart":
            rec = obj
            old = rec.receiver
            assert old is not None
            rec.past_stats.append(old.stats)
            rec.receiver = Receiver(rec.sink, rec.config, now, state=rec.sink.state, rng=rec.rng)
            if old.layout is not None:
                # What the restarted instance genuinely lacks: everything it had not verified.
                verified_seqs = sum(
                    old.layout.chunk_seqs(c)[1] - old.layout.chunk_seqs(c)[0]
                    for s, e in _state_verified(rec.sink.state)
                    for c in range(s, e)
                )
                rec.missing_at_restart = old.layout.total_seq - verified_seqs
            self._flush_receiver(rec)

    def _push(self, when: float, kind: str, obj: object) -> None:
        heapq.heappush(self._heap, (when, next(self._counter), kind, obj))

    def _arm(self, key: object, timer: Optional[float]) -> None:
        """Lazy re-arm: keep the pending event if it fires no later than asked (the
        endpoint just finds nothing due and reports its next deadline again)."""
        if timer is None:
            return
        timer = max(timer, self.now)
        pending = self._timer_at.get(key)
        if pending is not None and pending <= timer and self._timer_version.get(key, 0) >= 0:
            return
        version = next(self._counter)  # unique: a stale event can never match
        self._timer_version[key] = version
        self._timer_at[key] = timer
        self._push(timer, "timer", (key, version))

    def _flush_sender(self) -> None:
        now = self.now
        for data, dest in self.sender.datagrams_to_send(now):
            delay = self.latency
            if self.bottleneck is not None:
                left = self.bottleneck.admit(now, len(data))
                if left is None:
                    continue
                delay += left - now
            if dest == GROUP:
                self.multicast_sent += 1
                if self.shared_loss(now, data):
                    continue
                batch = []
                for rec in self.receivers:
                    if rec.receiver is None or not rec.up(now):
                        continue
                    if self.loss(now, SENDER_ADDR, rec.addr, data):
                        continue
                    batch.append(rec)
                    if self.duplicate(now, SENDER_ADDR, rec.addr, data):
                        self._push(now + delay + self.latency, "deliver", (rec.addr, data, SENDER_ADDR))
                if batch:
                    self._push(now + delay, "mdeliver", (data, batch))
            else:
                self._send(SENDER_ADDR, dest, data, delay)
        while (event := self.sender.next_event()) is not None:
            self.sender_events.append(event)
        self._arm("sender", self.sender.get_timer())

    def _flush_receiver(self, rec: SimReceiver) -> None:
        assert rec.receiver is not None
        for data, dest in rec.receiver.datagrams_to_send(self.now):
            self._send(rec.addr, dest, data)
        while (event := rec.receiver.next_event()) is not None:
            rec.events.append(event)
        self._arm(rec.addr[1], rec.receiver.get_timer())

    def _send(self, src: object, dst: object, data: bytes, delay: Optional[float] = None) -> None:
        if self.loss(self.now, src, dst, data):
            return
        delay = self.latency if delay is None else delay
        self._push(self.now + delay, "deliver", (dst, data, src))
        if self.duplicate(self.now, src, dst, data):
            self._push(self.now + delay + self.latency, "deliver", (dst, data, src))


def _state_verified(state: Optional[bytes]) -> list[tuple[int, int]]:
    import msgpack

    if not state:
        return []
    flat = msgpack.unpackb(state, raw=False).get("verified", [])
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
