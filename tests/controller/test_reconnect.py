"""The switch (re)connect state machine (controller.reconnect): requests, multipart
replies, ports reported down, and the plan it produces."""

from __future__ import annotations

import itertools

import pytest
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

import topologies as T
from controller import ofmsgs
from controller.core import MulticastCore, Plan, SwitchState
from controller.reconnect import Reconnect, normalise_actions, port_is_down, port_status
from controller.topoview import TopologyView
from lab.fakeof import FakeFabric
from tests.support.controller_env import core_and_fabric

TOPO = T.leaf_spine(2, 3, 2)  # spines 1, 2; leaves 3, 4, 5; hosts h1 h2 @3, h3 h4 @4, h5 h6 @5


def installed_fabric() -> tuple[MulticastCore, FakeFabric]:
    """Two groups installed on the fabric (switches holding their base flows and source
    table, as connected ones do), then one switch damaged."""
    core = MulticastCore(TopologyView.from_topology(TOPO))
    fabric = FakeFabric(TOPO)
    for dpid in TOPO.switches:
        assert not fabric.apply_all((dpid, m) for m in Reconnect(core).features(dpid))
        assert not fabric.apply_all(core.switch_enter(dpid))
    ips = [h.ip for h in TOPO.hosts]
    for i, src in enumerate(ips[:2]):
        assert not fabric.apply_all(core.create_group(f"m{i}", src, ips[2:])[1])
    leaf = TOPO.host(ips[0]).dpid
    g = core.groups[1]
    assert not fabric.apply_all([(leaf, ofmsgs.group_modify(leaf, 1, 3, frozenset({99}))),
                                 (leaf, ofmsgs.flow_add(leaf, 1, 77, g.source, g.address))])
    return core, fabric


def restored(core: MulticastCore) -> MulticastCore:
    fresh = MulticastCore()
    assert fresh.restore(core.to_dict()) == []
    return fresh


def replies(fabric: FakeFabric, dpid: int, session: Reconnect) -> list:
    return [r for req in session.start(dpid) for r in fabric.request(dpid, req)]


def old_app_plan(core: MulticastCore, dpid: int, parts: list, ports: list) -> tuple[SwitchState, Plan]:
    """The pre-refactor ``ModelcastApp._flow_stats/_group_stats/_stats_part_done``, kept
    here as the oracle the state machine must agree with."""
    flows, groups = [], {}
    for msg in parts:
        if isinstance(msg, parser.OFPFlowStatsReply):
            flows += [(f.cookie, f.priority, dict(f.match.items()),
                       normalise_actions(f.instructions[0].actions)
                       if f.priority in (ofmsgs.PRIO_DETOUR, ofmsgs.PRIO_REJOIN, ofmsgs.PRIO_SG) else ())
                      for f in msg.body]
        else:
            for g in msg.body:
                groups[g.group_id] = (g.type, [(b.watch_port, normalise_actions(b.actions))
                                               for b in g.buckets])
    present = SwitchState.from_tables(flows, groups, core.groups)
    plan = Plan()
    for port in ports:
        if port.port_no < ofp.OFPP_MAX and (port.state & ofp.OFPPS_LINK_DOWN
                                            or port.config & ofp.OFPPC_PORT_DOWN):
            plan.extend(core.port_down(dpid, port.port_no))
    return present, plan.extend(core.switch_enter(dpid, present))


def as_text(plan: Plan) -> list[list[tuple[int, str]]]:
    return [[(d, str(m)) for d, m in phase] for phase in plan.phases]


def test_start_asks_for_our_flows_in_every_table_and_every_group():
    flows, groups = Reconnect(MulticastCore()).start(7)
    assert isinstance(flows, parser.OFPFlowStatsRequest) and flows.datapath.id == 7
    assert (flows.table_id, flows.out_port, flows.out_group) == (ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY)
    assert (flows.cookie, flows.cookie_mask) == (ofmsgs.COOKIE_TAG, ofmsgs.COOKIE_MASK)
    assert isinstance(groups, parser.OFPGroupDescStatsRequest) and groups.datapath.id == 7


def test_the_plan_equals_what_the_app_computed_before():
    core, fabric = installed_fabric()
    fabric.set_link(1, 3, False)  # leaf 3 reports its port to spine 1 down
    old, new = restored(core), restored(core)
    session = Reconnect(new)
    for dpid in sorted(TOPO.switches):
        parts = replies(fabric, dpid, session)
        ports = list(fabric.ports(dpid).values())
        present, plan = old_app_plan(old, dpid, parts, ports)
        results = [session.on_reply(dpid, r, ports) for r in parts]
        assert all(r is None for r in results[:-1])
        done = results[-1]
        assert done.dpid == dpid and done.present == present
        assert as_text(done.plan) == as_text(plan) and done.plan.groups == plan.groups
        assert not fabric.apply_all(done.plan)
    assert new.installed == old.installed and new.view.ports_down == old.view.ports_down
    k = next(k for k in TOPO.links if {k.a, k.b} == {1, 3})
    assert new.view.ports_down == {(k.a, k.a_port), (k.b, k.b_port)}  # both ends reported it


def test_multipart_replies_complete_only_when_both_last_parts_arrive_in_any_order():
    core, fabric = installed_fabric()
    leaf = 3
    fabric.switches[leaf].reply_part_size = 1
    results = []
    for order in ("flows first", "groups first", "interleaved"):
        session = Reconnect(restored(core))
        parts = replies(fabric, leaf, session)
        more = [bool(p.flags & ofp.OFPMPF_REPLY_MORE) for p in parts]
        assert more.count(False) == 2 and len(parts) > 4  # one last part per request
        if order == "groups first":
            parts.sort(key=lambda p: isinstance(p, parser.OFPFlowStatsReply))
        elif order == "interleaved":
            f = [p for p in parts if isinstance(p, parser.OFPFlowStatsReply)]
            g = [p for p in parts if not isinstance(p, parser.OFPFlowStatsReply)]
            parts = [p for pair in itertools.zip_longest(f, g) for p in pair if p is not None]
        outs = [session.on_reply(leaf, p) for p in parts]
        assert all(o is None for o in outs[:-1]) and outs[-1] is not None
        results.append((outs[-1].present, as_text(outs[-1].plan)))
    assert results[0] == results[1] == results[2]
    present = results[0][0]
    assert set(present.groups) == {1, 2} and (1, 77) in present.flows


def test_ports_reported_down_become_port_down_and_reserved_ports_are_ignored():
    core = MulticastCore(TopologyView.from_topology(TOPO))
    session = Reconnect(core)
    down = parser.OFPPort(5, "02:00:00:00:00:05", b"p5", 0, ofp.OFPPS_LINK_DOWN, 0, 0, 0, 0, 0, 0)
    admin = down._replace(port_no=6, state=0, config=ofp.OFPPC_PORT_DOWN)
    up = down._replace(port_no=1, state=ofp.OFPPS_LIVE)
    local = down._replace(port_no=ofp.OFPP_LOCAL)
    session.start(3)
    for reply in (parser.OFPFlowStatsReply(ofmsgs.datapath(3), body=[], flags=0),
                  parser.OFPGroupDescStatsReply(ofmsgs.datapath(3), body=[], flags=0)):
        done = session.on_reply(3, reply, [down, admin, up, local])
    assert done is not None and done.present == SwitchState()
    assert core.view.ports_down == {(3, 5), (3, 6)}
    assert 3 in core.installed


def test_replies_without_a_read_in_progress_are_ignored_and_start_restarts():
    core, fabric = installed_fabric()
    session = Reconnect(restored(core))
    parts = replies(fabric, 3, session)
    session.forget(3)
    assert [session.on_reply(3, p) for p in parts] == [None] * len(parts)
    assert session.on_reply(4, parts[-1]) is None  # never started
    first = replies(fabric, 3, session)
    session.on_reply(3, first[0])
    again = replies(fabric, 3, session)  # reconnected mid-read: the read starts over
    outs = [session.on_reply(3, p) for p in again]
    assert outs[-1] is not None and all(o is None for o in outs[:-1])
    session.start(3)
    with pytest.raises(TypeError):
        session.on_reply(3, parser.OFPPortDescStatsReply(ofmsgs.datapath(3), body=[], flags=0))


def test_features_are_the_base_flows_and_the_known_source_table():
    """A switch the view knows nothing about gets its punt meter and the base flows
    only; one with known links and hosts also gets their source-table entries, so a
    restarted controller's hosts and links keep passing table 0 without being punted
    again."""
    topo = T.linear(3)
    core, _ = core_and_fabric(topo)
    unknown = Reconnect(core, punt_rate=300, punt_port_rate=30).features(9)
    assert [str(m) for m in unknown] == [str(m) for m in ofmsgs.punt_meter(9, 300, port_rate=30)
                                         + ofmsgs.base_flows(9, True)]
    assert [m.meter_id for m in unknown[:6]] == [ofmsgs.PUNT_METER] * 2 + [ofmsgs.LLDP_METER] * 2 + [
        ofmsgs.QUARANTINE_METER] * 2
    assert [m.bands[0].rate for m in unknown[:6]] == [300] * 4 + [30] * 2
    no_quarantine = Reconnect(core, punt_rate=300, punt_port_rate=0).features(9)
    assert ofmsgs.QUARANTINE_METER not in {getattr(m, "meter_id", None) for m in no_quarantine}
    assert [str(m) for m in Reconnect(core, punt_rate=0).features(9)] == [str(m) for m in ofmsgs.base_flows(9)]
    h2 = topo.host("h2")
    base = len(ofmsgs.punt_meter(2, 500, port_rate=100) + ofmsgs.base_flows(2, True))
    extra = Reconnect(core, host_idle_s=60).features(2)[base:]
    assert {(m.priority, m.match.get("in_port"), m.match.get("eth_src"), m.idle_timeout)
            for m in extra} == {(ofmsgs.PRIO_LINK_PORT, core.view.link_port(2, 1), None, 0),
                                (ofmsgs.PRIO_LINK_PORT, core.view.link_port(2, 3), None, 0),
                                (ofmsgs.PRIO_SOURCE, h2.port, h2.mac, 60)}


@pytest.mark.parametrize("reason,state,config,port,expect", [
    (ofp.OFPPR_MODIFY, ofp.OFPPS_LINK_DOWN, 0, 1, True),
    (ofp.OFPPR_MODIFY, 0, ofp.OFPPC_PORT_DOWN, 1, True),
    (ofp.OFPPR_DELETE, ofp.OFPPS_LIVE, 0, 1, True),
    (ofp.OFPPR_ADD, ofp.OFPPS_LIVE, 0, 1, False),
    (ofp.OFPPR_MODIFY, 0, 0, 2, False),
    (ofp.OFPPR_MODIFY, ofp.OFPPS_LINK_DOWN, 0, ofp.OFPP_LOCAL, None),
])
def test_port_status(reason, state, config, port, expect):
    desc = parser.OFPPort(port, "02:00:00:00:00:01", b"p", config, state, 0, 0, 0, 0, 0, 0)
    assert port_status(reason, desc) is expect
    assert port_is_down(desc) == bool(state & ofp.OFPPS_LINK_DOWN or config & ofp.OFPPC_PORT_DOWN)


def test_a_turn_group_is_ours_only_for_a_group_of_ours():
    """A switch read back holds a turn group of one of our groups (a move cut short: an
    (S,G) flow of ours points at it) and another application's group whose id has the
    same bit set: the first is reported to be deleted, its flow not counted as an
    ingress (the diff rewrites it); the second is left alone."""
    gid = 5
    mine, theirs = ofmsgs.turn_id(gid), ofmsgs.turn_id(0x1234)
    flows = [(ofmsgs.cookie(gid), ofmsgs.PRIO_SG, {"in_port": 2}, (("group", mine),)),
             (ofmsgs.cookie(gid), ofmsgs.PRIO_SG, {"in_port": 1}, (("group", gid),))]
    all_group = (ofp.OFPGT_ALL, [(ofp.OFPP_ANY, (("output", 3),))])
    state = SwitchState.from_tables(flows, {gid: all_group, mine: all_group, theirs: all_group}, [gid])
    assert state.turns == {mine}
    assert state.flows == {(gid, 1)} and state.groups[gid] is not None


def test_every_frame_to_the_controller_passes_the_punt_meter():
    """Each base flow that punts (IGMP, unknown sources, unknown destinations) goes
    through meter PUNT_METER at the configured rate, bursts of twice that, and link
    discovery frames through their own LLDP_METER; the drop of unknown SSM traffic
    punts nothing and is not metered. The quarantine meter is there, at its own rate,
    for the ports that will need it (``controller.punt``)."""
    core = MulticastCore(TopologyView.from_topology(TOPO))
    fabric = FakeFabric(TOPO)
    assert not fabric.apply_all((3, m) for m in Reconnect(core, punt_rate=250, punt_port_rate=40).features(3))
    sw = fabric.switches[3]
    band = (ofp.OFPMF_PKTPS | ofp.OFPMF_BURST, ((ofp.OFPMBT_DROP, 250, 500),))
    assert sw.meters == {ofmsgs.PUNT_METER: band, ofmsgs.LLDP_METER: band,
                         ofmsgs.QUARANTINE_METER: (band[0], ((ofp.OFPMBT_DROP, 40, 80),))}
    punting = [e for e in sw.flows if any(k == "apply" and ("output", ofp.OFPP_CONTROLLER) in p
                                          for k, p in e.instructions)]
    assert sorted(e.instructions[0] for e in punting) == [("meter", ofmsgs.PUNT_METER)] * 3 + [
        ("meter", ofmsgs.LLDP_METER)]
    assert [e.match for e in punting if e.instructions[0] == ("meter", ofmsgs.LLDP_METER)] == [
        {"eth_type": 0x88CC, "eth_dst": "01:80:c2:00:00:0e"}]
    assert not any(k == "meter" for e in sw.flows if e not in punting for k, _ in e.instructions)


def test_a_switch_that_kept_its_meter_reconnects_without_a_real_error_and_a_new_rate_applies():
    """A controller restarted (with another rate) adds the meter again: the switch answers
    METER_EXISTS, which ``benign_error`` names (the app ignores it), and the modify that
    follows sets the new rate; nothing is left to repair."""
    core = MulticastCore(TopologyView.from_topology(TOPO))
    fabric = FakeFabric(TOPO)
    assert not fabric.apply_all((3, m) for m in Reconnect(core, punt_rate=500).features(3))
    errors = fabric.apply_all((3, m) for m in Reconnect(core, punt_rate=100).features(3))
    assert [(e.type, e.code, e.meter_id) for e in errors] == [
        (ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_METER_EXISTS, m) for m in ofmsgs.METERS]
    assert all(ofmsgs.benign_error(e.type, e.code, e.meter_id) for e in errors)
    assert fabric.switches[3].meters[ofmsgs.PUNT_METER][1] == ((ofp.OFPMBT_DROP, 100, 200),)
    assert not ofmsgs.benign_error(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_METER_EXISTS, 7)
    assert not ofmsgs.benign_error(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_UNKNOWN_METER, ofmsgs.PUNT_METER)
    msg = ofmsgs.punt_meter(3, 100)[0]
    msg.serialize()
    assert ofmsgs.meter_of_error(bytes(msg.buf)[:64]) == ofmsgs.PUNT_METER  # (an error quotes it)
    assert ofmsgs.meter_of_error(b"short") is None


def test_a_meter_deleted_by_hand_is_restored_with_its_flows_by_the_audit():
    """``ovs-ofctl del-meters``: the switch deletes the flows that used the meter too (OF1.3);
    the next audit finds the base flows missing and sends the meter back before them."""
    core = MulticastCore(TopologyView.from_topology(TOPO))
    fabric = FakeFabric(TOPO)
    session = Reconnect(core)
    assert not fabric.apply_all((3, m) for m in session.features(3))
    assert not fabric.apply_all(core.switch_enter(3))
    before = sorted(map(repr, fabric.switches[3].flows))
    assert not fabric.apply_all([(3, parser.OFPMeterMod(ofmsgs.datapath(3), command=ofp.OFPMC_DELETE,
                                                        meter_id=ofmsgs.PUNT_METER))])
    assert set(fabric.switches[3].meters) == {ofmsgs.LLDP_METER, ofmsgs.QUARANTINE_METER}
    assert len(fabric.switches[3].flows) == len(before) - 3
    done, errors = fabric.audit(3, session)
    assert done is not None and not errors, errors
    assert sorted(map(repr, fabric.switches[3].flows)) == before
    assert ofmsgs.PUNT_METER in fabric.switches[3].meters
