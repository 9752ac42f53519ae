"""In-memory network for exercising the sans-IO sender and receivers together.

Virtual time only: an event heap of deliveries and endpoint timers, a fixed one-way
latency, and loss decided by caller-supplied functions, so a test scenario is a few
lambdas and its outcome is reproducible from a seed. Used by the tests and handy for
trying parameter changes without a lab.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field
from typing import Callable, Optional

from .common import GROUP, MemorySink, MemorySource, Stats
from .receiver import Receiver, ReceiverConfig
from .sender import Sender, SenderConfig

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
    sink: MemorySink = field(default_factory=MemorySink)
    receiver: Optional[Receiver] = None
    events: list = field(default_factory=list)
    past_stats: list[Stats] = field(default_factory=list)  # stats of pre-restart instances
    nack_seqs_after_restart: Optional[int] = None
    missing_at_restart: Optional[int] = None

    def up(self, now: float) -> bool:
        if self.receiver is None:
            return False
        return not any(s <= now < e for s, e in self.down)


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
    ) -> None:
        self.data = data
        self.now = 0.0
        self.latency = latency
        self.rng = random.Random(seed)
        self.loss = loss or (lambda *a: False)
        self.shared_loss = shared_loss or (lambda *a: False)
        self.duplicate = duplicate or (lambda *a: False)
        self.sender = Sender(MemorySource(data), sender_config, 0.0, rng=random.Random(seed))
        self.sender_events: list = []
        self.receivers: list[SimReceiver] = []
        self._heap: list = []
        self._counter = itertools.count()
        self._timer_version: dict[object, int] = {}
        self.multicast_sent = 0

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
        rec = SimReceiver(("rx", index), config, random.Random(self.rng.getrandbits(32)), join_at)
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
                break

    @property
    def done(self) -> bool:
        if not self.sender.closed:
            return False
        return all(r.receiver is not None and (r.receiver.complete or r.receiver.failed) for r in self.receivers)

    def _handle(self, kind: str, obj: object) -> None:
        now = self.now
        if kind == "deliver":
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
        version = self._timer_version.get(key, 0) + 1
        self._timer_version[key] = version
        if timer is not None:
            self._push(max(timer, self.now), "timer", (key, version))

    def _flush_sender(self) -> None:
        now = self.now
        for data, dest in self.sender.datagrams_to_send(now):
            if dest == GROUP:
                self.multicast_sent += 1
                if self.shared_loss(now, data):
                    continue
                for rec in self.receivers:
                    if rec.receiver is None or not rec.up(now):
                        continue
                    self._send(SENDER_ADDR, rec.addr, data)
            else:
                self._send(SENDER_ADDR, dest, data)
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

    def _send(self, src: object, dst: object, data: bytes) -> None:
        if self.loss(self.now, src, dst, data):
            return
        self._push(self.now + self.latency, "deliver", (dst, data, src))
        if self.duplicate(self.now, src, dst, data):
            self._push(self.now + 2 * self.latency, "deliver", (dst, data, src))


def _state_verified(state: Optional[bytes]) -> list[tuple[int, int]]:
    import msgpack

    if not state:
        return []
    flat = msgpack.unpackb(state, raw=False).get("verified", [])
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
