"""Leader election (controller.election) against an in-memory etcd with leases and
revisions, time stepped by hand: who leads, which role requests switches get, what a
dead leader, an unreachable etcd and a partitioned instance do -- and, over random
schedules, that two instances never both act as leader."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from controller.election import (FOLLOWER, LEADER, MASTER, SLAVE, UNKNOWN, Election, Leader,
                                 Status, role_for)
from controller.store import DEFAULT_PREFIX, EtcdUrl, parse_store_url
from tests.support.fake_etcd import FakeEtcd


def cluster(n: int, ttl: int = 2) -> tuple[FakeEtcd, set[str], list[Election]]:
    etcd, cut = FakeEtcd(), set()
    return etcd, cut, [Election(etcd.client(f"c{i}", cut), f"c{i}", f"http://10.0.0.{i}:8080", ttl)
                       for i in range(n)]


def run(etcd: FakeEtcd, elections: list[Election], until: float, alive: set[int] | None = None,
        dt: float = 0.1) -> None:
    while etcd.now < until - 1e-9:
        etcd.now = round(etcd.now + dt, 6)
        for i, e in enumerate(elections):
            if alive is None or i in alive:
                e.step(etcd.now)


def test_one_leader_the_others_follow_it_with_its_generation() -> None:
    etcd, _, es = cluster(3)
    run(etcd, es, 1.0)
    leaders = [e for e in es if e.is_leader]
    assert len(leaders) == 1
    lead = leaders[0].status
    for e in es:
        if e.is_leader:
            assert role_for(e.status) == (MASTER, lead.generation)
        else:
            assert e.status.role == FOLLOWER
            assert e.status.leader == Leader(lead.leader.ident, lead.leader.url, lead.generation)
            assert role_for(e.status) == (SLAVE, lead.generation)


def test_a_killed_leader_is_replaced_after_its_lease_with_a_larger_generation() -> None:
    etcd, _, es = cluster(3, ttl=2)
    run(etcd, es, 1.0)
    old = next(i for i, e in enumerate(es) if e.is_leader)
    gen = es[old].status.generation
    killed_at = etcd.now
    alive = {0, 1, 2} - {old}
    run(etcd, es, killed_at + 1.5, alive)
    assert not any(es[i].is_leader for i in alive)  # its lease still lives
    run(etcd, es, killed_at + 3.0, alive)
    new = [i for i in alive if es[i].is_leader]
    assert len(new) == 1
    assert es[new[0]].status.generation > gen
    other = (alive - set(new)).pop()
    assert role_for(es[other].status) == (SLAVE, es[new[0]].status.generation)


def test_resign_hands_over_without_waiting_for_the_lease() -> None:
    etcd, _, es = cluster(2, ttl=5)
    run(etcd, es, 0.5)
    old = next(i for i, e in enumerate(es) if e.is_leader)
    es[old].resign()
    run(etcd, es, etcd.now + 0.2, {1 - old})
    assert es[1 - old].is_leader


def test_a_short_etcd_outage_changes_nothing_a_long_one_steps_the_leader_down() -> None:
    etcd, _, es = cluster(2, ttl=2)
    run(etcd, es, 1.0)
    lead = next(i for i, e in enumerate(es) if e.is_leader)
    gen = es[lead].status.generation
    etcd.down = True
    run(etcd, es, etcd.now + 0.8)
    assert es[lead].is_leader and es[lead].status.generation == gen
    run(etcd, es, etcd.now + 2.5)
    assert not es[lead].is_leader
    # it asks the switches for SLAVE with its own generation: accepted, nothing written
    assert role_for(es[lead].status) == (SLAVE, gen)
    assert es[1 - lead].status.role == UNKNOWN


def test_after_an_etcd_restart_the_same_leader_keeps_its_generation() -> None:
    etcd, _, es = cluster(3, ttl=2)
    run(etcd, es, 1.0)
    lead = next(i for i, e in enumerate(es) if e.is_leader)
    gen = es[lead].status.generation
    etcd.down = True
    run(etcd, es, etcd.now + 3.0)  # longer than the TTL: the leader stepped down meanwhile
    assert not any(e.is_leader for e in es)
    etcd.come_back({k: v for e in es for k, v in e.store.ttls.items()})
    run(etcd, es, etcd.now + 0.5)
    assert es[lead].is_leader and es[lead].status.generation == gen
    assert all(e.status == es[(lead + 1) % 3].status for e in es if not e.is_leader)
    assert role_for(es[(lead + 1) % 3].status) == (SLAVE, gen)


def test_a_partitioned_leader_steps_down_before_the_other_can_win() -> None:
    etcd, cut, es = cluster(2, ttl=2)
    run(etcd, es, 1.0)
    lead = next(i for i, e in enumerate(es) if e.is_leader)
    cut.add(f"c{lead}")
    t = etcd.now
    while etcd.now < t + 4:
        run(etcd, es, etcd.now + 0.1)
        assert sum(e.is_leader for e in es) <= 1
    assert es[1 - lead].is_leader and not es[lead].is_leader
    cut.clear()
    run(etcd, es, etcd.now + 1.0)
    assert es[lead].status.role == FOLLOWER
    assert es[lead].status.generation == es[1 - lead].status.generation


def test_no_role_request_before_any_generation_is_known() -> None:
    assert role_for(Status(UNKNOWN)) is None
    assert role_for(Status(LEADER, None, 7)) == (MASTER, 7)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["tick", "down", "up", "cut", "heal", "kill", "revive"]),
                          st.integers(0, 2), st.integers(1, 12)), min_size=1, max_size=40))
def test_never_two_leaders_and_generations_only_grow(schedule: list[tuple[str, int, int]]) -> None:
    etcd, cut, es = cluster(3, ttl=2)
    alive = {0, 1, 2}
    seen_gen = [0, 0, 0]
    for what, who, ticks in schedule:
        if what == "down":
            etcd.down = True
        elif what == "up":
            etcd.down = False
        elif what == "cut":
            cut.add(f"c{who}")
        elif what == "heal":
            cut.discard(f"c{who}")
        elif what == "kill":
            alive.discard(who)
        elif what == "revive" and who not in alive:
            alive.add(who)
            es[who] = Election(etcd.client(f"c{who}", cut), f"c{who}", f"http://10.0.0.{who}:8080", 2)
            seen_gen[who] = 0
        for _ in range(ticks):
            run(etcd, es, etcd.now + 0.1, alive)
            assert sum(es[i].is_leader for i in alive) <= 1
            for i in alive:
                assert es[i].status.generation >= seen_gen[i]
                seen_gen[i] = es[i].status.generation


def test_store_urls() -> None:
    assert parse_store_url("etcd://10.0.0.5:2379,10.0.0.6") == EtcdUrl(
        (("10.0.0.5", 2379), ("10.0.0.6", 2379)), DEFAULT_PREFIX)
    assert parse_store_url("etcd://e1:2381/fabric-a").prefix == "/fabric-a/"
    assert parse_store_url("etcd://e1:2381/fabric-a", prefix="x").prefix == "/x/"
