"""``controller.ha`` without Ryu's loop: two instances, each a real ``Service`` over the
simulated fabric, share an in-memory etcd (``tests.support.fake_etcd``); time is stepped
by hand. Asserted as the operator sees it: which role each switch is asked for, that a
new leader starts from its predecessor's state and reads every switch before REST
mutations are served, that a follower mirrors the leader (not more often than the rate
limit) and forwards mutations to the leader's URL, that a deposed leader can no longer
overwrite the store, and that a single instance refuses to start over an unreadable
state file."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from ryu.ofproto import ofproto_v1_3 as ofp

from controller import ha as ha_module
from controller.cluster import Cluster
from controller.election import Election
from controller.ha import Ha, request_stop
from controller.rest import FORWARDED, ApiError
from controller.store import FileStore
from tests.support.controller_env import R1, R2, R3, S, Env, make_env
from tests.support.fake_etcd import FakeEtcd

TTL = 2


class Node:
    """One instance: its service, store client, election and ``Ha``."""

    def __init__(self, name: str, etcd: FakeEtcd, cut: set[str]) -> None:
        self.env: Env = make_env()
        self.store = etcd.client(name, cut)
        self.env.service.store = self.store
        self.election = Election(self.store, name, f"http://{name}:8080", ttl=TTL)
        self.rebinds = 0
        self.ha = Ha(self.env.service, self.store, self.election, self._rebind, takeover_s=5.0,
                     forward_timeout_s=11.0, cluster=Cluster(b"s" * 32))
        self.dpids = sorted(self.env.topo.switches)

    def _rebind(self) -> None:
        self.rebinds += 1

    def step(self, now: float) -> ha_module.Step:
        return self.ha.step(self.election.step(now), now, self.dpids)


def roles(step: ha_module.Step) -> dict[int, tuple[int, int]]:
    """dpid -> (OpenFlow role, generation) of the role requests a step sends."""
    return {dpid: (m.role, m.generation_id) for dpid, m in step.msgs}


class Req:
    """What ``forward`` reads of a webob request."""

    def __init__(self, forwarded: bool = False) -> None:
        self.headers = {FORWARDED: "1"} if forwarded else {}
        self.environ: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def campaigning(monkeypatch) -> list[Ha]:
    """Instances built here campaign in a list of their own (the process-wide one is
    what a SIGTERM stops)."""
    mine: list[Ha] = []
    monkeypatch.setattr(ha_module, "_CAMPAIGNING", mine)
    return mine


@pytest.fixture
def pair() -> tuple[FakeEtcd, set[str], Node, Node]:
    etcd, cut = FakeEtcd(min_ttl=TTL), set()
    return etcd, cut, Node("a", etcd, cut), Node("b", etcd, cut)


def test_the_leader_asks_for_master_and_reads_every_switch_before_serving_mutations(pair):
    etcd, _, a, b = pair
    etcd.now = 0.1
    first = a.step(etcd.now)
    gen = a.election.status.generation
    assert a.ha.leading and gen > 0
    assert roles(first) == {d: (ofp.OFPCR_ROLE_MASTER, gen) for d in a.dpids}
    assert first.takeover == a.dpids  # every connected switch is read anew
    assert a.store.fence == gen  # its saves are fenced by its own generation
    # the other instance follows, asking the switches for SLAVE with the leader's generation
    second = b.step(etcd.now)
    assert not b.ha.leading
    assert roles(second) == {d: (ofp.OFPCR_ROLE_SLAVE, gen) for d in b.dpids}
    assert second.takeover == []
    assert b.ha.cluster() == {"role": "follower", "leader": "http://a:8080", "generation": gen}
    assert a.ha.cluster() == {"role": "leader", "leader": "http://a:8080", "generation": gen}

    # a mutation now would be planned against switches not read yet: 503, retry
    with pytest.raises(ApiError) as refused:
        a.ha.forward(Req(), etcd.now)
    assert refused.value.status == 503 and refused.value.headers == {"Retry-After": "1"}
    for dpid in a.dpids[:-1]:
        a.ha.read(dpid)
    with pytest.raises(ApiError):
        a.ha.forward(Req(), etcd.now)
    a.ha.disconnected(a.dpids[-1])  # (a switch that left is not waited for)
    assert a.ha.forward(Req(), etcd.now) is None  # served here
    # a role that did not change is not asked again
    etcd.now = 0.2
    assert a.step(etcd.now).msgs == [] and b.step(etcd.now).msgs == []


def test_a_takeover_stops_holding_mutations_after_its_deadline(pair):
    etcd, _, a, _ = pair
    a.step(0.1)
    with pytest.raises(ApiError):
        a.ha.forward(Req(), 5.0)
    assert a.ha.forward(Req(), 5.1) is None  # (takeover_s 5 after the election)


def test_a_follower_forwards_mutations_to_the_leaders_url(pair, monkeypatch):
    etcd, _, a, b = pair
    a.step(0.1)
    b.step(0.1)
    sent: list[tuple[Any, str | None, float]] = []
    monkeypatch.setattr(ha_module, "forward_to",
                        lambda req, url, timeout, sign: sent.append((req, url, timeout)) or "answer")
    req = Req()
    assert b.ha.forward(req, 0.1) == "answer"
    assert sent == [(req, "http://a:8080", 11.0)]


def test_a_follower_without_a_leader_answers_503_and_never_forwards_twice(pair):
    etcd, cut, a, b = pair
    cut.add("b")  # b never reached etcd: no leader known
    b.step(0.1)
    with pytest.raises(ApiError) as none:
        b.ha.forward(Req(), 0.1)
    assert none.value.status == 503
    cut.clear()
    a.step(0.2)
    b.step(0.2)
    with pytest.raises(ApiError) as loop:  # (two instances each believing the other leads)
        b.ha.forward(Req(forwarded=True), 0.2)
    assert loop.value.status == 503


def test_a_follower_mirrors_the_leader_when_the_store_changes_at_most_every_half_second(pair):
    etcd, _, a, b = pair
    etcd.now = 0.1
    a.step(etcd.now)
    b.step(etcd.now)
    g, _ = a.env.service.create_group({"model": "m", "source": S, "receivers": [R1]})
    assert a.env.service.save()
    etcd.now = 0.2
    b.step(etcd.now)
    assert b.env.service.core.groups.keys() == {g["id"]}
    assert b.env.service.get_group(g["id"])["key"] == a.env.service.get_group(g["id"])["key"]
    assert b.rebinds == 1  # (the app's helpers follow the rebuilt core)
    # nothing new in the store: no rebuild
    etcd.now = 1.0
    b.step(etcd.now)
    assert b.rebinds == 1
    # a change shows within the rate limit, not before it
    a.env.service.join(g["id"], R2)
    assert a.env.service.save()
    etcd.now = 1.1
    b.step(etcd.now)
    assert b.rebinds == 2 and set(b.env.service.get_group(g["id"])["receivers"]) == {R1, R2}
    h, _ = a.env.service.create_group({"model": "n", "source": S, "receivers": [R2]})
    assert a.env.service.save()
    etcd.now = 1.3
    b.step(etcd.now)
    assert h["id"] not in b.env.service.core.groups
    etcd.now = 1.7
    b.step(etcd.now)
    assert h["id"] in b.env.service.core.groups and b.rebinds == 3
    assert a.rebinds == 1  # the leader rebuilt its core once, from the store when elected
    # a follower never writes to the store
    before = dict(etcd.kv)
    b.env.service.create_group({"model": "on-a-follower", "source": S})
    assert not b.env.service.save() and etcd.kv == before


def test_the_follower_takes_over_from_a_dead_leader_and_the_old_one_cannot_write(pair):
    etcd, _, a, b = pair
    etcd.now = 0.1
    a.step(etcd.now)
    b.step(etcd.now)
    old = a.election.status.generation
    g, _ = a.env.service.create_group({"model": "m", "source": S, "receivers": [R1, R2]})
    assert a.env.service.save()
    # a stops (killed): its lease runs out; b steps on
    took = None
    while etcd.now < 5.0 and took is None:
        etcd.now = round(etcd.now + 0.1, 6)
        step = b.step(etcd.now)
        if b.ha.leading:
            took = step
    assert took is not None and etcd.now <= 0.1 + TTL + 0.5
    new = b.election.status.generation
    assert new > old
    assert roles(took) == {d: (ofp.OFPCR_ROLE_MASTER, new) for d in b.dpids}
    assert took.takeover == b.dpids
    # it starts from the predecessor's state: same group, same key
    assert b.env.service.get_group(g["id"])["key"] == a.env.service.get_group(g["id"])["key"]
    assert b.store.fence == new
    # the old leader comes back: before it notices, its saves are refused (the store is
    # fenced by its old generation); then it steps down
    before = dict(etcd.kv)
    a.env.service.join(g["id"], R3)  # (its save is refused)
    assert not a.env.service.save()
    assert etcd.kv == before
    a.step(etcd.now)
    assert not a.ha.leading and a.store.fence is None
    a.env.service.create_group({"model": "late", "source": S, "receivers": [R1]})
    assert not a.env.service.save()
    assert etcd.kv == before
    b.env.service.join(g["id"], R3)
    assert b.env.service.save() and etcd.kv != before


def test_a_clean_stop_resigns_so_the_other_leads_at_once(pair, campaigning):
    etcd, _, a, b = pair
    etcd.now = 0.1
    a.step(etcd.now)
    b.step(etcd.now)
    assert campaigning == [a.ha, b.ha]
    assert request_stop() is True and a.ha.stopping and b.ha.stopping
    a.ha.stop()
    assert not a.ha.leading
    etcd.now = 0.2  # one step later, well within the lease TTL
    b.step(etcd.now)
    assert b.ha.leading


def test_request_stop_without_an_election_does_nothing(campaigning):
    solo = Ha(make_env().service, None, None, rebind=lambda: None)
    assert solo.leading and campaigning == []
    assert request_stop() is False and not solo.stopping


def test_switches_refusing_a_followers_messages_are_logged_now_and_then(pair, caplog):
    _, _, a, _ = pair
    caplog.set_level(logging.INFO, logger="modelcast.ha")
    for _ in range(1000):
        a.ha.refused_as_slave()
    said = [r.getMessage() for r in caplog.records if "as from a SLAVE" in r.getMessage()]
    assert [s.split()[2] for s in said] == ["1", "10", "100", "1000"]


def test_a_single_instance_refuses_to_start_over_an_unreadable_state_file(tmp_path, caplog):
    path = tmp_path / "state.json"
    path.write_text("{not json")
    env = make_env(state_path=path)
    solo = Ha(env.service, None, None, rebind=lambda: None)
    with pytest.raises(SystemExit) as stopped:
        solo.restore()
    assert stopped.value.code == 2
    assert "is not valid JSON" in caplog.text
    assert path.read_text() == "{not json"  # left as it was


def test_a_single_instance_restores_its_groups_from_the_state_file(tmp_path):
    path = tmp_path / "state.json"
    first = make_env(state_path=path)
    g, _ = first.service.create_group({"model": "m", "source": S, "receivers": [R1]})
    assert first.service.save() and isinstance(first.service.store, FileStore)
    second = make_env(state_path=path)
    Ha(second.service, None, None, rebind=lambda: None).restore()
    assert second.service.get_group(g["id"])["key"] == first.service.get_group(g["id"])["key"]
