"""The receiver's GRO batch path (``Receiver.receive_batch``) against the per-datagram
path: fed the same datagrams at the same instants, both must end in the same state --
file bytes, counters, events, NACKs and timers -- whatever the batches hold (loss,
duplicates, reordering, damaged or foreign datagrams, MACs)."""

from __future__ import annotations

import os
import random
from dataclasses import asdict

import pytest

from hostagent import fastrun, wire
from hostagent.common import MemorySink, MemorySource
from hostagent.receiver import Receiver, ReceiverConfig
from hostagent.sender import Sender
from lab.netsim import SourceBackedSink
from tests.support.agents import KIB, payload, sender_config

SENDER = ("10.0.0.1", 5000)
KEY = wire.derive_key(b"batch test")


@pytest.fixture(autouse=True, params=["c", "python"])
def run_path(request, monkeypatch) -> str:
    """Every test here on both implementations of the clean-stream path (hostagent.fastrun)."""
    if request.param == "c":
        if fastrun._native is None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"hostagent._fastrun is not built under CI ({fastrun._why})")
            pytest.skip(f"hostagent._fastrun is not built ({fastrun._why})")
        monkeypatch.setattr(fastrun, "verify_run", fastrun.verify_run_c)
        monkeypatch.setattr(fastrun, "compact_run", fastrun._native.compact_run)
    else:
        monkeypatch.setattr(fastrun, "verify_run", fastrun.verify_run_py)
        monkeypatch.setattr(fastrun, "compact_run", fastrun.compact_run_py)
    return request.param


def _stream(data: bytes, key: bytes | None, payload_size: int = 1000) -> list[bytes]:
    """Everything the sender multicasts in its first pass (manifest pages, DATA, END)."""
    config = sender_config(chunk_size=16 * KIB, payload_size=payload_size, key=key)
    sender = Sender(MemorySource(data), config, 0.0, rng=random.Random(1))
    out, now = [], 0.0
    while sender.stream_position < sender.layout.total_seq or not out or wire.peek_type(out[-1][0]) != wire.T_END:
        now += 0.001
        out.extend(sender.datagrams_to_send(now))
    return [raw for raw, _ in out]


def _batches(datagrams: list[bytes], rng: random.Random, most: int = 12) -> list[list[bytes]]:
    """Group runs of equal-length datagrams (a shorter one may end a run) as GRO would
    (up to ``most``: beyond a GRO super-packet's, as the receiver's reader joins reads)."""
    batches: list[list[bytes]] = []
    for raw in datagrams:
        last = batches[-1] if batches else None
        if (last and len(last) < rng.randint(1, most) and len(raw) <= len(last[0])
                and len(last[-1]) == len(last[0])):
            last.append(raw)
        else:
            batches.append([raw])
    return batches


def _receiver(key: bytes | None, sink=None) -> Receiver:
    return Receiver(sink or MemorySink(), ReceiverConfig(receiver_id=42, key=key), 0.0, rng=random.Random(7))


def _state(rx: Receiver, now: float) -> tuple:
    events = []
    while (event := rx.next_event()) is not None:
        events.append(event)
    return (bytes(rx._sink.read(0, 1 << 20)), rx.have.ranges(), rx.verified.ranges(), asdict(rx.stats), events,  # type: ignore[attr-defined]
            rx.datagrams_to_send(now), rx.get_timer(), rx.complete, rx._gap_s)


def _mutate(batch: list[bytes], rng: random.Random) -> list[bytes]:
    """Damage a batch the ways a network or an attacker would."""
    batch = list(batch)
    kind = rng.choice(["none", "none", "drop", "dup", "swap", "flip", "foreign"])
    i = rng.randrange(len(batch))
    if kind == "drop" and len(batch) > 1:
        del batch[i]
    elif kind == "dup":
        batch.insert(i, batch[i])
    elif kind == "swap" and len(batch) > 1:
        j = rng.randrange(len(batch))
        batch[i], batch[j] = batch[j], batch[i]
    elif kind == "flip":
        raw = bytearray(batch[i])
        raw[rng.randrange(len(raw))] ^= rng.randint(1, 255)
        batch[i] = bytes(raw)
    elif kind == "foreign":
        raw = bytearray(batch[i])
        raw[6:14] = (int.from_bytes(raw[6:14], "big") ^ 1).to_bytes(8, "big")  # another session
        batch[i] = bytes(raw)
    return batch


@pytest.mark.parametrize("payload_size", [1000, 1024], ids=["short-last", "chunks-end-flush"])
@pytest.mark.parametrize("vectored", [True, False], ids=["write_many", "write"])
@pytest.mark.parametrize("key", [None, KEY], ids=["plain", "mac"])
@pytest.mark.parametrize("most", [12, 60], ids=["gro", "joined"])
@pytest.mark.parametrize("seed", range(5))
def test_batch_path_ends_in_the_same_state_as_per_datagram(key, seed, vectored, payload_size, most) -> None:
    """``vectored``: a sink with ``write_many`` (one write per run) or only ``write``;
    with 1024-byte payloads every fragment is full size, so batches span chunk ends;
    ``joined``: batches of up to 60 datagrams, damage mid-run included."""
    rng = random.Random(seed)
    data = payload(100 * KIB + 123, seed=seed)
    batches = [_mutate(b, rng) if seed else b for b in _batches(_stream(data, key, payload_size), rng, most)]
    sink = MemorySink if vectored else (lambda: SourceBackedSink(data))
    one, many = _receiver(key, sink()), _receiver(key, sink())
    now = 0.0
    for batch in batches:
        now += 0.0005
        for raw in batch:
            one.receive_datagram(raw, SENDER, now)
        seg = len(batch[0])
        if len(batch) > 1 and all(len(r) == seg for r in batch[:-1]) and len(batch[-1]) <= seg:
            # (a reader's buffer is writable: the run's payloads are moved together in it)
            many.receive_batch(memoryview(bytearray(b"".join(batch))), seg, SENDER, now)
        else:
            for raw in batch:
                many.receive_batch(memoryview(raw), 0, SENDER, now)
        assert _state(one, now) == _state(many, now)
    if seed == 0:  # the clean stream: verified, in fewer writes than datagrams
        assert many.complete and bytes(many._sink.read(0, len(data))) == data  # type: ignore[attr-defined]
        if vectored:
            assert many._sink.writes < many.stats.data_received / 3  # type: ignore[attr-defined]


def test_batch_views_are_not_kept() -> None:
    """The reader reuses its buffer: overwriting it after the call changes nothing held."""
    data = payload(40 * KIB, seed=3)
    stream = _stream(data, None)
    rx = _receiver(None)
    buf = bytearray(65535)
    for batch in _batches(stream, random.Random(0)):
        blob = b"".join(batch)
        buf[: len(blob)] = blob
        seg = len(batch[0]) if len(batch) > 1 else 0
        rx.receive_batch(memoryview(buf)[: len(blob)], seg, SENDER, 1.0)
        buf[: len(blob)] = bytes(len(blob))
    assert rx.complete and bytes(rx._sink.data) == data  # type: ignore[attr-defined]


def test_clean_stream_takes_the_super_packet_path(monkeypatch) -> None:
    """A clean stream's GRO batches are runs that ``parse_data_run`` takes whole: the
    per-datagram parse never runs for them (that is the receiver's CPU saving)."""
    data = payload(100 * KIB + 123, seed=4)
    stream = _stream(data, None)
    rx = _receiver(None)
    per_datagram = []
    original = wire.parse_data
    monkeypatch.setattr(wire, "parse_data", lambda raw, key=None: per_datagram.append(1) or original(raw, key))
    now, batched = 0.0, 0
    for batch in _batches(stream, random.Random(2)):
        now += 0.0005
        seg = len(batch[0]) if len(batch) > 1 else 0
        if seg and wire.peek_type(batch[0]) == wire.T_DATA and all(wire.peek_type(r) == wire.T_DATA for r in batch):
            batched += len(batch)
        rx.receive_batch(memoryview(b"".join(batch)), seg, SENDER, now)
    assert rx.complete and bytes(rx._sink.data) == data  # type: ignore[attr-defined]
    assert batched > 50 and len(per_datagram) <= 2 * (len(stream) - batched)  # the rest: twice at most


@pytest.mark.parametrize("key", [None, KEY])
def test_a_joined_run_broken_in_the_middle_keeps_both_sides_on_the_run_path(monkeypatch, key) -> None:
    """Joined reads span a chunk's datagrams, so a loss, a repair or a forgery often
    lies inside one: the stretches before and after it are still runs (one write each,
    no per-datagram parse); only the odd one is taken alone."""
    data = payload(64 * KIB, seed=5)
    stream = _stream(data, key)
    pages = [r for r in stream if wire.peek_type(r) != wire.T_DATA]
    chunk0 = [r for r in stream if wire.peek_type(r) == wire.T_DATA][:17]  # chunk 0: 16 full + 1 short
    rx = _receiver(key)
    for raw in pages[:1]:
        rx.receive_datagram(raw, SENDER, 0.1)
    assert rx.layout is not None
    forged = bytearray(chunk0[9])
    forged[-1] ^= 1  # a bad tag (or, without a key, a payload that fails the chunk's digest later)
    joined = chunk0[:5] + chunk0[6:9] + [bytes(forged)] + chunk0[10:]  # chunk0[5] lost
    per_datagram = []
    original = wire.parse_data
    monkeypatch.setattr(wire, "parse_data", lambda raw, k=None: per_datagram.append(1) or original(raw, k))
    writes = rx._sink.writes  # type: ignore[attr-defined]
    rx.receive_batch(memoryview(bytearray(b"".join(joined))), len(chunk0[0]), SENDER, 0.2)
    assert rx._sink.writes - writes == (2 if key is None else 3)  # type: ignore[attr-defined]
    assert len(per_datagram) == (0 if key is None else 1)
    assert rx.have.count_in(0, 17) == (16 if key is None else 15)


def _count_read_backs(monkeypatch) -> list[int]:
    """Chunks the receiver reads back from its sink to hash them (their offsets)."""
    from hostagent import receiver as receiver_module

    reads: list[int] = []
    original = receiver_module.read_view
    monkeypatch.setattr(receiver_module, "read_view",
                        lambda sink, offset, length: reads.append(offset) or original(sink, offset, length))
    return reads


@pytest.mark.parametrize("key", [None, KEY])
def test_clean_stream_verifies_chunks_without_reading_them_back(monkeypatch, key) -> None:
    """In-order chunks are hashed from the receive buffer as they are written: none is
    read back from the file to verify it (the second copy a receiver used to pay per
    byte), and the copy is still exactly the file."""
    data = payload(100 * KIB + 123, seed=5)
    reads = _count_read_backs(monkeypatch)
    rx = _receiver(key)
    for now, batch in enumerate(_batches(_stream(data, key), random.Random(3))):
        rx.receive_batch(memoryview(b"".join(batch)), len(batch[0]) if len(batch) > 1 else 0, SENDER, now * 1e-4)
    assert rx.complete and bytes(rx._sink.data) == data  # type: ignore[attr-defined]
    assert reads == []


def test_damaged_fragment_in_a_streamed_chunk_is_caught(monkeypatch) -> None:
    """Without a MAC a damaged payload gets in; the chunk it lands in, streamed in order,
    still fails its manifest digest (counted corrupt, not verified, asked for again),
    and a chunk that was not streamed in order is read back and verified."""
    data = payload(64 * KIB, seed=6)
    stream = _stream(data, None)
    datas = [i for i, raw in enumerate(stream) if wire.peek_type(raw) == wire.T_DATA]
    victim = bytearray(stream[datas[3]])  # chunk 0 (16 KB chunks, 1000-byte payloads)
    victim[-1] ^= 0xFF
    stream[datas[3]] = bytes(victim)
    later = datas[20:23]  # chunk 1: its fragments reordered, so it is not streamed
    stream[later[0]], stream[later[2]] = stream[later[2]], stream[later[0]]
    reads = _count_read_backs(monkeypatch)
    rx = _receiver(None)
    for now, batch in enumerate(_batches(stream, random.Random(4))):
        rx.receive_batch(memoryview(b"".join(batch)), len(batch[0]) if len(batch) > 1 else 0, SENDER, now * 1e-4)
    assert rx.stats.corrupt_chunks == 1 and 0 not in rx.verified and 1 in rx.verified
    assert reads == [16 * KIB]  # chunk 1 only
    events = []
    while (event := rx.next_event()) is not None:
        events.append(event)
    assert any(type(e).__name__ == "ChunkCorrupt" and e.chunk == 0 for e in events)


def _two_with_the_manifest(data: bytes, key: bytes | None) -> tuple[Receiver, Receiver, list[bytes], list[bytes]]:
    """Two receivers that took the whole manifest of ``data``'s stream, its pages and its DATA."""
    stream = _stream(data, key)
    pages = [raw for raw in stream if wire.peek_type(raw) == wire.T_MANIFEST]
    rx, one = _receiver(key), _receiver(key)
    for page in pages:
        rx.receive_datagram(page, SENDER, 0.0)
        one.receive_datagram(page, SENDER, 0.0)
    return rx, one, pages, [raw for raw in stream if wire.peek_type(raw) == wire.T_DATA]


@pytest.mark.parametrize("key", [None, KEY])
def test_a_send_ending_in_a_manifest_page_keeps_its_data_on_the_run_path(monkeypatch, key) -> None:
    """A sender's GSO send may end with a shorter datagram of another kind (a manifest
    page): the DATA before it still takes the run path, and the page is still read."""
    rx, one, pages, datas = _two_with_the_manifest(payload(100 * KIB, seed=8), key)
    per_datagram = []
    original = wire.parse_data
    monkeypatch.setattr(wire, "parse_data", lambda raw, key=None: per_datagram.append(1) or original(raw, key))
    batch = datas[:6] + [pages[0]]
    assert len(pages[0]) < len(datas[0])
    rx.receive_batch(memoryview(bytearray(b"".join(batch))), len(datas[0]), SENDER, 0.001)
    assert rx.stats.data_received == 6 and len(per_datagram) <= 1  # (the page: at most a look)
    for raw in batch:
        one.receive_datagram(raw, SENDER, 0.001)
    assert _state(rx, 0.001) == _state(one, 0.001)


@pytest.mark.parametrize("tail", [b"\x01", b"MC\x02", b"MC\x02\x01" + bytes(5)])
def test_a_batch_ending_in_a_scrap_is_taken_like_its_datagrams(tail) -> None:
    """A run the reader joined may end in a datagram of a few bytes (anyone can send one):
    no crash, the same state as the datagrams one by one, the scrap counted as dropped."""
    rx, one, _, datas = _two_with_the_manifest(payload(40 * KIB, seed=9), KEY)
    batch = datas[:5] + [tail]
    rx.receive_batch(memoryview(bytearray(b"".join(batch))), len(datas[0]), SENDER, 0.001)
    for raw in batch:
        one.receive_datagram(raw, SENDER, 0.001)
    assert _state(rx, 0.001) == _state(one, 0.001) and rx.stats.data_received == 5
