"""Fast-failover protection (controller.protect) on the simulated fabric, whose groups
behave as OF1.3 says (FF: the first bucket whose watched port is live): every single
link of every tree fails in turn with NO controller action, and every receiver must still
get exactly one copy without loops; where no detour can exist (the link is a bridge of
the fabric) the receivers behind it lose delivery until the controller reroutes. Then
the controller reacts and the new tree and its protection must be exactly what the trees
need, with no stale entry."""

from __future__ import annotations

import networkx as nx
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import topologies as T
from controller import ofmsgs
from controller.core import MulticastCore
from controller.protect import is_ff
from controller.reconnect import Reconnect
from lab.fakeof import FakeFabric
from tests.support.controller_env import assert_exact, core_and_fabric
from tests.support.fabric_checks import (apply, assert_delivery, create_drawn_groups, nicira_actions,
                                        topology_strategy)



def live_graph(fabric: FakeFabric, topo: T.Topology) -> nx.Graph:
    """The fabric's live links, worked out from the fabric (not the controller)."""
    g = nx.Graph()
    g.add_nodes_from(d for d, sw in fabric.switches.items() if sw.up)
    for k in topo.links:
        if fabric.port_live(k.a, k.a_port) and fabric.port_live(k.b, k.b_port):
            g.add_edge(k.a, k.b)
    return g


def copies(core: MulticastCore, fabric: FakeFabric) -> dict[int, dict[str, int]]:
    out = {}
    for g in core.groups.values():
        tr = fabric.trace(g.source, g.address)
        assert not tr.loops, tr.log
        assert not tr.to_controller, tr.log  # nothing waits for the controller
        out[g.gid] = dict(tr.delivered)
    return out


def link_between(topo: T.Topology, a: int, b: int) -> T.Link:
    return next(k for k in topo.links if {k.a, k.b} == {a, b})


def react(core: MulticastCore, fabric: FakeFabric, k: T.Link, up: bool) -> None:
    """The controller hears PortStatus from both ends and installs its plans."""
    for d, p in ((k.a, k.a_port), (k.b, k.b_port)):
        apply(fabric, core.port_up(d, p) if up else core.port_down(d, p))


def fail_each_tree_link(core: MulticastCore, fabric: FakeFabric, topo: T.Topology) -> tuple[int, int]:
    """Fail every link of every group's tree, one at a time, with no controller action:
    exactly one copy per receiver where the link has a detour, loss behind a bridge.
    Returns (links protected, bridges)."""
    before = copies(core, fabric)
    links = sorted({(min(p, c), max(p, c)) for g in core.groups.values() if g.tree
                    for p, c in g.tree.links()})
    protected = bridges = 0
    for p, c in links:
        fabric.set_link(p, c, False)
        try:
            graph = live_graph(fabric, topo)
            bridge = not nx.has_path(graph, p, c)
            now = copies(core, fabric)
            for g in core.groups.values():
                if bridge and g.tree and {(p, c), (c, p)} & g.tree.links():
                    behind = {r for r in g.receivers
                              if r in g.tree.reached and not nx.has_path(graph, topo.host(g.source).dpid,
                                                                        topo.host(r).dpid)}
                    assert behind, (p, c)  # a bridge cuts off the receivers below it ...
                    assert all(now[g.gid].get(r, 0) == 0 for r in behind)
                    assert all(now[g.gid].get(r) == 1 for r in g.tree.reached - behind)
                else:  # ... any other link is bypassed by the switches alone, one copy each
                    assert now[g.gid] == before[g.gid], (g.gid, (p, c), now[g.gid], before[g.gid])
            if bridge:  # and the controller knows it has no detour, in either direction
                k = link_between(topo, p, c)
                assert core.detours.get(k.a, k.a_port) is None and core.detours.get(k.b, k.b_port) is None
                bridges += 1
            else:
                protected += 1
        finally:
            fabric.set_link(p, c, True)
    return protected, bridges


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), algorithm=st.sampled_from(["spt", "steiner"]),
       nicira=st.booleans())
def test_every_single_tree_link_failure_is_bypassed_by_the_switches(topo, data, algorithm, nicira):
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2 and topo.links)
    core, fabric = core_and_fabric(topo, algorithm=algorithm, nicira=nicira)
    create_drawn_groups(data, core, fabric, ips)
    assert_delivery(core, fabric, topo)
    assert_exact(core, fabric)
    fail_each_tree_link(core, fabric, topo)

    # now one tree link fails for real and the controller reacts: the new tree is exact,
    # protected again (its own links fail one at a time without loss), and nothing of the
    # old protection is left; the link's return is exact too
    tree_links = sorted({(p, c) for g in core.groups.values() if g.tree for p, c in g.tree.links()})
    assume(tree_links)
    p, c = data.draw(st.sampled_from(tree_links), label="failed link")
    k = link_between(topo, p, c)
    fabric.set_link(p, c, False)
    react(core, fabric, k, up=False)
    assert_delivery(core, fabric, topo)
    assert_exact(core, fabric)
    fail_each_tree_link(core, fabric, topo)
    fabric.set_link(p, c, True)
    react(core, fabric, k, up=True)
    assert_delivery(core, fabric, topo)
    assert_exact(core, fabric)
    for gid in list(core.groups):
        apply(fabric, core.delete_group(gid))
    assert_exact(core, fabric)  # nothing left: no FF group, no transit or rejoin flow


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data())
def test_a_switch_without_nicira_actions_turns_every_detour_into_plain_openflow(topo, data):
    """A switch that lacks Open vSwitch's Nicira actions is found after trees are up:
    ``set_nicira(False)`` moves every detour's end to one flow per group, with no Nicira
    action left anywhere; halfway through the move (its adds and group changes done, the
    shared flows not yet removed) and after it, every tree link failure is still bypassed
    by the switches alone, one copy per receiver; the end state is exactly what a core
    that started without them would install."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2 and topo.links)
    core, fabric = core_and_fabric(topo)
    create_drawn_groups(data, core, fabric, ips)
    protected, _ = fail_each_tree_link(core, fabric, topo)
    assert bool(nicira_actions(fabric)) == (protected > 0)  # (a rejoin flow per protected link in use)
    plan = core.set_nicira(False)
    *changes, remove = plan.phases  # (all but the removals)
    apply(fabric, [m for phase in changes for m in phase])
    fail_each_tree_link(core, fabric, topo)
    apply(fabric, remove)
    assert not nicira_actions(fabric)
    assert_exact(core, fabric)
    fail_each_tree_link(core, fabric, topo)
    assert len(core.set_nicira(False)) == 0  # (once)

    plain, plain_fabric = core_and_fabric(topo, nicira=False)
    for g in sorted(core.groups.values(), key=lambda g: g.gid):
        apply(plain_fabric, plain.create_group(g.model, g.source, g.receivers)[1])
    same_trees = all(plain.groups[g.gid].tree.parent == g.tree.parent for g in core.groups.values() if g.tree)
    if same_trees:  # (load balancing may pick other equal-cost trees in the other order)
        assert fabric.snapshot() == plain_fabric.snapshot()


def test_leaf_spine_every_link_protected_and_entries_bounded():
    """On a leaf-spine fabric every tree link has a detour (no bridges); each switch holds
    at most one FF group per link port and variant, and one rejoin flow per group."""
    topo = T.leaf_spine(2, 4, 2)
    core, fabric = core_and_fabric(topo)
    ips = [h.ip for h in topo.hosts]
    for i, src in enumerate(ips):
        apply(fabric, core.create_group(f"m{i}", src, [r for r in ips if r != src][i % 3:]) [1])
    protected, bridges = fail_each_tree_link(core, fabric, topo)
    assert bridges == 0 and protected == len(topo.links)
    for dpid in topo.switches:
        n = core.entries_at(dpid)
        link_ports = sum(1 for k in topo.links if dpid in (k.a, k.b))
        assert 0 < n["ff_groups"] <= 2 * link_ports
        assert n["detour_flows"] <= n["groups"] + 2 * len(topo.links)


def test_a_bridge_is_reported_and_the_controller_reroutes_what_it_can():
    """linear:3 -- every link is a bridge: no FF group anywhere; a failure cuts off the
    receivers behind it until the link returns, and the controller says so."""
    topo = T.linear(3, 1)  # s1 - s2 - s3, one host each
    core, fabric = core_and_fabric(topo)
    h1, h2, h3 = (h.ip for h in topo.hosts)
    g, plan = core.create_group("m", h1, [h2, h3])
    apply(fabric, plan)
    assert all(core.entries_at(d)["ff_groups"] == 0 for d in topo.switches)
    protected, bridges = fail_each_tree_link(core, fabric, topo)
    assert (protected, bridges) == (0, 2)
    k = link_between(topo, 2, 3)
    fabric.set_link(2, 3, False)
    react(core, fabric, k, up=False)
    assert g.tree.unreachable == {h3} and copies(core, fabric)[g.gid] == {h2: 1}
    assert_exact(core, fabric)


def test_without_protection_a_failure_waits_for_the_controller():
    topo = T.leaf_spine(2, 3, 2)
    core, fabric = core_and_fabric(topo, protection=False)
    ips = [h.ip for h in topo.hosts]
    g, plan = core.create_group("m", ips[0], ips[2:])
    apply(fabric, plan)
    assert not any(core.entries_at(d)["ff_groups"] or core.entries_at(d)["detour_flows"]
                   for d in topo.switches)
    p, c = sorted(g.tree.links())[0]
    fabric.set_link(p, c, False)
    lost = copies(core, fabric)[g.gid]
    assert sum(lost.values()) < len(g.receivers)  # without FF groups the switches drop it
    react(core, fabric, link_between(topo, p, c), up=False)
    assert copies(core, fabric)[g.gid] == {r: 1 for r in g.receivers}
    assert_exact(core, fabric)


def test_hand_deleted_detour_entries_are_restored_by_the_audit():
    """A transit flow, a rejoin flow and an FF group's backup bucket changed behind the
    controller's back: the audit puts exactly the intended entries back."""
    topo = T.leaf_spine(2, 3, 2)
    core, fabric = core_and_fabric(topo, pipeline=True)
    ips = [h.ip for h in topo.hosts]
    apply(fabric, core.create_group("m", ips[0], ips[2:])[1])
    want = fabric.snapshot()
    for dpid, sw in fabric.switches.items():
        sw.flows = [f for f in sw.flows if f.priority not in (ofmsgs.PRIO_DETOUR, ofmsgs.PRIO_REJOIN)]  # del-flows
        for gid, grp in list(sw.groups.items()):
            if len(grp.buckets) == 2 and grp.type == ofmsgs.ofp.OFPGT_FF:  # mod-group
                sw.groups[gid] = grp._replace(buckets=grp.buckets[:1])
    assert fabric.snapshot() != want
    session = Reconnect(core)
    for dpid in sorted(topo.switches):
        done, errors = fabric.audit(dpid, session)
        assert not errors and done is not None and not done.void
    assert fabric.snapshot() == want
    assert_exact(core, fabric)
    assert all(len(fabric.audit(d, session)[0].plan) == 0 for d in sorted(topo.switches))


def _below(tree, top: int) -> set[int]:
    """``top`` and the switches below it in ``tree``."""
    kids: dict[int, list[int]] = {}
    for c, p in tree.parent.items():
        kids.setdefault(p, []).append(c)
    out, todo = set(), [top]
    while todo:
        n = todo.pop()
        out.add(n)
        todo += kids.get(n, [])
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), known=st.booleans())
def test_links_leaving_a_switch_without_fast_failover_wait_for_the_controller(topo, data, known):
    """Some switches have no fast-failover groups (optional in OpenFlow 1.3), known as
    they connect (their group features) or only from their refusals of the first trees'
    FF groups (bad type; an audit of every switch then puts them right). Afterwards they
    hold no FF group; a tree link leaving one of them fails: the receivers below it lose
    delivery until the controller reroutes, everyone else still gets one copy; every
    other tree link is still bypassed by the switches alone."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2 and topo.links)
    core, fabric = core_and_fabric(topo)
    no_ff = data.draw(st.sets(st.sampled_from(sorted(topo.switches)), min_size=1), label="switches without FF")
    for d in no_ff:
        fabric.switches[d].group_types = tuple(t for t in fabric.switches[d].group_types if t != ofmsgs.ofp.OFPGT_FF)
    if known:
        for d in sorted(no_ff):
            apply(fabric, core.set_fast_failover(d, False))
    refused: set[int] = set()
    for i in range(data.draw(st.integers(1, 3), label="groups")):
        source = data.draw(st.sampled_from(ips), label="source")
        receivers = data.draw(st.sets(st.sampled_from([x for x in ips if x != source]), min_size=1, max_size=6),
                              label="receivers")
        plan = core.create_group(f"m{i}", source, receivers)[1]
        errors = fabric.apply_all(plan)
        if known:
            assert not errors, errors
        # (the fake switch refuses only an FF group's type; ``capabilities.refused_fast_failover``
        # reads that off the quoted request: tests/controller/test_app.py)
        refused |= {e.dpid for e in errors
                    if (e.type, e.code) == (ofmsgs.ofp.OFPET_GROUP_MOD_FAILED, ofmsgs.ofp.OFPGMFC_BAD_TYPE)}
    assert refused <= no_ff
    for d in sorted(refused):  # (what the app does on such a refusal: then it audits the switch)
        fabric.apply_all(core.set_fast_failover(d, False))
    session = Reconnect(core)
    for d in sorted(topo.switches):
        done, errors = fabric.audit(d, session)
        assert not errors and done is not None
    assert_exact(core, fabric)
    assert_delivery(core, fabric, topo)
    # (unknown, a switch none of whose tree links has a detour was never sent an FF group)
    assert core.no_ff == no_ff if known else core.no_ff == refused
    assert not any(is_ff(gid) for d in no_ff for gid in fabric.switches[d].groups)

    before = copies(core, fabric)
    links = sorted({(p, c) for g in core.groups.values() if g.tree for p, c in g.tree.links()})
    for p, c in links:
        fabric.set_link(p, c, False)
        try:
            now = copies(core, fabric)
            graph = live_graph(fabric, topo)
            for g in core.groups.values():
                if not g.tree or not {(p, c), (c, p)} & g.tree.links():
                    assert now[g.gid] == before[g.gid]
                    continue
                top = c if g.tree.parent.get(c) == p else p
                cut = g.tree.parent[top] in no_ff or not nx.has_path(graph, p, c)
                lost = {r for r in g.tree.reached if topo.host(r).dpid in _below(g.tree, top)} if cut else set()
                assert now[g.gid] == {r: n for r, n in before[g.gid].items() if r not in lost}, (
                    g.gid, (p, c), now[g.gid], before[g.gid], lost)
        finally:
            fabric.set_link(p, c, True)
