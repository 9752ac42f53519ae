"""FEC parity: the code itself, the sender's choice between parity and plain repair,
receivers rebuilding from shares, and everything that must not go wrong when shares are
lost, forged or useless. Virtual time only."""

from __future__ import annotations

import json
import random
from functools import partial

import pytest

from bench import scale as bench_scale
from hostagent import fec, wire
from hostagent.common import GROUP, Layout, MemorySink, MemorySource
from hostagent.events import ChunkCorrupt
from hostagent.receiver import Receiver, ReceiverConfig
from hostagent.sender import Sender
from lab.netsim import SENDER_ADDR, Sim, SourceBackedSink
from tests.support.agents import KIB, assert_all_verified, payload, sender_config, stream_out

config = partial(sender_config, chunk_size=64 * KIB)  # FEC blocks of up to 64 datagrams fit a chunk


def independent_loss(seed: int, rate: float):
    rng = random.Random(seed)
    return lambda now, src, dst, datagram: rng.random() < rate


def kind(datagram: bytes) -> int:
    return datagram[3]


# --------------------------------------------------------------------------- the code


def test_any_k_of_data_and_parity_rebuild_a_block_with_a_short_last_fragment() -> None:
    layout = Layout(file_size=10 * 1000 + 37, chunk_size=100_000, payload_size=1000)  # 11 fragments
    data = payload(layout.file_size)
    k = 8
    for block in (0, 1):  # a full block, then the 3-fragment tail block ending in 37 bytes
        first, end = fec.block_bounds(layout, 0, block, k)
        k_eff = end - first
        size = fec.symbol_size(layout, first)
        frags = [data[s * 1000 : s * 1000 + layout.locate(s)[2]] for s in range(first, end)]
        symbols = [fec.pad(f, size) for f in frags]
        parity = fec.encode(symbols, range(k_eff + 10, k_eff + 13))  # any fresh indices
        rng = random.Random(block)
        for _ in range(20):
            pool = {i: symbols[i] for i in range(k_eff)} | {k_eff + 10 + j: p for j, p in enumerate(parity)}
            chosen = dict(rng.sample(sorted(pool.items()), k_eff))
            out = fec.decode(k_eff, chosen)
            assert [o[: len(f)] for o, f in zip(out, frags)] == frags
    with pytest.raises(ValueError):
        fec.decode(2, {0: b"ab", 5: b"abc"})
    with pytest.raises(ValueError):
        fec.decode(3, {0: b"ab", 5: b"ab"})


def test_parity_shares_do_not_depend_on_how_many_were_made() -> None:
    """Successive repair rounds hand out fresh indices; a share must mean the same thing
    whichever round (and whichever code length) produced it."""
    symbols = [payload(64, seed=i) for i in range(5)]
    assert fec.encode(symbols, [7]) == fec.encode(symbols, [5, 6, 7])[2:]


def test_plan_shares_minimises_parity_plus_leftovers() -> None:
    assert fec.plan_shares([1, 1, 1], 100) == (1, 1)  # three receivers, one share
    assert fec.plan_shares([2, 2, 1], 100) == (2, 2)
    assert fec.plan_shares([5, 1, 1, 1], 100) == (1, 5)  # the outlier gets 4 of its own
    assert fec.plan_shares([3], 100) == (1, 3)  # alone: no cheaper than plain (caller decides)
    assert fec.plan_shares([3, 3], 2) == (2, 4)  # capped by the indices left
    assert fec.plan_shares([], 100) == (0, 0)


# --------------------------------------------------------------------------- sender decisions


def _streamed_sender(**overrides) -> tuple[Sender, bytes, float]:
    data = payload(128 * KIB)
    sender = Sender(MemorySource(data), config(rate_bps=1e9, fec_k=16, **overrides), 0.0, rng=random.Random(3))
    return sender, data, stream_out(sender)


def test_different_single_losses_in_one_block_get_one_parity_share() -> None:
    sender, data, now = _streamed_sender()
    s = sender.session
    for rid, seq in ((1, 3), (2, 7), (3, 11)):  # block 0 of chunk 0 (seqs 0..15)
        sender.receive_datagram(wire.encode(wire.Nack(s, rid, ((seq, seq + 1),))), ("rx", rid), now)
    now += 0.075
    sender.handle_timer(now)
    out = [(d, dest) for d, dest in sender.datagrams_to_send(now + 1) if kind(d) in (wire.T_REPAIR, wire.T_PARITY)]
    assert len(out) == 1
    raw, dest = out[0]
    share = wire.decode(raw)
    assert isinstance(share, wire.Parity) and dest == GROUP
    assert (share.chunk, share.block, share.k, share.n) == (0, 0, 16, 256) and share.index >= 16
    assert sender.stats.repairs_parity == 1 and sender.stats.repairs_unicast == 0

    # Each of the three rebuilds its own loss from that one share.
    for lost in (3, 7, 11):
        rx = Receiver(MemorySink(), ReceiverConfig(receiver_id=lost), 0.0)
        replay = Sender(MemorySource(data), config(rate_bps=1e9, session_id=s), 0.0)
        now2 = 0.0
        while replay._next_seq < 16:
            now2 += 0.0001
            for d, _ in replay.datagrams_to_send(now2):
                if not (kind(d) == wire.T_DATA and wire.decode(d).seq == lost):
                    rx.receive_datagram(d, SENDER_ADDR, now2)
        assert lost not in rx.have
        rx.receive_datagram(raw, SENDER_ADDR, now2)
        assert lost in rx.have and rx.stats.fec_decodes == 1
        assert bytes(rx._sink.read(lost * 1024, 1024)) == data[lost * 1024 : lost * 1024 + 1024]


def test_a_receiver_needing_more_gets_its_remainder_by_unicast() -> None:
    sender, _, now = _streamed_sender()
    s = sender.session
    sender.receive_datagram(wire.encode(wire.Nack(s, 1, ((1, 2), (4, 7)))), ("rx", 1), now)  # needs 4
    for rid, seq in ((2, 9), (3, 10), (4, 12)):
        sender.receive_datagram(wire.encode(wire.Nack(s, rid, ((seq, seq + 1),))), ("rx", rid), now)
    sender.handle_timer(now + 0.075)
    out = [(wire.decode(d), dest) for d, dest in sender.datagrams_to_send(now + 1)]
    parity = [m for m, _ in out if isinstance(m, wire.Parity)]
    unicast = [(m.seq, dest) for m, dest in out if isinstance(m, wire.Data) and m.repair]
    # One share for everyone; receiver 1 gets 3 of its 4 holes (any 3) to go with it.
    assert len(parity) == 1
    assert unicast == [(1, ("rx", 1)), (4, ("rx", 1)), (5, ("rx", 1))]


def test_a_lone_asker_in_a_quiet_group_gets_plain_unicast() -> None:
    sender, _, now = _streamed_sender()
    sender.receive_datagram(wire.encode(wire.Nack(sender.session, 1, ((3, 5),))), ("rx", 1), now)
    sender.handle_timer(now + 0.075)
    kinds = [kind(d) for d, _ in sender.datagrams_to_send(now + 1)]
    assert kinds.count(wire.T_REPAIR) == 2 and wire.T_PARITY not in kinds


# --------------------------------------------------------------------------- receivers


def test_held_shares_shrink_the_nack_and_complete_the_block() -> None:
    """Two holes, one share held: ask for one datagram; its arrival rebuilds the other."""
    data = payload(32 * KIB)
    sender = Sender(MemorySource(data), config(rate_bps=1e9), 0.0)
    rx = Receiver(MemorySink(), ReceiverConfig(receiver_id=9), 0.0, rng=random.Random(2))
    now = 0.0
    while sender._next_seq < sender.layout.total_seq:
        now += 0.0001
        for d, _ in sender.datagrams_to_send(now):
            if not (kind(d) == wire.T_DATA and wire.decode(d).seq in (3, 5)):
                rx.receive_datagram(d, SENDER_ADDR, now)
    symbols = [data[i * 1024 : (i + 1) * 1024] for i in range(16)]
    (share,) = fec.encode(symbols, [20])
    rx.receive_datagram(wire.encode(wire.Parity(sender.session, 0, 0, 16, 256, 20, share)), SENDER_ADDR, now)
    assert rx.missing_seqs == 2
    rx.handle_timer(now + 1.0)
    nacks = [wire.decode(d) for d, _ in rx.datagrams_to_send(now + 1.0)]
    assert [n.ranges for n in nacks if isinstance(n, wire.Nack)] == [((3, 4),)]
    repair = wire.Data(sender.session, 3, 0, 3 * 1024, symbols[3], repair=True, multicast=False)
    rx.receive_datagram(wire.encode(repair), SENDER_ADDR, now + 1.01)
    assert rx.missing_seqs == 0 and rx.stats.fec_recovered == 1
    assert rx.complete


def test_independent_loss_64_receivers_fec_at_least_halves_repair_bytes() -> None:
    """The headline: 1% independent loss per receiver, same seed with and without FEC."""
    data = payload(512 * KIB)
    results = {}
    for fec_k in (0, 32):
        sim = Sim(data, config(expected_receivers=64, fec_k=fec_k), seed=5, loss=independent_loss(5, 0.01))
        for _ in range(64):
            sim.add_receiver()
        sim.run(until=60)
        assert_all_verified(sim, data)
        results[fec_k] = sim
    plain, coded = results[0].sender.stats, results[32].sender.stats
    assert plain.repairs_parity == 0
    assert coded.repairs_parity > 0
    assert coded.repair_bytes <= 0.5 * plain.repair_bytes, (coded.repair_bytes, plain.repair_bytes)
    assert coded.nacks_received < plain.nacks_received
    decodes = sum(r.receiver.stats.fec_recovered for r in results[32].receivers)
    assert decodes > coded.repairs_parity  # one share served several receivers


def test_receiver_that_never_gets_parity_falls_back_to_nacks() -> None:
    data = payload(256 * KIB)
    base = independent_loss(8, 0.01)

    def loss(now, src, dst, datagram) -> bool:
        if dst == ("rx", 0) and kind(datagram) == wire.T_PARITY:
            return True
        return base(now, src, dst, datagram)

    sim = Sim(data, config(expected_receivers=32, fec_k=16), seed=8, loss=loss)
    for _ in range(32):
        sim.add_receiver()
    sim.run(until=60)
    assert_all_verified(sim, data)
    deaf = sim.receivers[0].receiver
    assert deaf.stats.parity_received == 0 and deaf.stats.nacks_sent > 0
    assert sim.sender.stats.repairs_parity > 0
    assert sum(r.receiver.stats.fec_decodes for r in sim.receivers[1:]) > 0


def test_proactive_parity_repairs_before_anyone_asks() -> None:
    """One proactive share per 16-datagram block at 0.5% loss halves the NACKs: counted
    over five seeds (a single run's ~20 NACKs move by a few with any change to the
    stream's timing)."""
    data = payload(512 * KIB)
    nacks = {0.0: 0, 1 / 16: 0}
    for seed in range(1, 6):
        for overhead in (0.0, 1 / 16):
            sim = Sim(data, config(expected_receivers=16, fec_k=16, fec_overhead=overhead), seed=seed,
                      loss=independent_loss(seed, 0.005))
            for _ in range(16):
                sim.add_receiver()
            sim.run(until=60)
            assert_all_verified(sim, data)
            nacks[overhead] += sim.sender.stats.nacks_received
            if overhead:
                blocks = 512 // 16
                assert sim.sender.stats.parity_proactive == blocks  # one share per 16-datagram block
                assert sim.sender.stats.parity_bytes_proactive < 0.08 * len(data)
    assert nacks[1 / 16] < 0.5 * nacks[0.0], nacks


# --------------------------------------------------------------------------- bad parity


def _target_loss(seq: int):
    def drop(now, src, dst, datagram) -> bool:
        return dst == ("rx", 0) and kind(datagram) == wire.T_DATA and wire.decode(datagram).seq == seq
    return drop


def test_forged_parity_without_a_key_is_caught_by_the_chunk_digest() -> None:
    data = payload(128 * KIB)
    sim = Sim(data, config(expected_receivers=1, fec_k=16), loss=_target_loss(5))
    # Full-length NACK backoff (not the short one of a one-receiver group), so the
    # forged share lands while the receiver still waits to ask.
    rec = sim.add_receiver(ReceiverConfig(nack_group_scale=1))
    evil = wire.encode(wire.Parity(sim.sender.session, 0, 0, 16, 256, 40, b"\xee" * 1024))
    sim.inject(0.02, rec, evil)  # after block 0 streamed past, before the NACK fires
    sim.run(until=60)
    assert_all_verified(sim, data)
    stats = rec.receiver.stats
    assert stats.fec_decodes == 1  # the forged share was used ...
    assert ChunkCorrupt(0) in rec.events  # ... the chunk digest refused the result ...
    assert stats.drops["corrupt_parity"] == 1  # ... and it was counted


def test_parity_with_bad_mac_or_impossible_geometry_is_dropped_and_counted() -> None:
    key = wire.derive_key(b"secret")
    data = payload(100 * KIB + 300)  # 2 chunks; chunk 1's last block is 5 fragments
    sim = Sim(data, config(expected_receivers=1, fec_k=16, key=key), loss=_target_loss(5))
    rec = sim.add_receiver()
    s = sim.sender.session
    attacker = wire.derive_key(b"attacker")
    bad_mac = [wire.encode(wire.Parity(s, 0, 0, 16, 256, 30 + i, bytes(1024)), attacker) for i in range(3)]
    bad_geometry = [
        wire.Parity(s, 7, 0, 16, 256, 20, bytes(1024)),  # no such chunk
        wire.Parity(s, 0, 9, 16, 256, 20, bytes(1024)),  # no such block in chunk 0
        wire.Parity(s, 0, 0, 16, 256, 3, bytes(1024)),  # index of a data share
        wire.Parity(s, 0, 0, 16, 256, 20, bytes(1000)),  # wrong share length
        wire.Parity(s, 1, 2, 16, 256, 4, bytes(1024)),  # the tail block holds only 5 fragments
    ]
    for i, raw in enumerate(bad_mac + [wire.encode(m, key) for m in bad_geometry]):
        sim.inject(0.02 + i * 1e-4, rec, raw)
    sim.run(until=60)
    assert_all_verified(sim, data)
    drops = rec.receiver.stats.drops
    assert drops["bad_mac"] == 3
    assert drops["bad_parity"] == len(bad_geometry)
    assert rec.receiver.stats.fec_decodes == 0 and not rec.receiver.stats.corrupt_chunks


def test_config_refuses_impossible_fec_settings() -> None:
    for bad in (dict(fec_k=200), dict(fec_overhead=0.1), dict(fec_k=16, fec_overhead=2.0),
                dict(fec_k=128, fec_overhead=1.0)):
        with pytest.raises(ValueError):
            config(**bad).validate()


# --------------------------------------------------------------------------- sim and bench


def test_source_backed_sink_returns_exactly_what_was_written() -> None:
    source = payload(10_000)
    sink = SourceBackedSink(source)
    sink.write(1000, source[1000:2000])
    sink.write(3000, b"\x01" * 500)  # differs from the source: kept verbatim
    assert sink.read(900, 1200) == bytes(100) + source[1000:2000] + bytes(100)
    assert sink.read(3000, 500) == b"\x01" * 500
    sink.write(3000, source[3000:3500])  # repaired
    assert sink.read(2900, 700) == bytes(100) + source[3000:3500] + bytes(100)


def test_bench_scale_reports_both_modes(capsys) -> None:
    assert bench_scale.main(["--receivers", "16", "--size-mb", "0.25", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["fec_k"] for r in rows] == [0, 32]
    assert all(r["all_verified"] for r in rows)
    assert rows[0]["lost"] == rows[1]["lost"] > 0  # same seed: same first-pass loss
    assert rows[1]["repair_pct"] < rows[0]["repair_pct"]
