"""The core's fast paths (cached BFS layers, the inlined least-loaded search and entry
building, OpenFlow messages stamped from templates) against a straightforward version written here from the
definitions: on generated topologies, every created group gets the tree a plain
networkx least-loaded shortest-path search gives, and its plan holds, byte for byte,
the messages Ryu's own constructors build for that tree and its protection."""

from __future__ import annotations

import dataclasses
from collections import Counter

import networkx as nx
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

import topologies as T
from controller import ofmsgs
from controller.core import MulticastCore
from controller.failover import Failover
from controller.protect import OWN_GROUP, TO_OWN_GROUP, ff_port, is_ff
from controller.topoview import LinkKey, TopologyView
from controller.trees import SwitchEntry
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
    hosts = {(core.view.hosts[r].dpid, core.view.hosts[r].port) for r in g.tree.reached}
    source = core.view.hosts[g.source]
    for dpid, e in g.tree.entries.items():
        dp = ofmsgs.datapath(dpid)
        via = {ff_port(f): f for f in e.ff}
        # (a copy leaves for a host without the fabric's version tag)
        buckets = [parser.OFPBucket(actions=[parser.OFPActionGroup(via[p])] if p in via else
                                    ([parser.OFPActionPopVlan()] if (dpid, p) in hosts else [])
                                    + [parser.OFPActionOutput(ofp.OFPP_IN_PORT if p == e.in_port else p, 0)])
                   for p in sorted(e.out_ports)]
        out.append(wire(parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_ALL, gid, buckets)))
        # (the source's switch stamps every copy with the tree's version)
        stamp = [parser.OFPActionPushVlan(0x8100), parser.OFPActionSetField(
            vlan_vid=ofp.OFPVID_PRESENT | ofmsgs.VERSION_VIDS[g.color])] if dpid == source.dpid else []
        out.append(wire(parser.OFPFlowMod(
            dp, cookie=ofmsgs.cookie(gid), table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD,
            priority=ofmsgs.PRIO_SG, flags=ofp.OFPFF_SEND_FLOW_REM,
            match=parser.OFPMatch(in_port=e.in_port, eth_type=0x0800, ipv4_src=g.source, ipv4_dst=g.address),
            instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                                       stamp + [parser.OFPActionGroup(gid)])])))
        if e.rejoin:
            arrival, tag, acts = e.rejoin
            # (kept without what is the group's: its MAC restored first, OWN_GROUP its ALL group)
            acts = tuple(("group", gid) if a == ("group", OWN_GROUP) else a for a in acts)
            # (copies to hosts leave last, after the version tag comes off)
            to_hosts = tuple(a for a in acts if a[0] == "output" and (dpid, a[1]) in hosts)
            if to_hosts:
                acts = tuple(a for a in acts if a not in to_hosts) + (("pop_vlan",),) + to_hosts
            acts = (("set_field", "eth_dst", ofmsgs.multicast_mac(g.address)),) + acts
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
    kind, in_port, tag = key
    return wire(parser.OFPFlowMod(
        dp, cookie=ofmsgs.COOKIE_DETOUR, table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD,
        priority=ofmsgs.PRIO_REJOIN if kind == "rejoin" else ofmsgs.PRIO_DETOUR, flags=ofp.OFPFF_SEND_FLOW_REM,
        match=parser.OFPMatch(in_port=in_port, eth_dst=tag, eth_type=0x0800, ipv4_dst=ofmsgs.SSM_NET),
        instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, ryu_actions(spec))]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def connected(cores: list[MulticastCore], topo: T.Topology) -> None:
    """Every switch of ``topo`` connected to each core, with nothing installed yet."""
    for core in cores:
        for dpid in topo.switches:
            core.installed[dpid] = {}


def draw_group(data, ips: list[str]) -> tuple[str, set[str]]:
    """A source and 1-8 receivers among ``ips``."""
    source = data.draw(st.sampled_from(ips), label="source")
    receivers = data.draw(st.sets(st.sampled_from([x for x in ips if x != source]),
                                  min_size=1, max_size=8), label="receivers")
    return source, receivers


@given(topo=topology_strategy, data=st.data(), protection=st.booleans(), nicira=st.booleans())
def test_fast_core_gives_the_straightforward_trees_and_messages(topo, data, protection, nicira):
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2)
    core = MulticastCore(TopologyView.from_topology(topo), protection=protection, nicira=nicira)
    connected([core], topo)
    load: Counter = Counter()  # groups per directed link, from the trees alone
    for i in range(data.draw(st.integers(1, 6), label="groups")):
        source, receivers = draw_group(data, ips)
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


class Searching(MulticastCore):
    """The core without its incremental reroute: every tree a change reaches is searched
    again whole (``compute_tree`` keeping the old tree), as before ``trees.regraft``."""

    def _regraft(self, g, stale) -> None:
        return None


class Counting(MulticastCore):
    """The core as it is, counting the reroutes ``trees.regraft`` did."""

    regrafts = 0

    def _regraft(self, g, stale) -> set[int] | None:
        changed = super()._regraft(g, stale)
        Counting.regrafts += changed is not None
        return changed


def by_switch(plan) -> list[dict[int, list[bytes]]]:
    """Each phase's messages per switch, in order (across switches a phase has none)."""
    out = []
    for phase in plan.phases:
        per: dict[int, list[bytes]] = {}
        for dpid, msg in phase:
            per.setdefault(dpid, []).append(wire(msg))
        out.append(per)
    return out


def core_state(core: MulticastCore) -> tuple:
    """Everything the core keeps about trees, loads, protection and switches (empty
    index entries left behind are no state)."""
    trees = {gid: None if g.tree is None else
             (g.tree.root, g.tree.parent, g.tree.entries, g.tree.reached, g.tree.unreachable)
             for gid, g in core.groups.items()}
    nonempty = lambda d: {k: v for k, v in d.items() if v}  # noqa: E731
    # (what a failure scans for the groups crossing a link: every tree's own parent map)
    assert {gid: id(p) for gid, p in core._parents.items()} == {
        gid: id(g.tree.parent) for gid, g in core.groups.items() if g.tree is not None}
    return (trees, nonempty(dict(core.load.items())), nonempty(core.ff_refs), core.guards,
            nonempty(core.shared_want), core.shared, core.installed, nonempty(core.placed))


def event(data, topo: T.Topology, cores: list[MulticastCore], ips: list[str], i: int):
    """One random change, the same for every core: a link or port going down or up, a
    receiver joining or leaving, a host leaving or coming back, a switch leaving or
    returning, a new group. Returns each core's plan."""
    kind = data.draw(st.sampled_from(["link", "port", "link", "port", "join", "leave", "host",
                                      "switch", "create"]), label="event")
    link = data.draw(st.sampled_from(topo.links), label="link") if topo.links else None
    if kind in ("link", "port") and link is not None:
        down = LinkKey.make(link.a, link.a_port, link.b, link.b_port) in cores[0].view.links \
            if kind == "link" else (link.a, link.a_port) not in cores[0].view.ports_down
        if kind == "link":
            step = (lambda c: c.link_remove(link.a, link.a_port, link.b, link.b_port)) if down else \
                (lambda c: c.link_add(link.a, link.a_port, link.b, link.b_port))
        else:
            step = (lambda c: c.port_down(link.a, link.a_port)) if down else (lambda c: c.port_up(link.a, link.a_port))
    elif kind in ("join", "leave") and cores[0].groups:
        gid = data.draw(st.sampled_from(sorted(cores[0].groups)), label="group")
        ip = data.draw(st.sampled_from([x for x in ips if x != cores[0].groups[gid].source]), label="receiver")
        step = (lambda c: c.join(gid, ip)) if kind == "join" else (lambda c: c.leave(gid, ip))
    elif kind == "host":
        h = topo.host(data.draw(st.sampled_from(ips), label="host"))
        step = (lambda c: c.host_remove(h.ip)) if h.ip in cores[0].view.hosts else \
            (lambda c: c.host_add(h.ip, h.mac, h.dpid, h.port))
    elif kind == "switch":
        dpid = data.draw(st.sampled_from(sorted(topo.switches)), label="switch")
        step = (lambda c: c.switch_leave(dpid)) if dpid in cores[0].view.switches else \
            (lambda c: c.switch_enter(dpid))
    else:
        source, receivers = draw_group(data, ips)
        step = lambda c: c.create_group(f"n{i}", source, receivers)[1]  # noqa: E731
    return [step(c) for c in cores]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), protection=st.booleans(), nicira=st.booleans())
def test_regrafted_reroutes_equal_trees_searched_again_whole(topo, data, protection, nicira):
    """A reroute changes only the part of a tree that lost its shortest path
    (``trees.regraft``): after every change of a random sequence (failures, links and
    ports coming back, joins, leaves, hosts and switches leaving and returning, new
    groups) its trees, entries, loads, protection state and every switch's messages,
    phase by phase, are those of the core that searches each such tree again whole."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2)
    cores = [Counting(TopologyView.from_topology(topo), protection=protection, nicira=nicira),
             Searching(TopologyView.from_topology(topo), protection=protection, nicira=nicira)]
    connected(cores, topo)
    for i in range(data.draw(st.integers(1, 5), label="groups")):
        source, receivers = draw_group(data, ips)
        for core in cores:
            core.create_group(f"m{i}", source, receivers)
    for i in range(data.draw(st.integers(1, 12), label="events")):
        mine, theirs = event(data, topo, cores, ips, i)
        assert by_switch(mine) == by_switch(theirs)
        assert mine.groups == theirs.groups
        assert core_state(cores[0]) == core_state(cores[1])
        protection_holds(cores[0])


def test_every_core_link_failure_of_a_fat_tree_is_regrafted_as_searched():
    """The bench's case, deterministic: many groups on fat-tree:4, every
    aggregation-core link failed and restored in turn; regraft does the reroutes."""
    topo = T.parse("fat-tree:4")
    ips = [h.ip for h in topo.hosts]
    cores = [Counting(TopologyView.from_topology(topo)), Searching(TopologyView.from_topology(topo))]
    connected(cores, topo)
    for i, source in enumerate(ips):
        receivers = [ips[(i + 3 * j + 1) % len(ips)] for j in range(5)]
        for core in cores:
            core.create_group(f"m{i}", source, [r for r in receivers if r != source])
    before = Counting.regrafts
    for link in topo.links:
        for step in (lambda c: c.link_remove(link.a, link.a_port, link.b, link.b_port),
                     lambda c: c.link_add(link.a, link.a_port, link.b, link.b_port)):
            mine, theirs = (step(c) for c in cores)
            assert by_switch(mine) == by_switch(theirs)
            assert core_state(cores[0]) == core_state(cores[1])
    assert Counting.regrafts - before > 20


def in_order(plan) -> list[list[tuple[int, bytes]]]:
    """Each phase's messages with their switches, in sending order."""
    return [[(dpid, wire(msg)) for dpid, msg in phase] for phase in plan.phases]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), protection=st.booleans(), balance=st.booleans(),
       algorithm=st.sampled_from(["spt", "spt", "steiner"]), nicira=st.booleans())
def test_first_trees_built_in_one_pass_equal_the_passes_apart(topo, data, protection, balance, algorithm, nicira):
    """A group's first tree gets its entries, protection, usage indexes and FF counts in
    one pass (``Failover.fill``) and its messages in one loop
    (``ofmsgs.tree_adds``, leaves first from the search's depths): after every change
    of a random sequence the plans, in sending order, and the whole core state are
    those of a core that builds them through ``Failover.protect``, ``MulticastCore._swap`` and the general
    diff."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2)
    cores = [MulticastCore(TopologyView.from_topology(topo), protection=protection, balance=balance,
                           algorithm=algorithm, nicira=nicira) for _ in range(2)]
    cores[1].planner.one_pass = False
    play_alike(data, topo, cores, ips, 5)


def play_alike(data, topo: T.Topology, cores: list[MulticastCore], ips: list[str], groups: int) -> None:
    """1..``groups`` groups created, then up to 10 random events (``event``), the same on
    both cores: after each, the two plans in sending order, their groups and the whole
    core state must be the same, and the protection what it is afresh (``protection_holds``)."""
    connected(cores, topo)
    for i in range(data.draw(st.integers(1, groups), label="groups")):
        source, receivers = draw_group(data, ips)
        mine, theirs = (c.create_group(f"m{i}", source, receivers)[1] for c in cores)
        assert in_order(mine) == in_order(theirs)
        assert core_state(cores[0]) == core_state(cores[1])
    for i in range(data.draw(st.integers(0, 10), label="events")):
        mine, theirs = event(data, topo, cores, ips, i)
        assert in_order(mine) == in_order(theirs)
        assert mine.groups == theirs.groups
        assert core_state(cores[0]) == core_state(cores[1])
        protection_holds(cores[0])


class UncachedFailover(Failover):
    def pieces_now(self):
        self._pieces.clear()
        self._uplinks.clear()
        return super().pieces_now()


class Uncached(MulticastCore):
    """The core computing every port's and parent link's protection pieces afresh each
    time it asks (``Failover.pieces_now`` forgets them): what the per-topology caches
    must give."""

    Failover = UncachedFailover


class ReprotectingFailover(Failover):
    def restale(self):
        self._pieces.clear()
        self._uplinks.clear()
        return super().restale()


class Reprotecting(MulticastCore):
    """The core re-protecting the ends of every link whose detour changed, as before
    ``Failover.restale`` compared the pieces: with none known, every stale link counts
    as changed."""

    Failover = ReprotectingFailover


def protection_holds(core: MulticastCore) -> None:
    """Every tree's entries are what protecting it afresh on the topology as it is now
    gives: no entry keeps protection a changed detour took away."""
    if not core.protection:
        return
    for g in core.groups.values():
        if g.tree is not None:
            fresh = dataclasses.replace(g.tree, entries={n: SwitchEntry(e[0], e[1], (), ())
                                                         for n, e in g.tree.entries.items()})
            core.failover.protect(fresh)
            assert fresh.entries == g.tree.entries, g.gid
    # the FF groups' users, counted afresh from every tree's entries, and the protected
    # links in use: those with a user of either of their port's FF groups
    users: dict = {}
    for g in core.groups.values():
        for n, e in (g.tree.entries.items() if g.tree is not None else ()):
            for f in e.ff + tuple(a[1] for a in (e.rejoin[2] if e.rejoin and e.rejoin[2] is not TO_OWN_GROUP
                                                 else ()) if a[0] == "group" and is_ff(a[1])):
                users.setdefault(n, Counter())[f] += 1
    assert {n: dict(c) for n, c in users.items()} == {n: refs for n, refs in core.ff_refs.items() if refs}
    assert set(core.guards) == {(n, ff_port(f)) for n, c in users.items() for f in c}


def cached_pieces_hold(core: MulticastCore) -> None:
    """Every cached piece and parent link is what the core's topology gives now."""
    fo = core.failover
    fo.pieces_now()  # (forgets them when the topology changed since)
    nbr = core.view.nbr_ports
    for dpid, ports in fo._pieces.items():
        for port, pc in ports.items():
            d = core.detours.known.get((dpid, port)) if (dpid, port) in core.view.port_link else None
            assert pc == (() if d is None else (d.first, pc[1], pc[2], -1, pc[4], ()) if core.nicira else
                          (d.first, pc[1], pc[2], d.arrival, pc[4], (d.arrival, pc[4], TO_OWN_GROUP)))
    for n, ups in fo._uplinks.items():
        for par, (in_port, pc) in ups.items():
            assert in_port == nbr[n][par]
            assert pc == (fo._pieces[par][nbr[par][n]] if core.protection else ())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), protection=st.booleans(), nicira=st.booleans())
def test_cached_protection_pieces_follow_the_topology(topo, data, protection, nicira):
    """The protection pieces of ports and parent links are kept per topology
    (``Failover.pieces_now``, ``_uplink``): through random failures, returns and new groups the
    plans and the whole state are a core's that computes them afresh every time, and
    what is cached is what the topology gives; and a core that re-protects the ends of
    every link whose detour changed (``Reprotecting``) sends and keeps the same: those
    whose piece did not change are rightly left alone (``Failover.restale``)."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2)
    cores = [cls(TopologyView.from_topology(topo), protection=protection, nicira=nicira)
             for cls in (MulticastCore, Uncached, Reprotecting)]
    connected(cores, topo)
    for i in range(data.draw(st.integers(1, 5), label="groups")):
        source, receivers = draw_group(data, ips)
        plans = [c.create_group(f"m{i}", source, receivers)[1] for c in cores]
        assert in_order(plans[0]) == in_order(plans[1]) == in_order(plans[2])
    for i in range(data.draw(st.integers(1, 12), label="events")):
        plans = event(data, topo, cores, ips, i)
        assert in_order(plans[0]) == in_order(plans[1]) == in_order(plans[2])
        assert core_state(cores[0]) == core_state(cores[1]) == core_state(cores[2])
        cached_pieces_hold(cores[0])
        protection_holds(cores[0])
