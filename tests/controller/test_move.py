"""Trees that move cleanly (issues 12 and 44): when the controller moves a group to a
new tree (a tree link failed and the fast-failover detour carries its traffic meanwhile,
a link came back, a join or a leave reshapes the tree), every receiver of both trees
gets every packet exactly once -- not only once the plan is done, but at every state the
switches pass through, and for a packet in flight while they change.

What states can a plan pass through? The installer sends a phase's messages and then a
barrier to every switch it touched, and starts the next phase only once all of them
replied. One switch applies the messages of its connection in order; nothing orders two
switches' messages inside a phase (they are separate connections, read by the switch
process whenever it gets to them). So within a phase the fabric may hold any combination
of per-switch prefixes of that phase's messages: ``install_checking`` checks them all (or
a sample, where there are too many), on the simulated fabric whose fast-failover groups
behave as OF1.3 says. ``in_flight_checking`` follows single packets hop by hop while
messages keep arriving between the hops, in any order the phases allow; a packet stamped
with the old version is out of the fabric before the plan's drain ends (the SETTLE
phase), which is what the drain is for."""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
import pytest

import topologies as T
from controller import ofmsgs
from controller.core import MulticastCore, Plan
from controller.plan import BUILD, FLIP
from controller.reconnect import Reconnect
from lab.fakeof import FakeFabric
from tests.support.controller_env import assert_exact, core_and_fabric
from tests.support.fabric_checks import (apply, assert_delivery, create_drawn_groups, expected_reachable,
                                         topology_strategy)

MAX_STATES = 1000  # per phase: all of them up to this many, else a sample of this many


def served(core: MulticastCore, fabric: FakeFabric) -> dict[int, set[str]]:
    """Per group, the receivers that get a copy now."""
    out = {}
    for g in core.groups.values():
        tr = fabric.trace(g.source, g.address)
        out[g.gid] = {r for r in g.receivers if tr.delivered.get(r)}
    return out


def holes(core: MulticastCore, fabric: FakeFabric, topo: T.Topology,
          must: dict[int, set[str]] | None = None) -> list[str]:
    """Receivers of ``must`` (default: all the fabric can reach) that get no copy now,
    receivers that get more than one or one still tagged, and loops (never allowed)."""
    out = []
    for g in core.groups.values():
        tr = fabric.trace(g.source, g.address)
        if tr.loops:
            out.append(f"group {g.gid}: a loop")
        want = expected_reachable(fabric, topo, g.source, g.receivers) if must is None else must.get(g.gid, set())
        out += _miscounted(g.gid, tr, want)
    return out


def _miscounted(gid: int, tr: Any, want: set[str]) -> list[str]:
    """What is wrong with one traced packet: a receiver of ``want`` without its copy,
    anyone with two, a copy delivered with the fabric's version tag on."""
    out = [f"group {gid}: {r} gets nothing" for r in sorted(want) if not tr.delivered.get(r)]
    out += [f"group {gid}: {r} gets {n} copies" for r, n in sorted(tr.delivered.items()) if n > 1]
    return out + [f"group {gid}: {r} gets a tagged copy" for r in sorted(tr.tagged)]


def phase_states(phase: list[tuple[int, Any]], rng: random.Random):
    """Every combination of per-switch prefixes of ``phase`` (a sample if too many):
    the messages applied, as (dpid, message) in a per-switch order."""
    per: dict[int, list[Any]] = {}
    for dpid, msg in phase:
        per.setdefault(dpid, []).append(msg)
    dpids = sorted(per)
    ranges = [range(len(per[d]) + 1) for d in dpids]
    total = 1
    for r in ranges:
        total *= len(r)
    cuts = itertools.product(*ranges) if total <= MAX_STATES else (
        tuple(rng.choice(r) for r in ranges) for _ in range(MAX_STATES))
    for cut in cuts:
        yield [(d, m) for d, n in zip(dpids, cut) for m in per[d][:n]], dict(zip(dpids, cut))


def parents(core: MulticastCore) -> dict[int, dict[int, int | None]]:
    return {gid: dict(g.tree.parent) for gid, g in core.groups.items() if g.tree is not None}


def reversed_groups(core: MulticastCore, before: dict[int, dict[int, int | None]]) -> set[int]:
    """Groups whose new tree turns a segment of the old one around (a switch's new parent
    was its child): the hard case (see ``test_a_reversed_segment_moves_without_a_hole``)."""
    out = set()
    for gid, old in before.items():
        g = core.groups.get(gid)
        new = g.tree.parent if g is not None and g.tree is not None else {}
        if any(q is not None and old.get(q) == n for n, q in new.items()):
            out.add(gid)
    return out


def install_checking(core: MulticastCore, fabric: FakeFabric, topo: T.Topology, plan: Plan,
                     what: str, seed: int = 0) -> None:
    """Install ``plan`` phase by phase as the app's installer does, asserting that no state
    a phase may pass through, nor any packet in flight through them, leaves a receiver
    that has a copy before and after without exactly one, or holds a loop."""
    rng = random.Random(seed)
    after = _served_after(core, fabric, plan)  # (a drained bridge leaves receivers without a path)
    must = {gid: got & after.get(gid, set()) for gid, got in served(core, fabric).items()}
    in_flight_checking(core, fabric, plan, must, what, seed)
    for i, phase in enumerate(plan.phases):
        before = {d: (list(sw.flows), dict(sw.groups)) for d, sw in fabric.switches.items()}
        for msgs, cut in phase_states(phase, rng):
            errors = fabric.apply_all(msgs)
            found = holes(core, fabric, topo, must)
            assert not errors and not found, (
                f"{what}: phase {i} with these many of each switch's messages applied: {cut}: "
                f"{found or errors}\nphase {i}:\n" + "\n".join(f"  s{d} {_describe(m)}" for d, m in phase)
                + f"\ntrees: {[sorted(g.tree.links()) for g in core.groups.values() if g.tree]}")
            for d, (flows, groups) in before.items():
                fabric.switches[d].flows, fabric.switches[d].groups = list(flows), dict(groups)
        assert not fabric.apply_all(phase)  # the barrier: all of it, before the next phase
        for d, sw in fabric.switches.items():  # a move holds at most two entries per group
            ids = [gid & ~ofmsgs.TURN_BIT for gid in sw.groups if gid < ofmsgs.FF_BASE]
            assert all(ids.count(gid) <= 2 for gid in ids), (what, i, d, sorted(sw.groups))
            flows = [(f.cookie, f.priority) for f in sw.flows if f.priority in (ofmsgs.PRIO_SG, ofmsgs.PRIO_VERSION)]
            assert all(flows.count(k) <= 2 for k in flows), (what, i, d, flows)


def in_flight_checking(core: MulticastCore, fabric: FakeFabric, plan: Plan, must: dict[int, set[str]],
                       what: str, seed: int = 0, packets: int = 30) -> None:
    """Follow ``packets`` packets of every group of ``plan`` hop by hop while the plan's
    messages keep arriving between the hops (each phase's in a random interleaving of
    the switches' own orders, phase after phase): each receiver of ``must`` gets every
    one exactly once, untagged. A packet that meets its first switch before the flip
    phase is wholly applied may see the plan go no further than that phase (the drain)."""
    rng = random.Random(seed)
    order: list[tuple[int, Any]] = []
    for phase in plan.phases:
        queues: dict[int, list[Any]] = {}
        for dpid, msg in phase:
            queues.setdefault(dpid, []).append(msg)
        while queues:
            d = rng.choice(sorted(queues))
            order.append((d, queues[d].pop(0)))
            if not queues[d]:
                del queues[d]
    flipped = sum(len(p) for p in plan.phases[:2])  # (BUILD and FLIP)
    saved = {d: (list(sw.flows), dict(sw.groups)) for d, sw in fabric.switches.items()}
    for gid in sorted(plan.groups & core.groups.keys()):
        g = core.groups[gid]
        for n in range(packets):
            at = [rng.randint(0, len(order))]
            limit = [len(order)]
            first = [True]
            assert not fabric.apply_all(order[:at[0]])

            def between(dpid: int) -> None:
                if first[0]:  # (the packet's first switch: its version is now decided)
                    first[0] = False
                    if at[0] < flipped:
                        limit[0] = flipped
                step = min(limit[0], at[0] + int(rng.expovariate(0.5)))
                assert not fabric.apply_all(order[at[0]:step])
                at[0] = max(at[0], step)

            tr = fabric.trace(g.source, g.address, between=between)
            found = (["a loop"] if tr.loops else []) + _miscounted(gid, tr, must.get(gid, set()))
            assert not found, (f"{what}: group {gid}, packet {n}: {found}; the plan's messages "
                               f"applied when it ended: {at[0]} of {len(order)}\n" + "\n".join(tr.log))
            for d, (flows, groups) in saved.items():
                fabric.switches[d].flows, fabric.switches[d].groups = list(flows), dict(groups)


def _served_after(core: MulticastCore, fabric: FakeFabric, plan: Plan) -> dict[int, set[str]]:
    """``served`` once ``plan`` is wholly applied (the fabric is put back)."""
    saved = {d: (list(sw.flows), dict(sw.groups)) for d, sw in fabric.switches.items()}
    assert not fabric.apply_all(plan.messages())
    out = served(core, fabric)
    for d, (flows, groups) in saved.items():
        fabric.switches[d].flows, fabric.switches[d].groups = list(flows), dict(groups)
    return out


def _describe(msg: Any) -> str:
    """One line for a message in an assertion (group or flow mod)."""
    if hasattr(msg, "group_id"):
        return f"group cmd {msg.command} type {msg.type} id {msg.group_id:#x} " + " | ".join(
            f"w{b.watch_port}:{[(a.cls_action_type, getattr(a, 'port', getattr(a, 'group_id', ''))) for a in b.actions]}"
            for b in msg.buckets)
    return f"flow cmd {msg.command} prio {msg.priority} {dict(msg.match.items())}"


def link_between(topo: T.Topology, a: int, b: int) -> T.Link:
    return next(k for k in topo.links if {k.a, k.b} == {a, b})


def fail_and_move(core: MulticastCore, fabric: FakeFabric, topo: T.Topology, p: int, c: int,
                  seed: int = 0) -> set[int]:
    """The link p-c goes down (the switches' own failover takes it), the controller hears
    PortStatus from both ends and moves; then the link comes back and it re-arms. Returns
    the groups whose move turned a segment of their tree around."""
    k = link_between(topo, p, c)
    fabric.set_link(p, c, False)
    assert not holes(core, fabric, topo) or not _protected(core, p, c)  # the FF groups' part
    ends = ((k.a, k.a_port), (k.b, k.b_port))
    turned: set[int] = set()
    for up, steps in ((False, ends[::-1] if c == k.a else ends), (True, ends)):
        if up:  # (the child's PortStatus may come first)
            fabric.set_link(p, c, True)
        for d, port in steps:
            before = parents(core)
            plan = core.port_up(d, port) if up else core.port_down(d, port)
            turned |= reversed_groups(core, before)
            install_checking(core, fabric, topo, plan,
                             f"link {p}-{c} {'up' if up else 'down'}: {d}:{port}", seed)
        assert_delivery(core, fabric, topo)
        assert_exact(core, fabric)
    return turned


def _protected(core: MulticastCore, p: int, c: int) -> bool:
    port = core.view.nbr_ports[p].get(c)
    return port is not None and core.detours.get(p, port) is not None


def test_the_ovs_lab_failures_move_without_a_hole():
    """The OVS lab's case (tests/lab/test_controller_ff.py): leaf-spine 2 spines, 3 leaves,
    a group from h1 to h3 and h5; a spine -> leaf link of its tree cut, ten times over as
    the tree moves around. Before the fix the phase that switched traffic onto the new
    tree also held the group-mods cutting the old feeds, so a switch that applied its cut
    before another applied its new feed left a receiver without a copy."""
    topo = T.leaf_spine(2, 3, 2)
    core, fabric = core_and_fabric(topo)
    ips = {h.name: h.ip for h in topo.hosts}
    g, plan = core.create_group("m", ips["h1"], [ips["h3"], ips["h5"]])
    apply(fabric, plan)
    for i in range(10):
        p, c = next((p, c) for p, c in sorted(g.tree.links()) if p in (1, 2))
        assert not fail_and_move(core, fabric, topo, p, c, seed=i)  # (no segment turns here)


def test_a_reversed_segment_moves_without_a_hole():
    """ring:6, a group from s1 to s2, s3 and s4 (tree 1 -> 2 -> 3 -> 4); link 1-2 fails
    and the new tree runs the other way round, 1 -> 6 -> 5 -> 4 -> 3 -> 2: s3 turns from
    copying to s4 to copying to s2 while s1 starts feeding s6. One ALL group cannot copy
    both ways (to s4 for copies from s2, to s2 for copies from s4), so s3 holds the new
    direction in a turn group until the old feed is cut; before that, a plan that turned
    s3's group with the new feeds left s4 with nothing whenever s3 went first."""
    topo = T.ring(6, 1)
    core, fabric = core_and_fabric(topo)
    h = {x.dpid: x.ip for x in topo.hosts}
    g, plan = core.create_group("m", h[1], [h[2], h[3], h[4]])
    apply(fabric, plan)
    assert g.tree.parent[4] == 3 and g.tree.parent[3] == 2
    assert fail_and_move(core, fabric, topo, 1, 2) == {g.gid}  # (it did turn)
    assert not any(ofmsgs.is_turn(t) for sw in fabric.switches.values() for t in sw.groups)


def test_a_move_cut_short_leaves_a_turn_group_the_reconnect_removes():
    """The controller dies (or a switch disconnects) between a move's phases: the
    switches hold second groups and flows pointing at them. Reading its tables back, the
    controller deletes the turn group first and rewrites the flow: exact again."""
    topo = T.ring(6, 1)
    core, fabric = core_and_fabric(topo)
    h = {x.dpid: x.ip for x in topo.hosts}
    g, plan = core.create_group("m", h[1], [h[2], h[3], h[4]])
    apply(fabric, plan)
    fabric.set_link(1, 2, False)
    k = link_between(topo, 1, 2)
    plan = core.port_down(k.a, k.a_port)
    assert any(hasattr(m, "group_id") and ofmsgs.is_turn(m.group_id) for _, m in plan.phases[BUILD])
    assert not fabric.apply_all(plan.phases[BUILD] + plan.phases[FLIP])  # the rest never sent
    turned = {d for d, sw in fabric.switches.items() if any(ofmsgs.is_turn(t) for t in sw.groups)}
    assert turned == {1, 2, 3, 4}  # (every switch of both trees whose entry changes holds the new one apart)
    for dpid in topo.switches:  # each switch reconnects and is read back
        done, errors = fabric.audit(dpid, Reconnect(core), audit=False)
        assert done is not None and not errors, errors
    assert not any(ofmsgs.is_turn(t) for sw in fabric.switches.values() for t in sw.groups)
    assert_delivery(core, fabric, topo)
    assert_exact(core, fabric)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), algorithm=st.sampled_from(["spt", "steiner"]),
       nicira=st.booleans())
def test_no_hole_while_a_tree_moves(topo, data, algorithm, nicira):
    """Any fabric, a few groups: a tree link fails (and returns); at every state the
    plans pass through, every receiver the fabric can reach gets a copy, and one only.
    Without Nicira actions a detour ends in a flow per group, which moves too."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2 and topo.links)
    core, fabric = core_and_fabric(topo, algorithm=algorithm, nicira=nicira)
    create_drawn_groups(data, core, fabric, ips)
    tree_links = sorted({(p, c) for g in core.groups.values() if g.tree for p, c in g.tree.links()})
    assume(tree_links)
    p, c = data.draw(st.sampled_from(tree_links), label="failed link")
    fail_and_move(core, fabric, topo, p, c, seed=data.draw(st.integers(0, 1000), label="seed"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), algorithm=st.sampled_from(["spt", "steiner"]))
def test_no_hole_while_receivers_join_and_leave(topo, data, algorithm):
    """Any fabric, a few groups; receivers join and leave one at a time. A join or a
    leave may reshape the tree (a Steiner tree especially, whose segments can turn
    around): at every state each plan passes through, every receiver that had a copy
    and still belongs gets one, and nothing loops; afterwards the switches hold exactly
    the trees."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 3)
    core, fabric = core_and_fabric(topo, algorithm=algorithm)
    create_drawn_groups(data, core, fabric, ips)
    seed = data.draw(st.integers(0, 1000), label="seed")
    for step in range(data.draw(st.integers(1, 6), label="changes")):
        g = core.groups[data.draw(st.sampled_from(sorted(core.groups)), label="group")]
        others = sorted(ip for ip in ips if ip != g.source and ip not in g.receivers)
        leave = data.draw(st.booleans(), label="leave") if others and len(g.receivers) > 1 else not others
        ip = data.draw(st.sampled_from(sorted(g.receivers) if leave else others), label="who")
        plan = core.leave(g.gid, ip) if leave else core.join(g.gid, ip)
        install_checking(core, fabric, topo, plan, f"step {step}: {ip} {'leaves' if leave else 'joins'} "
                         f"group {g.gid}", seed + step)
        assert_delivery(core, fabric, topo)
        assert_exact(core, fabric)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), algorithm=st.sampled_from(["spt", "steiner"]))
def test_a_drain_moves_every_tree_off_exactly_once_and_its_return_moves_none(topo, data, algorithm):
    """Any fabric, a few groups; a tree link or a switch is drained for maintenance
    while it is still up: every tree crossing it moves off, each packet in flight meanwhile
    reaches each receiver of both trees exactly once, no copy crosses it afterwards (but
    for receivers it alone reaches); given back, no tree that reaches all its receivers
    moves (those it cut off come back)."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2 and topo.links)
    core, fabric = core_and_fabric(topo, algorithm=algorithm)
    create_drawn_groups(data, core, fabric, ips)
    tree_links = sorted({(p, c) for g in core.groups.values() if g.tree for p, c in g.tree.links()})
    assume(tree_links)
    p, c = data.draw(st.sampled_from(tree_links), label="tree link")
    whole = data.draw(st.booleans(), label="the switch")
    a, b = (c, None) if whole else (p, c)
    seed = data.draw(st.integers(0, 1000), label="seed")
    plan = core.drain(a, b)
    install_checking(core, fabric, topo, plan, f"drain {a}-{b}", seed)
    assert_exact(core, fabric)
    crossing = [x for x in core.drained() if x["switches"] == ([a] if whole else sorted((a, b)))]
    assert len(crossing) == 1
    for g in core.groups.values():
        tr = fabric.trace(g.source, g.address)
        used = {frozenset(k) for k in tr.link_copies}
        if whole:  # (a tree rooted there, or reaching hosts there, keeps its copies on it)
            assert not any(a in k for k in used) or a in g.tree.entries, (g.gid, tr.link_copies)
        else:
            assert frozenset((a, b)) not in used, (g.gid, tr.link_copies)
    trees = {gid: dict(g.tree.parent) for gid, g in core.groups.items() if g.tree and not g.tree.unreachable}
    plan = core.drain(a, b, on=False)
    install_checking(core, fabric, topo, plan, f"undrain {a}-{b}", seed + 1)
    assert {gid: dict(g.tree.parent) for gid, g in core.groups.items() if g.tree and gid in trees} == trees
    assert not core.drained() and len(core.drain(a, b, on=False)) == 0


def test_a_drained_link_stays_out_when_it_is_rediscovered_or_its_switch_reconnects():
    """The drain holds by switches, not by the link's discovery: a link seen again (LLDP
    after a flap, a switch reconnecting) is still held, and a switch's drain holds links
    found later too."""
    topo = T.leaf_spine(2, 3, 1)
    core, fabric = core_and_fabric(topo)
    k = link_between(topo, 1, 3)
    apply(fabric, core.drain(1, 3))
    apply(fabric, core.link_remove(k.a, k.a_port, k.b, k.b_port))
    apply(fabric, core.link_add(k.a, k.a_port, k.b, k.b_port))
    assert not core.view.graph.has_edge(1, 3) and any({x.a, x.b} == {1, 3} for x in core.view.links)
    apply(fabric, core.drain(2))
    assert not any(2 in e for e in core.view.graph.edges)
    k2 = link_between(topo, 2, 4)
    apply(fabric, core.link_remove(k2.a, k2.a_port, k2.b, k2.b_port))
    apply(fabric, core.link_add(k2.a, k2.a_port, k2.b, k2.b_port))
    assert not any(2 in e for e in core.view.graph.edges)
    assert [d["switches"] for d in core.drained()] == [[1, 3], [2]]
    apply(fabric, core.drain(1, 3, on=False))
    apply(fabric, core.drain(2, on=False))
    assert core.view.graph.has_edge(1, 3) and core.view.graph.has_edge(2, 4)
