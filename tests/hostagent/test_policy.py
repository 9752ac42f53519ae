"""Loss is not congestion; the group is not its slowest member (issue 10, item 3).

Sender and receivers in the in-memory network, virtual time, seeded loss: one receiver
losing datagrams on its own is repaired at the group's rate; loss the group shares, or
drops at the sender's own link, cut the rate; a receiver that cannot keep up catches up
after the stream or is reported failed as a straggler at the documented bound."""

from __future__ import annotations

import random
from functools import partial
from typing import Callable, Optional

import pytest

from hostagent import wire
from hostagent.common import MemorySource
from hostagent.cli import build_parser
from hostagent.events import ReceiverCompleted, ReceiverFailed, StreamFinished, TransferFinished
from hostagent.pacing import Verdict
from hostagent.sender import Sender, SenderConfig
from lab.netsim import Bottleneck, Sim, stall
from tests.support.agents import KIB, assert_all_verified, payload, sender_config, stream_out

CAP = 20e6
RATE_TOLERANCE = 0.02  # "at the cap": never more than 2% below it once there
CLEAN_SLOWDOWN = 1.15  # clean receivers finish within this factor of their clean-run time

config = partial(sender_config, chunk_size=64 * KIB, rate_bps=CAP)  # 64-datagram FEC blocks fit a chunk


def towards(index: int, rate: float, seed: int) -> Callable:
    """Random loss of ``rate`` on every datagram sent to receiver ``index`` (its own
    problem: a lossy last hop, a busy CPU); nobody else loses anything."""
    rng = random.Random(seed)
    return lambda now, src, dst, datagram: dst == ("rx", index) and rng.random() < rate


class Run:
    """One simulated transfer, stepped in 1 ms of virtual time, recording when each
    receiver verified the file and the lowest pacing rate once the cap was reached."""

    def __init__(self, data: bytes, cfg: SenderConfig, receivers: int, **sim_args: object) -> None:
        self.sim = Sim(data, cfg, seed=3, **sim_args)
        for _ in range(receivers):
            self.sim.add_receiver()
        self.done_at: dict[int, float] = {}
        self.lowest_at_cap: Optional[float] = None
        self.event_at: list[tuple[float, object]] = []
        t = 0.0
        while not self.sim.done and t < 60:
            t += 0.001
            self.sim.run(until=t)
            rate = self.sim.sender.rate
            if self.lowest_at_cap is not None or rate >= cfg.rate_bps:
                self.lowest_at_cap = rate if self.lowest_at_cap is None else min(self.lowest_at_cap, rate)
            for i, rec in enumerate(self.sim.receivers):
                if i not in self.done_at and rec.receiver is not None and rec.receiver.complete:
                    self.done_at[i] = t
            while len(self.event_at) < len(self.sim.sender_events):
                self.event_at.append((t, self.sim.sender_events[len(self.event_at)]))

    @property
    def sender(self) -> Sender:
        return self.sim.sender

    def when(self, kind: type) -> list[tuple[float, object]]:
        return [(t, e) for t, e in self.event_at if isinstance(e, kind)]


# --------------------------------------------------------------------------- one lossy receiver


@pytest.mark.parametrize("fec_k", [0, 64])
def test_one_lossy_receiver_among_many_keeps_the_group_at_the_cap(fec_k: int) -> None:
    """5% random loss at one receiver of twelve: no rate decrease, the rate stays at the
    cap, the eleven clean receivers finish within 1.15x of their time in the clean
    run, and the lossy one completes by repair (unicast or parity) alongside them."""
    data = payload(1024 * KIB)
    n = 12
    clean = Run(data, config(expected_receivers=n, fec_k=fec_k), n)
    lossy = Run(data, config(expected_receivers=n, fec_k=fec_k), n, loss=towards(0, 0.05, seed=7))
    for run in (clean, lossy):
        assert_all_verified(run.sim, data)
        assert run.sender.stats.rate_decreases == 0
        assert run.lowest_at_cap is not None and run.lowest_at_cap >= CAP * (1 - RATE_TOLERANCE)
    verdicts = lossy.sender.loss_verdicts
    assert verdicts["local"] > 0 and verdicts["group"] == verdicts["link"] == 0
    assert lossy.sender.lowest_rate is None  # never cut
    for i in range(1, n):
        assert lossy.done_at[i] <= CLEAN_SLOWDOWN * clean.done_at[i], (i, lossy.done_at[i], clean.done_at[i])
    stats = lossy.sender.stats
    assert stats.repair_bytes > 0.04 * len(data)  # the lossy receiver really was repaired
    assert lossy.sim.receivers[0].receiver.stats.nacks_sent > 0
    for rec in lossy.sim.receivers[1:]:
        assert rec.receiver.stats.nacks_sent == 0  # the clean ones needed nothing


def test_heavy_loss_at_one_receiver_is_caught_up_after_the_stream() -> None:
    """25% loss needs more repair than the repair share allows while streaming: the
    stream (and the clean receivers) is not held back, and the lossy receiver completes
    in catch-up after it, still without a single rate decrease."""
    data = payload(512 * KIB)
    n = 6
    clean = Run(data, config(expected_receivers=n), n)
    lossy = Run(data, config(expected_receivers=n), n, loss=towards(0, 0.25, seed=5))
    assert_all_verified(lossy.sim, data)
    assert lossy.sender.stats.rate_decreases == 0
    ((stream_end, _),) = lossy.when(StreamFinished)
    assert lossy.done_at[0] > stream_end  # caught up after the stream
    for i in range(1, n):
        assert lossy.done_at[i] <= CLEAN_SLOWDOWN * clean.done_at[i]


# --------------------------------------------------------------------------- congestion


def _bursts(now: float, datagram: bytes) -> bool:
    return datagram[3] == wire.T_DATA and 0.1 <= now % 0.2 < 0.11


def _sender_link(seed: int) -> Callable[[float, bytes], bool]:
    rng = random.Random(seed)
    return lambda now, datagram: rng.random() < 0.05


@pytest.mark.parametrize("shared", [_bursts, _sender_link(4)], ids=["same-bursts", "sender-link-5pct"])
def test_loss_shared_by_the_group_cuts_the_rate(shared: Callable[[float, bytes], bool]) -> None:
    """Every receiver loses the same datagrams -- bursts of a switch buffer overrun
    upstream of all of them, or 5% dropped at random on the sender's own link (netsim's
    shared loss): that is congestion, and the rate drops."""
    data = payload(1024 * KIB)
    run = Run(data, config(expected_receivers=8), 8, shared_loss=shared)
    assert_all_verified(run.sim, data)
    assert run.sender.stats.rate_decreases >= 1
    assert run.sender.loss_verdicts["group"] >= 1
    assert run.sender.lowest_rate is not None and run.sender.lowest_rate <= 0.7 * CAP + 1


def test_loss_at_a_minority_is_local_and_at_a_majority_is_congestion() -> None:
    """The quorum: 3 of 8 receivers losing 5% leave the rate alone; 5 of 8 cut it.
    (Long enough for the receivers' loss estimates, smoothed over ~1000 datagrams, to
    rise above the tolerance.)"""
    data = payload(2048 * KIB)
    for lossy, cut in ((3, False), (5, True)):
        rng = random.Random(lossy)
        run = Run(data, config(expected_receivers=8), 8,
                  loss=lambda now, s, d, b, k=lossy: d[1] < k and d[0] == "rx" and rng.random() < 0.05)
        assert_all_verified(run.sim, data)
        assert (run.sender.stats.rate_decreases > 0) is cut, lossy
        verdicts = run.sender.loss_verdicts
        assert verdicts["group" if cut else "local"] > 0, verdicts  # the loss was reported and judged


# The OVS lab's shape (issue 14): jumbo datagrams at 95 Mbit/s, 1 MiB chunks, FEC on, four
# receivers each losing 1% at random on their own links.
JUMBO = dict(chunk_size=1024 * KIB, payload_size=8900, max_datagram=8972, rate_bps=95e6, fec_k=64,
             expected_receivers=4, linger_timeout=120)


def _own_loss(seed: int, rate: float = 0.01) -> Callable:
    rng = random.Random(seed)
    return lambda now, src, dst, datagram: dst[0] == "rx" and rng.random() < rate


@pytest.mark.parametrize("seed", [0, 2])
def test_one_shared_stall_costs_one_cut_not_the_floor(seed: int) -> None:
    """A switch that forwards nothing for 20 ms (a userspace datapath off the CPU) costs
    every receiver the same ~27 datagrams: one congestion event, one cut. Receivers'
    loss figures average over ~1000 datagrams, so the burst stays in them for that long;
    read as new congestion window after window it cut the rate 9-26 times (in one seed
    to the 5% floor) and the transfer took 2-5x as long (the OVS lab's bimodal 1%-loss
    runs)."""
    data = payload(8 * 1024 * KIB)
    clean = Run(data, SenderConfig(**JUMBO), 4, loss=_own_loss(seed))
    run = Run(data, SenderConfig(**JUMBO), 4, loss=_own_loss(seed), shared_loss=stall(0.3, 0.02))
    for r in (clean, run):
        assert_all_verified(r.sim, data)
    assert clean.sender.stats.rate_decreases == 0
    assert 1 <= run.sender.stats.rate_decreases <= 2  # the stall is congestion: cut, once
    assert run.sender.lowest_rate is not None and run.sender.lowest_rate >= 0.6 * JUMBO["rate_bps"]
    assert max(run.done_at.values()) <= 1.25 * max(clean.done_at.values())


def test_a_bottleneck_below_the_cap_is_found_and_kept() -> None:
    """A tail-drop queue at half the cap between the sender and everyone (a slower link,
    a switch port): the rate comes down below it and stays there through catch-up, so
    the transfer takes about the bottleneck's line-rate time. (Cutting on the same
    stale reports again and again drove it to the floor instead: ~2x that time.)"""
    data = payload(8 * 1024 * KIB)
    link = Bottleneck(rate_bps=JUMBO["rate_bps"] / 2, limit_bytes=128 * KIB)
    run = Run(data, SenderConfig(**JUMBO), 4, bottleneck=link)
    assert_all_verified(run.sim, data)
    assert link.dropped > 0  # the queue really overflowed
    assert run.sender.loss_verdicts["group"] > 0
    assert run.sender.lowest_rate is not None and run.sender.lowest_rate <= link.rate_bps
    assert run.sender.rate <= link.rate_bps  # still below it at the end (catch-up)
    line = len(data) * 8 / link.rate_bps
    assert max(run.done_at.values()) <= 1.3 * line


def _group_reports(sender: Sender, now: float, loss_permille: int = 300) -> None:
    """Receivers 1..3 of 4 NACK with ``loss_permille``; the window closes."""
    for rid in (1, 2, 3):
        sender.receive_datagram(wire.encode(wire.Nack(sender.session, rid, ((0, 1),), loss_permille)),
                                ("rx", rid), now)
    sender.handle_timer(now + sender.nack_window)


def _stream(sender: Sender, now: float, datagrams: int) -> float:
    """Let ``datagrams`` more first transmissions leave; returns the virtual time."""
    target = sender.stream_position + datagrams
    while sender.stream_position < target:
        now += 0.0005
        sender.datagrams_to_send(now)
    return now


def test_the_group_reporting_the_same_loss_again_is_not_a_new_cut() -> None:
    """After a cut on the group's reports, the same reports (each receiver's figure
    averages over its last ``loss_horizon`` datagrams, so they still hold the loss the cut
    answered) neither cut again nor let the rate grow, window after window; once the
    receivers took in ``loss_horizon`` datagrams sent after the cut, loss they still
    report is new and cuts again."""
    cfg = config(aimd_interval=0.01, expected_receivers=4, loss_horizon=64)
    sender = Sender(MemorySource(payload(512 * KIB)), cfg, 0.0)
    now = _stream(sender, 0.0, 100)
    _group_reports(sender, now)
    assert sender.stats.rate_decreases == 1
    after_cut = sender.rate
    for _ in range(10):  # 10 windows, 20 aimd intervals, nothing streamed in between
        now += 0.02
        _group_reports(sender, now)
    sender.datagrams_to_send(now + sender.nack_window)  # (the rate grows here, if at all)
    assert sender.stats.rate_decreases == 1 and sender.rate == pytest.approx(after_cut)
    assert sender.loss_verdicts["group"] == 11
    now = _stream(sender, now, 64)
    before = sender.rate
    _group_reports(sender, now + 0.02)
    assert sender.stats.rate_decreases == 2
    assert sender.rate == pytest.approx(cfg.aimd_decrease * before)


def test_drops_at_the_senders_own_link_cut_the_rate_below_the_minimum() -> None:
    """The socket layer reports send drops: congestion whatever receivers say. Loss the
    receivers report stops at ``min_rate_bps``; the sender's own link may go below it."""
    # (loss_horizon 1: each window's reports count as news once one repair went out)
    cfg = config(rate_bps=1e9, min_rate_bps=5e8, aimd_interval=0.01, expected_receivers=4, loss_horizon=1)
    sender = Sender(MemorySource(payload(256 * KIB)), cfg, 0.0)
    now = stream_out(sender)
    for _ in range(10):  # receivers 1..3 of 4 report 30% loss, window after window
        now += 0.02
        for rid in (1, 2, 3):
            sender.receive_datagram(wire.encode(wire.Nack(sender.session, rid, ((0, 1),), 300)), ("rx", rid), now)
        sender.handle_timer(now + sender.nack_window)
        sender.datagrams_to_send(now + sender.nack_window)
    assert sender.loss_verdicts["group"] >= 1
    assert sender.rate == pytest.approx(5e8)  # the floor for receiver-reported loss
    for _ in range(10):
        now += 0.02
        sender.send_dropped(3, now)
        sender.handle_timer(now + sender.nack_window)
    assert sender.loss_verdicts["link"] >= 1
    assert sender.rate < 5e8
    assert sender.rate >= 1e9 * cfg.min_rate_fraction


# --------------------------------------------------------------------------- stragglers


def test_receiver_that_cannot_keep_up_is_reported_a_straggler_at_the_bound() -> None:
    """70% loss at one receiver: the others finish as in the clean run; the straggler
    is served for ``linger_timeout`` after the stream and then reported failed, by name
    and reason, at that bound -- never silently, never holding the others back."""
    data = payload(256 * KIB)
    n = 5
    bound = 0.5
    clean = Run(data, config(expected_receivers=n, linger_timeout=bound), n)
    run = Run(data, config(expected_receivers=n, linger_timeout=bound), n, loss=towards(0, 0.7, seed=2))
    ((stream_end, _),) = run.when(StreamFinished)
    ((failed_at, failed),) = run.when(ReceiverFailed)
    assert failed.receiver_id == 1000 and failed.reason.startswith("straggler")
    assert stream_end + bound <= failed_at <= stream_end + bound + 0.01
    ((_, finished),) = run.when(TransferFinished)
    assert not finished.ok and finished.failed == (1000,)
    assert sorted(finished.completed) == list(range(1001, 1000 + n))
    completed = [t for t, _ in run.when(ReceiverCompleted)]
    assert max(completed) < failed_at
    for i in range(1, n):
        assert run.done_at[i] <= CLEAN_SLOWDOWN * clean.done_at[i]
        assert bytes(run.sim.receivers[i].sink.data) == data
    assert run.sender.stats.rate_decreases == 0


# --------------------------------------------------------------------------- knobs


def test_the_policy_knobs_are_validated_and_reach_the_cli() -> None:
    for bad in (dict(min_rate_bps=0.0), dict(min_rate_bps=2 * CAP), dict(congestion_quorum=1.0),
                dict(repair_share=1.5), dict(loss_memory=0.0), dict(linger_timeout=0.0)):
        with pytest.raises(ValueError):
            config(**bad).validate()
    args = build_parser().parse_args(["send", "f", "--group", "232.1.1.1:5000", "--min-rate", "100",
                                      "--congestion-quorum", "0.3", "--repair-share", "0.2", "--timeout", "9"])
    assert (args.min_rate, args.congestion_quorum, args.repair_share, args.timeout) == (100.0, 0.3, 0.2, 9.0)
    defaults = build_parser().parse_args(["send", "f", "--group", "232.1.1.1:5000"])
    assert defaults.min_rate is None
    assert (defaults.congestion_quorum, defaults.repair_share) == (SenderConfig.congestion_quorum,
                                                                   SenderConfig.repair_share)


def test_a_minimum_rate_above_the_start_rate_is_where_the_sender_starts() -> None:
    sender = Sender(MemorySource(payload(16 * KIB)), config(min_rate_bps=0.9 * CAP), 0.0)
    assert sender.rate == pytest.approx(0.9 * CAP)
    assert sender.lowest_rate is None
    assert set(sender.loss_verdicts) == {v.value for v in Verdict}
