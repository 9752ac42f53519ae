"""The round policy (``hostagent.serve.Rounds``) driven by a small deterministic model of
the server and its fetchers: arrivals at given times in, rounds and every receiver's
finish time out. The model is the server's loop as ``serve`` runs it (a look at the
group every ``POLL``; a round is set up, then streams the model in ``T``) and a fetch
as it behaves on the lab: on the group ``JOIN`` after it starts; in a round from its
start it has the model when the stream ends; admitted late, the sender repairs what it
missed within its repair share while the stream runs and the rest after it at half the
rate; not admitted, it keeps the tail, its attempt
ends with the round, it is off the group for ``RETRY`` and then asks again and needs
only the start. No CPU contention: that is what the OVS lab adds (docs/lab.md)."""

from __future__ import annotations

import dataclasses
import random
import statistics
from dataclasses import dataclass, field
from typing import Optional

import pytest
from hypothesis import given, settings, strategies as st

from hostagent.serve import RoundSettings, Rounds

POLL = 0.1  # the server's look at the group
JOIN = 0.5  # a fetch's start (process, offer look-up, join) until it is on the group
SETUP = 0.1  # a round's REST set-up before its stream
T = 1.5  # one stream of the model
RETRY = 0.3  # a fetch between attempts: off the group this long
REPAIR_SHARE = 0.1  # while the stream runs, repairs get this share of the sends (SenderConfig.repair_share)
REPAIR_SPEED = 0.5  # after it, a late joiner is repaired at half the rate
WINDOW = min(RoundSettings().quiet_s, RoundSettings().window_share * T)  # a lone request's window


@dataclass
class Fetcher:
    name: str
    arrives: float
    asking_from: float = 0.0
    need: float = 1.0  # share of the model still missing
    finished: Optional[float] = None
    rounds: list[int] = field(default_factory=list)


@dataclass
class Round:
    number: int
    start: float
    stream: float  # when its stream begins
    hosts: set[str]
    ends: Optional[float] = None
    repaired: float = 0.0  # shares of the model repaired to its late joiners

    @property
    def sent(self) -> float:
        """The model shares the server sent in this round: its stream as far as it ran
        (a round whose hosts lacked only the start ends early) and the repairs."""
        ran = (self.ends if self.ends is not None else self.stream + T) - self.stream
        return min(1.0, max(0.0, ran / T)) + self.repaired


def simulate(arrivals: dict[str, float], policy: Rounds, horizon: float = 120.0,
             join: float = JOIN) -> tuple[dict[str, Fetcher], list[Round]]:
    """Run the policy over the model; every fetcher ends verified (or the run fails).
    ``join``: a fetch's start until it is on the group (the lab's is 0.6-1.4 s)."""
    fetchers = {h: Fetcher(h, t, t + join) for h, t in arrivals.items()}
    rounds: list[Round] = []
    current: Optional[Round] = None
    now = 0.0
    while now < horizon and (current is not None or any(f.finished is None for f in fetchers.values())):
        now = round(now + POLL, 6)
        if current is not None:  # the stream begins; finishes land; the round may end
            if current.stream <= now and policy.stream_since is None:
                policy.streaming(current.stream)
            done = {h for h in policy.admitted() if fetchers[h].finished is not None}
            ends = max((fetchers[h].finished for h in policy.admitted()), default=None) \
                if done == policy.admitted() else None
            if ends is not None and ends <= now:
                current.ends = ends
                policy.ended(frozenset(policy.admitted()), ends, stream_s=T)
                for f in fetchers.values():  # the deferred kept the tail; their attempt ends now
                    if f.finished is None and f.asking_from <= ends and f.name in policy.deferred:
                        f.need = min(f.need, policy_missed(current, f, ends))
                        f.asking_from = ends + RETRY
                current = None
        asking = frozenset(h for h, f in fetchers.items() if f.finished is None and f.asking_from <= now)
        for host in policy.observe(asking, now):  # admitted late: repaired after the stream
            f = fetchers[host]
            missed = policy.late[host]
            f.rounds.append(current.number)
            current.repaired += missed
            during = min(missed, REPAIR_SHARE * (1 - missed))  # repaired while the stream runs
            f.finished = current.stream + T + (missed - during) * T / REPAIR_SPEED
        hosts = policy.due(now)
        if hosts is not None:
            policy.started(hosts, now)
            current = Round(len(rounds) + 1, now, now + SETUP, set(hosts))
            rounds.append(current)
            for host in hosts:
                f = fetchers[host]
                f.rounds.append(current.number)
                f.finished = current.stream + f.need * T  # the start it lacks (all of it, if new)
    assert all(f.finished is not None for f in fetchers.values()), fetchers
    return fetchers, rounds


def policy_missed(r: Round, f: Fetcher, ends: float) -> float:
    """A deferred fetcher's missing share: the start of the stream, up to when it joined."""
    return min(1.0, max(0.0, f.asking_from - r.stream) / T)


def one_alone(join: float = JOIN) -> float:
    """A fetch with nobody else about: the reference the issue's 2x target means."""
    f, _ = simulate({"x": 0.0}, Rounds(RoundSettings(), T), join=join)
    return f["x"].finished


def test_one_fetch_alone_waits_its_window_and_one_stream():
    s = RoundSettings()
    window = min(s.quiet_s, s.max_wait_s, s.window_share * T)  # (a quarter of this short T: below quiet_s)
    assert JOIN + window + SETUP + T <= one_alone() <= JOIN + window + SETUP + T + 2 * POLL


def test_a_fetch_whose_round_closed_under_it_is_in_the_next_round_without_a_new_window():
    """B arrives past the admit share: it keeps the tail, its attempt ends with the round,
    and it asks again RETRY later. Without a hold the next round starts at once (within a
    poll), with no quiet window: it waited long enough (before return_s, it was a new
    request and waited quiet_s more). With the hold (the default) the next round waits
    for others until one hold after B first asked, no longer."""
    b = WINDOW + SETUP + 0.7 * T  # on the group (JOIN after it starts) at 70% of round 1's stream
    no_hold = RoundSettings(hold_share=0)
    f, rounds = simulate({"a": 0.0, "b": b}, Rounds(no_hold, T))
    first, second = rounds
    assert f["b"].rounds == [2] and second.hosts == {"b"}
    assert second.start <= first.ends + RETRY + POLL + 1e-9
    old, _ = simulate({"a": 0.0, "b": b}, Rounds(dataclasses.replace(no_hold, return_s=0), T))
    assert old["b"].finished >= f["b"].finished + RoundSettings().quiet_s - POLL
    held, (_, second) = simulate({"a": 0.0, "b": b}, Rounds(RoundSettings(), T))
    hold = min(RoundSettings().max_wait_s, RoundSettings().hold_share * T)
    assert b + JOIN + hold <= second.start <= b + JOIN + hold + POLL + 1e-9
    assert held["b"].finished > f["b"].finished  # (the price: alone, nobody shared its round)


def test_one_that_returns_late_is_a_new_request():
    p = Rounds(RoundSettings(return_s=2.0), 8.0)
    p.observe(frozenset({"a"}), 0.0)
    p.observe(frozenset(), 0.1)  # left while its window was open
    p.observe(frozenset({"a"}), 0.3)  # back at once: same place
    assert p.window_closes() == 0.5
    p.observe(frozenset(), 0.4)
    p.observe(frozenset({"a"}), 3.0)  # back after return_s: a new request, a new window
    assert p.window_closes() == 3.5


def test_a_mid_round_arrival_is_done_no_later_than_one_at_the_next_rounds_start():
    """The issue's target, on the model: for arrivals anywhere in a round's stream."""
    for share in (0.05, 0.3, 0.49, 0.51, 0.8, 0.99):
        mid = JOIN + WINDOW + SETUP + share * T  # on the group at that share of round 1's stream
        f, rounds = simulate({"a": 0.0, "mid": mid - JOIN}, Rounds(RoundSettings(), T))
        first_end = rounds[0].ends
        # one arriving (on the group) at the next round's start: that round is set up and streams T
        next_start = (rounds[1].start if len(rounds) > 1 else first_end + POLL)
        assert f["mid"].finished <= next_start + SETUP + T + 1e-9, (share, f["mid"], rounds)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=6, max_size=8), st.booleans())
def test_arrivals_over_twice_one_fetch_each_finish_within_twice_one_fetch(spread, cluster):
    """The 2x target holds for the policy itself: 6-8 fetchers arriving at any moments
    over twice one fetch alone, each verified within 2x one fetch after it started."""
    alone = one_alone()
    starts = sorted(s * 2 * alone * (0.3 if cluster else 1.0) for s in spread)
    f, rounds = simulate({f"h{i}": t for i, t in enumerate(starts)}, Rounds(RoundSettings(), T))
    worst = max((x.finished - x.arrives) / alone for x in f.values())
    assert worst <= 2.0, (worst, [(x.name, x.arrives, x.finished, x.rounds) for x in f.values()])
    assert len(rounds) <= len(starts)


def _fleet_sent(settings: RoundSettings, draws: int, join: float, n: int = 7, seed: int = 16) -> list[float]:
    """For ``draws`` fleets of ``n`` fetchers arriving uniformly over twice one fetch
    (as the OVS lab's): what the server sent, in copies of the model per fetcher."""
    rng = random.Random(seed)
    alone = one_alone(join)
    out = []
    for _ in range(draws):
        starts = sorted(rng.uniform(0, 2 * alone) for _ in range(n))
        _, rounds = simulate({f"h{i}": t for i, t in enumerate(starts)}, Rounds(settings, T), join=join)
        out.append(sum(r.sent for r in rounds) / n)
    return out


@pytest.mark.parametrize("join", [0.5, 1.0])
def test_a_fleet_arriving_over_twice_one_fetch_costs_the_server_at_most_half_the_copies(join):
    """The bytes target on the model: for 200 fleets of 7 arriving at random over twice
    one fetch, the server sends at most 0.5 x N copies in (nearly) every one -- the hold
    batches the hosts that come while it is busy; without it, rounds follow each other
    with a host or two each (0.5-1.0 s: a fetch's start until it is on the group, on the
    model and as measured on the lab). A fleet whose last host comes alone at the very
    end can still cost a little more (one of 200 at 0.5 s: 0.505)."""
    held = _fleet_sent(RoundSettings(), 200, join)
    assert sum(x <= 0.5 for x in held) >= 0.99 * len(held) and max(held) <= 0.52, sorted(held)[-5:]
    unheld = _fleet_sent(RoundSettings(hold_share=0, admit_share=0.5), 200, join)  # the policy before the hold
    assert statistics.mean(held) < 0.9 * statistics.mean(unheld) and max(unheld) > 0.55
