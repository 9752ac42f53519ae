"""The core's fast paths (cached BFS layers, the inlined least-loaded search and entry
building, OpenFlow messages stamped from templates) against a straightforward version written here from the
definitions: on generated topologies, every created group gets the tree a plain
networkx least-loaded shortest-path search gives, and its plan holds, byte for byte,
the messages Ryu's own constructors build for that tree and its protection."""

from __future__ import annotations

from collections import Counter

import networkx as nx
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

import topologies as T
from controller import ofmsgs
from controller.core import MulticastCore
from controller.protect import is_ff, ff_port
from controller.topoview import TopologyView
from tests.support.fabric_checks import topology_strategy


def plain_tree(topo: T.Topology, root: int, targets: set[int], load: Counter) -> dict[int, int | None]:
    """Least-loaded shortest-path tree, straight from the definition: every switch's cost
    is the least (cost of a shortest-path predecessor + groups on that link), ties to the
    lowest dpid; the tree is the union of the targets' chosen paths."""
    g = nx.Graph((k.a, k.b) for k in topo.links)
    g.add_nodes_from(topo.switches)
    dist = nx.single_source_shortest_path_length(g, root)
    cost, choice = {root: 0}, {root: None}
    for n in sorted(dist, key=dist.__getitem__):
        if n == root:
            continue
        preds = sorted(p for p in g[n] if dist.get(p) == dist[n] - 1)
        best = min(preds, key=lambda p: (cost[p] + load[(p, n)], p))
        cost[n], choice[n] = cost[best] + load[(best, n)], best
    parent: dict[int, int | None] = {root: None}
    for t in targets:
        while t not in parent:
            parent[t] = choice[t]
            t = choice[t]
    return parent


def wire(msg) -> bytes:
    msg.set_xid(1)
    msg.serialize()
    return bytes(msg.buf)


ryu_actions = ofmsgs.actions  # plain Ryu constructors, one object per action


def plain_messages(core: MulticastCore, gid: int) -> list[bytes]:
    """What a switch must be sent for one group's tree, with Ryu's constructors."""
    g = core.groups[gid]
    out = []
    for dpid, e in g.tree.entries.items():
        dp = ofmsgs.datapath(dpid)
        via = {ff_port(f): f for f in e.ff}
        buckets = [parser.OFPBucket(actions=[parser.OFPActionGroup(via[p]) if p in via else
                                             parser.OFPActionOutput(ofp.OFPP_IN_PORT if p == e.in_port else p, 0)])
                   for p in sorted(e.out_ports)]
        out.append(wire(parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_ALL, gid, buckets)))
        out.append(wire(parser.OFPFlowMod(
            dp, cookie=ofmsgs.cookie(gid), table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD,
            priority=ofmsgs.PRIO_SG, flags=ofp.OFPFF_SEND_FLOW_REM,
            match=parser.OFPMatch(in_port=e.in_port, eth_type=0x0800, ipv4_src=g.source, ipv4_dst=g.address),
            instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionGroup(gid)])])))
        if e.rejoin:
            arrival, tag, acts = e.rejoin
            out.append(wire(parser.OFPFlowMod(
                dp, cookie=ofmsgs.cookie(gid), table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD,
                priority=ofmsgs.PRIO_DETOUR, flags=ofp.OFPFF_SEND_FLOW_REM,
                match=parser.OFPMatch(in_port=arrival, eth_dst=tag, eth_type=0x0800,
                                      ipv4_src=g.source, ipv4_dst=g.address),
                instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, ryu_actions(acts))])))
    return out


def plain_shared(dpid: int, key: tuple, spec, command: int) -> bytes:
    dp = ofmsgs.datapath(dpid)
    if key[0] == "ff":
        assert is_ff(key[1])
        return wire(parser.OFPGroupMod(dp, command, ofp.OFPGT_FF, key[1], [
            parser.OFPBucket(watch_port=w, actions=ryu_actions(acts)) for w, acts in spec]))
    _, in_port, tag = key
    return wire(parser.OFPFlowMod(
        dp, cookie=ofmsgs.COOKIE_DETOUR, table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD,
        priority=ofmsgs.PRIO_DETOUR, flags=ofp.OFPFF_SEND_FLOW_REM,
        match=parser.OFPMatch(in_port=in_port, eth_dst=tag, eth_type=0x0800, ipv4_dst=ofmsgs.SSM_NET),
        instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, ryu_actions(spec))]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), protection=st.booleans())
def test_fast_core_gives_the_straightforward_trees_and_messages(topo, data, protection):
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2)
    core = MulticastCore(TopologyView.from_topology(topo), protection=protection)
    for dpid in topo.switches:
        core.installed[dpid] = {}
    load: Counter = Counter()  # groups per directed link, from the trees alone
    for i in range(data.draw(st.integers(1, 6), label="groups")):
        source = data.draw(st.sampled_from(ips), label="source")
        receivers = data.draw(st.sets(st.sampled_from([x for x in ips if x != source]),
                                      min_size=1, max_size=8), label="receivers")
        shared_before = {d: dict(core.shared.get(d, {})) for d in topo.switches}
        g, plan = core.create_group(f"m{i}", source, receivers)
        root = topo.host(source).dpid
        fabric = nx.Graph((k.a, k.b) for k in topo.links)
        fabric.add_nodes_from(topo.switches)
        reach = {r for r in receivers if nx.has_path(fabric, root, topo.host(r).dpid)}
        assert g.tree.reached == frozenset(reach)
        assert g.tree.parent == plain_tree(topo, root, {topo.host(r).dpid for r in reach}, load)
        for c, p in g.tree.parent.items():
            if p is not None:
                load[(p, c)] += 1
        want = plain_messages(core, g.gid)
        for dpid, wanted in core.shared_want.items():
            for key, spec in wanted.items():
                had = shared_before.get(dpid, {}).get(key)
                if had != spec:  # new or changed shared entries are in this plan
                    want.append(plain_shared(dpid, key, spec, ofp.OFPGC_ADD if had is None else ofp.OFPGC_MODIFY))
        sent = [wire(m) for _, m in plan]
        assert Counter(sent) == Counter(want)
        assert all(m.datapath.id == d for d, m in plan)
