"""The sender's pacer on its own: token bucket arithmetic and the AIMD rate, in virtual time."""

from __future__ import annotations

import pytest

from hostagent.pacing import Pacer

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
