"""No hole during a planned move (issue 12): when the controller moves a group to a new
tree (a tree link failed and the fast-failover detour carries its traffic meanwhile, or a
link came back and protection is re-armed), every receiver the fabric can reach must get
at least one copy at *every* state the switches pass through, not only once the plan is
done. Duplicates are allowed in between (the agents drop them by sequence number).

What states can a plan pass through? The installer sends a phase's messages and then a
barrier to every switch it touched, and starts the next phase only once all of them
replied. One switch applies the messages of its connection in order; nothing orders two
switches' messages inside a phase (they are separate connections, read by the switch
process whenever it gets to them). So within a phase the fabric may hold any combination
of per-switch prefixes of that phase's messages: this test checks them all (or a sample,
where there are too many), on the simulated fabric whose fast-failover groups behave as
OF1.3 says."""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import topologies as T
from controller.core import MulticastCore, Plan
from lab.fakeof import FakeFabric
from tests.support.controller_env import assert_exact, core_and_fabric
from tests.support.fabric_checks import apply, assert_delivery, expected_reachable, topology_strategy

MAX_STATES = 2000  # per phase: all of them up to this many, else a sample of this many


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
    and loops (never allowed)."""
    out = []
    for g in core.groups.values():
        tr = fabric.trace(g.source, g.address)
        if tr.loops:
            out.append(f"group {g.gid}: a loop")
        want = expected_reachable(fabric, topo, g.source, g.receivers) if must is None else must.get(g.gid, set())
        for r in sorted(want):
            if not tr.delivered.get(r):
                out.append(f"group {g.gid}: {r} gets nothing")
    return out


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


def install_checking(core: MulticastCore, fabric: FakeFabric, topo: T.Topology, plan: Plan,
                     what: str, seed: int = 0) -> None:
    """Install ``plan`` phase by phase as the app's installer does, asserting that no state
    a phase may pass through leaves a receiver that had a copy before without one."""
    rng = random.Random(seed)
    must = served(core, fabric)
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
                  seed: int = 0) -> None:
    """The link p-c goes down (the switches' own failover takes it), the controller hears
    PortStatus from both ends and moves; then the link comes back and it re-arms."""
    k = link_between(topo, p, c)
    fabric.set_link(p, c, False)
    assert not holes(core, fabric, topo) or not _protected(core, p, c)  # the FF groups' part
    ends = ((k.a, k.a_port), (k.b, k.b_port))
    for d, port in ends[::-1] if c == k.a else ends:  # the child's PortStatus may come first
        install_checking(core, fabric, topo, core.port_down(d, port), f"link {p}-{c} down: {d}:{port}", seed)
    assert_delivery(core, fabric, topo)
    assert_exact(core, fabric)
    fabric.set_link(p, c, True)
    for d, port in ends:
        install_checking(core, fabric, topo, core.port_up(d, port), f"link {p}-{c} up: {d}:{port}", seed)
    assert_delivery(core, fabric, topo)
    assert_exact(core, fabric)


def _protected(core: MulticastCore, p: int, c: int) -> bool:
    port = core.view.nbr_ports[p].get(c)
    return port is not None and core.detours.get(p, port) is not None


def test_the_ovs_lab_failures_move_without_a_hole():
    """The OVS lab's case (tests/test_controller_ff_ovs.py): leaf-spine 2 spines, 3 leaves,
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
        fail_and_move(core, fabric, topo, p, c, seed=i)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), algorithm=st.sampled_from(["spt", "steiner"]))
def test_no_hole_while_a_tree_moves(topo, data, algorithm):
    """Any fabric, a few groups: a tree link fails (and returns); at every state the
    plans pass through, every receiver the fabric can reach gets a copy."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2 and topo.links)
    core, fabric = core_and_fabric(topo, algorithm=algorithm)
    for i in range(data.draw(st.integers(1, 3), label="groups")):
        source = data.draw(st.sampled_from(ips), label="source")
        receivers = data.draw(st.sets(st.sampled_from([x for x in ips if x != source]),
                                      min_size=1, max_size=6), label="receivers")
        apply(fabric, core.create_group(f"m{i}", source, receivers)[1])
    tree_links = sorted({(p, c) for g in core.groups.values() if g.tree for p, c in g.tree.links()})
    assume(tree_links)
    p, c = data.draw(st.sampled_from(tree_links), label="failed link")
    fail_and_move(core, fabric, topo, p, c, seed=data.draw(st.integers(0, 1000), label="seed"))
