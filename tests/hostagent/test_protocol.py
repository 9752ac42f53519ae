"""Sender and receivers wired through the in-memory network (virtual time, seeded loss).

Every scenario asserts what a user cares about: each receiver ends with a file whose
whole-file digest matches the source, and the overhead (NACKs, repair bytes) stays
within stated bounds. No wall-clock timing is asserted anywhere.
"""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import example, given, settings, strategies as st

from hostagent import wire
from hostagent.common import GROUP, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, Layout, MemorySink, MemorySource
from hostagent.events import (
    ChunkCorrupt, Failed, ManifestReceived, ReceiverCompleted, ReceiverFailed, TransferFinished,
)
from hostagent.receiver import Receiver, ReceiverConfig
from hostagent.sender import Sender, SenderConfig
from lab.netsim import SENDER_ADDR, Sim
from tests.support.agents import KIB, assert_all_verified, payload, sender_config, stream_out
from tests.support.profiles import examples


def seq_of(datagram: bytes) -> int | None:
    """Sequence number of a first-transmission DATA datagram (None for anything else)."""
    try:
        msg = wire.decode(datagram)
    except wire.WireError:
        return None
    if isinstance(msg, wire.Data) and not msg.repair:
        return msg.seq
    return None


# --------------------------------------------------------------------------- basics


def test_lossless_transfer_needs_no_repair() -> None:
    data = payload(300 * KIB)
    sim = Sim(data, sender_config(expected_receivers=8))
    for _ in range(8):
        sim.add_receiver()
    sim.run(until=30)
    assert_all_verified(sim, data)
    stats = sim.sender.stats
    assert stats.nacks_received == 0
    assert stats.repair_bytes == 0
    # Every fragment went out exactly once, to the group.
    assert stats.data_sent == Layout(len(data), 4 * KIB, 1024).total_seq


def test_empty_and_tiny_files() -> None:
    for size in (0, 1, 4 * KIB, 4 * KIB + 1):
        data = payload(size)
        sim = Sim(data, sender_config(expected_receivers=2))
        sim.add_receiver()
        sim.add_receiver()
        sim.run(until=30)
        assert_all_verified(sim, data)


LARGEST_PAYLOAD = SenderConfig.max_datagram - wire.DATA_HEADER_LEN - wire.MAC_LEN  # what a 1472-byte datagram holds


@settings(max_examples=examples(30), deadline=None)
@given(chunk=st.sampled_from([MIN_CHUNK_SIZE, MIN_CHUNK_SIZE + 1, 4 * KIB]),
       payload_size=st.sampled_from([wire.MIN_PAYLOAD, wire.MIN_PAYLOAD + 1, 1000, 1024, LARGEST_PAYLOAD]),
       chunks=st.integers(0, 4), edge=st.integers(-1, 1), seed=st.integers(0, 1 << 16))
@example(chunk=MAX_CHUNK_SIZE, payload_size=LARGEST_PAYLOAD, chunks=1, edge=1, seed=0)  # the largest chunk, a byte more
@example(chunk=MAX_CHUNK_SIZE, payload_size=1024, chunks=2, edge=0, seed=1)  # two whole largest chunks
@example(chunk=MIN_CHUNK_SIZE, payload_size=wire.MIN_PAYLOAD, chunks=3, edge=0, seed=2)  # every fragment full
@example(chunk=MIN_CHUNK_SIZE, payload_size=MIN_CHUNK_SIZE, chunks=2, edge=-1, seed=3)  # one fragment a chunk
def test_files_ending_at_chunk_and_fragment_boundaries_arrive_whole(chunk, payload_size, chunks, edge, seed) -> None:
    """Run endpoints: file sizes at a multiple of the chunk size and a byte either side,
    with the smallest and the sender's largest chunk and payload sizes, payloads that
    divide a chunk or leave it a short last fragment, over 3% seeded loss. Every
    receiver verifies the file, and the stream sent each fragment of the layout once."""
    size = max(0, chunks * chunk + edge)
    data = payload(size, seed=seed)
    lossy = random.Random(seed)
    sim = Sim(data, sender_config(chunk_size=chunk, payload_size=payload_size, expected_receivers=2),
              loss=lambda now, s, d, b: lossy.random() < 0.03)
    sim.add_receiver()
    sim.add_receiver()
    sim.run(until=60)
    assert_all_verified(sim, data)
    assert sim.sender.stats.data_sent == Layout(size, chunk, payload_size).total_seq


def test_multi_page_manifest_with_loss() -> None:
    """Enough chunks that the digest list spans several MANIFEST pages."""
    data = payload(200 * KIB)
    cfg = sender_config(chunk_size=1 * KIB, payload_size=512, expected_receivers=4)
    lossy = random.Random(3)
    sim = Sim(data, cfg, loss=lambda now, s, d, b: lossy.random() < 0.05)
    for _ in range(4):
        sim.add_receiver()
    assert len(sim.sender.pages) >= 3
    sim.run(until=60)
    assert_all_verified(sim, data)


# --------------------------------------------------------------------------- loss


@pytest.mark.parametrize("receivers", [8, 64, 256])
def test_shared_loss_nacks_stay_flat_as_group_grows(receivers: int) -> None:
    """1% loss between sender and the first switch: every receiver misses the same
    datagrams. Suppression must keep NACKs per lost datagram O(1), and one multicast
    repair per lost datagram must serve the whole group."""
    data = payload(512 * KIB)
    lost: set[int] = set()

    def shared(now: float, datagram: bytes) -> bool:
        seq = seq_of(datagram)
        if seq is not None and seq % 100 == 42:
            lost.add(seq)
            return True
        return False

    sim = Sim(data, sender_config(expected_receivers=receivers), seed=receivers, shared_loss=shared)
    for _ in range(receivers):
        sim.add_receiver()
    sim.run(until=60)
    assert_all_verified(sim, data)
    stats = sim.sender.stats
    assert len(lost) == 5
    # Roughly flat: bound independent of the group size (8 receivers need ~4 per loss).
    assert stats.nacks_received <= 8 * len(lost), stats.nacks_received
    assert stats.repair_bytes < 0.05 * len(data)
    assert stats.repairs_multicast >= len(lost)
    if receivers >= 64:
        assert sum(r.receiver.stats.nacks_suppressed for r in sim.receivers) > receivers


def test_independent_one_percent_loss() -> None:
    data = payload(512 * KIB)
    lossy = random.Random(11)
    lost = [0]

    def loss(now, src, dst, datagram) -> bool:
        if lossy.random() < 0.01:
            lost[0] += 1
            return True
        return False

    n = 16
    sim = Sim(data, sender_config(expected_receivers=n), loss=loss)
    for _ in range(n):
        sim.add_receiver()
    sim.run(until=60)
    assert_all_verified(sim, data)
    stats = sim.sender.stats
    # Repair cost per receiver stays near the loss rate (1%), well under 5% of the file.
    assert stats.repair_bytes / n < 0.05 * len(data)
    # NACKs batch gaps: fewer NACK datagrams than lost datagrams.
    assert 0 < stats.nacks_received <= lost[0]


def test_no_data_nonce_repeats_under_loss_repair_and_fec() -> None:
    """AES-GMAC's one rule (``hostagent.wire``): under one session key a nonce is used
    once. DATA's nonce is its seq, so the sender must send each seq as DATA at most once
    per session whatever repair does: 5% loss at every receiver, unicast and multicast
    repair, FEC parity, a late joiner; every other datagram is BLAKE3-tagged."""
    data = payload(512 * KIB)
    lossy = random.Random(12)
    sent: dict[tuple[int, int], bytes] = {}
    repeats = []

    def loss(now, src, dst, datagram) -> bool:
        if src == SENDER_ADDR and datagram[3] == wire.T_DATA:
            session, seq = struct.unpack_from("!6xQQ", datagram)
            if (session, seq) in sent and sent[(session, seq)] != datagram:
                repeats.append(seq)
            sent.setdefault((session, seq), datagram)
        return lossy.random() < 0.05

    sim = Sim(data, sender_config(expected_receivers=4, key=wire.derive_key(b"k"), fec_k=8), loss=loss)
    for _ in range(3):
        sim.add_receiver()
    sim.run(until=1.0)
    sim.add_receiver()  # joins mid-stream: its gaps are repaired, never re-streamed
    sim.run(until=90)
    assert_all_verified(sim, data)
    stats = sim.sender.stats
    assert stats.repairs_multicast + stats.repairs_unicast + stats.repairs_parity > 0
    assert not repeats and len(sent) == sim.sender.layout.total_seq


def test_burst_loss_slows_the_sender_but_never_above_cap() -> None:
    """A switch buffer overrun: everyone loses everything for 20 ms of virtual time."""
    data = payload(1024 * KIB)
    cap = 20e6
    sim = Sim(data, sender_config(rate_bps=cap, expected_receivers=4),
              loss=lambda now, s, d, b: 0.1 <= now < 0.12 and s == SENDER_ADDR)
    for _ in range(4):
        sim.add_receiver()
    assert sim.sender.rate == pytest.approx(0.7 * cap)
    rates = []
    while not sim.done and sim.now < 60:
        sim.run(until=sim.now + 0.01)
        rates.append((sim.now, sim.sender.rate))
    assert_all_verified(sim, data)
    assert sim.sender.stats.rate_decreases >= 1
    # Clean start: it ramps up from 70%; the overrun then cuts the rate multiplicatively.
    rates = [r for _, r in rates]
    peak = max(rates)
    assert peak > 0.7 * cap
    assert min(rates) <= 0.7 * peak + 1
    assert max(rates) <= cap
    # Pacing: data never left faster than the cap allows (plus one bucket of burst).
    stream_bytes = sim.sender.stats.data_bytes_sent
    first_pass_end = sim.sender._stream_done_at
    assert stream_bytes * 8 <= cap * first_pass_end + 8 * sim.sender.config.burst_bytes


def test_receiver_that_loses_everything_for_a_while_recovers() -> None:
    data = payload(512 * KIB)
    sim = Sim(data, sender_config(expected_receivers=4),
              loss=lambda now, s, d, b: d == ("rx", 3) and 0.05 <= now < 0.15)
    for _ in range(4):
        sim.add_receiver()
    sim.run(until=60)
    assert_all_verified(sim, data)
    blackout = sim.receivers[3].receiver
    assert blackout.stats.nack_seqs_requested > 50
    # The others needed nothing: the blackout was repaired by unicast, not multicast.
    assert sim.sender.stats.repairs_multicast == 0
    for rec in sim.receivers[:3]:
        assert rec.receiver.stats.nacks_sent == 0


def test_late_joiner_at_half_way_catches_up() -> None:
    data = payload(512 * KIB)
    sim = Sim(data, sender_config(expected_receivers=4))
    for _ in range(3):
        sim.add_receiver()
    total = sim.sender.layout.total_seq
    while sim.sender._next_seq < total // 2 and sim.now < 30:  # (virtual time: a stalled stream ends the loop)
        sim.run(until=sim.now + 0.001)
    late = sim.add_receiver()
    sim.run(until=60)
    assert_all_verified(sim, data)
    joined = [e for e in late.events if isinstance(e, ManifestReceived)]
    assert len(joined) == 1
    assert late.receiver.stats.data_received < total * 0.55  # it really missed the first half
    assert late.receiver.stats.repairs_received >= total * 0.45
    for rec in sim.receivers[:3]:
        assert rec.receiver.stats.nacks_sent == 0  # nobody else paid for it


def _stream_with_late_joiner(sim: Sim, data: bytes, receivers: int) -> tuple[float, object]:
    """``receivers`` from the start and one more half-way through the stream; run to the
    end; (when the stream ended, the late receiver)."""
    for _ in range(receivers):
        sim.add_receiver()
    total = sim.sender.layout.total_seq
    while sim.sender._next_seq < total // 2 and sim.now < 30:
        sim.run(until=sim.now + 0.001)
    late = sim.add_receiver()
    while sim.sender._next_seq < total and sim.now < 30:
        sim.run(until=sim.now + 0.001)
    stream_end = sim.now
    sim.run(until=60)
    assert_all_verified(sim, data)
    return stream_end, late


def test_the_stream_stops_repeating_a_manifest_every_expected_receiver_has() -> None:
    """Four expected receivers, a manifest of one page: once each said HELLO (the answer
    to a page) the stream carries a page once per manifest_interval, for late joiners,
    instead of every 64 datagrams; a fifth receiver nobody expected, joining half-way,
    still gets one and verifies."""
    data = payload(8 * 1024 * KIB)
    sim = Sim(data, SenderConfig(rate_bps=150e6, expected_receivers=4), seed=5)
    assert len(sim.sender.pages) == 1
    stream_end, late = _stream_with_late_joiner(sim, data, 4)
    stats = sim.sender.stats
    assert stats.manifests_sent <= 3 + stream_end / sim.sender.config.manifest_interval, stats.manifests_sent
    assert stats.data_sent > 60 * sim.sender.config.manifest_every  # (it would have been 90 pages)
    assert [type(e) for e in late.events].count(ManifestReceived) == 1


def test_a_receiver_that_lost_the_first_pages_gets_the_next_one_within_the_stream() -> None:
    """One of four expected receivers loses every manifest page for the first 50 ms: until
    it said HELLO the pages keep coming every 64 datagrams, so it joins a few ms later, not
    a manifest_interval later, and verifies."""
    data = payload(8 * 1024 * KIB)
    blind = ("rx", 2)
    sim = Sim(data, SenderConfig(rate_bps=150e6, expected_receivers=4), seed=6,
              loss=lambda now, src, dst, d: dst == blind and now < 0.05 and d[3] == wire.T_MANIFEST)
    for _ in range(4):
        sim.add_receiver()
    joined_at = None
    while sim.now < 1.0 and joined_at is None:
        sim.run(until=sim.now + 0.001)
        if any(isinstance(e, ManifestReceived) for e in sim.receivers[2].events):
            joined_at = sim.now
    assert joined_at is not None and 0.05 <= joined_at < 0.05 + sim.sender.config.manifest_interval / 5
    sim.run(until=60)
    assert_all_verified(sim, data)


def test_restarted_receiver_resumes_from_saved_state() -> None:
    data = payload(512 * KIB)
    sim = Sim(data, sender_config(expected_receivers=3))
    sim.add_receiver()
    sim.add_receiver()
    crashy = sim.add_receiver(ReceiverConfig(state_save_interval=0.02), down=(0.1, 0.2))
    sim.run(until=60)
    assert_all_verified(sim, data)
    total = sim.sender.layout.total_seq
    assert crashy.missing_at_restart is not None
    assert 0 < crashy.missing_at_restart < total  # the saved state covered real progress
    resumed = crashy.receiver
    assert resumed.resumed_chunks > 0
    # The new instance asked only for what it lacked.
    assert resumed.stats.nack_seqs_requested <= crashy.missing_at_restart
    assert resumed.stats.data_received + resumed.stats.repairs_received < total


def test_resumed_receiver_keeps_its_id() -> None:
    """A restarted receiver is the same receiver to the sender, not a failed one plus a
    stranger: its id travels in the resume record."""
    data = payload(64 * KIB)
    sim = Sim(data, sender_config(expected_receivers=1))
    first = sim.add_receiver(ReceiverConfig(receiver_id=None))
    sim.run(until=60)
    state = first.receiver.snapshot_state()
    again = Receiver(MemorySink(), ReceiverConfig(), 0.0, state=state)
    assert again.receiver_id == first.receiver.receiver_id
    assert Receiver(MemorySink(), ReceiverConfig(), 0.0).receiver_id != again.receiver_id


def test_straggler_is_reported_failed_without_holding_back_others() -> None:
    data = payload(256 * KIB)
    cfg = sender_config(expected_receivers=4, receiver_timeout=1.0, idle_timeout=0.5)
    sim = Sim(data, cfg, loss=lambda now, s, d, b: (d == ("rx", 3) or s == ("rx", 3)) and now >= 0.03)
    for _ in range(4):
        sim.add_receiver()
    sim.run(until=60)
    finished = [e for e in sim.sender_events if isinstance(e, TransferFinished)]
    assert len(finished) == 1
    assert not finished[0].ok
    assert finished[0].failed == (1003,)
    assert sorted(finished[0].completed) == [1000, 1001, 1002]
    completed_at = [i for i, e in enumerate(sim.sender_events) if isinstance(e, ReceiverCompleted)]
    failed_at = [i for i, e in enumerate(sim.sender_events) if isinstance(e, ReceiverFailed)]
    assert max(completed_at) < min(failed_at)
    for rec in sim.receivers[:3]:
        assert bytes(rec.sink.data) == data
    assert sim.receivers[3].receiver.complete is False


def test_expected_receiver_that_never_shows_up() -> None:
    data = payload(64 * KIB)
    sim = Sim(data, sender_config(expected_receivers=3, idle_timeout=0.5))
    sim.add_receiver()
    sim.add_receiver()
    sim.run(until=60)
    finished = [e for e in sim.sender_events if isinstance(e, TransferFinished)]
    assert finished == [TransferFinished(False, (1000, 1001), (), 1)]


# --------------------------------------------------------------------------- bad input


def test_duplicated_datagrams_do_not_double_count() -> None:
    data = payload(256 * KIB)
    dup = random.Random(5)
    sim = Sim(data, sender_config(expected_receivers=4), duplicate=lambda *a: dup.random() < 0.3)
    for _ in range(4):
        sim.add_receiver()
    sim.run(until=60)
    assert_all_verified(sim, data)
    for rec in sim.receivers:
        assert rec.receiver.stats.duplicates > 0
        assert rec.receiver.have.count == sim.sender.layout.total_seq
    completions = [e for e in sim.sender_events if isinstance(e, ReceiverCompleted)]
    assert sorted(e.receiver_id for e in completions) == [1000, 1001, 1002, 1003]


def test_forged_and_malformed_datagrams_are_counted_and_dropped() -> None:
    key = wire.derive_key(b"session secret")
    data = payload(128 * KIB)
    sim = Sim(data, sender_config(expected_receivers=2, key=key))
    victim = sim.add_receiver()
    sim.add_receiver()
    session = sim.sender.session
    layout = sim.sender.layout
    forged_key = wire.derive_key(b"attacker")
    bad = {
        "bad_mac": [wire.encode(wire.Data(session, s, *layout.locate(s)[:2], b"X" * layout.locate(s)[2]), forged_key)
                    for s in range(40, 60)],
        "unauthenticated": [wire.encode(wire.Data(session, 5, *layout.locate(5)[:2], b"Y" * 1024))],
        "truncated": [b"MC\x01"],
        "bad_version": [b"MC\x07" + bytes(40)],
        "bad_magic": [b"\x00" * 60],
    }
    for i, (_, datagrams) in enumerate(bad.items()):  # (after the victim heard a manifest:
        for j, d in enumerate(datagrams):              # before it, data is "no_manifest" unchecked)
            sim.inject(0.01 + 0.001 * (i + 1) + 1e-5 * j, victim, d)
    forged_nack = wire.encode(wire.Nack(session, 1000, ((0, 100),)), forged_key)
    sim.inject_to_sender(0.01, forged_nack, victim.addr)
    sim.inject_to_sender(0.011, b"garbage", victim.addr)
    sim.run(until=60)
    assert_all_verified(sim, data)
    drops = victim.receiver.stats.drops
    for reason, datagrams in bad.items():
        assert drops[reason] == len(datagrams), reason
    assert sim.sender.stats.drops["bad_mac"] == 1
    assert sim.sender.stats.drops["truncated"] == 1
    assert sim.sender.stats.repair_bytes == 0  # the forged NACK triggered nothing


def test_corrupt_payload_without_mac_is_caught_by_chunk_digest() -> None:
    """No session key: a datagram with a valid header but wrong bytes slips past the wire
    check; the chunk digest catches it, the chunk is re-requested, the file is right."""
    data = payload(128 * KIB)
    target = 10

    def drop_target(now, src, dst, datagram) -> bool:
        return dst == ("rx", 0) and seq_of(datagram) == target

    sim = Sim(data, sender_config(expected_receivers=1), loss=drop_target)
    rec = sim.add_receiver()
    layout = sim.sender.layout
    chunk, offset, length = layout.locate(target)
    evil = wire.encode(wire.Data(sim.sender.session, target, chunk, offset, b"\xee" * length))
    sim.inject(0.005, rec, evil)
    sim.run(until=60)
    assert_all_verified(sim, data)
    assert ChunkCorrupt(chunk) in rec.events
    assert rec.receiver.stats.corrupt_chunks == 1


def test_wrong_session_is_ignored() -> None:
    data = payload(64 * KIB)
    sim = Sim(data, sender_config(expected_receivers=1))
    rec = sim.add_receiver()
    other = Sender(MemorySource(payload(64 * KIB, seed=9)), sender_config(session_id=sim.sender.session ^ 1), 0.0)
    foreign = [d for t in range(10) for d, _ in other.datagrams_to_send(t * 0.001)]
    assert len(foreign) > 5
    for i, d in enumerate(foreign):  # after the real manifest locked the session
        sim.inject(0.002 + i * 1e-5, rec, d)
    sim.run(until=60)
    assert_all_verified(sim, data)
    assert rec.receiver.stats.drops["wrong_session"] > 0


# --------------------------------------------------------------------------- exact unit behaviour


def _sender_with_stream_out() -> tuple[Sender, float]:
    sender = Sender(MemorySource(payload(64 * KIB)), sender_config(rate_bps=1e9, multicast_threshold=2), 0.0)
    return sender, stream_out(sender)


def test_sender_aggregates_nacks_into_one_multicast_repair() -> None:
    sender, now = _sender_with_stream_out()
    s = sender.session
    for rid in (1, 2, 3):
        sender.receive_datagram(wire.encode(wire.Nack(s, rid, ((5, 6),))), ("rx", rid), now)
    sender.receive_datagram(wire.encode(wire.Nack(s, 4, ((9, 10),))), ("rx", 4), now)
    assert sender.get_timer() <= now + 0.075
    now += 0.075
    sender.handle_timer(now)
    out = [(wire.decode(d), dest) for d, dest in sender.datagrams_to_send(now + 1)]
    repairs = [(m.seq, m.multicast, dest) for m, dest in out if isinstance(m, wire.Data) and m.repair]
    assert repairs == [(5, True, GROUP), (9, False, ("rx", 4))]


def test_receiver_suppresses_nack_when_multicast_repair_arrives_first() -> None:
    data = payload(64 * KIB)
    sender = Sender(MemorySource(data), sender_config(), 0.0)
    sink = MemorySink()
    rx = Receiver(sink, ReceiverConfig(receiver_id=7, nack_backoff=0.3), 0.0, rng=random.Random(1))
    datagrams = [d for t in range(20) for d, _ in sender.datagrams_to_send(t * 0.001)]
    assert 3 in {seq_of(d) for d in datagrams} and 4 in {seq_of(d) for d in datagrams}
    for d in datagrams:
        if seq_of(d) != 3:
            rx.receive_datagram(d, SENDER_ADDR, 0.001)
    assert rx.get_timer() is not None
    assert rx.get_timer() > 0.001
    # The sender multicasts seq 3 because someone else asked for it.
    chunk, offset, length = sender.layout.locate(3)
    repair = wire.Data(sender.session, 3, chunk, offset, data[chunk * 4096 + offset:][:length], True, True)
    rx.receive_datagram(wire.encode(repair), SENDER_ADDR, 0.002)
    rx.handle_timer(0.5)
    sent = [wire.decode(d) for d, _ in rx.datagrams_to_send(0.5)]
    assert not any(isinstance(m, wire.Nack) for m in sent)
    assert rx.stats.nacks_suppressed == 1


def test_damaged_resume_record_means_start_over() -> None:
    data = payload(16 * KIB)
    sender = Sender(MemorySource(data), sender_config(), 0.0)
    rx = Receiver(MemorySink(), ReceiverConfig(), 0.0, state=b"\xc1not msgpack")
    for d, _ in sender.datagrams_to_send(0.0):
        rx.receive_datagram(d, SENDER_ADDR, 0.0)
    event = rx.next_event()
    assert isinstance(event, ManifestReceived) and event.resumed_chunks == 0


def test_receiver_fails_when_sender_goes_silent() -> None:
    data = payload(16 * KIB)
    sender = Sender(MemorySource(data), sender_config(), 0.0)
    rx = Receiver(MemorySink(), ReceiverConfig(idle_timeout=2.0), 0.0)
    first = sender.datagrams_to_send(0.0)[0][0]  # manifest only
    rx.receive_datagram(first, SENDER_ADDR, 0.0)
    rx.next_event()
    assert rx.get_timer() == 2.0
    rx.handle_timer(2.0)
    assert rx.next_event() == Failed("sender silent")


def test_receiver_with_other_lane_count_says_so_when_it_gives_up() -> None:
    """A receiver started with another --lanes than the sender hears only manifests it
    must drop; 'sender silent' alone would send the user looking at the network."""
    data = payload(16 * KIB)
    sender = Sender(MemorySource(data), sender_config(lane=(0, 2, 0)), 0.0)
    rx = Receiver(MemorySink(), ReceiverConfig(idle_timeout=2.0), 0.0)
    rx.receive_datagram(sender.datagrams_to_send(0.0)[0][0], SENDER_ADDR, 0.0)
    assert rx.stats.drops["wrong_lane"] == 1
    rx.handle_timer(2.0)
    failed = rx.next_event()
    assert isinstance(failed, Failed)
    assert "2 lane(s)" in failed.reason and "--lanes" in failed.reason


def test_second_asker_escalates_to_multicast_but_re_asking_does_not() -> None:
    sender, now = _sender_with_stream_out()
    s = sender.session

    def nack(rid: int, seq: int, at: float) -> list:
        sender.receive_datagram(wire.encode(wire.Nack(s, rid, ((seq, seq + 1),))), ("rx", rid), at)
        sender.handle_timer(at + 0.075)
        out = [(wire.decode(d), dest) for d, dest in sender.datagrams_to_send(at + 0.5)]
        return [(m.seq, dest) for m, dest in out if isinstance(m, wire.Data) and m.repair]

    assert nack(1, 5, now) == [(5, ("rx", 1))]
    assert nack(1, 5, now + 0.6) == [(5, ("rx", 1))]  # lost its repair: still unicast
    assert nack(2, 5, now + 1.2) == [(5, GROUP)]  # someone else too: shared loss


def test_resumed_chunk_changed_on_disk_is_fetched_again() -> None:
    """A resume record vouches for chunks, the disk may not: every resumed chunk is
    hashed before the file counts as verified, and one that no longer matches its digest
    is asked for again (not trusted, not a failed transfer)."""
    data = payload(256 * KIB)
    first = Sim(data, sender_config(expected_receivers=1))
    done = first.add_receiver(ReceiverConfig(receiver_id=7))
    first.run(until=60)
    state = done.receiver.snapshot_state()
    damaged = MemorySink()
    damaged.data[:] = data
    damaged.data[3 * 4 * KIB + 5] ^= 0xFF  # chunk 3 (4 KiB chunks) changed after the crash
    again = Sim(data, sender_config(expected_receivers=1), seed=1)
    rec = again.add_receiver(ReceiverConfig(receiver_id=7))
    rec.sink = damaged
    rec.receiver = Receiver(damaged, rec.config, 0.0, state=state, rng=rec.rng)
    again.run(until=60)
    rx = rec.receiver
    assert rx.complete and bytes(damaged.data) == data
    assert rx.resumed_chunks == rx.layout.chunk_count - 1  # the claims that held
    assert ChunkCorrupt(3) in rec.events
    stored = rx.stats.data_received + rx.stats.repairs_received - rx.stats.duplicates
    assert stored == rx.layout.chunk_frags(3)  # the rest was kept, only chunk 3 written again


def test_an_exact_repeat_of_a_taken_manifest_page_is_not_decoded_again(monkeypatch) -> None:
    """The sender repeats its manifest pages through the stream: a receiver takes each
    once and an exact repeat costs a comparison (no MAC check, no decode) and changes
    nothing, not even the receiver's idle timer (a repeat is no news: a liar could send
    it forever, docs/security.md "Receivers"); a datagram with a taken page's tag but other
    bytes is checked as ever and dropped (bad_mac); the transfer verifies."""
    key = wire.derive_key(b"page repeats")
    data = payload(96 * KIB)
    sender = Sender(MemorySource(data), sender_config(key=key), 0.0, rng=random.Random(3))
    stream, now = [], 0.0
    while sender.stream_position < sender.layout.total_seq or wire.peek_type(stream[-1]) != wire.T_END:
        assert now < 60, "no END after 60 virtual seconds"
        now += 0.001
        stream.extend(raw for raw, _ in sender.datagrams_to_send(now))
    pages = [raw for raw in stream if wire.peek_type(raw) == wire.T_MANIFEST]
    distinct = list(dict.fromkeys(pages))
    assert len(pages) > len(distinct)
    decoded: list[bytes] = []
    real = wire.decode
    monkeypatch.setattr(wire, "decode", lambda raw, k: decoded.append(bytes(raw)) or real(raw, k))
    sink = MemorySink()
    rx = Receiver(sink, ReceiverConfig(key=key), 0.0)
    for raw in pages:
        rx.receive_datagram(raw, SENDER_ADDR, 0.5)
    taken = len(decoded)
    assert taken == len(distinct) and rx.manifest is not None
    for raw in pages:
        rx.receive_datagram(memoryview(raw), SENDER_ADDR, 0.7)  # (as the socket layer hands them on)
    assert len(decoded) == taken and rx._last_heard == 0.5
    forged = bytearray(pages[0])
    forged[wire.HEADER_LEN + 2] ^= 1
    rx.receive_datagram(bytes(forged), SENDER_ADDR, 0.8)
    assert len(decoded) == taken + 1 and rx.stats.drops["bad_mac"] == 1 and rx._last_heard == 0.5
    for raw in stream:
        rx.receive_datagram(raw, SENDER_ADDR, 1.0)
    assert rx.complete and bytes(sink.data[: len(data)]) == data
    assert len(decoded) - taken - 1 < len([raw for raw in stream if wire.peek_type(raw) != wire.T_DATA])


def test_the_simulation_steps_through_a_quiet_stretch() -> None:
    """``Sim.run(until=t)`` leaves the clock at t when nothing happens before it: a test
    stepping ``run(until=sim.now + dt)`` through a stretch with no event (a receiver
    waiting for a page that repeats every 0.25 s) used to step in place forever."""
    data = payload(64 * KIB)
    sim = Sim(data, sender_config(), loss=lambda now, s, d, b: True)  # nobody hears anything
    sim.add_receiver()
    for _ in range(100):
        sim.run(until=sim.now + 0.01)
    assert sim.now == pytest.approx(1.0)
