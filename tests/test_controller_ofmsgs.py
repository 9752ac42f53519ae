"""The message builders stamp copies of template messages instead of calling ryu's
constructors (for speed): each must serialise to exactly the bytes the constructor gives."""

from __future__ import annotations

import pytest
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller import ofmsgs


def wire(msg: object) -> bytes:
    msg.set_xid(7)
    msg.serialize()
    return bytes(msg.buf)


def reference_buckets(in_port: int, outs: list[int]) -> list:
    return [parser.OFPBucket(actions=[parser.OFPActionOutput(
        ofp.OFPP_IN_PORT if p == in_port else p, 0)]) for p in sorted(outs)]


@pytest.mark.parametrize("cmd,build", [
    (ofp.OFPGC_ADD, ofmsgs.group_add), (ofp.OFPGC_MODIFY, ofmsgs.group_modify)])
def test_group_mods_serialise_like_ryus_constructor(cmd: int, build) -> None:
    dp = ofmsgs.datapath(9)
    ref = parser.OFPGroupMod(dp, cmd, ofp.OFPGT_ALL, 42, reference_buckets(3, [5, 3, 1]))
    assert wire(build(9, 42, 3, [5, 3, 1])) == wire(ref)
    ref = parser.OFPGroupMod(dp, ofp.OFPGC_DELETE, ofp.OFPGT_ALL, 42, [])
    assert wire(ofmsgs.group_delete(9, 42)) == wire(ref)


def test_flow_add_serialises_like_ryus_constructor_and_copies_share_nothing_mutable() -> None:
    dp = ofmsgs.datapath(9)
    ref = parser.OFPFlowMod(
        dp, cookie=ofmsgs.cookie(42), table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD,
        priority=ofmsgs.PRIO_SG, flags=ofp.OFPFF_SEND_FLOW_REM,
        match=parser.OFPMatch(in_port=4, eth_type=0x0800, ipv4_src="10.0.0.1",
                              ipv4_dst="232.1.2.3"),
        instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                                   [parser.OFPActionGroup(42)])])
    a = ofmsgs.flow_add(9, 42, 4, "10.0.0.1", "232.1.2.3")
    b = ofmsgs.flow_add(9, 43, 5, "10.0.0.2", "232.1.2.4")
    assert wire(a) == wire(ref)
    assert a.buf is not b.buf and a.match is not b.match and a.xid != b.xid
    assert dict(b.match.items()) == {"in_port": 5, "eth_type": 0x0800,
                                     "ipv4_src": "10.0.0.2", "ipv4_dst": "232.1.2.4"}
    assert a.datapath.id == 9 and b.cookie == ofmsgs.cookie(43)


def test_protection_messages_serialise_like_ryus_constructor() -> None:
    """FF groups, ALL groups chained to them, transit and rejoin flows, and the
    normalised actions the reconnect reads back are the ones that were sent."""
    from controller.reconnect import normalise_actions
    dp = ofmsgs.datapath(9)
    tag = "02:00:00:09:00:03"
    spec = ((3, (("output", 3),)), (2, (("set_field", "eth_dst", tag), ("output", ofp.OFPP_IN_PORT))))
    ref = parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_FF, 0xFFFF8003, [
        parser.OFPBucket(watch_port=3, actions=[parser.OFPActionOutput(3, 0)]),
        parser.OFPBucket(watch_port=2, actions=[parser.OFPActionSetField(eth_dst=tag),
                                                parser.OFPActionOutput(ofp.OFPP_IN_PORT, 0)])])
    assert wire(ofmsgs.ff_group(9, 0xFFFF8003, spec)) == wire(ref)
    ref = parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_ALL, 42, [
        parser.OFPBucket(actions=[parser.OFPActionOutput(1, 0)]),
        parser.OFPBucket(actions=[parser.OFPActionGroup(0xFFFF0003)])])
    assert wire(ofmsgs.group_add(9, 42, 4, (1, 3), (0xFFFF0003,))) == wire(ref)
    acts = (("set_field", "eth_dst", "01:00:5e:01:02:03"), ("group", 42))
    for source, group, match in [
            (None, None, dict(in_port=2, eth_dst=tag, eth_type=0x0800, ipv4_dst=("232.0.0.0", "255.0.0.0"))),
            ("10.0.0.1", "232.1.2.3", dict(in_port=2, eth_dst=tag, eth_type=0x0800,
                                           ipv4_src="10.0.0.1", ipv4_dst="232.1.2.3"))]:
        ref = parser.OFPFlowMod(
            dp, cookie=ofmsgs.cookie(42), table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD,
            priority=ofmsgs.PRIO_DETOUR, flags=ofp.OFPFF_SEND_FLOW_REM, match=parser.OFPMatch(**match),
            instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, ofmsgs.actions(acts))])
        msg = ofmsgs.detour_flow(9, ofmsgs.cookie(42), 2, tag, acts, source, group)
        assert wire(msg) == wire(ref)
        parsed = parser.OFPFlowMod.parser(dp, ofp.OFP_VERSION, ofp.OFPT_FLOW_MOD, len(msg.buf), 7, msg.buf)
        assert normalise_actions(parsed.instructions[0].actions) == acts
        assert dict(parsed.match.items()) == match
