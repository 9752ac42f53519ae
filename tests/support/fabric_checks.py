"""Checks shared by the simulated-fabric controller tests: generated topologies (the
families and random graphs) and "every reachable receiver gets exactly one copy"."""

from __future__ import annotations

import random

import networkx as nx
from hypothesis import strategies as st

import topologies as T
from controller.core import MulticastCore
from lab.fakeof import FakeFabric


def random_topology(rng: random.Random, n: int, extra: int, hosts: int) -> T.Topology:
    """A random connected graph: a random spanning tree plus ``extra`` chords."""
    names = [f"s{i}" for i in range(1, n + 1)]
    edges = {frozenset((names[i], names[rng.randrange(i)])) for i in range(1, n)}
    for _ in range(extra):
        a, b = rng.sample(names, 2) if n > 1 else (names[0], names[0])
        if a != b:
            edges.add(frozenset((a, b)))
    return T.from_dict({
        "name": f"random:{n},{extra},{hosts}", "switches": names,
        "links": [sorted(e) for e in sorted(edges, key=sorted)],
        "hosts": [{"switch": rng.choice(names)} for _ in range(hosts)]})


topology_strategy = st.one_of(
    st.builds(T.linear, st.integers(1, 6), st.integers(1, 2)),
    st.builds(T.ring, st.integers(3, 7), st.integers(1, 2)),
    st.builds(T.leaf_spine, st.integers(1, 4), st.integers(2, 5), st.integers(1, 3)),
    st.builds(T.fat_tree, st.sampled_from([2, 4])),
    st.builds(lambda seed, n, extra, h: random_topology(random.Random(seed), n, extra, h),
              st.integers(0, 2**32), st.integers(1, 12), st.integers(0, 12), st.integers(3, 12)),
)


def expected_reachable(fabric: FakeFabric, topo: T.Topology, source: str,
                       receivers: set[str]) -> set[str]:
    """Receivers the fabric's live switches and links can reach from the source,
    computed independently of the controller."""
    g = nx.Graph()
    g.add_nodes_from(d for d, sw in fabric.switches.items() if sw.up)
    for link in topo.links:
        if fabric.port_live(link.a, link.a_port) and fabric.port_live(link.b, link.b_port):
            g.add_edge(link.a, link.b)
    src = topo.host(source)
    if src.dpid not in g:
        return set()
    comp = nx.node_connected_component(g, src.dpid)
    return {r for r in receivers if topo.host(r).dpid in comp}


def assert_delivery(core: MulticastCore, fabric: FakeFabric, topo: T.Topology) -> None:
    """Every reachable receiver of every group gets exactly one copy, nobody else gets
    any, no link carries two copies, no loops, and unreachable receivers are reported."""
    for g in core.groups.values():
        reach = expected_reachable(fabric, topo, g.source, g.receivers)
        reported = g.tree.reached if g.tree else frozenset()
        assert reported == reach, f"group {g.gid}: core reports {sorted(reported)}, fabric reaches {sorted(reach)}"
        assert set(g.receivers) - reach == set(g.tree.unreachable if g.tree else g.receivers)
        tr = fabric.trace(g.source, g.address)
        assert not tr.loops, tr.log
        assert dict(tr.delivered) == {r: 1 for r in reach}, (g.gid, dict(tr.delivered), tr.log)
        assert not tr.tagged, (g.gid, "copies delivered with the version tag on", dict(tr.tagged), tr.log)
        assert all(n == 1 for n in tr.link_copies.values()), tr.link_copies
        if g.tree:
            assert set(tr.link_copies) == g.tree.links()


def apply(fabric: FakeFabric, plan) -> None:
    errs = fabric.apply_all(plan)
    assert not errs, errs


def nicira_actions(fabric: FakeFabric) -> list[tuple[int, object]]:
    """Every Nicira action a switch of the fabric holds, in a flow or a group bucket."""
    found = []
    for dpid, sw in fabric.switches.items():
        acts = [a for f in sw.flows for i in f.instructions if i[0] in ("apply", "write") for a in i[1]]
        acts += [a for grp in sw.groups.values() for b in grp.buckets for a in b.actions]
        found += [(dpid, a) for a in acts if a[0] in ("move", "resubmit") or a[:2] == ("set_field", "in_port")]
    return found


def create_drawn_groups(data: st.DataObject, core: MulticastCore, fabric: FakeFabric, ips: list[str]) -> None:
    """1-3 groups, each a drawn source and 1-6 other hosts, created and their plans
    applied to ``fabric``."""
    for i in range(data.draw(st.integers(1, 3), label="groups")):
        source = data.draw(st.sampled_from(ips), label="source")
        receivers = data.draw(st.sets(st.sampled_from([x for x in ips if x != source]),
                                      min_size=1, max_size=6), label="receivers")
        apply(fabric, core.create_group(f"m{i}", source, receivers)[1])
