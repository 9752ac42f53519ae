"""The pure controller core, proven on the simulated OpenFlow fabric: messages the core
emits are applied to fake switches and packets are traced through them."""

from __future__ import annotations

import os
import random
from collections import Counter

import networkx as nx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import topologies as T
from controller import errors, ofmsgs
from controller.addressing import check_ssm, ssm_address
from controller.core import MulticastCore
from controller.reconnect import Reconnect
from controller.trees import compute_tree
from lab.fakeof import FakeFabric
from tests.support.controller_env import core_and_fabric
from tests.support.fabric_checks import apply, assert_delivery, random_topology, topology_strategy

# ---------------------------------------------------------------------- helpers


def our_state(fabric: FakeFabric) -> list:
    """Flows and groups of ours on any live switch (a down one returns empty), excluding
    the per-switch base flows and source table."""
    left = []
    for dpid, sw in fabric.switches.items():
        if not sw.up:
            continue
        left += [(dpid, f) for f in sw.flows if f.cookie & ofmsgs.COOKIE_MASK == ofmsgs.COOKIE_TAG
                 and f.cookie not in (ofmsgs.COOKIE_TAG, ofmsgs.COOKIE_SOURCE)]
        left += [(dpid, gid) for gid in sw.groups]
    return left


# ---------------------------------------------------------------------- generative trees


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), algorithm=st.sampled_from(["spt", "steiner"]))
def test_every_receiver_gets_exactly_one_copy(topo, data, algorithm):
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2)
    source = data.draw(st.sampled_from(ips), label="source")
    receivers = data.draw(st.sets(st.sampled_from([i for i in ips if i != source]), min_size=1),
                          label="receivers")
    core, fabric = core_and_fabric(topo, algorithm=algorithm)
    g, plan = core.create_group("llama-70b", source, receivers)
    apply(fabric, plan)
    assert g.tree.reached == frozenset(receivers)
    assert_delivery(core, fabric, topo)
    # Steiner trees never use more links than the shortest-path tree.
    spt = compute_tree(core.view, source, receivers, "spt")
    if algorithm == "steiner":
        assert len(g.tree.links()) <= len(spt.links())
    else:  # the SPT gives every receiver a shortest path
        graph = core.view.graph
        for r in receivers:
            d = topo.host(r).dpid
            assert g.tree.depth(d) == nx.shortest_path_length(graph, topo.host(source).dpid, d)


def test_receiver_on_the_source_switch_and_port_reuse():
    topo = T.linear(2, 3)  # 3 hosts per switch
    core, fabric = core_and_fabric(topo)
    hosts = [h.ip for h in topo.hosts]
    g, plan = core.create_group("m", hosts[0], hosts[1:3])  # same switch only
    apply(fabric, plan)
    assert_delivery(core, fabric, topo)
    assert g.tree.links() == set()


# ---------------------------------------------------------------------- make-before-break


def test_reroute_is_make_before_break_and_minimal():
    topo = T.ring(6)
    core, fabric = core_and_fabric(topo)
    hosts = [h.ip for h in topo.hosts]
    g, plan = core.create_group("m", hosts[0], [hosts[2], hosts[3]])
    apply(fabric, plan)
    old_links = g.tree.links()
    a, b = sorted(old_links)[0]
    link = next(k for k in topo.links if {k.a, k.b} == {a, b})
    fabric.set_link(a, b, False)
    before = {d: dict(e) for d, e in core.installed.items()}
    plan = core.link_remove(link.a, link.a_port, link.b, link.b_port)
    build, flip, _settle, _redirect, remove = plan.phases
    assert build and flip and remove and g.gid in plan.moved
    assert all(m.command in (0,) for _, m in build)  # OFPFC_ADD / OFPGC_ADD only
    # after every phase each receiver gets exactly one copy, without the version tag
    for phase in plan.phases:
        apply(fabric, phase)
        tr = fabric.trace(g.source, g.address)
        assert not tr.loops and all(tr.delivered[r] == 1 for r in g.receivers) and not tr.tagged, tr.log
    assert_delivery(core, fabric, topo)
    # exactly the switches whose part of the tree changed got messages, and the first
    # switch its flip
    changed = {d for d in topo.switches if before[d].get(g.gid) != core.installed[d].get(g.gid)}
    assert plan.switches() == changed | {g.tree.root}


def test_join_and_leave_keep_existing_branches_delivering_in_every_phase():
    topo = T.leaf_spine(2, 4, 2)
    core, fabric = core_and_fabric(topo)
    hosts = [h.ip for h in topo.hosts]
    g, plan = core.create_group("m", hosts[0], hosts[2:4])
    apply(fabric, plan)
    before = g.tree.parent.copy()
    for step in (lambda: core.join(g.gid, hosts[6]), lambda: core.leave(g.gid, hosts[2])):
        for phase in step().phases:
            apply(fabric, phase)
            tr = fabric.trace(g.source, g.address)
            assert tr.delivered[hosts[3]] == 1, tr.log  # a stable receiver never misses
        assert_delivery(core, fabric, topo)
    assert g.tree.parent[topo.host(hosts[3]).dpid] == before[topo.host(hosts[3]).dpid]


def test_replaying_a_batch_leaves_the_fabric_unchanged():
    topo = T.fat_tree(4)
    core, fabric = core_and_fabric(topo)
    hosts = [h.ip for h in topo.hosts]
    g, plan = core.create_group("m", hosts[0], hosts[5:12])
    apply(fabric, plan)
    snap = fabric.snapshot()
    errs = fabric.apply_all(plan)
    assert fabric.snapshot() == snap
    # the only complaint a switch makes is that the group already exists
    assert errs and all(e.code == 0 for e in errs)  # OFPGMFC_GROUP_EXISTS
    join = core.join(g.gid, hosts[13])
    apply(fabric, join)
    snap = fabric.snapshot()
    fabric.apply_all(join)
    assert fabric.snapshot() == snap
    assert_delivery(core, fabric, topo)


def test_teardown_leaves_nothing_behind():
    topo = T.leaf_spine(2, 3, 2)
    core, fabric = core_and_fabric(topo)
    hosts = [h.ip for h in topo.hosts]
    gids, addrs = [], []
    for i, src in enumerate(hosts[:3]):
        g, plan = core.create_group(f"m{i}", src, [h for h in hosts if h != src])
        apply(fabric, plan)
        gids.append(g.gid)
        addrs.append((g.source, g.address))
    assert our_state(fabric)
    for gid in gids:
        apply(fabric, core.delete_group(gid))
    assert our_state(fabric) == []
    assert not any(core.installed.values())
    assert sum(core.load.values()) == 0
    for src, addr in addrs:
        assert not fabric.trace(src, addr).delivered


# ---------------------------------------------------------------------- load awareness


def test_groups_spread_over_parallel_spines():
    topo = T.leaf_spine(4, 2, 8)
    core, fabric = core_and_fabric(topo)
    left = [h.ip for h in topo.hosts if topo.switches[h.dpid] == "leaf1"]
    right = [h.ip for h in topo.hosts if topo.switches[h.dpid] == "leaf2"]
    for i in range(16):
        _, plan = core.create_group(f"m{i}", left[i % 8], [right[i % 8]])
        apply(fabric, plan)
    spines = [d for d, n in topo.switches.items() if n.startswith("spine")]
    per_spine = Counter(d for g in core.groups.values() for d in g.tree.parent if d in spines)
    assert sorted(per_spine.values()) == [4, 4, 4, 4]
    assert_delivery(core, fabric, topo)
    blind, _ = core_and_fabric(topo, balance=False)
    for i in range(16):
        blind.create_group(f"m{i}", left[i % 8], [right[i % 8]])
    assert max(Counter(d for g in blind.groups.values() for d in g.tree.parent if d in spines).values()) == 16


# ---------------------------------------------------------------------- bad input


def test_bad_input_raises_specific_errors():
    topo = T.linear(3)
    core, _ = core_and_fabric(topo)
    h = [x.ip for x in topo.hosts]
    # hosts not seen yet are accepted (looked for), not errors: no tree reaches them yet
    g, _ = core.create_group("m-unseen-source", "10.9.9.9", [h[1]])
    assert g.tree is None
    g, _ = core.create_group("m-unseen-receiver", h[0], ["10.9.9.9", h[1]])
    assert g.tree.reached == {h[1]} and g.tree.unreachable == {"10.9.9.9"}
    with pytest.raises(errors.ReceiverIsSource):
        core.create_group("m", h[0], [h[0], h[1]])
    with pytest.raises(errors.InvalidAddress, match="not an IPv4"):
        core.create_group("m", "not-an-ip", [h[1]])
    with pytest.raises(errors.InvalidAddress, match="unicast"):
        core.create_group("m", "232.1.1.1", [h[1]])
    with pytest.raises(errors.InvalidAddress, match="model"):
        core.create_group("", h[0], [h[1]])
    with pytest.raises(errors.InvalidAddress, match="SSM"):
        core.create_group("m", h[0], [h[1]], address="239.1.1.1")
    with pytest.raises(errors.EmptyReceivers):
        compute_tree(core.view, h[0], [])
    with pytest.raises(errors.UnknownGroup):
        core.join(999, h[1])
    with pytest.raises(errors.CoreError, match="algorithm"):
        core.create_group("m", h[0], [h[1]], algorithm="ospf")
    g, _ = core.create_group("m", h[0], [h[1]])
    with pytest.raises(errors.ReceiverIsSource):
        core.join(g.gid, h[0])
    # a disconnected graph: strict computation names the unreachable receivers
    core.link_remove(*next((k.a, k.a_port, k.b, k.b_port) for k in topo.links))
    with pytest.raises(errors.Unreachable) as info:
        compute_tree(core.view, h[0], [h[1], h[2]], strict=True)
    assert info.value.receivers == frozenset({h[1], h[2]})
    assert compute_tree(core.view, h[0], [h[1], h[2]]).unreachable == frozenset({h[1], h[2]})


def test_same_model_and_source_returns_the_existing_group():
    topo = T.linear(3)
    core, _ = core_and_fabric(topo)
    h = [x.ip for x in topo.hosts]
    g1, p1 = core.create_group("m", h[0], [h[1]])
    g2, p2 = core.create_group("m", h[0], [h[2]])
    assert g1 is g2 and len(p2) == 0
    g3, _ = core.create_group("m", h[1], [h[2]])  # same model, another source: (S,G) differs
    assert g3.gid != g1.gid and g3.address == g1.address


# ---------------------------------------------------------------------- addressing


@given(st.text(min_size=1, max_size=64).filter(lambda s: s.strip() and s.isprintable()))
def test_model_addresses_are_deterministic_ssm(model):
    a = ssm_address(model)
    assert a == ssm_address(model) == check_ssm(a)
    assert a.startswith("232.") and not a.startswith("232.0.0.")


def test_address_collisions_probe_to_a_free_address():
    a = ssm_address("llama")
    b = ssm_address("llama", taken={a}.__contains__)
    assert b != a and check_ssm(b)
    topo = T.linear(2)
    core, _ = core_and_fabric(topo)
    h = [x.ip for x in topo.hosts]
    g1, _ = core.create_group("llama", h[0], [h[1]])
    with pytest.raises(errors.Conflict):
        core.create_group("other", h[0], [h[1]], address=g1.address)


# ---------------------------------------------------------------------- stateful


class FabricMachine(RuleBasedStateMachine):
    """Random link/switch failures and repairs, joins, leaves, creates and deletes; the
    fabric changes only through the core's messages. Invariants hold after every step."""

    @initialize(topo=st.one_of(
        st.builds(T.ring, st.integers(3, 6), st.just(2)),
        st.builds(T.leaf_spine, st.integers(2, 3), st.integers(2, 4), st.integers(1, 2)),
        st.builds(T.fat_tree, st.just(4), st.just(1)),
        st.builds(lambda s: random_topology(random.Random(s), 7, 5, 8), st.integers(0, 1000))))
    def setup(self, topo):
        self.topo = topo
        self.core, self.fabric = core_and_fabric(topo)
        self.reconnect = Reconnect(self.core)
        self.ips = [h.ip for h in topo.hosts]
        self.models = 0

    @rule(data=st.data())
    def create(self, data):
        src = data.draw(st.sampled_from(self.ips))
        rcv = data.draw(st.sets(st.sampled_from([i for i in self.ips if i != src]), max_size=5))
        self.models += 1
        g, plan = self.core.create_group(f"model-{self.models}", src, rcv)
        apply(self.fabric, plan)

    @precondition(lambda self: self.core.groups)
    @rule(data=st.data())
    def delete(self, data):
        gid = data.draw(st.sampled_from(sorted(self.core.groups)))
        apply(self.fabric, self.core.delete_group(gid))

    @precondition(lambda self: self.core.groups)
    @rule(data=st.data())
    def join_or_leave(self, data):
        g = self.core.groups[data.draw(st.sampled_from(sorted(self.core.groups)))]
        ip = data.draw(st.sampled_from([i for i in self.ips if i != g.source]))
        plan = self.core.leave(g.gid, ip) if ip in g.receivers else self.core.join(g.gid, ip)
        apply(self.fabric, plan)

    @rule(data=st.data(), up=st.booleans())
    def link(self, data, up):
        assume(self.topo.links)
        k = data.draw(st.sampled_from(self.topo.links))
        self.fabric.set_link(k.a, k.b, up)
        # a switch reports PortStatus on both ends; the controller sees each
        for dpid, port in ((k.a, k.a_port), (k.b, k.b_port)):
            if self.fabric.switches[dpid].up:
                plan = self.core.port_up(dpid, port) if up else self.core.port_down(dpid, port)
                apply(self.fabric, plan)

    @rule(data=st.data())
    def switch(self, data):
        dpid = data.draw(st.sampled_from(sorted(self.topo.switches)))
        if self.fabric.switches[dpid].up:
            self.fabric.set_switch(dpid, False)
            apply(self.fabric, self.core.switch_leave(dpid))
        else:
            self.fabric.set_switch(dpid, True)  # comes back rebooted, with empty tables
            # the app's connect sequence: its ports' state is read with its tables
            done, errs = self.fabric.connect(dpid, self.reconnect)
            assert done is not None and not errs, errs
            # its neighbours see their ports to it come up (PortStatus)
            for k in self.topo.links:
                if dpid in (k.a, k.b):
                    d, p = (k.b, k.b_port) if k.a == dpid else (k.a, k.a_port)
                    if d != dpid and self.fabric.switches[d].up:
                        live = self.fabric.port_live(d, p)
                        apply(self.fabric, self.core.port_up(d, p) if live else self.core.port_down(d, p))

    @rule()
    def controller_restart(self):
        """A new controller from the saved state; every live switch keeps its tables and
        reconnects through the same reconnect sequence as in the app."""
        self.core = restarted(self.core)
        self.reconnect = Reconnect(self.core)
        for dpid, sw in sorted(self.fabric.switches.items()):
            if sw.up:
                done, errs = self.fabric.connect(dpid, self.reconnect)
                assert done is not None and not errs, errs

    @invariant()
    def delivery(self):
        if hasattr(self, "core"):
            assert_delivery(self.core, self.fabric, self.topo)

    def teardown(self):
        if hasattr(self, "core"):
            for gid in list(self.core.groups):
                apply(self.fabric, self.core.delete_group(gid))
            assert our_state(self.fabric) == []


FabricMachine.TestCase.settings = settings(max_examples=int(os.environ.get("MC_STATEFUL_EXAMPLES", 150)), stateful_step_count=30, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
TestFabricMachine = FabricMachine.TestCase


# ---------------------------------------------------------------------- controller restart


def restarted(core: MulticastCore) -> MulticastCore:
    fresh = MulticastCore()
    assert fresh.restore(core.to_dict()) == []
    return fresh


def test_controller_restart_on_a_healthy_fabric_sends_nothing():
    topo = T.leaf_spine(2, 3, 2)
    core, fabric = core_and_fabric(topo)
    hosts = [h.ip for h in topo.hosts]
    for i in range(4):
        apply(fabric, core.create_group(f"m{i}", hosts[i], hosts[4:])[1])
    apply(fabric, core.delete_group(1))  # restored groups see other loads: trees must not move
    fresh = restarted(core)
    assert {g.gid: g.tree.parent for g in fresh.groups.values()} == {
        g.gid: g.tree.parent for g in core.groups.values()}
    session = Reconnect(fresh)
    for dpid in fabric.switches:
        done, errs = fabric.connect(dpid, session)
        assert not errs and len(done.plan) == 0, list(done.plan)
        assert set(done.present.groups) == set(core.installed[dpid])
    assert fresh.installed == core.installed
    assert_delivery(fresh, fabric, topo)


def test_controller_restart_repairs_only_what_differs():
    topo = T.leaf_spine(2, 3, 2)
    core, fabric = core_and_fabric(topo)
    hosts = [h.ip for h in topo.hosts]
    g, plan = core.create_group("m", hosts[0], hosts[2:])
    apply(fabric, plan)
    gone, _ = core.create_group("old", hosts[1], hosts[4:])
    apply(fabric, _)
    leaf = topo.host(hosts[0]).dpid
    sw = fabric.switches[leaf]
    # damage: wrong buckets on one switch, an extra (S,G) flow on a wrong port
    entry = core.installed[leaf][g.gid]
    apply(fabric, [(leaf, ofmsgs.group_modify(leaf, g.gid, entry.in_port, frozenset({99})))])
    apply(fabric, [(leaf, ofmsgs.flow_add(leaf, g.gid, 77, g.source, g.address))])
    state = core.to_dict()
    state["groups"] = [d for d in state["groups"] if d["model"] != "old"]  # deleted meanwhile
    fresh = MulticastCore()
    assert fresh.restore(state) == []
    touched = set()
    session = Reconnect(fresh)
    for dpid in fabric.switches:
        done, errs = fabric.connect(dpid, session)
        assert not errs, errs
        touched |= done.plan.switches()
    assert_delivery(fresh, fabric, topo)
    assert our_state(fabric) and not any(gid == gone.gid for _, gid in our_state(fabric))
    assert not any(f.match.get("in_port") == 77 for f in sw.flows)
    assert leaf in touched
    for gid in list(fresh.groups):
        apply(fabric, fresh.delete_group(gid))
    assert our_state(fabric) == []


def test_restart_with_several_ports_down_on_one_switch_keeps_delivery():
    """Found by FabricMachine: the restored topology has every link up; the source's
    switch reconnects reporting two of its ports down. Rerouting once per port in one plan
    moved the tree off and back, and phase 2 deleted the flows it was back on."""
    topo = random_topology(random.Random(668), 7, 5, 8)
    core, fabric = core_and_fabric(topo)
    down = [(1, 2), (4, 5), (4, 6)]  # 4 is the source's switch; 4-5 and 4-6 both go
    for a, b in down:
        k = next(k for k in topo.links if (k.a, k.b) == (a, b))
        fabric.set_link(a, b, False)
        for dpid, port in ((k.a, k.a_port), (k.b, k.b_port)):
            apply(fabric, core.port_down(dpid, port))
    assert topo.host("10.0.0.8").dpid == 4
    apply(fabric, core.create_group("m", "10.0.0.8", ["10.0.0.6", "10.0.0.7"])[1])
    assert_delivery(core, fabric, topo)
    core = restarted(core)
    reconnect = Reconnect(core)
    for dpid in sorted(fabric.switches):
        done, errs = fabric.connect(dpid, reconnect)
        assert done is not None and not errs, errs
    assert_delivery(core, fabric, topo)
