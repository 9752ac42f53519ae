"""OpenFlow 1.3 messages built without a live datapath (faucet's valve_of pattern), so the
code that decides what a switch holds runs unchanged in tests and in the Ryu app.

Every flow of ours carries a cookie with ``COOKIE_TAG`` in its top 16 bits and the group
id in the low bits: reconciliation and teardown find exactly our state by cookie/mask.
"""

from __future__ import annotations

import copy
import types
from functools import lru_cache
from typing import Any, Iterable

from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

COOKIE_TAG = 0x4D43 << 48  # "MC"
COOKIE_MASK = 0xFFFF << 48
COOKIE_UNICAST = COOKIE_TAG | (1 << 47)  # group ids stay below 2**32
FULL_MASK = (1 << 64) - 1
TABLE = 0
PRIO_SG = 1000  # (S,G) multicast forwarding
PRIO_IGMP = 800  # membership reports to the controller
PRIO_UNICAST = 500  # learned host-to-host paths (NACKs, repairs, REST)
PRIO_SSM_DROP = 100  # unknown (S,G) in 232/8: drop, never flood or punt
PRIO_MISS = 0  # learning: to the controller
SSM_NET = ("232.0.0.0", "255.0.0.0")
ETH_IPV4 = 0x0800
IPPROTO_IGMP = 2
Msg = Any  # a ryu.ofproto.ofproto_v1_3_parser message object


@lru_cache(maxsize=None)
def datapath(dpid: int) -> types.SimpleNamespace:
    """A stand-in for ryu's Datapath: message classes only read these attributes."""
    return types.SimpleNamespace(id=dpid, ofproto=ofp, ofproto_parser=parser)


def cookie(gid: int) -> int:
    return COOKIE_TAG | gid


_MATCH_TEMPLATE = parser.OFPMatch()


def sg_match(in_port: int, source: str, group: str) -> parser.OFPMatch:
    """The (S,G) match on the tree's ingress port.

    Built like ryu's own parser does (``_fields2`` in OXM order, user-format values), from a
    shallow copy of an empty match: the keyword constructor converts each address string
    and allocates legacy-API helpers, ~20x slower, which matters when a failure rebuilds
    thousands of flows. The shared legacy helpers are never mutated (we never use that API)."""
    m = copy.copy(_MATCH_TEMPLATE)
    m._fields2 = [("in_port", in_port), ("eth_type", ETH_IPV4), ("ipv4_src", source),
                  ("ipv4_dst", group)]
    return m


@lru_cache(maxsize=4096)
def _bucket(port: int) -> parser.OFPBucket:
    return parser.OFPBucket(actions=[parser.OFPActionOutput(port, 0)])


@lru_cache(maxsize=65536)
def _to_group(gid: int) -> list:
    return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionGroup(gid)])]


def buckets(in_port: int, out_ports: Iterable[int]) -> list[parser.OFPBucket]:
    """One bucket per output port; a receiver behind the ingress port itself needs
    OFPP_IN_PORT, because a switch never sends a packet back out where it came in."""
    return [_bucket(ofp.OFPP_IN_PORT if p == in_port else p) for p in sorted(out_ports)]


def group_add(dpid: int, gid: int, in_port: int, out_ports: Iterable[int]) -> Msg:
    return parser.OFPGroupMod(datapath(dpid), ofp.OFPGC_ADD, ofp.OFPGT_ALL, gid,
                              buckets(in_port, out_ports))


def group_modify(dpid: int, gid: int, in_port: int, out_ports: Iterable[int]) -> Msg:
    return parser.OFPGroupMod(datapath(dpid), ofp.OFPGC_MODIFY, ofp.OFPGT_ALL, gid,
                              buckets(in_port, out_ports))


def group_delete(dpid: int, gid: int) -> Msg:
    return parser.OFPGroupMod(datapath(dpid), ofp.OFPGC_DELETE, ofp.OFPGT_ALL, gid, [])


def flow_add(dpid: int, gid: int, in_port: int, source: str, group: str) -> Msg:
    return parser.OFPFlowMod(datapath(dpid), cookie=cookie(gid), table_id=TABLE,
                             command=ofp.OFPFC_ADD, priority=PRIO_SG,
                             match=sg_match(in_port, source, group), instructions=_to_group(gid))


def flow_delete(dpid: int, gid: int, in_port: int, source: str, group: str) -> Msg:
    return parser.OFPFlowMod(datapath(dpid), cookie=cookie(gid), cookie_mask=FULL_MASK,
                             table_id=TABLE, command=ofp.OFPFC_DELETE_STRICT,
                             priority=PRIO_SG, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                             match=sg_match(in_port, source, group))


def base_flows(dpid: int) -> list[Msg]:
    """Installed when a switch connects: IGMP to the controller, unknown SSM traffic
    dropped (multicast is never flooded), everything else to the controller for host
    learning and unicast forwarding. (Ryu's topology app adds its own LLDP flow.)"""
    dp = datapath(dpid)
    to_ctrl = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [
        parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])]

    def add(prio: int, match: parser.OFPMatch, inst: list) -> Msg:
        return parser.OFPFlowMod(dp, cookie=COOKIE_TAG, table_id=TABLE, command=ofp.OFPFC_ADD,
                                 priority=prio, match=match, instructions=inst)

    return [
        add(PRIO_IGMP, parser.OFPMatch(eth_type=ETH_IPV4, ip_proto=IPPROTO_IGMP), to_ctrl),
        add(PRIO_SSM_DROP, parser.OFPMatch(eth_type=ETH_IPV4, ipv4_dst=SSM_NET), []),
        add(PRIO_MISS, parser.OFPMatch(), to_ctrl),
    ]


def unicast_flow(dpid: int, eth_dst: str, out_port: int, idle_timeout: int = 120) -> Msg:
    return parser.OFPFlowMod(datapath(dpid), cookie=COOKIE_UNICAST, table_id=TABLE,
                             command=ofp.OFPFC_ADD, priority=PRIO_UNICAST, idle_timeout=idle_timeout,
                             match=parser.OFPMatch(eth_dst=eth_dst), instructions=[
                                 parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                                              [parser.OFPActionOutput(out_port, 0)])])


def unicast_flush(dpid: int) -> Msg:
    """Forget learned unicast paths (after a topology change they may cross a dead link)."""
    return parser.OFPFlowMod(datapath(dpid), cookie=COOKIE_UNICAST, cookie_mask=FULL_MASK,
                             table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY, match=parser.OFPMatch())


def barrier(dpid: int) -> Msg:
    return parser.OFPBarrierRequest(datapath(dpid))


def packet_out(dpid: int, in_port: int, out_ports: Iterable[int], data: bytes) -> Msg:
    """Send a frame the switch punted to us (unbuffered, so ``data`` is the whole frame)."""
    return parser.OFPPacketOut(datapath(dpid), buffer_id=ofp.OFP_NO_BUFFER, in_port=in_port,
                               actions=[parser.OFPActionOutput(p, 0) for p in out_ports],
                               data=data)


def flow_stats_request(dpid: int) -> Msg:
    """Every flow of ours (by cookie tag) in every table: what a reconnecting switch holds."""
    return parser.OFPFlowStatsRequest(datapath(dpid), 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY,
                                      COOKIE_TAG, COOKIE_MASK, parser.OFPMatch())


def group_desc_request(dpid: int) -> Msg:
    return parser.OFPGroupDescStatsRequest(datapath(dpid), 0)
