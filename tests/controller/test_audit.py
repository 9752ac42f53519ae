"""Self-healing tables: the audit (a re-read of a connected switch through the reconnect
state machine) puts back exactly what was deleted or changed behind the controller's
back, and nothing else; an audit overtaken by a change is void; and a tree link that
flaps 20 times leaves no stale entry behind. All on the simulated fabric."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import topologies as T
from controller import ofmsgs
from controller.core import MulticastCore
from controller.reconnect import AuditClock, Reconnect, removal_is_drift
from lab.fakeof import FakeFabric
from tests.support.controller_env import assert_exact, core_and_fabric

TOPO = T.leaf_spine(2, 3, 2)  # spines 1, 2; leaves 3, 4, 5; hosts h1 h2 @3, h3 h4 @4, h5 h6 @5
IPS = [h.ip for h in TOPO.hosts]


def installed() -> tuple[MulticastCore, FakeFabric]:
    core, fabric = core_and_fabric(TOPO, pipeline=True)
    for i, src in enumerate(IPS[:3]):
        assert not fabric.apply_all(core.create_group(f"m{i}", src, [r for r in IPS if r != src][i:])[1])
    return core, fabric


def delivered(core: MulticastCore, fabric: FakeFabric) -> dict[int, dict[str, int]]:
    out = {}
    for g in core.groups.values():
        tr = fabric.trace(g.source, g.address)
        assert not tr.loops, tr.log
        out[g.gid] = dict(tr.delivered)
    return out


def audit_all(core: MulticastCore, fabric: FakeFabric) -> int:
    """Audit every switch; the number of messages that repaired something."""
    session, sent = Reconnect(core), 0
    for dpid in sorted(TOPO.switches):
        done, errors = fabric.audit(dpid, session)
        assert not errors and done is not None and done.audit and not done.void, errors
        sent += len(done.plan)
    return sent


def test_an_audit_of_an_untouched_fabric_sends_nothing():
    core, fabric = installed()
    assert audit_all(core, fabric) == 0


def test_deleted_and_changed_entries_are_put_back_exactly():
    core, fabric = installed()
    before, want = fabric.snapshot(), delivered(core, fabric)
    g = core.groups[1]
    leaf, spine = TOPO.host(g.source).dpid, next(iter(set(g.tree.parent) & {1, 2}))
    some_leaf = next(d for d in g.tree.entries if d not in (leaf, spine))
    # ovs-ofctl del-flows on the source's leaf: everything, base flows and source table too
    fabric.apply(leaf, ofmsgs.parser.OFPFlowMod(ofmsgs.datapath(leaf), command=ofmsgs.ofp.OFPFC_DELETE,
                                                table_id=ofmsgs.ofp.OFPTT_ALL,
                                                out_port=ofmsgs.ofp.OFPP_ANY, out_group=ofmsgs.ofp.OFPG_ANY))
    # ovs-ofctl del-groups on a spine (its (S,G) flows go with them)
    fabric.apply(spine, ofmsgs.parser.OFPGroupMod(ofmsgs.datapath(spine), ofmsgs.ofp.OFPGC_DELETE,
                                                  ofmsgs.ofp.OFPGT_ALL, ofmsgs.ofp.OFPG_ALL, []))
    # a hand-edited group elsewhere
    entry = core.installed[some_leaf][1]
    fabric.apply(some_leaf, ofmsgs.group_modify(some_leaf, 1, entry.in_port, [99]))
    assert delivered(core, fabric) != want
    assert audit_all(core, fabric) > 0
    assert delivered(core, fabric) == want
    # exactly what was there before, except the wiped leaf's host entries: the audit does
    # not restore those (they idle out by design); the hosts' next frames re-learn them
    assert _without_host_entries(fabric.snapshot()) == _without_host_entries(before)
    assert not [f for f in fabric.switches[leaf].flows if f.priority == ofmsgs.PRIO_SOURCE]
    assert audit_all(core, fabric) == 0  # and the repair itself is not drift


def test_the_per_group_rejoin_flows_of_an_older_controller_are_removed_by_one_audit():
    """Before a detour ended in one flow per link, each group had its own rejoin flow at
    each protected parent link's far end (in_port, tag and (S,G)): a switch still holding
    them after an upgrade loses them to the first audit, delivery stays, and what is left
    is exactly today's state."""
    from controller.protect import TO_OWN_GROUP, tag
    core, fabric = installed()
    want = delivered(core, fabric)
    old = 0
    for g in core.groups.values():
        for n, par in g.tree.parent.items():
            if par is None:
                continue
            port = core.view.nbr_ports[par][n]
            d = core.detours.get(par, port)
            if d is not None:
                assert not fabric.apply(n, ofmsgs.detour_flow(n, ofmsgs.cookie(g.gid), d.arrival, tag(par, port),
                                                              TO_OWN_GROUP, g.source, g.address))
                old += 1
    assert old > 3
    assert audit_all(core, fabric) >= old
    assert_exact(core, fabric)
    assert delivered(core, fabric) == want
    assert audit_all(core, fabric) == 0


def _without_host_entries(snapshot: tuple) -> tuple:
    switches, links = snapshot
    return tuple((d, up, (tuple(f for f in flows if f[1] != ofmsgs.PRIO_SOURCE), groups))
                 for d, up, (flows, groups) in switches), links


def test_an_audit_overtaken_by_a_change_is_void_and_the_next_one_finds_no_drift():
    core, fabric = installed()
    g = core.groups[3]
    joiner = next(h for h in TOPO.hosts if h.ip not in g.receivers and h.ip != g.source)

    def join_meanwhile() -> None:  # the switch answered, then a join changed it
        assert not fabric.apply_all(core.join(3, joiner.ip))

    done, errors = fabric.audit(joiner.dpid, Reconnect(core), between=join_meanwhile)
    assert done.void and not len(done.plan) and not errors
    assert delivered(core, fabric)[3][joiner.ip] == 1
    assert audit_all(core, fabric) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_deletion_of_our_entries_is_repaired_by_one_audit(data):
    core, fabric = installed()
    before, want = fabric.snapshot(), delivered(core, fabric)
    for dpid, sw in sorted(fabric.switches.items()):
        ours = [f for f in sw.flows if f.priority != ofmsgs.PRIO_SOURCE]  # not host entries
        doomed = data.draw(st.sets(st.sampled_from(range(len(ours)))), label=f"flows of {dpid}") if ours else set()
        sw.flows = [f for f in sw.flows if f not in [ours[i] for i in doomed]]
        gone = data.draw(st.sets(st.sampled_from(sorted(sw.groups))), label=f"groups of {dpid}") \
            if sw.groups else set()
        for gid in gone:
            fabric.apply(dpid, ofmsgs.group_delete(dpid, gid))
    audit_all(core, fabric)
    assert fabric.snapshot() == before and delivered(core, fabric) == want


def test_a_tree_link_flapping_20_times_leaves_no_stale_state():
    core, fabric = installed()
    g = core.groups[1]
    spine, leaf = next((p, c) for p, c in g.tree.links() if p in (1, 2))
    k = next(k for k in TOPO.links if {k.a, k.b} == {spine, leaf})
    for _ in range(20):
        for up in (False, True):
            fabric.set_link(k.a, k.b, up)
            for d, p in ((k.a, k.a_port), (k.b, k.b_port)):  # both ends report it
                plan = core.port_up(d, p) if up else core.port_down(d, p)
                assert not fabric.apply_all(plan)
            assert all(v == {r: 1 for r in core.groups[gid].receivers}
                       for gid, v in delivered(core, fabric).items())
    # converged: each switch holds exactly one entry per tree crossing it (the belief is
    # the trees, the audit finds the fabric equal to the belief, no extra (S,G) flow)
    for dpid in TOPO.switches:
        want = {gid: t.tree.entries[dpid] for gid, t in core.groups.items() if dpid in t.tree.entries}
        assert core.installed[dpid] == want
    assert_exact(core, fabric)  # and no FF group, transit or rejoin flow is left over
    assert audit_all(core, fabric) == 0


def test_the_audit_clock_waits_for_quiet_and_spreads_over_switches():
    clock = AuditClock(5.0)
    assert clock.due(0.0, [1, 2], busy=False) == []  # first audits one interval after connect
    assert clock.due(5.0, [1, 2], busy=True) == []  # plans in flight: not now
    assert clock.due(5.0, [1, 2], busy=False, reading=[2]) == [1]  # 2 is being read anyway
    assert clock.due(5.1, [1, 2], busy=False) == [2]
    assert clock.due(9.9, [1, 2], busy=False) == []
    assert clock.due(10.0, [1], busy=False) == [1]  # 2 left
    assert AuditClock(0).due(100.0, [1], busy=False) == []  # 0 disables
    clock.soon(1)  # it reported an entry of ours deleted: audit it at the next chance
    assert clock.due(10.5, [1], busy=True) == [] and clock.due(10.6, [1], busy=False) == [1]
    assert clock.due(11.0, [1], busy=False) == []


def test_an_expensive_audit_is_repeated_only_after_fifty_times_its_cost():
    """Reading a switch with thousands of entries costs the controller seconds (Ryu's
    parser): at most 2% of the time goes to auditing one switch, a cheap read still
    comes back every interval, and a reported deletion is still audited at once."""
    clock = AuditClock(5.0)
    clock.due(0.0, [1, 2], busy=False)
    assert clock.due(5.0, [1, 2], busy=False) == [1, 2]
    clock.finished(1, 5.01)  # 10 ms: a small table
    clock.finished(2, 7.0)  # 2 s: a big one
    assert clock.due(10.0, [1, 2], busy=False) == [1]
    assert clock.due(106.9, [1, 2], busy=False) == [1] and clock.due(107.0, [1, 2], busy=False) == [2]
    clock.soon(2)
    assert clock.due(107.1, [1, 2], busy=False) == [2]  # a deletion it reported: now
    clock.soon(2)  # reported again while that read was still running: still at once after it
    clock.finished(2, 109.1)
    assert clock.due(109.2, [2], busy=False) == [2]


def test_a_removal_report_is_drift_only_for_an_entry_still_intended():
    """Deleting thousands of groups makes switches report thousands of removals, some
    after our plan finished: those of a group (or a switch of its tree) that is gone are
    ours and must not each trigger a full re-read of the switch; a group's entry that is
    still intended, or a shared one, is drift."""
    core, fabric = installed()
    g = core.groups[1]
    on_tree = next(iter(g.tree.entries))
    off_tree = next(d for d in TOPO.switches if d not in g.tree.entries)
    assert removal_is_drift(core, on_tree, ofmsgs.cookie(1))
    assert not removal_is_drift(core, off_tree, ofmsgs.cookie(1))
    assert removal_is_drift(core, on_tree, ofmsgs.COOKIE_DETOUR)
    assert not fabric.apply_all(core.delete_group(1))
    assert not removal_is_drift(core, on_tree, ofmsgs.cookie(1))
    assert not removal_is_drift(core, on_tree, ofmsgs.cookie(9999))
