"""The core's fast paths (cached BFS layers, the inlined least-loaded search and entry
building, OpenFlow messages stamped from templates) against a straightforward version written here from the
definitions: on generated topologies, every created group gets the tree a plain
networkx least-loaded shortest-path search gives, and its plan holds, byte for byte,
the messages Ryu's own constructors build for that tree and its protection."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter, defaultdict

import networkx as nx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

import topologies as T
from controller import native, ofmsgs, trees
from controller import core as C
from controller.core import MulticastCore, Plan
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
            # (kept without what is the group's: its MAC restored first, OWN_GROUP its ALL group)
            acts = (("set_field", "eth_dst", ofmsgs.multicast_mac(g.address)),) + tuple(
                ("group", gid) if a == ("group", OWN_GROUP) else a for a in acts)
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
    one pass (``MulticastCore._fill``) and its messages in one loop
    (``ofmsgs.tree_adds``, leaves first from the search's depths): after every change
    of a random sequence the plans, in sending order, and the whole core state are
    those of a core that builds them through ``_protect``, ``_swap`` and the general
    diff."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2)
    cores = [MulticastCore(TopologyView.from_topology(topo), protection=protection, balance=balance,
                           algorithm=algorithm, nicira=nicira) for _ in range(2)]
    cores[1].one_pass = False
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


class Uncached(MulticastCore):
    """The core computing every port's and parent link's protection pieces afresh each
    time it asks (``_pieces_now`` forgets them): what the per-topology caches must give."""

    def _pieces_now(self):
        self._pieces.clear()
        self._uplinks.clear()
        return super()._pieces_now()


class Reprotecting(MulticastCore):
    """The core re-protecting the ends of every link whose detour changed, as before
    ``_restale`` compared the pieces: with none known, every stale link counts as
    changed."""

    def _restale(self):
        self._pieces.clear()
        self._uplinks.clear()
        return super()._restale()


def protection_holds(core: MulticastCore) -> None:
    """Every tree's entries are what protecting it afresh on the topology as it is now
    gives: no entry keeps protection a changed detour took away."""
    if not core.protection:
        return
    for g in core.groups.values():
        if g.tree is not None:
            fresh = dataclasses.replace(g.tree, entries={n: SwitchEntry(e[0], e[1], (), ())
                                                         for n, e in g.tree.entries.items()})
            MulticastCore._protect_py(core, g, fresh)
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
    core._pieces_now()  # (forgets them when the topology changed since)
    nbr = core.view.nbr_ports
    for dpid, ports in core._pieces.items():
        for port, pc in ports.items():
            d = core.detours.known.get((dpid, port)) if (dpid, port) in core.view.port_link else None
            assert pc == (() if d is None else (d.first, pc[1], pc[2], -1, pc[4], ()) if core.nicira else
                          (d.first, pc[1], pc[2], d.arrival, pc[4], (d.arrival, pc[4], TO_OWN_GROUP)))
    for n, ups in core._uplinks.items():
        for par, (in_port, pc) in ups.items():
            assert in_port == nbr[n][par]
            assert pc == (core._pieces[par][nbr[par][n]] if core.protection else ())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), protection=st.booleans(), nicira=st.booleans())
def test_cached_protection_pieces_follow_the_topology(topo, data, protection, nicira):
    """The protection pieces of ports and parent links are kept per topology
    (``_pieces_now``, ``_uplink``): through random failures, returns and new groups the
    plans and the whole state are a core's that computes them afresh every time, and
    what is cached is what the topology gives; and a core that re-protects the ends of
    every link whose detour changed (``Reprotecting``) sends and keeps the same: those
    whose piece did not change are rightly left alone (``_restale``)."""
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


# -- controller._fastplan: a new tree's per-switch loops in C (``MulticastCore._fill_c``,
# ``ofmsgs.tree_adds_c``) give the entries, bookkeeping, callbacks and bytes their Python
# twins give, on generated topologies and after random changes, and refuse bad input
# with an exception rather than a crash.

needs_c = pytest.mark.skipif(
    native.module is None and os.environ.get("CI") != "true",
    reason=f"controller._fastplan is not built ({native.why}): reinstall with a C compiler and the Python headers")


def test_the_c_builder_is_built_in_ci():
    """CI installs with a compiler: there the C loops must exist and be the default."""
    assert native.module is not None, native.why
    if os.environ.get("MODELCAST_PURE_PYTHON", "") in ("", "0"):
        assert MulticastCore._fill is MulticastCore._fill_c
        assert MulticastCore._tree_adds is ofmsgs.tree_adds_c

        assert trees._spt_vector is trees._spt_vector_c
        assert trees._bfs_dag is trees._bfs_dag_c
        assert trees._outs is native.module.outs and trees._bump is native.module.bump
        assert trees.crossing is native.module.crossing
        assert MulticastCore._count is MulticastCore._count_c and ofmsgs._all_group is ofmsgs._all_group_c
        assert MulticastCore._protect is MulticastCore._protect_c
        assert trees.regraft is trees.regraft_c and MulticastCore._regraft_tree is trees.regraft_c
        assert MulticastCore._diff_switches is MulticastCore._diff_switches_c
        assert MulticastCore._recount is MulticastCore._recount_c and MulticastCore._changed is MulticastCore._changed_c
        assert MulticastCore._reprotect is MulticastCore._reprotect_c
        assert MulticastCore._place is MulticastCore._place_c
        assert MulticastCore._diff_shared is MulticastCore._diff_shared_c
        assert MulticastCore._guard is MulticastCore._guard_c and MulticastCore._want_ff is MulticastCore._want_ff_c
        from controller import protect

        assert protect._path_around is protect._path_around_c


class InC(MulticastCore):
    _fill = MulticastCore._fill_c
    _count = MulticastCore._count_c
    _protect = MulticastCore._protect_c
    _regraft_tree = staticmethod(trees.regraft_c)
    _diff_switches = MulticastCore._diff_switches_c
    _recount = MulticastCore._recount_c
    _changed = MulticastCore._changed_c
    _reprotect = MulticastCore._reprotect_c
    _place = MulticastCore._place_c
    _tree_adds = staticmethod(ofmsgs.tree_adds_c)
    _diff_shared = MulticastCore._diff_shared_c
    _guard = MulticastCore._guard_c
    _want_ff = MulticastCore._want_ff_c


class InPython(MulticastCore):
    _fill = MulticastCore._fill_py
    _count = MulticastCore._count_py
    _protect = MulticastCore._protect_py
    _regraft_tree = staticmethod(trees.regraft_py)
    _diff_switches = MulticastCore._diff_switches_py
    _recount = MulticastCore._recount_py
    _changed = MulticastCore._changed_py
    _reprotect = MulticastCore._reprotect_py
    _place = MulticastCore._place_py
    _tree_adds = staticmethod(ofmsgs.tree_adds_py)
    _diff_shared = MulticastCore._diff_shared_py
    _guard = MulticastCore._guard_py
    _want_ff = MulticastCore._want_ff_py


@needs_c
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data(), protection=st.booleans(), balance=st.booleans(),
       nicira=st.booleans())
def test_c_and_python_build_the_same_trees_state_and_bytes(topo, data, protection, balance, nicira):
    """Groups created (their first trees: the C loops), then random link, port, switch,
    host, join and leave events and more groups: every plan, in sending order and byte
    for byte, and the whole core state are the same in both."""
    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2)
    cores = [cls(TopologyView.from_topology(topo), protection=protection, balance=balance, nicira=nicira)
             for cls in (InC, InPython)]
    play_alike(data, topo, cores, ips, 6)


@needs_c
@pytest.mark.parametrize("nicira", [True, False])
def test_many_groups_on_few_links_build_the_same_in_both(nicira):
    """Larger than the generated cases: 1200 groups of 6 receivers on a small leaf-spine,
    so FF groups gain many users, entries repeat across groups and counts pass 256 (no
    longer the small cached ints); the messages and state agree."""
    topo = T.leaf_spine(2, 4, 3)
    ips = [h.ip for h in topo.hosts]
    cores = [cls(TopologyView.from_topology(topo), protection=True, nicira=nicira) for cls in (InC, InPython)]
    connected(cores, topo)
    for i in range(1200):
        source = ips[(i * 7) % len(ips)]
        receivers = {ips[(i * 5 + k * 7) % len(ips)] for k in range(6)} - {source}
        mine, theirs = (c.create_group(f"m{i}", source, receivers)[1] for c in cores)
        assert [(d, type(m), m._wire) for d, m in mine] == [(d, type(m), m._wire) for d, m in theirs]
    assert core_state(cores[0]) == core_state(cores[1])
    assert max(n for refs in cores[0].ff_refs.values() for n in refs.values()) > 256


@needs_c
def test_bad_input_raises_instead_of_crashing():
    """The loops check what they are given: wrong types raise TypeError (or KeyError for
    a switch missing from the tree), never a crash of the controller process."""
    fill, adds = native.module.fill, native.module.tree_adds
    with pytest.raises(TypeError):
        fill(1, 2, 3)
    args = [{}, {}, {1: [2]}, 1, {}, None, False, {}, None, {}, None, None, TO_OWN_GROUP,
            SwitchEntry, (), {}]
    with pytest.raises(KeyError):  # switch 1 has no parent
        fill(*args)
    args[1] = {1: None}
    args[2] = {1: "not a list"}
    with pytest.raises(TypeError):
        fill(*args)
    args[2] = {1: [3, 2]}
    fill(*args)
    assert args[0] == {1: SwitchEntry(1, (2, 3), (), ())} and type(args[0][1]) is SwitchEntry
    out: list = []
    good = [5, b"h", b"t", [1], {1: SwitchEntry(1, (2, 3), (0xFFFF0003,), ())}, out, {},
            lambda t: b"x", lambda acts: (b"r", b"s"), ofmsgs.ReadyGroupMod, ofmsgs.ReadyFlowMod]
    adds(*good)
    assert [(d, type(m).__name__, m._wire) for d, m in out] == [
        (1, "ReadyGroupMod", ofmsgs.group_add(1, 5, 1, (2, 3), (0xFFFF0003,))._wire),
        (1, "ReadyFlowMod", b"h\x00\x00\x00\x01t")]
    for i, bad in ((0, -1), (3, [2]), (4, {1: (1, 2)}), (4, {1: SwitchEntry(1, (3, 2), (), ())}),
                   (4, {1: SwitchEntry(1, (2,), (-5,), ())}), (4, {1: SwitchEntry(1, [2], (), ())}),
                   (7, lambda key: "no bytes"), (4, {1: SwitchEntry(1, (2,), (), (1,))}), (9, object),
                   (10, ofmsgs.ReadyFlowMod.__mro__[1])):
        wrong = list(good)
        wrong[i] = bad
        if i == 7:  # (the tag callback is asked only for a rejoin whose tag C does not read)
            wrong[4] = {1: SwitchEntry(1, (2,), (), (4, "not a MAC", ()))}
        with pytest.raises((TypeError, KeyError, OverflowError, ValueError)):
            adds(*wrong)


@needs_c
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data())
def test_the_search_in_c_makes_the_numpy_searchs_choices(topo, data):
    """``trees._spt_vector_c`` against ``_spt_vector_py`` under loads left by random
    groups, also after a link failure: the same tree in the same order (the root, then a
    layer at a time), the same link numbers and the same deepest-first order."""

    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2)
    core = MulticastCore(TopologyView.from_topology(topo))
    connected([core], topo)
    for i in range(data.draw(st.integers(0, 6), label="groups")):
        core.create_group(f"m{i}", *draw_group(data, ips))
    if topo.links and data.draw(st.booleans(), label="fail a link"):
        link = data.draw(st.sampled_from(topo.links), label="link")
        core.link_remove(link.a, link.a_port, link.b, link.b_port)
    switches = sorted(core.view.switches)
    root = data.draw(st.sampled_from(switches), label="root")
    dist, _ = core.cache.dag(root)
    targets = data.draw(st.sets(st.sampled_from(sorted(dist)), min_size=1), label="targets")
    a = trees._spt_vector_py(root, targets, core.cache, core.load)
    b = trees._spt_vector_c(root, targets, core.cache, core.load)
    assert list(a[0].items()) == list(b[0].items())
    assert a[1].tolist() == b[1].tolist() and a[2] == b[2]


@needs_c
def test_the_search_in_c_refuses_bad_arrays():
    """Wrong shapes, types, orders or numbers out of range raise; they never read past an
    array."""
    import numpy as np

    grid = native.module.spt_grid
    # switches 10 (node 1, the root) and 11 (node 2), one link 10 -> 11 numbered 1
    nodes, hops = np.array([1, 2]), np.array([0, 1])
    around, links = np.array([[0], [2], [1]]), np.array([[0], [1], [1]])
    load = np.zeros(4, dtype=np.int64)
    assert grid(nodes, hops, around, links, load, 3, 1, [2], [0, 10, 11]) == (
        {10: None, 11: 10}, np.array([1]).tobytes(), [11, 10])
    for bad in ((np.array([1, 7]), hops, around, links), (nodes, np.array([0, 2]), around, links),
                (nodes, hops, np.array([[0], [9], [9]]), links), (nodes, hops, around, np.array([[0], [9], [9]])),
                (nodes, np.array([0.5, 1.0]), around, links), (np.array([2, 1]), hops, around, links),
                (nodes, hops, around[:2], links[:2]), (nodes, hops, np.array([[0], [0], [0]]), links)):
        with pytest.raises((TypeError, ValueError, IndexError)):
            grid(*bad, load, 3, 1, [2], [0, 10, 11])
    with pytest.raises(IndexError):
        grid(nodes, hops, around, links, load, 3, 1, [5], [0, 10, 11])
    with pytest.raises(ValueError):
        grid(nodes, hops, around, links, load, 3, 1, [2], [0, 10])  # (fewer dpids than nodes)


# -- the graph searches done once per topology: a source switch's DAG (``PathCache.dag``)
# and a protected link's detour (``protect._path_around``)

adjacency = st.integers(1, 14).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(1, n), st.integers(1, n), st.integers(1, 48)), max_size=3 * n),
    st.randoms(use_true_random=False)))


def draw_adjacency(spec) -> dict[int, dict[int, int]]:
    """``nbr_ports`` as a view holds it (dpid -> {neighbour: port}), insertion orders
    shuffled: the searches must follow the dicts' own orders, not sorted ones."""
    n, edges, rng = spec
    nbr: dict[int, dict[int, int]] = {d: {} for d in rng.sample(range(1, n + 1), n)}
    for a, b, port in edges:
        if a != b:
            nbr[a][b] = port
            nbr[b][a] = port + 1
    return {d: dict(rng.sample(list(p.items()), len(p))) for d, p in nbr.items()}


def searches_agree(nbr: dict[int, dict[int, int]], data) -> None:
    """Every switch's DAG and the detour around every link and a drawn other pair, with
    and without a drawn hint: C's and Python's the same."""
    from controller import protect

    for root in nbr:
        a, b = trees._bfs_dag_py(nbr, root), trees._bfs_dag_c(nbr, root)
        assert list(a[0].items()) == list(b[0].items()) and list(a[1].items()) == list(b[1].items())
    switches = sorted(nbr)
    for u in nbr:
        for v in [*nbr[u], data.draw(st.sampled_from(switches), label="any other")]:
            hint = data.draw(st.none() | st.tuples(st.sampled_from(switches), st.sampled_from(switches)), label="hint")
            assert protect._path_around_c(nbr, u, v, hint) == protect._path_around_py(nbr, u, v, hint)


@needs_c
@settings(max_examples=300, deadline=None)
@given(spec=adjacency, data=st.data())
def test_the_searches_in_c_find_the_pythons_dags_and_detours(spec, data):
    """Every switch's DAG (distances and sorted predecessors, in the same insertion
    orders: the layers are built in that order) and the detour around every link and
    around some non-links, with and without a hint of a replaced detour: the same in C
    as in Python."""
    searches_agree(draw_adjacency(spec), data)


@needs_c
@settings(max_examples=200, deadline=None)
@given(spec=adjacency, data=st.data())
def test_the_searches_in_c_agree_on_any_dpid(spec, data):
    """The C searches keep nodes by their int value (``_fastplan`` Ids) and fall back to
    dicts for what does not fit: dpid 0 (false as a first hop, as in Python), 32- and
    64-bit values, values past 2**63; the same DAGs and detours as Python's."""
    nbr = draw_adjacency(spec)
    values = data.draw(st.lists(st.sampled_from([0, 1, 2, 7, 2**31, 2**32 + 5, 2**48 + 1, 2**62, 2**63 - 1,
                                                 2**63, 2**63 + 7, 2**64 - 1]) | st.integers(0, 2**64 - 1),
                                min_size=len(nbr), max_size=len(nbr), unique=True), label="dpids")
    name = dict(zip(sorted(nbr), values))
    searches_agree({name[d]: {name[n]: p for n, p in ports.items()} for d, ports in nbr.items()}, data)


@needs_c
def test_the_searches_in_c_agree_on_a_fat_tree_and_refuse_bad_input():
    """fat-tree:8 whole (its detours are all equally long: the hash decides), then
    input a view never holds: errors, not crashes."""
    from controller import protect, trees

    nbr = TopologyView.from_topology(T.fat_tree(8)).nbr_ports
    for u in nbr:
        assert trees._bfs_dag_c(nbr, u) == trees._bfs_dag_py(nbr, u)
        for v in nbr[u]:
            assert protect._path_around_c(nbr, u, v) == protect._path_around_py(nbr, u, v)
    dag, around = native.module.bfs_dag, native.module.path_around
    with pytest.raises(TypeError):
        dag([], 1)
    with pytest.raises(KeyError):  # a neighbour that is no switch
        dag({1: {2: 1}}, 1)
    with pytest.raises(TypeError):
        dag({1: {2: 1}, 2: [1]}, 1)
    assert dag({1: {}}, 1) == ({1: 0}, {1: []})
    assert around({1: {2: 1}, 2: {1: 1}}, 1, 3, None) is None  # (no such switch)
    assert around({1: {2: 1}, 2: {1: 1}}, 1, 2, None) is None  # (a bridge)
    for bad in ((1, 2), "x", (1, 2, 3)):
        with pytest.raises(TypeError):
            around({1: {2: 1}, 2: {1: 1}}, 1, 2, bad if bad != (1, 2) else [1, 2])
    with pytest.raises((OverflowError, TypeError)):
        around({-1: {2: 1}, 2: {-1: 1}}, -1, 2, None)
    with pytest.raises(KeyError):  # a neighbour that is no switch, reached while searching
        around({1: {2: 1, 3: 2}, 2: {1: 1}, 3: {1: 2, 5: 3}}, 1, 2, None)
    assert dag({1: {-2: 1}, -2: {1: 1}}, 1) == ({1: 0, -2: 1}, {1: [], -2: [1]})  # (any int)
    assert dag({"a": {"b": 1}, "b": {"a": 1}}, "a") == ({"a": 0, "b": 1}, {"a": [], "b": ["a"]})  # (on dicts)


@needs_c
@settings(max_examples=200, deadline=None)
@given(spec=adjacency, data=st.data())
def test_the_outputs_and_load_loops_in_c_are_the_pythons(spec, data):
    """A tree's output ports per switch (``trees._outs``) and the link load counts
    (``trees._bump``, adding and taking off) on trees drawn from generated graphs: the
    same dicts, in the same orders, in C as in Python; what a tree cannot hold raises."""

    nbr = draw_adjacency(spec)
    root = data.draw(st.sampled_from(sorted(nbr)), label="root")
    dist, preds = trees._bfs_dag_py(nbr, root)
    parent = {n: (data.draw(st.sampled_from(preds[n]), label="parent") if preds[n] else None) for n in dist}
    ends = frozenset(data.draw(st.lists(st.tuples(st.sampled_from(sorted(dist)), st.integers(50, 60)),
                                        max_size=6), label="ends"))
    a, b = trees._outs_py(parent, nbr, ends), native.module.outs(parent, nbr, ends)
    assert list(a.items()) == list(b.items())
    into_py: dict = {}
    into_c: dict = {}
    for step in data.draw(st.lists(st.sampled_from([1, -1, 3]), min_size=1, max_size=4), label="steps"):
        trees._bump_py(into_py, parent, step)
        native.module.bump(into_c, parent, step)
        assert list(into_py.items()) == list(into_c.items())
    with pytest.raises(KeyError):
        native.module.outs({1: None, 2: 1}, {1: {}}, ())  # (no port from 1 to 2)
    with pytest.raises(KeyError):
        native.module.outs({1: None}, {1: {}}, [(9, 1)])  # (an end off the tree)
    with pytest.raises(TypeError):
        native.module.outs({1: None}, {1: {}}, [(1, 2, 3)])
    with pytest.raises(TypeError):
        native.module.bump({2: [1]}, {2: 1}, 1)


@needs_c
@settings(max_examples=200, deadline=None)
@given(spec=adjacency, data=st.data(), shift=st.sampled_from([0, 1 << 40, 1 << 64]))
def test_a_trees_entries_in_one_call_are_outs_then_fill(spec, data, shift):
    """``_fastplan.fill_tree`` (each switch's output ports gathered and sorted in C
    arrays, then its entry) gives ``outs`` then ``fill``'s entries, in the same order;
    switches that are no small ints (here past 2**64) take that path itself; what a tree
    cannot hold raises as there."""

    nbr0 = draw_adjacency(spec)
    nbr = {a + shift: {b + shift: port for b, port in to.items()} for a, to in nbr0.items()}
    root = data.draw(st.sampled_from(sorted(nbr)), label="root")
    dist, preds = trees._bfs_dag_py(nbr, root)
    parent = {n: (data.draw(st.sampled_from(preds[n]), label="parent") if preds[n] else None) for n in dist}
    ends = frozenset(data.draw(st.lists(st.tuples(st.sampled_from(sorted(dist)), st.integers(1, 60)),
                                        max_size=8), label="ends"))

    def made(call) -> tuple:
        asked: list = []

        def uplink(n, par):
            asked.append((n, par))
            return (nbr[n][par], ())

        shapes: dict = {}
        rest = (7, {}, uplink, False, {}, None, {}, None, None, TO_OWN_GROUP, SwitchEntry, (), shapes)
        got = call(rest)
        return list(got.items()), [type(e) for e in got.values()], asked

    def old(rest):
        outs = native.module.outs(parent, nbr, ends)
        entries = dict.fromkeys(outs)
        native.module.fill(entries, parent, outs, *rest)
        return entries

    assert made(lambda rest: native.module.fill_tree(None, parent, nbr, ends, *rest)) == made(old)
    rest = (7, {}, lambda n, par: (0, ()), False, {}, None, {}, None, None, TO_OWN_GROUP, SwitchEntry, (), {})
    for bad_parent, bad_nbr, bad_ends in (({1: None, 2: 1}, {1: {}}, frozenset()),  # (no port from 1 to 2)
                                          ({1: None}, {1: {}}, frozenset({(9, 1)}))):  # (an end off the tree)
        with pytest.raises(KeyError):
            native.module.fill_tree(None, bad_parent, bad_nbr, bad_ends, *rest)
    with pytest.raises(TypeError):
        native.module.fill_tree(None, {1: None}, {1: {}}, frozenset({(1, 2, 3)}), *rest)
    with pytest.raises(TypeError):
        native.module.fill_tree(None, {1: None}, {1: {}}, [(1, 2)], *rest)  # (ends are a set)


@needs_c
@settings(max_examples=200, deadline=None)
@given(spec=adjacency, data=st.data())
def test_the_scan_for_a_links_groups_in_c_is_the_pythons(spec, data):
    """Which groups' trees cross which of a set of links (``trees.crossing``, asked on a
    failure instead of an index): trees drawn on generated graphs; C and Python give the
    same dict in the same orders, and it is exactly the groups whose tree has the link
    in that direction."""

    nbr = draw_adjacency(spec)
    parents = {}
    for gid in data.draw(st.lists(st.integers(1, 50), unique=True, max_size=6), label="gids"):
        root = data.draw(st.sampled_from(sorted(nbr)), label="root")
        dist, preds = trees._bfs_dag_py(nbr, root)
        parents[gid] = {n: (data.draw(st.sampled_from(preds[n]), label="parent") if preds[n] else None)
                        for n in dist}
    links = data.draw(st.lists(st.sampled_from(sorted((a, b) for a in nbr for b in nbr[a])), max_size=5)
                      if any(nbr.values()) else st.just([]), label="links")
    below: dict = {}
    for p, c in links:
        below.setdefault(c, []).append(p)
    a, b = trees._crossing_py(parents, below), native.module.crossing(parents, below)
    assert list(a.items()) == list(b.items())
    assert set(a) == {gid for gid, parent in parents.items() if any(parent.get(c) == p for p, c in links)}
    for bad in (([], {}), ({1: []}, {1: [2]}), ({1: {1: 2}}, {1: (2,)})):
        with pytest.raises(TypeError):
            native.module.crossing(*bad)


@needs_c
@settings(max_examples=300, deadline=None)
@given(command=st.sampled_from([ofmsgs.ofp.OFPGC_ADD, ofmsgs.ofp.OFPGC_MODIFY]),
       gid=st.integers(1, 0x7FFEFFFF), in_port=st.integers(1, 40),
       ports=st.lists(st.integers(1, 40), unique=True, max_size=20), data=st.data())
def test_an_all_group_packed_in_c_is_the_pythons(command, gid, in_port, ports, data):
    """An ALL group's add or modify (``ofmsgs._all_group_c``, what a reroute's group
    changes use) is byte for byte ``_all_group_py``'s for out-ports in any order, some
    through FF groups (either variant), the ingress port among them or not."""
    from controller.protect import ff_id

    ff = tuple(ff_id(p, data.draw(st.booleans(), label="via in_port"))
               for p in data.draw(st.lists(st.sampled_from(ports), unique=True), label="protected")) if ports else ()
    out_ports = tuple(data.draw(st.permutations(ports), label="order"))
    mine = ofmsgs._all_group_c(7, command, gid, in_port, out_ports, ff)
    theirs = ofmsgs._all_group_py(7, command, gid, in_port, out_ports, ff)
    assert (type(mine), mine._dpid, mine._wire) == (type(theirs), theirs._dpid, theirs._wire)
    assert ofmsgs._all_group_c(7, command, gid, in_port, list(out_ports), list(ff))._wire == mine._wire
    for bad in ((-1, (1,)), (2 ** 32, (1,)), (1, (-2,)), (1, ("x",))):
        with pytest.raises((ValueError, TypeError, OverflowError)):
            native.module.group_mod(command, gid if bad[0] == 1 else bad[0], in_port, bad[1], ())


@needs_c
def test_counting_ff_users_in_c_refuses_bad_input():
    """``_fastplan.count`` (``MulticastCore._count_c``) raises on what is not an entry or a
    step, and counts up and back down to nothing, asking for the protected link's guard
    (which wants both FF groups of its port) at the first user of either and at the
    last, and for the FF group alone when the port's other one is in use."""
    count = native.module.count
    calls: list = []
    args = (lambda n, f: calls.append(("want", n, f)), lambda key, on: calls.append(("guard", key, on)),
            TO_OWN_GROUP)
    from collections import defaultdict

    ff_refs: defaultdict = defaultdict(dict)
    e = SwitchEntry(1, (2, 3), (0xFFFF0003,), ())
    for bad in (({1: (1, 2)}, 1), ({1: SwitchEntry(1, (2,), [5], ())}, 1), ({1: e}, 2), ({1: e}, "1"),
                ({1: SwitchEntry(1, (2,), (), (4, "t", "acts"))}, 1), ([], 1)):
        with pytest.raises((TypeError, ValueError)):
            count(*bad, ff_refs, *args)
    count({9: e}, 1, ff_refs, *args)
    count({9: e}, 1, ff_refs, *args)
    assert ff_refs[9] == {0xFFFF0003: 2} and calls == [("guard", (9, 3), True)]
    via = SwitchEntry(3, (2, 3), (0xFFFF8003,), ())  # (the port's other FF group)
    count({9: via}, 1, ff_refs, *args)
    count({9: via}, -1, ff_refs, *args)
    assert calls[1:] == [("want", 9, 0xFFFF8003), ("want", 9, 0xFFFF8003)]
    count({9: e}, -1, ff_refs, *args)
    count({9: e}, -1, ff_refs, *args)
    assert ff_refs[9] == {} and calls[3:] == [("guard", (9, 3), False)]


@needs_c
def test_protecting_in_c_reuses_recomputes_and_refuses_bad_input():
    """``_fastplan.protect`` (``MulticastCore._protect_c``): a switch gets its FF group and
    the rejoin its parent link's detour gives; it keeps the old tree's entry (the same
    object) where its ports and parent are unchanged, unless a detour there is stale;
    and what is not an entry, a parent or a piece raises instead of crashing."""
    protect = native.module.protect
    tag_rejoin = (7, "02:00:00:00:00:09", TO_OWN_GROUP)
    piece3 = (5, 0xFFFF0003, 0xFFFF8003, 7, "02:00:00:00:00:03", tag_rejoin)
    up = (4, (9, 0xFFFF0004, 0xFFFF8004, 8, "02:00:00:00:00:09", tag_rejoin))
    asked: list = []

    def run(entries, parent, nodes=None, was=None, was_parent=None, at=frozenset(), touches=None,
            pieces=None, piece=lambda n, q: asked.append((n, q)) or (), uplinks=None):
        pieces = {1: {2: (), 3: piece3}} if pieces is None else pieces
        protect(entries, parent, nodes, was or {}, was_parent or {}, set(at), set(),
                touches or (lambda *a: True), {1: {6: up}} if uplinks is None else uplinks,
                lambda n, par: (1, ()), pieces, piece, SwitchEntry, ("output", 0xFFFFFFF8), {})
        return entries

    got = run({1: SwitchEntry(1, (2, 3), (), ())}, {1: 6})
    assert got == {1: SwitchEntry(1, (2, 3), (0xFFFF0003,), tag_rejoin)} and type(got[1]) is SwitchEntry
    old = SwitchEntry(1, (2, 3), (0xFFFF0003,), ("kept",))
    kept = run({1: SwitchEntry(1, (2, 3), (), ())}, {1: 6}, was={1: old}, was_parent={1: 6})
    assert kept[1] is old  # (no detour of its is stale: the old entry as it was)
    again = run({1: SwitchEntry(1, (2, 3), (), ())}, {1: 6}, was={1: old}, was_parent={1: 6}, at={1})
    assert again[1] == got[1]  # (stale there: protected anew)
    moved = run({1: SwitchEntry(1, (2, 3), (), ())}, {1: 6}, was={1: old}, was_parent={1: 8})
    assert moved[1] == got[1]  # (another parent)
    assert run({1: SwitchEntry(1, (2, 4), (), ())}, {1: None})[1] == SwitchEntry(1, (2, 4), (), ())
    assert asked == [(1, 4)]  # (a port not asked about yet: the piece callback)
    for bad in (dict(entries=[]), dict(parent={}), dict(entries={1: (1, 2)}), dict(nodes=[5]),
                dict(piece=lambda n, q: "no piece", entries={1: SwitchEntry(1, (7,), (), ())}),
                dict(uplinks={1: {6: (1, 2, 3)}}), dict(pieces={1: "no dict"})):
        kwargs = {"entries": {1: SwitchEntry(1, (2, 3), (), ())}, "parent": {1: 6}} | bad
        with pytest.raises((TypeError, KeyError)):
            run(**kwargs)


@needs_c
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data())
def test_regrafting_in_c_is_the_pythons(topo, data):
    """``trees.regraft_c`` against ``regraft_py`` on every tree of random groups after a
    random link failure: the same tree (its parent map and entries in the same orders),
    the same changed switches in the same order, the same loads and pending links, or
    None from both (a receiver cut off)."""
    import copy

    ips = [h.ip for h in topo.hosts]
    assume(len(ips) >= 2 and topo.links)
    core = MulticastCore(TopologyView.from_topology(topo), protection=False)
    connected([core], topo)
    for i in range(data.draw(st.integers(1, 6), label="groups")):
        core.create_group(f"m{i}", *draw_group(data, ips))
    k = data.draw(st.sampled_from(sorted(topo.links, key=lambda k: (k.a, k.b, k.a_port))), label="link")
    core.view.remove_link(k.a, k.a_port, k.b, k.b_port)
    core.load.vector(core.cache)  # (so that the links are noted as pending)
    for g in core.groups.values():
        if g.tree is None:
            continue
        loads = [copy.deepcopy(core.load) for _ in range(2)]
        got = [f(core.view, g.tree, g.receivers, load, core.cache)
               for f, load in zip((trees.regraft_c, trees.regraft_py), loads)]
        assert (got[0] is None) == (got[1] is None)
        assert loads[0].into == loads[1].into
        assert [(d, s) for d, _, s in loads[0].pending] == [(d, s) for d, _, s in loads[1].pending]
        if got[0] is None:
            continue
        (a, changed_a), (b, changed_b) = got
        assert list(a.parent.items()) == list(b.parent.items())
        assert list(a.entries.items()) == list(b.entries.items())
        assert all(type(e) is SwitchEntry for e in a.entries.values())
        assert list(changed_a) == list(changed_b)
    with pytest.raises(TypeError):
        native.module.regraft({}, {}, [], {}, {}, {}, {}, 1, SwitchEntry)
    # switch 2's parent link (from 1) is no longer a shortest-path link: it goes via 3
    args = [{1: None, 2: 1}, {1: SwitchEntry(1, (2,), (), ())}, frozenset({(2, 5)}), {1: [], 2: [3], 3: [1]},
            {1: 0, 3: 1, 2: 2}, {}, {1: {3: 4}, 3: {1: 6, 2: 7}, 2: {3: 8}}, 1, SwitchEntry]
    parent, entries, changed, taken, walked, pruned = native.module.regraft(*args)
    assert parent == {1: None, 2: 3, 3: 1} and taken == {2: 1} and walked == {2: 3, 3: 1} and not pruned
    assert entries == {1: (1, (4,), (), ()), 2: (8, (5,), (), ()), 3: (6, (7,), (), ())} and changed == {1, 2, 3}
    assert args[5] == {2: {1: -1, 3: 1}, 3: {1: 1}}  # (the loads: counted in ``into``)
    args[5], args[6] = {}, {1: {3: 4}, 2: {3: 8}}
    with pytest.raises(KeyError):  # (switch 3's ports are unknown)
        native.module.regraft(*args)


@needs_c
@settings(max_examples=200, deadline=None)
@given(tags=st.lists(st.one_of(
    st.binary(min_size=6, max_size=6).map(lambda b: b.hex(":")),
    st.binary(min_size=6, max_size=6).map(lambda b: b.hex(":").upper()),
    st.text(alphabet="0123456789abcdefABCDEF: xg", min_size=15, max_size=19)), min_size=1, max_size=6))
def test_tag_tlvs_made_in_c_are_the_pythons(tags):
    """A rejoin's tag TLV (eth_dst) is read off the tag in C for a tag of the form
    aa:bb:cc:dd:ee:ff (Python's bytes, never asked of Python); any other string is
    asked of Python (which refuses what is no MAC address) or taken from the tags dict
    Python keeps them in."""
    asked: list = []
    kept: dict = {}

    def make(link_tag: str) -> bytes:  # (as ofmsgs.tag_tlv: kept too)
        asked.append(link_tag)
        tlv = kept[link_tag] = ofmsgs._tag_oxm(link_tag)
        return tlv

    def strict(t: str) -> bool:
        return len(t) == 17 and all(t[i] == ":" for i in (2, 5, 8, 11, 14)) and all(
            c in "0123456789abcdefABCDEF" for c in t.replace(":", "")) and t.count(":") == 5

    def refused(t: str) -> bool:
        try:
            ofmsgs._tag_oxm(t)
        except ValueError:
            return True
        return False

    entries = {d: SwitchEntry(1, (2,), (), (3, t, TO_OWN_GROUP)) for d, t in enumerate(tags, 1)}
    out: list = []
    try:
        native.module.tree_adds(5, b"h", b"t", list(entries), entries, out, kept, make,
                                ofmsgs.rejoin_flow(5, "10.0.0.1", "232.1.0.5"), ofmsgs.ReadyGroupMod,
                                ofmsgs.ReadyFlowMod)
    except ValueError:  # (Python's refusal of a tag that is no MAC address)
        assert refused(asked[-1]) and not strict(asked[-1])
        return
    rejoins = out[2::3]  # (each switch: its group, its (S,G) flow, its rejoin flow)
    assert len(rejoins) == len(tags)
    for (d, t), (at, msg) in zip(enumerate(tags, 1), rejoins):
        assert at == d and msg._wire == ofmsgs.detour_flow(d, ofmsgs.cookie(5), 3, t, TO_OWN_GROUP, "10.0.0.1",
                                                           "232.1.0.5")._wire
        assert (t in asked) == (not strict(t))
    assert len(asked) == len(set(asked))  # (a tag Python made once is taken from the dict)
    assert ofmsgs._OXM_ETH_DST == bytes.fromhex("80000606")  # (the header C writes)


@needs_c
def test_a_new_trees_bookkeeping_in_c_is_the_pythons():
    """``_fastplan.live_of`` / ``note_placed`` (``MulticastCore._place_c``): only live
    switches (known to ``installed`` and connected) get messages and beliefs, in the
    search's order; counts go up by one; bad input raises."""
    from collections import defaultdict

    from controller.core import Group

    g = Group(9, "m", "10.0.0.1", "232.1.0.9", 5000, "spt", {"10.0.0.2"})
    want = {d: SwitchEntry(1, (d + 1,), (), ()) for d in (1, 2, 3, 4)}
    got = []
    for place in (MulticastCore._place_c, MulticastCore._place_py):
        core = MulticastCore(TopologyView())
        core.view.switches = {1, 2, 4}
        core.installed = {1: {}, 3: {}, 4: {5: want[4]}}
        core.changes = defaultdict(int, {4: 7})
        build: list = []
        assert place(core, g, [4, 3, 2, 1], want, build) is True
        got.append(([(d, m._wire) for d, m in build], core.installed, dict(core.changes), core.placed[9]))
        assert place(core, g, [2, 3], want, []) is False
    assert got[0] == got[1]
    assert got[0][1] == {1: {9: want[1]}, 3: {}, 4: {5: want[4], 9: want[4]}} and got[0][2] == {4: 8, 1: 1}
    assert [d for d, _ in got[0][0]] == [4, 4, 1, 1] and list(got[0][3]) == [4, 1]
    live_of, note = native.module.live_of, native.module.note_placed
    for bad in ((1, {}, set()), ([1], [], set()), ([1], {}, {})):
        with pytest.raises(TypeError):
            live_of(*bad)
    ch = defaultdict(int)
    for bad, err in (((9, [1], want, {1: []}, ch), TypeError), ((9, [7], want, {7: {}}, ch), KeyError),
                     ((9, [1], want, {}, ch), KeyError), ((9, (1,), want, {1: {}}, ch), TypeError),
                     ((9, [1], want, {1: {}}, {}), KeyError)):  # (a plain dict's missing count)
        with pytest.raises(err):
            note(*bad)


@needs_c
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_rejoin_flows_packed_in_c_are_the_pythons(data):
    """A group's rejoin flows after the first are packed in C from the one Python made
    (``_fastplan.rejoin_pair``): drawn kept action lists (outputs, OFPP_IN_PORT, FF
    groups, the group's own, large port numbers, forms C leaves to Python) give the
    bytes ``ofmsgs._rejoin_flow`` gives, in a new tree (``tree_adds``) and in a changed
    switch (``diff_switches``); a first pair of another layout leaves every one to
    Python."""
    from collections import defaultdict

    from controller.core import Group

    action = st.one_of(
        st.tuples(st.just("output"), st.one_of(st.integers(1, 70), st.just(ofp.OFPP_IN_PORT),
                                               st.just(0xFFFFFFFF))),
        st.tuples(st.just("group"), st.one_of(st.just(OWN_GROUP), st.integers(0xFFFF0000, 0xFFFF8040))),
        st.just(("set_field", "eth_dst", "02:00:00:00:00:07")),  # (not packed in C)
        st.just(("output", 1 << 33)))  # (too large for C: Python raises)
    lists = st.one_of(st.just(TO_OWN_GROUP), st.lists(action, min_size=1, max_size=5).map(tuple))
    gid, source, address = data.draw(st.integers(1, 5000)), "10.0.0.1", "232.1.0.7"
    entries = {d: SwitchEntry(1, (2,), (), (3, f"02:00:00:00:00:{d:02x}", data.draw(lists)))
               for d in range(1, data.draw(st.integers(1, 8)) + 1)}

    def made(build):
        out: list = []
        try:
            build(out)
        except (OverflowError, struct_error):
            return "refused"
        return [(d, type(m).__name__, m._wire) for d, m in out]

    import struct
    struct_error = struct.error
    dpids = list(entries)
    mine = made(lambda out: ofmsgs.tree_adds_c(gid, source, address, dpids, entries, out))
    assert mine == made(lambda out: ofmsgs.tree_adds_py(gid, source, address, dpids, entries, out))
    # Python is asked for the first list C packs, and then only for those it does not
    asked: list = []
    make = ofmsgs.rejoin_flow(gid, source, address)

    def counting(acts: tuple) -> tuple[bytes, bytes]:
        asked.append(acts)
        return make(acts)

    def packed(acts: tuple) -> bool:
        return all(a[0] in ("output", "group") and 0 <= (gid if a == ("group", OWN_GROUP) else a[1]) < 1 << 32
                   for a in acts)

    assert mine == made(lambda out: native.module.tree_adds(
        gid, *ofmsgs._sg_flow(gid, source, address), dpids, entries, out, ofmsgs.TAGS, ofmsgs.tag_tlv, counting,
        ofmsgs.ReadyGroupMod, ofmsgs.ReadyFlowMod))
    assert sum(map(packed, asked)) <= 1
    # another layout first: Python's bytes for every list, as given
    other = made(lambda out: native.module.tree_adds(
        gid, *ofmsgs._sg_flow(gid, source, address), dpids, entries, out, ofmsgs.TAGS, ofmsgs.tag_tlv,
        lambda acts: (b"h" * 9, b"t" * len(acts)), ofmsgs.ReadyGroupMod, ofmsgs.ReadyFlowMod))
    if other != "refused":
        assert [w for d, k, w in other if len(w) < 40] == [
            b"h" * 9 + entries[d].rejoin[0].to_bytes(4, "big") + ofmsgs.tag_tlv(entries[d].rejoin[1])
            + b"t" * len(entries[d].rejoin[2]) for d in dpids]
    # a changed switch's messages (the same entries, each switch's rejoin new)
    g = Group(gid, "m", source, address, 5000, "spt", {"10.0.0.2"})
    outs = []
    for diff in (MulticastCore._diff_switches_c, MulticastCore._diff_switches_py):
        core = MulticastCore(TopologyView())
        have = {d: SwitchEntry(1, (2,), (), ()) for d in dpids}
        core.installed = {d: {gid: have[d]} for d in dpids}
        core.changes = defaultdict(int)
        phases: list[list] = [[], [], [], []]
        try:
            diff(core, g, list(dpids), dict(have), entries, dict.fromkeys(have), *phases)
        except (OverflowError, struct_error):
            outs.append("refused")
            continue
        outs.append([[(d, type(m).__name__, m._wire) for d, m in p] for p in phases])
    assert outs[0] == outs[1]


@needs_c
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_switchs_messages_packed_in_c_are_the_pythons(data):
    """``_fastplan.diff_switches`` (``MulticastCore._diff_switches_c``) against
    ``_diff_switches_py`` for drawn believed and wanted entries of one group: new, gone,
    grown, shrunk, moved and turned-around switches, FF groups, rejoins, an unknown
    believed ingress, None believed, switches with more ports than the C arrays: the same
    messages in every phase in the same order, and the same beliefs and counts after."""
    from collections import defaultdict

    from controller.core import UNKNOWN_PORT, Group

    ports = st.integers(1, 6)
    many = st.just(tuple(range(1, 71)))  # (more than the C side's arrays: handed to Python)

    def entry():
        out = data.draw(st.one_of(st.lists(ports, unique=True, max_size=4).map(lambda p: tuple(sorted(p))), many))
        ff = tuple(sorted({0xFFFF0000 | (data.draw(st.booleans()) << 15) | p
                           for p in (data.draw(st.lists(st.sampled_from(out), max_size=3)) if out else ())}))
        rejoin = data.draw(st.sampled_from([(), (2, "02:00:00:00:00:01", TO_OWN_GROUP),
                                            (3, "02:00:00:00:00:01", TO_OWN_GROUP),
                                            (3, "02:00:00:00:00:01", (("output", 4), ("group", 0xFFFF0002)))]))
        in_port = data.draw(st.one_of(ports, st.just(UNKNOWN_PORT))) if out else data.draw(ports)
        return SwitchEntry(in_port, out, ff, rejoin)

    dpids = list(range(1, data.draw(st.integers(1, 6)) + 1))
    have = {d: entry() if data.draw(st.booleans()) else None for d in dpids if data.draw(st.booleans())}
    want = {d: e for d in dpids if data.draw(st.booleans()) for e in [entry()] if e.in_port != UNKNOWN_PORT}
    changed = [d for d in dpids if have.get(d) != want.get(d) and (d in have or d in want)]
    g = Group(7, "m", "10.0.0.1", "232.1.0.7", 5000, "spt", {"10.0.0.2"})
    outs = []
    for diff in (MulticastCore._diff_switches_c, MulticastCore._diff_switches_py):
        core = MulticastCore(TopologyView())
        core.installed = {d: ({g.gid: have[d]} if d in have else {}) for d in dpids}
        core.changes = defaultdict(int)
        placed = dict.fromkeys(have)
        phases: list[list] = [[], [], [], []]
        diff(core, g, list(changed), dict(have), want, placed, *phases)
        outs.append(([[(d, type(m).__name__, m._wire) for d, m in p] for p in phases], core.installed, placed,
                     dict(core.changes)))
    assert outs[0] == outs[1]
    args = [7, [1], {}, {1: SwitchEntry(1, (2,), (), ())}, {1: {}}, {}, defaultdict(int), [], [], [], [],
            ofmsgs.diff_parts(7, "10.0.0.1", "232.1.0.7"), lambda acts: (b"h", b"t"), ofmsgs.TAGS, ofmsgs.tag_tlv,
            lambda *a: None, ofmsgs.ReadyFlowMod, ofmsgs.ReadyGroupMod, UNKNOWN_PORT]
    for i, bad in ((1, (1,)), (3, {1: (1, 2)}), (4, {}), (11, (b"x",)), (16, object), (0, -3), (13, []),
                   (3, {1: SwitchEntry(1, (2,), (), (1,))})):
        wrong = list(args)
        wrong[i] = bad
        with pytest.raises((TypeError, KeyError, ValueError, OverflowError)):
            native.module.diff_switches(*wrong)


@needs_c
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_recounting_ff_users_in_c_is_the_pythons(data):
    """``_fastplan.recount`` (``MulticastCore._recount_c``) against ``_recount_py`` for
    drawn entries before and after, with FF groups a rejoin lists too (one used twice):
    the same counts and the same calls for the FF groups and links, in the same order,
    as counting every entry down and up would leave."""
    from collections import defaultdict

    ids = st.sampled_from([0xFFFF0001, 0xFFFF0002, 0xFFFF8002, 0xFFFF0003])

    def entry():
        ff = tuple(data.draw(st.lists(ids, max_size=3, unique=True)))
        rejoin = data.draw(st.sampled_from([(), (2, "t", TO_OWN_GROUP), (2, "t", (("output", 4),)),
                                            (3, "t", (("group", 0xFFFF0001), ("output", 0xFFFFFFF8),
                                                      ("group", 0xFFFF0003)))]))
        return SwitchEntry(1, (), ff, rejoin)

    switches = st.sampled_from([1, 2, 3])
    was = {n: entry() for n in data.draw(st.lists(switches, unique=True), label="was")}
    now = {n: (was[n] if n in was and data.draw(st.booleans()) else entry())
           for n in data.draw(st.lists(switches, unique=True), label="now")}
    start = {n: {f: data.draw(st.integers(0, 2)) for f in (0xFFFF0001, 0xFFFF0002, 0xFFFF8002, 0xFFFF0003)}
             for n in (1, 2, 3)}
    seen = []
    for recount in (MulticastCore._recount_c, MulticastCore._recount_py):
        core = MulticastCore(TopologyView(), protection=True)
        core.ff_refs = defaultdict(dict, {n: {f: c for f, c in refs.items() if c} for n, refs in start.items()})
        calls: list = []
        core._want_ff = lambda n, f, calls=calls: calls.append(("want", n, f))
        core._guard = lambda key, on, calls=calls: calls.append(("guard", key, on))
        recount(core, dict(was), dict(now))
        down_up = MulticastCore(TopologyView(), protection=True)  # (all of was down, all of now up)
        down_up.ff_refs = defaultdict(dict, {n: {f: c for f, c in refs.items() if c} for n, refs in start.items()})
        down_up._want_ff = down_up._guard = lambda *a: None
        down_up._count(was, -1)
        down_up._count(now, 1)
        assert {n: r for n, r in core.ff_refs.items() if r} == {n: r for n, r in down_up.ff_refs.items() if r}
        seen.append((dict(core.ff_refs), calls))
    assert seen[0] == seen[1]
    for bad in (([], {}), ({1: (1, 2)}, {1: SwitchEntry(1, (), (), ())}), ({1: SwitchEntry(1, (), [5], ())}, {})):
        with pytest.raises(TypeError):
            native.module.recount(*bad, defaultdict(dict), lambda *a: None, lambda *a: None, TO_OWN_GROUP)


@needs_c
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_which_switches_changed_in_c_is_the_pythons(data):
    """``_fastplan.changed_of`` (``MulticastCore._changed_c``) against ``_changed_py``:
    for a drawn tree, beliefs and asked switches, the same switches deepest first (ties in
    dpid order) and the same beliefs; a parent map with a cycle or a belief missing raises."""
    n = data.draw(st.integers(1, 8))
    parent = {1: None}
    for d in range(2, n + 1):
        parent[d] = data.draw(st.integers(1, d - 1))
    e = st.sampled_from([SwitchEntry(1, (2,), (), ()), SwitchEntry(2, (3,), (), ())])
    want = {d: data.draw(e) for d in parent if data.draw(st.booleans())}
    placed = dict.fromkeys(d for d in range(1, n + 3) if data.draw(st.booleans()))
    installed = {d: {7: data.draw(st.one_of(st.none(), e))} for d in placed}
    dpids = set(data.draw(st.lists(st.integers(1, n + 2), unique=True)))
    core = MulticastCore(TopologyView())
    core.installed = installed
    got = [f(core, 7, dpids, placed, want, p) for f in (MulticastCore._changed_c, MulticastCore._changed_py)
           for p in (parent, None)]
    assert got[0] == got[2] and got[1] == got[3]
    with pytest.raises(ValueError):
        native.module.changed_of({1, 2}, {}, {}, 7, {1: SwitchEntry(1, (2,), (), ()), 2: SwitchEntry(1, (2,), (), ())},
                                 {1: 2, 2: 1})
    with pytest.raises(KeyError):
        native.module.changed_of({1}, {1: None}, {1: {}}, 7, {}, None)
    with pytest.raises(TypeError):
        native.module.changed_of([1], {}, {}, 7, {}, None)


@needs_c
def test_reprotecting_in_c_keeps_unchanged_groups_out_and_refuses_bad_input():
    """``_fastplan.reprotect`` (``MulticastCore._reprotect_c``): a group whose entries come
    out the same is not returned (and counts nothing); one whose entry gains an FF group is,
    and that group gains a user; what is not (gid, entries, parent, switches) raises."""
    from collections import defaultdict

    protect = native.module.reprotect
    piece3 = (5, 0xFFFF0003, 0xFFFF8003, 7, "02:00:00:00:00:03", (7, "02:00:00:00:00:03", TO_OWN_GROUP))
    pieces = {1: {2: (), 3: piece3}}
    calls: list = []
    ff_refs: defaultdict = defaultdict(dict)
    args = [frozenset(), lambda *a: True, {}, lambda n, par: (1, ()), pieces, lambda n, q: (), SwitchEntry,
            ("output", 0xFFFFFFF8), {}, ff_refs, lambda n, f: calls.append(("want", n, f)),
            lambda key, on: calls.append(("guard", key, on)), TO_OWN_GROUP]
    same = {1: SwitchEntry(1, (2, 3), (0xFFFF0003,), ())}
    gains = {1: SwitchEntry(1, (2, 3), (), ())}
    assert protect([(4, same, {1: None}, {1}), (5, gains, {1: None}, {1})], *args) == [5]
    assert gains[1] == same[1] and ff_refs[1] == {0xFFFF0003: 1}
    assert calls == [("guard", (1, 3), True)]  # (the link's first user: its guard wants both FF groups)
    for bad in ([(4, same, {1: None})], [(4, [], {1: None}, {1})], [(4, {1: SwitchEntry(1, (2,), (), ())}, {}, {1})],
                [(4, same, {1: None}, {9})]):
        with pytest.raises((TypeError, KeyError)):
            protect(bad, *args)



_u32 = st.integers(0, 0xFFFFFFFF)
_mac = st.binary(min_size=6, max_size=6).map(lambda b: b.hex(":"))
_output = st.tuples(st.just("output"), _u32)
_ff_pair = st.tuples(st.tuples(_u32, st.tuples(_output)),
                     st.tuples(_u32, st.tuples(st.tuples(st.just("set_field"), st.just("eth_dst"),
                                                         st.one_of(_mac, _mac.map(str.upper))), _output)))
_shared_key_want = st.one_of(
    st.tuples(st.tuples(st.just("transit"), _u32, _mac), st.tuples(_output)),
    st.tuples(st.tuples(st.just("ff"), _u32), _ff_pair),
    # shapes the templates do not cover: Python's builders make them
    st.tuples(st.tuples(st.just("rejoin"), st.integers(1, 0xFFFF), _mac), st.just((("output", 7), ("output", 8)))),
    st.tuples(st.tuples(st.just("ff"), _u32), st.tuples(st.tuples(_u32, st.tuples(_output)))),
)
_SHARED_FF = ((5, (("output", 5),)), (6, (("set_field", "eth_dst", "02:00:00:00:00:01"), ("output", 6))))


@needs_c
@settings(max_examples=300, deadline=None)
@given(entries=st.lists(st.tuples(st.integers(1, 4), _shared_key_want,
                                  st.sampled_from(["add", "same", "change", "drop"])), max_size=12))
def test_shared_entries_are_the_same_messages_in_c_and_python(entries):
    """What switches must hold of the shared protection entries (FF groups, transit and
    rejoin flows) against what they hold: the same adds, modifies, deletes, bookkeeping
    and bytes from the C loop (its templates) as from Python's builders."""
    cores = [MulticastCore(TopologyView(), protection=True) for _ in range(2)]
    for core in cores:
        for dpid, (key, want), how in entries:
            if how != "add":
                core.shared.setdefault(dpid, {})[key] = want if how == "same" else (("output", 1),)
            if how != "drop":
                core.shared_want[dpid][key] = want
            core._dirty[dpid].add(key)
    plans = []
    for core, diff in zip(cores, (MulticastCore._diff_shared_c, MulticastCore._diff_shared_py)):
        plan = Plan()
        diff(core, dict(core._dirty), plan)
        plans.append([[(d, type(m).__name__, m._wire) for d, m in phase] for phase in plan.phases])
    assert plans[0] == plans[1]
    assert cores[0].shared == cores[1].shared and cores[0].changes == cores[1].changes


@needs_c
def test_the_shared_diff_in_c_refuses_bad_input():
    """Wrong types raise TypeError, an error of a builder it calls back comes through."""
    diff = native.module.diff_shared

    def args(**change):
        a = dict(items=[(1, {("ff", 5)})], want_of={1: {("ff", 5): _SHARED_FF}}, have_of={}, changes=defaultdict(int),
                 adds=[], removes=[], absent=C._ABSENT, make=C._shared_msg, parts=C._SHARED_PARTS,
                 flow=ofmsgs.ReadyFlowMod, group=ofmsgs.ReadyGroupMod)
        a.update(change)
        return a

    good = args()
    diff(*good.values())
    assert [(d, m._wire) for d, m in good["adds"]] == [(1, ofmsgs.ff_group(1, 5, _SHARED_FF)._wire)]
    assert good["changes"] == {1: 1} and good["have_of"] == {1: {("ff", 5): _SHARED_FF}}
    parts = C._SHARED_PARTS
    for bad in (dict(items=[1]), dict(want_of=[]), dict(want_of={1: "not a dict"}), dict(parts=()),
                dict(parts=(b"", (0, 0, 0)) + parts[2:]), dict(flow=object),
                dict(group=ofmsgs.ReadyGroupMod.__mro__[1])):
        with pytest.raises(TypeError):
            diff(*args(**bad).values())
    with pytest.raises(ZeroDivisionError):  # (make is asked for what the templates do not cover)
        diff(*args(want_of={1: {("ff", 5): _SHARED_FF[:1]}}, make=lambda *a: 1 / 0).values())
    with pytest.raises(TypeError):
        diff(1, 2)


def detours_state(d) -> tuple:
    """Everything a ``protect.Detours`` keeps (with the detours' types: C makes Detours)."""
    return (list(d._paths.items()), [type(v) for v in d._paths.values()], d._by_edge, d._none,
            list(d._around.items()), list(d._pair.items()), d._hint)


@needs_c
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_strategy, data=st.data())
def test_the_detours_found_in_c_and_python_are_the_same(topo, data):
    """``Detours._miss_c`` against ``_miss_py``: every link end asked for (in a drawn
    order, some twice), then links failed and restored with ``stale()`` between (so a
    replaced detour follows its hint), also ends of links that are gone: the same
    detours, cache and index in both, in the same insertion orders."""
    from controller import protect

    class InPy(protect.Detours):
        _miss = protect.Detours._miss_py

    class InC(protect.Detours):
        _miss = protect.Detours._miss_c

    views = [TopologyView.from_topology(topo) for _ in range(2)]
    both = [InC(views[0]), InPy(views[1])]
    ends = [(k.a, k.a_port) for k in topo.links] + [(k.b, k.b_port) for k in topo.links]
    assume(ends)
    for step in range(data.draw(st.integers(1, 5), label="steps")):
        asked = data.draw(st.lists(st.sampled_from(ends), max_size=3 * len(ends)), label="asked")
        got = [[d.get(*e) for e in asked] for d in both]
        assert got[0] == got[1] and [type(x) for x in got[0]] == [type(x) for x in got[1]]
        assert detours_state(both[0]) == detours_state(both[1])
        link = data.draw(st.sampled_from(topo.links), label="link")
        for v in views:
            key = LinkKey.make(link.a, link.a_port, link.b, link.b_port)
            if key in v.links:
                v.remove_link(link.a, link.a_port, link.b, link.b_port)
            else:
                v.add_link(link.a, link.a_port, link.b, link.b_port)
        assert both[0].stale() == both[1].stale()
    assert detours_state(both[0]) == detours_state(both[1])


@needs_c
def test_the_detour_miss_in_c_refuses_bad_input():
    from controller import protect

    view = TopologyView.from_topology(T.ring(4))
    d = protect.Detours(view)
    miss = native.module.detour_miss
    with pytest.raises(TypeError):
        miss(d, 1, 1, ())
    with pytest.raises(TypeError):
        miss(d, 1, 1, (protect.MAX_PORT, protect.MAX_TAG_DPID, "not a type"))
    d._around = []  # (not the dict a Detours holds)
    end = next(iter(view.port_link))
    with pytest.raises(TypeError):
        miss(d, *end, protect._MISS_PARTS)
    assert miss(protect.Detours(view), 99, 1, protect._MISS_PARTS) is None  # (no such link end)


@needs_c
def test_the_guard_in_c_refuses_bad_input():
    """Wrong parts, a key that is no (dpid, port) pair, a negative FF id, a core whose
    bookkeeping is not what a core holds: errors, not crashes."""
    topo = T.leaf_spine(2, 2, 1)
    core = MulticastCore(TopologyView.from_topology(topo))
    guard, want_ff = native.module.guard, native.module.want_ff
    key = next(iter(core.view.port_link))
    with pytest.raises(TypeError):
        guard(core, key, True, ())
    for bad in ([key[0], key[1]], (key[0],), "ab"):
        with pytest.raises(TypeError):
            guard(core, bad, True, C._GUARD_PARTS)
    with pytest.raises(OverflowError):
        want_ff(core, key[0], -1, C._GUARD_PARTS)
    guard(core, key, True, C._GUARD_PARTS)  # (the real thing, then the Python one undoes it)
    assert key in core.guards
    MulticastCore._guard_py(core, key, False)
    assert key not in core.guards and not any(core.shared_want.values())
    core.guards = []
    with pytest.raises(TypeError):
        guard(core, key, True, C._GUARD_PARTS)
