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
