"""The simulated fabric must itself be right before it can judge the controller: each test
here drives it with hand-built Ryu messages and asserts where copies end up."""

from __future__ import annotations

import types
from collections import Counter

import pytest
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

import topologies as t
from lab.fakeof import FakeFabric, FakeSwitch, OFError

DP = types.SimpleNamespace(ofproto=ofp, ofproto_parser=parser, id=0)
GROUP = "232.1.2.3"


# ---- message builders (what the controller would send)

def out(port: int) -> parser.OFPActionOutput:
    return parser.OFPActionOutput(port)


def to_group(gid: int) -> parser.OFPActionGroup:
    return parser.OFPActionGroup(gid)


def flow(actions, priority=100, cookie=0, table_id=0, command=ofp.OFPFC_ADD, flags=0,
         instructions=None, **match) -> parser.OFPFlowMod:
    if instructions is None:
        instructions = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
    return parser.OFPFlowMod(DP, cookie=cookie, table_id=table_id, command=command,
                             priority=priority, flags=flags, match=parser.OFPMatch(**match),
                             instructions=instructions)


def mcast(actions, dst=GROUP, **kw) -> parser.OFPFlowMod:
    return flow(actions, eth_type=0x0800, ipv4_dst=dst, **kw)


def delete(cookie=0, cookie_mask=0, table_id=ofp.OFPTT_ALL, strict=False, priority=0,
           out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, **match) -> parser.OFPFlowMod:
    return parser.OFPFlowMod(DP, cookie=cookie, cookie_mask=cookie_mask, table_id=table_id,
                             command=ofp.OFPFC_DELETE_STRICT if strict else ofp.OFPFC_DELETE,
                             priority=priority, out_port=out_port, out_group=out_group,
                             match=parser.OFPMatch(**match))


def bucket(*actions, watch_port=ofp.OFPP_ANY) -> parser.OFPBucket:
    return parser.OFPBucket(watch_port=watch_port, actions=list(actions))


def group(gid, buckets, gtype=ofp.OFPGT_ALL, command=ofp.OFPGC_ADD) -> parser.OFPGroupMod:
    return parser.OFPGroupMod(DP, command=command, type_=gtype, group_id=gid, buckets=buckets)


def group_delete(gid) -> parser.OFPGroupMod:
    return parser.OFPGroupMod(DP, command=ofp.OFPGC_DELETE, group_id=gid)


# ---- topology helpers: ports are looked up, never hard-coded

def port(topo: t.Topology, a: int, b: int) -> int:
    """Port on switch ``a`` that leads to switch ``b``."""
    for link in topo.links:
        if (link.a, link.b) == (a, b):
            return link.a_port
        if (link.b, link.a) == (a, b):
            return link.b_port
    raise KeyError((a, b))


def hport(topo: t.Topology, name: str) -> int:
    return topo.host(name).port


def ip(topo: t.Topology, name: str) -> str:
    return topo.host(name).ip


@pytest.fixture
def linear3():
    topo = t.linear(3)  # s1 - s2 - s3, host hN on sN
    return topo, FakeFabric(topo)


def install_linear_chain(topo, fab) -> None:
    """h1 -> s1 -> s2 -> (h2, s3) -> h3 for GROUP."""
    fab.apply(1, mcast([out(port(topo, 1, 2))]))
    fab.apply(2, group(1, [bucket(out(hport(topo, "h2"))), bucket(out(port(topo, 2, 3)))]))
    fab.apply(2, mcast([to_group(1)]))
    fab.apply(3, mcast([out(hport(topo, "h3"))]))


# ---- replication

def test_all_group_delivers_one_copy_to_each_receiver_on_linear(linear3):
    topo, fab = linear3
    install_linear_chain(topo, fab)
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter({ip(topo, "h2"): 1, ip(topo, "h3"): 1}), tr.log
    assert tr.link_copies == Counter({(1, 2): 1, (2, 3): 1})
    assert not tr.loops and tr.dropped_at == []


def test_all_group_on_leaf_spine_reaches_every_leaf_host_exactly_once():
    topo = t.leaf_spine(2, 2, 2)  # spine1=1 spine2=2 leaf1=3 (h1,h2) leaf2=4 (h3,h4)
    fab = FakeFabric(topo)
    leaf1, leaf2, spine1 = topo.switch_dpid("leaf1"), topo.switch_dpid("leaf2"), 1
    fab.apply_all([
        (leaf1, group(10, [bucket(out(hport(topo, "h2"))),
                           bucket(out(port(topo, leaf1, spine1)))])),
        (leaf1, mcast([to_group(10)], in_port=hport(topo, "h1"))),
        (spine1, mcast([out(port(topo, spine1, leaf2))])),
        (leaf2, group(10, [bucket(out(hport(topo, "h3"))), bucket(out(hport(topo, "h4")))])),
        (leaf2, mcast([to_group(10)])),
    ])
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter({ip(topo, n): 1 for n in ("h2", "h3", "h4")}), tr.log
    assert tr.link_copies == Counter({(leaf1, spine1): 1, (spine1, leaf2): 1})
    assert not tr.loops


def test_duplicate_outputs_are_counted_not_merged(linear3):
    topo, fab = linear3
    fab.apply(1, group(1, [bucket(out(port(topo, 1, 2))), bucket(out(port(topo, 1, 2)))]))
    fab.apply(1, mcast([to_group(1)]))
    fab.apply(2, mcast([out(hport(topo, "h2"))]))
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter({ip(topo, "h2"): 2})
    assert tr.link_copies[(1, 2)] == 2


def test_flood_excludes_ingress_and_controller_is_not_delivery(linear3):
    topo, fab = linear3
    fab.apply(1, mcast([out(ofp.OFPP_FLOOD), out(ofp.OFPP_CONTROLLER)]))
    fab.apply(2, mcast([out(hport(topo, "h2"))]))
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter({ip(topo, "h2"): 1})  # h1 (ingress) gets nothing
    assert tr.to_controller == Counter({1: 1})


# ---- lookup

@pytest.mark.parametrize("high_first", [True, False])
def test_highest_priority_wins_whatever_the_install_order(linear3, high_first):
    topo, fab = linear3
    high = mcast([out(port(topo, 1, 2))], priority=200)
    low = flow([out(ofp.OFPP_CONTROLLER)], priority=100, eth_type=0x0800)
    for msg in ([high, low] if high_first else [low, high]):
        fab.apply(1, msg)
    fab.apply(2, mcast([out(hport(topo, "h2"))]))
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter({ip(topo, "h2"): 1}) and not tr.to_controller
    fab.apply(1, delete(strict=True, priority=200, eth_type=0x0800, ipv4_dst=GROUP))
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter() and tr.to_controller == Counter({1: 1})


def test_equal_priority_overlap_first_installed_wins(linear3):
    topo, fab = linear3
    fab.apply(1, flow([out(ofp.OFPP_CONTROLLER)], eth_type=0x0800))
    fab.apply(1, mcast([out(port(topo, 1, 2))]))
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.to_controller == Counter({1: 1}) and not tr.link_copies


def test_masked_ipv4_match_and_table_miss(linear3):
    topo, fab = linear3
    fab.apply(1, mcast([out(ofp.OFPP_CONTROLLER)], dst=("232.0.0.0", "255.0.0.0")))
    assert fab.trace(ip(topo, "h1"), "232.9.9.9").to_controller == Counter({1: 1})
    tr = fab.trace(ip(topo, "h1"), "239.1.1.1")
    assert tr.to_controller == Counter() and tr.dropped_at == [1]


def test_goto_table_and_write_actions(linear3):
    topo, fab = linear3
    fab.apply(1, flow(None, instructions=[parser.OFPInstructionGotoTable(1)], eth_type=0x0800))
    fab.apply(1, mcast(None, table_id=1, instructions=[
        parser.OFPInstructionActions(ofp.OFPIT_WRITE_ACTIONS, [out(port(topo, 1, 2))])]))
    fab.apply(2, mcast([out(hport(topo, "h2"))]))
    assert fab.trace(ip(topo, "h1"), GROUP).delivered == Counter({ip(topo, "h2"): 1})
    with pytest.raises(OFError) as err:  # goto must move forward
        fab.apply(1, flow(None, table_id=1, instructions=[parser.OFPInstructionGotoTable(1)]))
    assert (err.value.type, err.value.code) == (ofp.OFPET_BAD_INSTRUCTION, ofp.OFPBIC_BAD_TABLE_ID)


# ---- fast failover

def ring_ff(topo, fab, gtype=ofp.OFPGT_FF) -> None:
    """On ring(4): s1 reaches s3 via s2 (primary) or s4 (backup); s3 delivers to h3."""
    fab.apply(1, group(5, [bucket(out(port(topo, 1, 2)), watch_port=port(topo, 1, 2)),
                           bucket(out(port(topo, 1, 4)), watch_port=port(topo, 1, 4))], gtype))
    fab.apply(1, mcast([to_group(5)]))
    fab.apply(2, mcast([out(port(topo, 2, 3))]))
    fab.apply(4, mcast([out(port(topo, 4, 3))]))
    fab.apply(3, mcast([out(hport(topo, "h3"))]))


@pytest.mark.parametrize("gtype", [ofp.OFPGT_FF, ofp.OFPGT_SELECT])
def test_fast_failover_takes_first_live_bucket_only(gtype):
    topo = t.ring(4)
    fab = FakeFabric(topo)
    ring_ff(topo, fab, gtype)
    h1, h3 = ip(topo, "h1"), ip(topo, "h3")
    tr = fab.trace(h1, GROUP)
    assert tr.delivered == Counter({h3: 1}), "an FF group must not replicate like ALL"
    assert tr.link_copies == Counter({(1, 2): 1, (2, 3): 1})
    fab.set_link(1, 2, False)
    tr = fab.trace(h1, GROUP)
    assert tr.delivered == Counter({h3: 1}), tr.log
    assert tr.link_copies == Counter({(1, 4): 1, (4, 3): 1})
    fab.set_link(1, 2, True)
    assert fab.trace(h1, GROUP).link_copies == Counter({(1, 2): 1, (2, 3): 1})


def test_fast_failover_follows_a_down_neighbour_and_drops_with_no_live_bucket():
    topo = t.ring(4)
    fab = FakeFabric(topo)
    ring_ff(topo, fab)
    fab.set_switch(2, False)
    assert fab.trace(ip(topo, "h1"), GROUP).link_copies == Counter({(1, 4): 1, (4, 3): 1})
    fab.set_link(1, 4, False)
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter() and tr.link_copies == Counter()


def test_all_group_is_not_failover():
    """Contrast for the FF test: the same buckets as ALL send both ways."""
    topo = t.ring(4)
    fab = FakeFabric(topo)
    ring_ff(topo, fab, ofp.OFPGT_ALL)
    assert fab.trace(ip(topo, "h1"), GROUP).delivered == Counter({ip(topo, "h3"): 2})


# ---- group-mod errors and deletion

def test_group_add_twice_is_group_exists_and_keeps_the_first(linear3):
    topo, fab = linear3
    fab.apply(1, group(1, [bucket(out(2))]))
    with pytest.raises(OFError) as err:
        fab.apply(1, group(1, [bucket(out(1))]))
    assert (err.value.type, err.value.code) == (ofp.OFPET_GROUP_MOD_FAILED,
                                                ofp.OFPGMFC_GROUP_EXISTS)
    assert err.value.dpid == 1 and "GROUP_EXISTS" in str(err.value)
    assert fab.switches[1].groups[1].buckets[0].actions == (("output", 2),)


def test_group_modify_missing_errors_and_existing_replaces(linear3):
    topo, fab = linear3
    with pytest.raises(OFError) as err:
        fab.apply(1, group(7, [bucket(out(2))], command=ofp.OFPGC_MODIFY))
    assert (err.value.type, err.value.code) == (ofp.OFPET_GROUP_MOD_FAILED,
                                                ofp.OFPGMFC_UNKNOWN_GROUP)
    assert fab.switches[1].groups == {}
    fab.apply(1, group(7, [bucket(out(2))]))
    fab.apply(1, group(7, [bucket(out(1))], gtype=ofp.OFPGT_INDIRECT, command=ofp.OFPGC_MODIFY))
    gtype, buckets = fab.switches[1].groups[7]
    assert gtype == ofp.OFPGT_INDIRECT and buckets[0].actions == (("output", 1),)


def test_group_delete_removes_referring_flows_only(linear3):
    topo, fab = linear3
    sw = fab.switches[2]
    fab.apply(2, group(1, [bucket(out(3))]))
    fab.apply(2, group(2, [bucket(out(2))]))
    fab.apply(2, mcast([to_group(1)]))
    fab.apply(2, mcast([to_group(2)], dst="232.0.0.2"))
    fab.apply(2, mcast([out(3)], dst="232.0.0.3"))
    fab.apply(2, group_delete(1))
    assert set(sw.groups) == {2}
    assert sorted(f.match["ipv4_dst"] for f in sw.flows) == ["232.0.0.2", "232.0.0.3"]
    fab.apply(2, group_delete(99))  # missing: no-op, no error
    fab.apply(2, group_delete(ofp.OFPG_ALL))
    assert sw.groups == {} and [f.match["ipv4_dst"] for f in sw.flows] == ["232.0.0.3"]


def test_flow_to_missing_group_and_bad_prereq_are_refused_atomically(linear3):
    topo, fab = linear3
    with pytest.raises(OFError) as err:
        fab.apply(1, mcast([to_group(3)]))
    assert (err.value.type, err.value.code) == (ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_GROUP)
    with pytest.raises(OFError) as err:
        fab.apply(1, flow([out(2)], ipv4_dst=GROUP))  # no eth_type
    assert (err.value.type, err.value.code) == (ofp.OFPET_BAD_MATCH, ofp.OFPBMC_BAD_PREREQ)
    assert fab.switches[1].flows == []


def test_apply_all_collects_errors_and_continues(linear3):
    topo, fab = linear3
    errors = fab.apply_all([(1, group(1, [bucket(out(2))])), (1, group(1, [bucket(out(2))])),
                            (1, mcast([to_group(1)])), (2, group(1, [], command=ofp.OFPGC_MODIFY))])
    assert [(e.dpid, e.code) for e in errors] == [(1, ofp.OFPGMFC_GROUP_EXISTS),
                                                  (2, ofp.OFPGMFC_UNKNOWN_GROUP)]
    assert len(fab.switches[1].flows) == 1


def test_unmodelled_message_is_a_type_error_and_barrier_is_ignored():
    sw = FakeSwitch(1)
    sw.apply(parser.OFPBarrierRequest(DP))
    with pytest.raises(TypeError, match="OFPPortMod"):
        sw.apply(parser.OFPPortMod(DP, port_no=1, hw_addr="00:00:00:00:00:01"))
    assert sw.snapshot() == FakeSwitch(1).snapshot()


# ---- traversal rules

def test_flow_loop_is_reported_and_terminates():
    topo = t.ring(4)
    fab = FakeFabric(topo)
    for d in topo.switches:  # everyone forwards clockwise: the packet circles forever
        fab.apply(d, mcast([out(port(topo, d, d % 4 + 1))]))
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.loops and any("loop at s2" in line for line in tr.log)
    # s1 forwards once more (new in_port, from s4); s2 then sees a repeat and stops it
    assert tr.link_copies == Counter({(1, 2): 2, (2, 3): 1, (3, 4): 1, (4, 1): 1})


def test_broadcast_storm_is_reported_as_loop():
    topo = t.ring(4)
    fab = FakeFabric(topo)
    for d in topo.switches:
        fab.apply(d, mcast([out(ofp.OFPP_FLOOD)]))
    tr = fab.trace(ip(topo, "h1"), GROUP, max_hops=8)
    assert tr.loops and sum(tr.delivered.values()) > 3


def test_output_to_in_port_is_dropped_unless_ofpp_in_port(linear3):
    topo, fab = linear3
    h1 = ip(topo, "h1")
    fab.apply(1, mcast([out(hport(topo, "h1"))]))
    tr = fab.trace(h1, GROUP)
    assert tr.delivered == Counter() and any("ingress" in line for line in tr.log)
    fab.apply(1, mcast([out(ofp.OFPP_IN_PORT)]))  # replaces: same match and priority
    assert fab.trace(h1, GROUP).delivered == Counter({h1: 1})


def test_resubmit_looks_up_as_another_port_and_move_copies_bits_as_ovs_does(linear3):
    """A detour's end as the controller builds it: the tag MAC gives way to the group's
    (01:00:5e + the address's low 23 bits), and the lookup again as if the copy came in on
    another port (h2's). As in OVS that port is the ingress for the lookup alone: the
    entry found still never outputs to the real ingress (nor does the output after the
    resubmit), h2 gets its copy, and the restored MAC stays (s3 matches on it). With the
    ingress set to h2's port first (OVS's set_field of in_port, as the controller's detour
    end does), the group's output back where the copy came in goes out, h2's does not."""
    topo, fab = linear3
    tag, mac = "02:00:00:00:00:01", "01:00:5e:01:02:03"
    p12, p21, p23 = port(topo, 1, 2), port(topo, 2, 1), port(topo, 2, 3)
    fab.apply_all([
        (1, mcast([parser.OFPActionSetField(eth_dst=tag), out(p12)], priority=200, in_port=hport(topo, "h1"))),
        (2, group(1, [bucket(out(p21)), bucket(out(hport(topo, "h2"))), bucket(out(p23))])),
        (2, mcast([to_group(1)], in_port=hport(topo, "h2"))),
        (2, flow([parser.OFPActionSetField(eth_dst="01:00:5e:00:00:00"),
                  parser.NXActionRegMove(src_field="ipv4_dst", dst_field="eth_dst", n_bits=23, src_ofs=0,
                                         dst_ofs=0),
                  parser.NXActionResubmitTable(in_port=hport(topo, "h2"), table_id=0), out(p21)],
                 priority=200, in_port=p21, eth_dst=tag, eth_type=0x0800, ipv4_dst=("232.0.0.0", "255.0.0.0"))),
        (3, mcast([out(hport(topo, "h3"))], eth_dst=mac)),
    ])
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter({ip(topo, "h2"): 1, ip(topo, "h3"): 1}), tr.log
    assert tr.link_copies == Counter({(1, 2): 1, (2, 3): 1})
    assert sum("ingress" in line for line in tr.log) == 2, tr.log  # (the group's and the one after)
    fab.apply(2, flow([parser.OFPActionSetField(eth_dst="01:00:5e:00:00:00"),
                       parser.NXActionRegMove(src_field="ipv4_dst", dst_field="eth_dst", n_bits=23, src_ofs=0,
                                              dst_ofs=0),
                       parser.NXActionRegLoad(ofs_nbits=15, dst="in_port_nxm", value=hport(topo, "h2")),
                       parser.NXActionResubmitTable(in_port=hport(topo, "h2"), table_id=0)],
                      priority=200, in_port=p21, eth_dst=tag, eth_type=0x0800,
                      ipv4_dst=("232.0.0.0", "255.0.0.0")))  # (same match and priority: replaced)
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter({ip(topo, "h3"): 1}), tr.log
    assert tr.link_copies == Counter({(1, 2): 1, (2, 1): 1, (2, 3): 1}), tr.log
    with pytest.raises(OFError) as err:  # (as OVS: a move of ipv4_dst needs eth_type IPv4)
        fab.switches[2].apply(flow([parser.NXActionRegMove(
            src_field="ipv4_dst", dst_field="eth_dst", n_bits=23, src_ofs=0, dst_ofs=0)], in_port=p21))
    assert err.value.code == ofp.OFPBAC_MATCH_INCONSISTENT
    with pytest.raises(OFError) as err:  # (as OVS: the ingress is set by Nicira's load only)
        fab.switches[2].apply(flow([parser.OFPActionSetField(in_port=3)], in_port=p21))
    assert err.value.code == ofp.OFPBAC_BAD_SET_ARGUMENT


def test_down_link_carries_nothing(linear3):
    topo, fab = linear3
    install_linear_chain(topo, fab)
    fab.set_link(2, 3, False)
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter({ip(topo, "h2"): 1})
    assert tr.link_copies == Counter({(1, 2): 1})
    with pytest.raises(KeyError):
        fab.set_link(1, 3, False)


def test_switch_down_forwards_nothing_and_comes_back_empty(linear3):
    topo, fab = linear3
    install_linear_chain(topo, fab)
    fab.set_switch(2, False)
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter() and tr.link_copies == Counter()
    fab.apply(2, mcast([out(3)]))  # the connection is gone: discarded
    assert fab.discarded == Counter({2: 1})
    fab.set_switch(2, True)
    assert fab.switches[2].flows == [] and fab.switches[2].groups == {}
    assert len(fab.switches[3].flows) == 1  # neighbours keep their tables
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter() and tr.dropped_at == [2] and tr.link_copies == {(1, 2): 1}


def test_a_down_ingress_switch_forwards_nothing(linear3):
    topo, fab = linear3
    install_linear_chain(topo, fab)
    fab.apply(1, mcast([out(port(topo, 1, 2)), out(ofp.OFPP_IN_PORT)]))
    assert fab.trace(ip(topo, "h1"), GROUP).delivered[ip(topo, "h1")] == 1
    fab.set_switch(1, False)  # tables still held until it reboots, but it is off
    tr = fab.trace(ip(topo, "h1"), GROUP)
    assert tr.delivered == Counter() and tr.link_copies == Counter()


def test_unicast_uses_host_mac_and_unused_port_drops(linear3):
    topo, fab = linear3
    fab.apply(1, flow([out(port(topo, 1, 2))], eth_dst=topo.host("h2").mac))
    fab.apply(2, flow([out(hport(topo, "h2")), out(42)], eth_type=0x0800,
                      ipv4_dst=ip(topo, "h2")))
    tr = fab.trace(ip(topo, "h1"), ip(topo, "h2"))
    assert tr.delivered == Counter({ip(topo, "h2"): 1})
    assert any("unused port 42" in line for line in tr.log)


# ---- flow deletion and modification

def test_delete_with_cookie_mask_removes_only_matching_cookies(linear3):
    topo, fab = linear3
    for cookie, dst in ((0x100, "232.0.0.1"), (0x1FF, "232.0.0.2"), (0x200, "232.0.0.3")):
        fab.apply(1, mcast([out(2)], dst=dst, cookie=cookie))
    fab.apply(1, delete(cookie=0x100, cookie_mask=0xFF00))
    kept = [(f.cookie, f.match["ipv4_dst"]) for f in fab.switches[1].flows]
    assert kept == [(0x200, "232.0.0.3")]


def test_delete_filters_by_match_out_port_and_ryu_defaults_delete_nothing(linear3):
    topo, fab = linear3
    sw = fab.switches[1]
    fab.apply(1, mcast([out(1)], dst="232.0.0.1"))
    fab.apply(1, mcast([out(2)], dst="232.0.0.2"))
    fab.apply(1, flow([out(2)], eth_type=0x0806))
    # Ryu's OFPFlowMod defaults out_port=out_group=0: a real switch filters on port 0.
    fab.apply(1, parser.OFPFlowMod(DP, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL))
    assert len(sw.flows) == 3
    fab.apply(1, delete(out_port=2, eth_type=0x0800))
    assert [f.match.get("ipv4_dst") for f in sw.flows] == ["232.0.0.1", None]
    fab.apply(1, delete())
    assert sw.flows == []


def test_modify_changes_instructions_keeps_cookie_and_never_adds(linear3):
    topo, fab = linear3
    sw = fab.switches[1]
    fab.apply(1, mcast([out(1)], command=ofp.OFPFC_MODIFY))
    assert sw.flows == []
    fab.apply(1, mcast([out(1)], cookie=7))
    fab.apply(1, flow([out(2)], command=ofp.OFPFC_MODIFY, eth_type=0x0800))
    assert sw.flows[0].cookie == 7
    assert sw.flows[0].instructions == (("apply", (("output", 2),)),)


def test_check_overlap_flag(linear3):
    topo, fab = linear3
    fab.apply(1, flow([out(2)], eth_type=0x0800))
    with pytest.raises(OFError) as err:
        fab.apply(1, mcast([out(1)], flags=ofp.OFPFF_CHECK_OVERLAP))
    assert err.value.code == ofp.OFPFMFC_OVERLAP
    fab.apply(1, mcast([out(1)], priority=5, flags=ofp.OFPFF_CHECK_OVERLAP))
    assert len(fab.switches[1].flows) == 2


# ---- idempotence

def test_same_batch_twice_gives_equal_snapshots(linear3):
    """Flow ADD with the same match+priority replaces (idempotent); group ADD twice is
    GROUP_EXISTS (not idempotent: a controller must MODIFY), but leaves state unchanged."""
    topo, fab = linear3
    batch = [(1, mcast([out(port(topo, 1, 2))])),
             (2, group(1, [bucket(out(hport(topo, "h2"))), bucket(out(port(topo, 2, 3)))])),
             (2, mcast([to_group(1)])),
             (3, mcast([out(hport(topo, "h3"))]))]
    assert fab.apply_all(batch) == []
    first = fab.snapshot()
    errors = fab.apply_all(batch)
    assert [(e.dpid, e.code) for e in errors] == [(2, ofp.OFPGMFC_GROUP_EXISTS)]
    assert fab.snapshot() == first
    assert sum(len(sw.flows) for sw in fab.switches.values()) == 3
    fab.apply(3, mcast([out(ofp.OFPP_CONTROLLER)]))  # a real change must show
    assert fab.snapshot() != first


def test_snapshot_ignores_install_order_but_not_cookies(linear3):
    topo, _ = linear3
    a, b = FakeFabric(topo), FakeFabric(topo)
    x, y = mcast([out(1)], dst="232.0.0.1"), mcast([out(2)], dst="232.0.0.2")
    a.apply_all([(1, x), (1, y)])
    b.apply_all([(1, y), (1, x)])
    assert a.snapshot() == b.snapshot()
    b.apply(1, mcast([out(1)], dst="232.0.0.1", cookie=9))
    assert a.snapshot() != b.snapshot()


# ---- multipart requests and port descriptions (what a reconnecting controller reads)

def flow_stats(cookie=0, cookie_mask=0, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
               **match) -> parser.OFPFlowStatsRequest:
    return parser.OFPFlowStatsRequest(DP, 0, ofp.OFPTT_ALL, out_port, out_group, cookie,
                                      cookie_mask, parser.OFPMatch(**match))


def test_flow_stats_honour_cookie_match_and_out_filters_and_come_in_parts(linear3):
    topo, fab = linear3
    sw = fab.switches[1]
    fab.apply(1, group(4, [bucket(out(2))]))
    for i in range(6):
        fab.apply(1, mcast([to_group(4)] if i % 2 else [out(2)], dst=f"232.0.0.{i}",
                           cookie=0x100 + i, in_port=1))
    fab.apply(1, flow([out(3)], cookie=0x900, eth_type=0x0806))
    sw.reply_part_size = 2
    parts = sw.request(flow_stats(cookie=0x100, cookie_mask=0xF00))
    assert [p.flags for p in parts] == [ofp.OFPMPF_REPLY_MORE] * 2 + [0]
    body = [f for p in parts for f in p.body]
    assert [f.cookie for f in body] == [0x100 + i for i in range(6)]
    assert body[1].match["ipv4_dst"] == "232.0.0.1" and body[1].match["in_port"] == 1
    assert body[1].instructions[0].actions[0].group_id == 4 and body[0].priority == 100
    only_group = [f for p in sw.request(flow_stats(out_group=4)) for f in p.body]
    assert [f.cookie for f in only_group] == [0x101, 0x103, 0x105]
    arp = [f for p in sw.request(flow_stats(eth_type=0x0806)) for f in p.body]
    assert [f.cookie for f in arp] == [0x900]
    assert [(p.flags, p.body) for p in sw.request(flow_stats(cookie=0xF, cookie_mask=0xF))] == [(0, [])]


def test_group_desc_describes_buckets_as_installed(linear3):
    topo, fab = linear3
    fab.apply(2, group(1, [bucket(out(1)), bucket(out(ofp.OFPP_IN_PORT))]))
    fab.apply(2, group(2, [bucket(out(3), watch_port=3)], gtype=ofp.OFPGT_FF))
    [reply] = fab.request(2, parser.OFPGroupDescStatsRequest(DP, 0))
    assert isinstance(reply, parser.OFPGroupDescStatsReply) and reply.flags == 0
    desc = {g.group_id: (g.type, [(b.watch_port, [a.port for a in b.actions]) for b in g.buckets])
            for g in reply.body}
    assert desc == {1: (ofp.OFPGT_ALL, [(ofp.OFPP_ANY, [1]), (ofp.OFPP_ANY, [ofp.OFPP_IN_PORT])]),
                    2: (ofp.OFPGT_FF, [(3, [3])])}
    with pytest.raises(TypeError, match="OFPPortDescStatsRequest"):
        fab.request(2, parser.OFPPortDescStatsRequest(DP, 0))


def test_ports_report_link_down_and_a_down_switch_answers_nothing(linear3):
    topo, fab = linear3
    to_s3 = port(topo, 2, 3)
    assert sorted(fab.ports(2)) == sorted([port(topo, 2, 1), to_s3, hport(topo, "h2")])
    assert all(p.state == 0 and p.port_no == n for n, p in fab.ports(2).items())
    fab.set_link(2, 3, False)
    assert fab.ports(2)[to_s3].state == ofp.OFPPS_LINK_DOWN
    assert fab.ports(2)[port(topo, 2, 1)].state == 0
    fab.set_switch(3, False)
    fab.set_link(2, 3, True)
    assert fab.ports(2)[to_s3].state == ofp.OFPPS_LINK_DOWN  # the peer is down
    assert fab.request(3, parser.OFPGroupDescStatsRequest(DP, 0)) == []
    assert fab.discarded == Counter({3: 1})


def test_idle_expiry_removes_only_timed_entries_and_reports_the_flagged_ones(linear3):
    _, fab = linear3
    sw = fab.switches[1]
    timed = parser.OFPFlowMod(DP, cookie=7, table_id=0, priority=10, idle_timeout=30,
                              flags=ofp.OFPFF_SEND_FLOW_REM, match=parser.OFPMatch(in_port=1),
                              instructions=[])
    quiet = parser.OFPFlowMod(DP, cookie=7, table_id=0, priority=10, idle_timeout=30,
                              match=parser.OFPMatch(in_port=2), instructions=[])
    for m in (timed, quiet, flow([out(2)], cookie=7, in_port=3), flow([out(1)], cookie=8, in_port=4)):
        fab.apply(1, m)
    assert sw.expire_idle(cookie=8) == []  # cookie 8 has no timed entry
    [reported] = sw.expire_idle(cookie=7)
    assert (reported.match, reported.idle_timeout, reported.cookie) == ({"in_port": 1}, 30, 7)
    assert sorted(f.match["in_port"] for f in sw.flows) == [3, 4]  # the untimed ones stay


def test_punted_copies_carry_their_headers_and_packet_outs_reach_host_ports(linear3):
    topo, fab = linear3
    h1, h2 = topo.host("h1"), topo.host("h2")
    fab.apply(1, flow([out(ofp.OFPP_CONTROLLER)], priority=0))
    tr = fab.trace(h1.ip, h2.ip, eth_type=0x0806, eth_dst="02:00:00:00:00:99")
    assert not tr.delivered and tr.to_controller == Counter({1: 1})
    [(dpid, pkt)] = tr.punted
    assert (dpid, pkt["in_port"], pkt["eth_src"], pkt["eth_dst"]) == (1, h1.port, h1.mac, "02:00:00:00:00:99")
    po = parser.OFPPacketOut(DP, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                             actions=[out(h1.port), out(99)], data=b"x")
    assert fab.packet_out_hosts(1, po) == [h1]  # unused port 99 reaches nobody
    fab.set_switch(1, False)
    assert fab.packet_out_hosts(1, po) == []
