"""The sender's pacer on its own: token bucket arithmetic and the AIMD rate, in virtual time."""

from __future__ import annotations

import pytest

from hostagent.pacing import LossClassifier, Pacer, RepairBudget, Verdict

CAP = 80e6  # bits/s: 10 MB/s, so 1 ms earns 10_000 bytes at the cap


def pacer(**overrides: float) -> Pacer:
    knobs: dict = dict(initial_fraction=0.5, min_fraction=0.1, ramp_increase=1.0, increase=0.1, decrease=0.5,
                       interval=0.1, burst_bytes=64_000, max_datagram=1500)
    knobs.update(overrides)
    return Pacer(CAP, 0.0, **knobs)


def test_bucket_starts_with_one_datagram_and_may_be_overdrawn_once() -> None:
    p = pacer()
    assert p.rate == CAP * 0.5
    assert p.may_send
    p.spend(1500)
    assert p.may_send  # exactly empty
    p.spend(1500)
    assert not p.may_send  # in debt: the debt delays the next datagram
    # 1500 bytes of debt at 40 Mbit/s = 0.3 ms
    assert p.next_send_at() == pytest.approx(1500 * 8 / (CAP * 0.5), abs=1e-8)


def test_refill_earns_rate_times_time_up_to_the_burst() -> None:
    p = pacer(ramp_increase=0.0)  # keep the rate fixed
    p.spend(1500)
    p.refill(0.001)  # 1 ms at 40 Mbit/s = 5000 bytes
    p.spend(5000)
    assert p.may_send
    p.spend(1)
    assert not p.may_send
    p.refill(10.0)  # long idle: capped at the bucket depth
    p.spend(64_000)
    assert p.may_send
    p.spend(1)
    assert not p.may_send


def test_ramps_fast_to_the_cap_and_never_beyond() -> None:
    p = pacer()
    p.refill(0.05)  # half an interval at ramp 1.0: +50% of the cap
    assert p.rate == pytest.approx(CAP)
    p.refill(1.0)
    assert p.rate == CAP


def test_congestion_cuts_multiplicatively_once_per_interval() -> None:
    p = pacer(initial_fraction=1.0)
    p.congested = True
    assert p.window_closed(0.2) is True
    assert p.rate == pytest.approx(CAP * 0.5) and p.decreases == 1 and not p.congested
    p.congested = True
    assert p.window_closed(0.25) is False  # within one interval of the last cut
    assert p.rate == pytest.approx(CAP * 0.5) and not p.congested
    assert p.window_closed(0.5) is False  # no signal, no cut


def test_rate_never_falls_below_the_floor() -> None:
    p = pacer(initial_fraction=0.12, decrease=0.5)
    for i in range(5):
        p.congested = True
        p.window_closed(1.0 + i)
    assert p.rate == pytest.approx(CAP * 0.1)


def test_after_a_cut_it_probes_back_gently_and_not_while_congested() -> None:
    p = pacer(initial_fraction=1.0)
    p.congested = True
    p.window_closed(0.0)
    cut = p.rate
    p.refill(0.05)  # within the interval after the cut: hold
    assert p.rate == cut
    p.congested = True
    p.refill(0.2)  # a signal is pending: hold
    assert p.rate == cut
    p.congested = False
    p.refill(0.3)  # 0.1 s clean at increase 0.1: +10% of the cap
    assert p.rate == pytest.approx(cut + 0.1 * CAP)


def test_a_cut_stops_at_the_floor_it_is_given() -> None:
    p = pacer(initial_fraction=1.0, decrease=0.5)
    for i in range(5):
        p.congested = True
        p.window_closed(1.0 + i, floor=CAP * 0.6)
    assert p.rate == pytest.approx(CAP * 0.6) and p.lowest_cut == pytest.approx(CAP * 0.6)
    p.congested = True
    assert p.window_closed(7.0, floor=CAP * 0.6) is False  # already at that floor: no cut counted
    p.congested = True
    p.window_closed(8.0)  # without a floor: down to the hard one
    assert p.rate == pytest.approx(CAP * 0.3)


def test_a_signal_already_answered_is_cleared_without_a_cut() -> None:
    p = pacer()
    p.congested = True
    assert p.window_closed(1.0, may_cut=False) is False
    assert p.rate == pytest.approx(CAP * 0.5) and p.decreases == 0 and not p.congested


# --------------------------------------------------------------------------- loss classifier


def classifier(**overrides: float) -> LossClassifier:
    knobs: dict = dict(quorum=0.5, tolerance=0.02, memory=0.5)
    knobs.update(overrides)
    return LossClassifier(**knobs)


def test_one_receivers_loss_is_local_however_high() -> None:
    c = classifier()
    assert c.report(1, 0.6, 0.0) is True  # a signal ...
    assert c.pending and not c.shared(0.0, group=4)  # ... but 1 of 4 is not the group's loss
    assert c.verdict(0.01, group=4) is Verdict.LOCAL
    assert not c.pending
    assert c.verdict(0.02, group=4) is Verdict.NONE  # nothing new since


def test_loss_reported_by_more_than_the_quorum_is_congestion() -> None:
    c = classifier()
    c.report(1, 0.05, 0.0)
    c.report(2, 0.05, 0.1)
    assert not c.shared(0.1, group=4)
    c.report(3, 0.05, 0.2)
    assert c.shared(0.2, group=4)  # 3 of 4 within the memory
    assert c.verdict(0.2, group=4) is Verdict.GROUP
    c.report(1, 0.05, 0.9)  # the others' reports are older than the memory
    assert c.verdict(0.9, group=4) is Verdict.LOCAL
    assert c.verdicts == {Verdict.NONE: 0, Verdict.LOCAL: 1, Verdict.GROUP: 1, Verdict.LINK: 0}


def test_a_lone_receiver_is_its_whole_group() -> None:
    c = classifier()
    c.report(1, 0.05, 0.0)
    assert c.verdict(0.0, group=1) is Verdict.GROUP


def test_noise_and_requestless_reports_are_no_signal_but_failed_receivers_leave() -> None:
    c = classifier()
    assert c.report(1, 0.01, 0.0) is False  # below the tolerance
    assert c.report(2, 0.5, 0.0, requests=False) is False  # asked for nothing: no signal ...
    assert not c.pending and c.verdict(0.0, group=2) is Verdict.NONE
    assert c.lossy(0.0) == 1  # ... but it still counts towards the quorum
    c.forget(2)
    assert c.lossy(0.0) == 0


def test_drops_at_the_senders_own_link_are_congestion_whatever_receivers_say() -> None:
    c = classifier()
    c.send_dropped(3)
    assert c.pending
    assert c.verdict(0.0, group=100) is Verdict.LINK
    assert c.verdict(0.1, group=100) is Verdict.NONE


# --------------------------------------------------------------------------- repair budget


def test_repairs_get_their_share_of_the_sends_and_no_saved_up_burst() -> None:
    budget = RepairBudget(0.25, depth=2.0)
    sent = []
    for _ in range(400):
        repair = budget.allows  # a repair is always waiting
        budget.sent(repair)
        sent.append(repair)
    assert sum(sent) == 100  # a quarter of the sends
    quiet = RepairBudget(0.25, depth=2.0)
    for _ in range(1000):  # a long stretch with no repair waiting
        quiet.sent(False)
    burst = 0
    while quiet.allows:
        quiet.sent(True)
        burst += 1
    assert burst == 3  # only `depth` datagrams' worth was kept
    assert not RepairBudget(0.0, depth=2.0).allows


@pytest.mark.parametrize("quantum", [1, 7])
def test_data_leaves_in_whole_gso_sends_at_the_same_average_rate(quantum: int) -> None:
    """With ``send_quantum`` (what one GSO send carries) every release of data is whole
    groups of that many -- no lone datagram a receiver's GRO would hand over alone --
    while the stream still takes its rate's time."""
    import random

    from hostagent import wire
    from hostagent.common import MemorySource
    from hostagent.sender import Sender
    from tests.support.agents import KIB, payload, sender_config

    size = 400 * KIB
    config = sender_config(chunk_size=64 * KIB, payload_size=1000, rate_bps=80e6, initial_rate_fraction=1.0,
                           send_quantum=quantum)
    sender = Sender(MemorySource(payload(size, seed=1)), config, 0.0, rng=random.Random(1))
    now, releases = 0.0, []
    while sender.stream_position < sender.layout.total_seq:
        now += random.Random(int(now * 1e6)).uniform(0.0001, 0.003)  # uneven wake-ups
        datas = [raw for raw, _ in sender.datagrams_to_send(now) if wire.peek_type(raw) == wire.T_DATA]
        if datas:
            releases.append(len(datas))
    wire_bytes = sender.layout.total_seq * (1000 + wire.DATA_HEADER_LEN)
    assert now == pytest.approx(wire_bytes * 8 / 80e6, rel=0.1)
    assert all(n % quantum == 0 for n in releases[:-1])
    if quantum > 1:
        assert max(releases) > quantum
    with pytest.raises(ValueError):
        sender_config(send_quantum=0).validate()


def test_a_rate_equal_to_the_links_speed_never_overruns_the_link() -> None:
    """``--rate`` is what the Ethernet link carries (headers, FCS, preamble and gap
    included): streaming full 1500-MTU datagrams at the link's speed, the link bits in
    any stretch of time stay within the rate plus the bucket's burst -- counting payload
    alone put 4.5% more on the link than it carries."""
    import random

    from hostagent import wire
    from hostagent.common import MemorySource
    from hostagent.pacing import LINK_OVERHEAD
    from hostagent.sender import Sender
    from tests.support.agents import KIB, payload, sender_config

    link_bps = 100e6
    payload_size = 1472 - wire.DATA_HEADER_LEN - wire.MAC_LEN  # the largest a 1500 MTU takes
    config = sender_config(chunk_size=64 * KIB, payload_size=payload_size, rate_bps=link_bps,
                           initial_rate_fraction=1.0, max_datagram=1472)
    sender = Sender(MemorySource(payload(2048 * KIB, seed=2)), config, 0.0, rng=random.Random(2))
    now, sent = 0.0, []  # (time, link bytes) of every paced datagram
    while sender.stream_position < sender.layout.total_seq:
        now += 0.0005
        for raw, _ in sender.datagrams_to_send(now):
            if wire.peek_type(raw) == wire.T_DATA:
                sent.append((now, len(raw) + LINK_OVERHEAD))
    start = sent[0][0]
    total = 0
    for t, nbytes in sent:
        total += nbytes
        assert total * 8 <= link_bps * (t - start) + (config.burst_bytes + 1538) * 8
    # ... and it does not crawl either: the link is busy at least 95% of the time
    assert total * 8 >= 0.95 * link_bps * (sent[-1][0] - start)
