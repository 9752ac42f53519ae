"""Flapping links are held out of the trees (issue 43): a link that goes down three times
within 60 s is kept out of every new tree and detour for 30 s, doubled at each hold that
follows, so trees stop moving with it; without damping every new tree takes it again."""

from __future__ import annotations

import time

import topologies as T
from controller.damping import Damping
from tests.support.controller_env import TOKEN, Api, core_and_fabric, make_env
from tests.support.fabric_checks import apply, assert_delivery


def test_the_third_down_within_the_window_holds_the_link_and_holds_grow():
    d = Damping()
    link = frozenset((1, 2))
    assert d.down(link, 0.0) is None and d.down(link, 10.0) is None
    assert d.down(link, 20.0) == 50.0  # (30 s)
    assert d.down(link, 25.0) is None  # (held: downs meanwhile do not count)
    assert d.due(49.0) == [] and d.due(50.0) == [link]
    assert [d.down(link, t) for t in (60.0, 61.0, 62.0)] == [None, None, 122.0]  # (then 60 s)
    assert d.report(100.0) == [{"switches": [1, 2], "held_s": 22.0}]
    # downs spread wider than the window never hold
    e = Damping()
    assert all(e.down(link, t) is None for t in range(0, 600, 31))
    assert Damping(flaps=0).down(link, 0.0) is None


def flap(core, fabric, topo, k, times, start=0.0, every=4.0):
    """Link ``k`` down and up ``times`` times (both ends' PortStatus), a new group from h1
    to h2 created after each return; the tree of each new group."""
    ip = {h.name: h.ip for h in topo.hosts}
    trees = []
    for i in range(times):
        t = start + every * i
        fabric.set_link(k.a, k.b, False)
        for d, p in ((k.a, k.a_port), (k.b, k.b_port)):
            apply(fabric, core.port_down(d, p, now=t))
        fabric.set_link(k.a, k.b, True)
        for d, p in ((k.a, k.a_port), (k.b, k.b_port)):
            apply(fabric, core.port_up(d, p))
        g, plan = core.create_group(f"m{i}", ip["h1"], [ip["h2"]])
        apply(fabric, plan)
        trees.append(g.tree.links())
    return trees


def test_a_link_flapped_five_times_in_twenty_seconds_is_held_after_the_third():
    """ring:6, the link s1-s2 on the only shortest path from h1 to h2: with damping, from
    its third down in 20 s no new tree takes it (they go the long way round) and every
    receiver still gets one copy; when the hold ends it is given back and the next new
    tree takes it again. Without damping every new tree takes it at once."""
    topo = T.ring(6, 1)
    core, fabric = core_and_fabric(topo, flap_damping=3)
    k = next(x for x in topo.links if {x.a, x.b} == {1, 2})
    trees = flap(core, fabric, topo, k, 5)
    uses = [(1, 2) in t for t in trees]
    assert uses == [True, True, False, False, False], uses
    assert frozenset((1, 2)) in core.damping.held and core.view.damped == {frozenset((1, 2))}
    assert not any((1, 2) in g.tree.links() or (2, 1) in g.tree.links() for g in core.groups.values())
    assert_delivery(core, fabric, topo)
    until = core.damping.held[frozenset((1, 2))]
    assert len(core.release_damped(until - 0.1)) == 0 and core.view.damped
    apply(fabric, core.release_damped(until))
    assert not core.view.damped and core.view.graph.has_edge(1, 2)
    ip = {h.name: h.ip for h in topo.hosts}
    g, plan = core.create_group("after", ip["h1"], [ip["h2"]])
    apply(fabric, plan)
    assert (1, 2) in g.tree.links()
    assert_delivery(core, fabric, topo)

    plain, plain_fabric = core_and_fabric(topo, flap_damping=0)
    assert [(1, 2) in t for t in flap(plain, plain_fabric, topo, k, 5)] == [True] * 5
    assert not plain.view.damped


def test_a_held_link_shows_in_health_with_the_time_it_has_left():
    """GET /v1/health names the links held for flapping and how long each hold lasts."""
    topo = T.ring(6, 1)
    env = make_env(topo, token=TOKEN, flap_damping=3)
    api = Api(env)
    k = next(x for x in topo.links if {x.a, x.b} == {1, 2})
    assert "flapping" not in api.json("GET", "/v1/health")
    flap(env.core, env.fabric, topo, k, 3, start=time.monotonic())
    got = api.json("GET", "/v1/health")["flapping"]
    assert [h["switches"] for h in got] == [[1, 2]] and 0 < got[0]["held_s"] <= 38  # (30 s from the third down, 8 s on)
