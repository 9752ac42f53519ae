"""Authenticated fuzzing (issue 11): a million datagrams that carry a *valid* MAC -- a
real datagram of every type, its body mutated, then MAC'd again with the session key,
i.e. what a receiver that holds the key, or a sender bug, could produce -- go through
``wire.decode`` / ``wire.parse_data``, a Receiver and a Sender. Only clean refusals are
allowed: ``decode`` raises nothing but ``WireError``, the two decoders agree, the state
machines never raise, their state stays within its caps, and timers keep running.

The run is split in slices (one per seed, endpoint alternating) that each rebuild a
fresh Receiver or Sender when the last one finished, failed or closed, so the fuzz
keeps reaching deep states instead of bouncing off "already failed". The count and the
time are printed (``-s``); the README's SECURITY section quotes them.
"""

from __future__ import annotations

import random
import struct
import time
from collections import Counter
from typing import Callable, Optional

import blake3

from hostagent import wire
from hostagent.common import MemorySink, MemorySource
from hostagent.receiver import MAX_PARITY_BYTES, Receiver, ReceiverConfig
from hostagent.sender import Sender
from tests.support.agents import KIB, payload, sender_config

KEY = wire.derive_key(b"fuzz key")
SESSION = 0x5EED
DATAGRAMS = 1_000_000
SENDER_ADDR = ("10.9.0.1", 5500)
MAX_PEERS = 64


def seeds(sender: Sender) -> tuple[list[bytes], list[bytes]]:
    """Valid datagrams (MAC stripped): what the sender sends (manifest pages, data,
    repairs, parity, END), and what receivers send it (HELLO, NACK, COMPLETE)."""
    to_receiver: list[bytes] = []
    now = 0.0
    while sender.stream_position < sender.layout.total_seq:
        now += 0.001
        to_receiver += [raw for raw, _ in sender.datagrams_to_send(now)]
    layout = sender.layout
    extra: list[wire.Message] = [
        wire.Data(SESSION, 5, *layout.locate(5)[:2], b"r" * layout.locate(5)[2], repair=True, multicast=False),
        wire.Parity(SESSION, 0, 0, 4, 256, 4, b"p" * layout.payload_size),
        wire.Parity(SESSION, 1, 1, 4, 256, 7, b"q" * layout.payload_size),
        wire.End(SESSION, layout.total_seq, 3),
        wire.CompleteAck(SESSION, 77),
    ]
    to_receiver += [wire.encode(m, KEY) for m in extra]
    to_sender = [wire.encode(m, KEY) for m in (
        wire.Hello(SESSION, 77),
        wire.Nack(SESSION, 77, ((0, 3), (9, 12), (40, 41)), 30),
        wire.Nack(SESSION, 78, (), 500),
        wire.Complete(SESSION, 77, sender.file_digest),
        wire.Complete(SESSION, 79, bytes(32)),
    )]
    return [raw[: -wire.MAC_LEN] for raw in to_receiver], [raw[: -wire.MAC_LEN] for raw in to_sender]


def mutate(rng: random.Random, seed: bytes, pool: list[bytes]) -> bytes:
    """One mutation of a valid datagram, MAC'd again (so it gets past the MAC check into
    the parsers and the state machines): structure-blind, except that a DATA fragment is
    sometimes moved to end right at the largest chunk size, or just past it. ``getrandbits``
    only: the fuzz budget is mostly Python calls."""
    bits = rng.getrandbits
    b = bytearray(seed)
    n = len(b)
    body = max(1, n - wire.HEADER_LEN)
    op = bits(4)
    if op < 7:  # overwrite a few body bytes
        for _ in range(1 + (op & 3)):
            b[wire.HEADER_LEN + bits(16) % body if n > wire.HEADER_LEN else bits(16) % n] = bits(8)
    elif op == 8 and b[3] in (wire.T_DATA, wire.T_REPAIR) and n > wire.DATA_HEADER_LEN:
        # a fragment that ends 1 byte before, at, or 1 or 2 bytes past the largest chunk
        plen = n - wire.DATA_HEADER_LEN
        struct.pack_into("!I", b, 26, wire.MAX_CHUNK_SIZE - plen + bits(2) - 1)
    elif op < 9:  # an extreme value in an aligned field
        width = (1, 2, 4, 8)[bits(2)]
        at = wire.HEADER_LEN + bits(16) % max(1, n - width + 1 - wire.HEADER_LEN)
        b[at : at + width] = (b"\x00", b"\xff", b"\x7f", b"\x80")[bits(2)] * width
    elif op < 11:  # truncate
        del b[wire.HEADER_LEN + bits(16) % (body + 1):]
    elif op < 12:  # trailing garbage
        b += rng.randbytes(1 + bits(6))
    elif op < 14:  # another type's body under this header
        b[wire.HEADER_LEN:] = pool[bits(16) % len(pool)][wire.HEADER_LEN:]
    else:  # the type or flags byte (magic and version stay: those fail too early)
        b[3 + bits(1)] = bits(8)
    b[4] |= wire.FLAG_MAC
    return wire.seal(KEY, bytes(b))


def check_decoders(raw: bytes) -> None:
    """``decode`` refuses with ``WireError`` only; the fast path accepts exactly what
    ``decode`` accepts as DATA/REPAIR, with the same fields."""
    try:
        msg: Optional[wire.Message] = wire.decode(raw, KEY)
    except wire.WireError:
        msg = None
    fields = wire.parse_data(raw, KEY)
    if isinstance(msg, wire.Data):
        assert msg.offset + len(msg.payload) <= wire.MAX_CHUNK_SIZE, raw
        assert fields is not None and (*fields[:4], bytes(fields[4]), *fields[5:]) == (
            msg.session, msg.seq, msg.chunk, msg.offset, msg.payload, msg.repair, msg.multicast), raw
    else:
        assert fields is None, raw


class Fuzzer:
    """Fresh endpoints on demand, fed mutated datagrams, timers stepped as they go."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.config = sender_config(key=KEY, session_id=SESSION, fec_k=8, max_peers=MAX_PEERS,
                                    chunk_size=8 * KIB, payload_size=1024)
        self.pages = Sender(MemorySource(data), self.config, 0.0).pages
        self.digest = blake3.blake3(data).digest()
        self.now = 0.0
        self.rebuilt = 0
        self.max_gap_timers = 0
        self.drops = {"receiver": Counter(), "sender": Counter()}  # of every instance, so far
        self.receiver = self._receiver()
        self.sender = self._sender()

    def _receiver(self) -> Receiver:
        rx = Receiver(MemorySink(), ReceiverConfig(key=KEY, session_id=SESSION, file_digest=self.digest,
                                                   receiver_id=77), self.now, rng=random.Random(self.rebuilt))
        for page in self.pages:  # locked onto the real file, as a receiver is once it joined
            rx.receive_datagram(wire.encode(page, KEY), SENDER_ADDR, self.now)
        self.rebuilt += 1
        return rx

    def _sender(self) -> Sender:
        self.rebuilt += 1
        return Sender(MemorySource(self.data), self.config, self.now, rng=random.Random(self.rebuilt),
                      manifest=self.pages)

    def to_receiver(self, raw: bytes) -> None:
        rx = self.receiver
        if rx.failed or rx.complete:
            self.drops["receiver"] += rx.stats.drops
            rx = self.receiver = self._receiver()
        rx.receive_datagram(raw, SENDER_ADDR, self.now)
        rx.datagrams_to_send(self.now)
        self.max_gap_timers = max(self.max_gap_timers, len(rx._gap_timers))
        assert rx._parity.bytes <= MAX_PARITY_BYTES

    def to_sender(self, raw: bytes, src: tuple[str, int]) -> None:
        tx = self.sender
        if tx.closed:
            self.drops["sender"] += tx.stats.drops
            tx = self.sender = self._sender()
        tx.receive_datagram(raw, src, self.now)
        assert len(tx.peers) <= MAX_PEERS

    def tick(self) -> None:
        """Time passes: both endpoints' timers and sends run."""
        self.now += 0.002
        for endpoint in (self.receiver, self.sender):
            timer = endpoint.get_timer()
            if timer is not None and timer <= self.now:
                endpoint.handle_timer(self.now)
            endpoint.datagrams_to_send(self.now)


def run_fuzz(count: int, seed: int = 11, check: Callable[[bytes], None] = check_decoders) -> Fuzzer:
    rng = random.Random(seed)
    fuzz = Fuzzer(payload(256 * KIB, seed=seed))
    to_receiver, to_sender = seeds(Sender(MemorySource(fuzz.data), fuzz.config, 0.0))
    pool = to_receiver + to_sender
    hosts = [(f"10.9.0.{i}", 4000 + i) for i in range(2, 200)]
    bits = rng.getrandbits
    for i in range(count):
        if i & 1:
            raw = mutate(rng, to_sender[bits(16) % len(to_sender)], pool)
            fuzz.to_sender(raw, hosts[bits(7)])
        else:
            raw = mutate(rng, to_receiver[bits(16) % len(to_receiver)], pool)
            fuzz.to_receiver(raw)
        if i % 16 == 0:  # the decoders on their own, on a sample (the endpoints ran them anyway)
            check(raw)
        if i % 64 == 0:
            fuzz.tick()
    return fuzz


def test_a_million_authenticated_fuzzed_datagrams_are_refused_cleanly() -> None:
    started = time.perf_counter()
    fuzz = run_fuzz(DATAGRAMS)
    seconds = time.perf_counter() - started
    rx, tx = fuzz.receiver.stats, fuzz.sender.stats
    drops = {role: dict(c + (rx if role == "receiver" else tx).drops) for role, c in fuzz.drops.items()}
    print(f"fuzz: {DATAGRAMS} datagrams with a valid MAC in {seconds:.1f} s "
          f"({DATAGRAMS / seconds:,.0f}/s); endpoints built {fuzz.rebuilt} times; drops {drops}")
    # The fuzz reached the parsers and the state machines, not just the MAC check.
    assert "bad_mac" not in drops["receiver"] and "bad_mac" not in drops["sender"]
    assert sum(drops["receiver"].values()) > 0 and sum(drops["sender"].values()) > 0
    assert rx.data_received + rx.repairs_received > 0 and tx.nacks_received > 0
    assert fuzz.max_gap_timers < 4 * 1024  # NACK timers stay bounded (the file has 256 datagrams)
