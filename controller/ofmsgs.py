"""OpenFlow 1.3 messages built without a live datapath (faucet's valve_of pattern), so the
code that decides what a switch holds runs unchanged in tests and in the Ryu app.

Every flow of ours carries a cookie with ``COOKIE_TAG`` in its top 16 bits and the group
id in the low bits: reconciliation and teardown find exactly our state by cookie/mask.
(S,G), base and link-port entries carry ``OFPFF_SEND_FLOW_REM``: a switch reports any of
them that someone else deletes, and the controller audits that switch at once.
"""

from __future__ import annotations

import types
from functools import lru_cache
from typing import Any, Iterable

from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller.protect import ff_port

COOKIE_TAG = 0x4D43 << 48  # "MC"
COOKIE_MASK = 0xFFFF << 48
COOKIE_UNICAST = COOKIE_TAG | (1 << 47)  # group ids stay below 2**32
COOKIE_SOURCE = COOKIE_TAG | (1 << 46)  # the source table: learned hosts, link ports
COOKIE_DETOUR = COOKIE_TAG | (1 << 45)  # transit flows of detours, shared by all groups
FULL_MASK = (1 << 64) - 1
# Two tables, as faucet's eth_src/eth_dst: table 0 lets through only frames from sources
# the controller knows (a learned host on its port, or anything arriving over an
# inter-switch link) and sends the first frame of any other source to the controller, so
# a host is learned even when it never broadcasts; table 1 forwards by destination.
TABLE = 0
TABLE_DST = 1
PRIO_DETOUR = 1100  # table 0: detoured copies (transit and rejoin, controller.protect)
PRIO_SG = 1000  # table 0: (S,G) multicast forwarding
PRIO_IGMP = 800  # table 0: membership reports to the controller
PRIO_LINK_PORT = 650  # table 0: frames arriving over an inter-switch link
PRIO_SOURCE = 600  # table 0: a learned host on its port (idle timeout: it went silent)
PRIO_UNICAST = 500  # table 1: learned host-to-host paths (NACKs, repairs, REST)
PRIO_SSM_DROP = 100  # table 1: unknown (S,G) in 232/8: drop, never flood or punt
PRIO_MISS = 0  # both tables: to the controller (learning, unicast forwarding)
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


def _template(msg: Any) -> tuple[type, dict[str, Any]]:
    """A message's class and attributes, to stamp out copies of it with a few changed.

    ``__init__`` of ryu's message classes costs several microseconds (keyword handling,
    base-attribute bookkeeping, an ``OFPMatch`` that converts every address string); a new
    object holding a template's attributes is the same object for serialisation, at a
    fraction of the cost — which matters when one request installs a tree on a hundred
    switches, or a failure rebuilds thousands of entries. The builders below inline the
    stamping (``object.__new__``, a copy of the template's attributes with the changed ones
    set, assigned as ``__dict__``) because they run ~10^5 times."""
    return type(msg), dict(msg.__dict__)


_new = object.__new__
_MATCH_CLS, _MATCH_ATTRS = _template(parser.OFPMatch())


def sg_match(in_port: int, source: str, group: str) -> parser.OFPMatch:
    """The (S,G) match on the tree's ingress port.

    Built like ryu's own parser does (``_fields2`` in OXM order, user-format values). The
    legacy-API helpers shared with the template are never mutated (we never use that API)."""
    m = _new(_MATCH_CLS)
    attrs = _MATCH_ATTRS.copy()  # (copy + assign: cheaper than update with keywords)
    attrs["_fields2"] = [("in_port", in_port), ("eth_type", ETH_IPV4), ("ipv4_src", source),
                         ("ipv4_dst", group)]
    m.__dict__ = attrs
    return m


@lru_cache(maxsize=4096)
def _bucket(port: int) -> parser.OFPBucket:
    return parser.OFPBucket(actions=[parser.OFPActionOutput(port, 0)])


@lru_cache(maxsize=65536)
def _to_group(gid: int) -> list:
    return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionGroup(gid)])]


@lru_cache(maxsize=4096)
def _ff_bucket(ffid: int) -> parser.OFPBucket:
    return parser.OFPBucket(actions=[parser.OFPActionGroup(ffid)])


def buckets(in_port: int, out_ports: Iterable[int], ff: Iterable[int] = ()) -> list[parser.OFPBucket]:
    """One bucket per output port; a receiver behind the ingress port itself needs
    OFPP_IN_PORT, because a switch never sends a packet back out where it came in. A port
    protected by a fast-failover group ``ff`` (ids carry their port) goes through it."""
    via = {ff_port(f): f for f in ff}
    return [_ff_bucket(via[p]) if p in via else _bucket(ofp.OFPP_IN_PORT if p == in_port else p)
            for p in sorted(out_ports)]


@lru_cache(maxsize=65536)
def _shared_buckets(in_port: int, out_ports: tuple[int, ...], ff: tuple[int, ...]) -> list[parser.OFPBucket]:
    """``buckets`` for a tree entry: the same few port sets recur on every switch, and
    nothing mutates a message's bucket list, so messages share it."""
    return buckets(in_port, out_ports, ff)


def _group_buckets(in_port: int, out_ports: Iterable[int], ff: Iterable[int] = ()) -> list[parser.OFPBucket]:
    if type(out_ports) is tuple and type(ff) is tuple:
        return _shared_buckets(in_port, out_ports, ff)
    return buckets(in_port, out_ports, ff)


_GROUP_CLS, _GROUP_ATTRS = _template(parser.OFPGroupMod(datapath(0), ofp.OFPGC_ADD, ofp.OFPGT_ALL, 0, []))
_FLOW_CLS, _FLOW_ADD_ATTRS = _template(parser.OFPFlowMod(
    datapath(0), cookie=COOKIE_TAG, table_id=TABLE, command=ofp.OFPFC_ADD, priority=PRIO_SG,
    flags=ofp.OFPFF_SEND_FLOW_REM))


def _group_mod(dpid: int, command: int, gid: int, bucket_list: list,
               template: dict[str, Any] = _GROUP_ATTRS) -> Msg:
    m = _new(_GROUP_CLS)
    attrs = template.copy()
    attrs["datapath"], attrs["command"], attrs["group_id"], attrs["buckets"] = \
        datapath(dpid), command, gid, bucket_list
    m.__dict__ = attrs
    return m


def group_add(dpid: int, gid: int, in_port: int, out_ports: Iterable[int], ff: Iterable[int] = ()) -> Msg:
    return _group_mod(dpid, ofp.OFPGC_ADD, gid, _group_buckets(in_port, out_ports, ff))


def group_modify(dpid: int, gid: int, in_port: int, out_ports: Iterable[int], ff: Iterable[int] = ()) -> Msg:
    return _group_mod(dpid, ofp.OFPGC_MODIFY, gid, _group_buckets(in_port, out_ports, ff))


def group_delete(dpid: int, gid: int) -> Msg:
    return _group_mod(dpid, ofp.OFPGC_DELETE, gid, [])


def flow_add(dpid: int, gid: int, in_port: int, source: str, group: str) -> Msg:
    m = _new(_FLOW_CLS)
    attrs = _FLOW_ADD_ATTRS.copy()
    attrs["datapath"], attrs["cookie"], attrs["match"], attrs["instructions"] = \
        datapath(dpid), COOKIE_TAG | gid, sg_match(in_port, source, group), _to_group(gid)
    m.__dict__ = attrs
    return m


def flow_delete(dpid: int, gid: int, in_port: int, source: str, group: str) -> Msg:
    return parser.OFPFlowMod(datapath(dpid), cookie=cookie(gid), cookie_mask=FULL_MASK,
                             table_id=TABLE, command=ofp.OFPFC_DELETE_STRICT,
                             priority=PRIO_SG, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                             match=sg_match(in_port, source, group))


# -- fast-failover protection (controller.protect decides; these only build) ----------
# Actions are given in one normalised form, ("output", port) | ("group", id) |
# ("set_field", field, value): the core compares what it wants with what a switch reports
# in that form, and ``lab.fakeof`` uses the same one.
_GROUP_FF_ATTRS = dict(_GROUP_ATTRS, type=ofp.OFPGT_FF)


def actions(acts: Iterable[tuple]) -> list:
    """Ryu action objects for normalised actions."""
    out: list = []
    for a in acts:
        if a[0] == "output":
            out.append(parser.OFPActionOutput(a[1], 0))
        elif a[0] == "group":
            out.append(parser.OFPActionGroup(a[1]))
        else:
            out.append(parser.OFPActionSetField(**{a[1]: a[2]}))
    return out


@lru_cache(maxsize=65536)
def _ff_buckets(bucket_specs: tuple) -> list:
    return [parser.OFPBucket(watch_port=w, actions=actions(acts)) for w, acts in bucket_specs]


def ff_group(dpid: int, ffid: int, bucket_specs: tuple, command: int = ofp.OFPGC_ADD) -> Msg:
    """An OFPGT_FF group from (watch_port, actions) buckets: the first live one forwards."""
    return _group_mod(dpid, command, ffid, _ff_buckets(bucket_specs), _GROUP_FF_ATTRS)


def _detour_match(in_port: int, tag: str, source: str | None, group: str | None) -> parser.OFPMatch:
    """Stamped like ``sg_match`` (OXM order: in_port, eth_dst, eth_type, ipv4_src/dst)."""
    m = _new(_MATCH_CLS)
    if source is None:  # transit: any SSM group's copy carrying the tag
        fields = [("in_port", in_port), ("eth_dst", tag), ("eth_type", ETH_IPV4), ("ipv4_dst", SSM_NET)]
    else:
        fields = [("in_port", in_port), ("eth_dst", tag), ("eth_type", ETH_IPV4),
                  ("ipv4_src", source), ("ipv4_dst", group)]
    attrs = _MATCH_ATTRS.copy()
    attrs["_fields2"] = fields
    m.__dict__ = attrs
    return m


@lru_cache(maxsize=65536)
def _apply(acts: tuple) -> list:
    return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions(acts))]


def detour_flow(dpid: int, cookie_value: int, in_port: int, tag: str, acts: tuple,
                source: str | None = None, group: str | None = None) -> Msg:
    """A transit flow (``source`` None: shared, cookie ``COOKIE_DETOUR``) or a group's
    rejoin flow (cookie of the group) for copies tagged ``tag`` arriving on ``in_port``."""
    m = _new(_FLOW_CLS)
    attrs = _FLOW_ADD_ATTRS.copy()
    attrs["datapath"], attrs["cookie"], attrs["priority"] = datapath(dpid), cookie_value, PRIO_DETOUR
    attrs["match"], attrs["instructions"] = _detour_match(in_port, tag, source, group), _apply(acts)
    m.__dict__ = attrs
    return m


def detour_flow_delete(dpid: int, cookie_value: int, in_port: int, tag: str,
                       source: str | None = None, group: str | None = None) -> Msg:
    return parser.OFPFlowMod(datapath(dpid), cookie=cookie_value, cookie_mask=FULL_MASK,
                             table_id=TABLE, command=ofp.OFPFC_DELETE_STRICT,
                             priority=PRIO_DETOUR, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                             match=_detour_match(in_port, tag, source, group))


def cookie_delete(dpid: int, gid: int) -> Msg:
    """Every flow of group ``gid`` (a group the controller no longer has)."""
    return parser.OFPFlowMod(datapath(dpid), cookie=cookie(gid), cookie_mask=FULL_MASK,
                             table_id=TABLE, command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY, match=parser.OFPMatch())


def multicast_mac(group: str) -> str:
    """RFC 1112: 01:00:5e + the low 23 bits of the group address."""
    a = [int(x) for x in group.split(".")]
    return f"01:00:5e:{a[1] & 0x7F:02x}:{a[2]:02x}:{a[3]:02x}"


def base_flows(dpid: int) -> list[Msg]:
    """Installed when a switch connects: IGMP to the controller; in the source table,
    unknown sources to the controller; in the destination table, unknown SSM traffic
    dropped (multicast is never flooded) and unknown destinations to the controller for
    unicast forwarding. (Ryu's topology app adds its own LLDP flow.)"""
    dp = datapath(dpid)
    to_ctrl = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [
        parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])]

    def add(table: int, prio: int, match: parser.OFPMatch, inst: list) -> Msg:
        return parser.OFPFlowMod(dp, cookie=COOKIE_TAG, table_id=table, command=ofp.OFPFC_ADD,
                                 priority=prio, match=match, instructions=inst,
                                 flags=ofp.OFPFF_SEND_FLOW_REM)

    return [
        add(TABLE, PRIO_IGMP, parser.OFPMatch(eth_type=ETH_IPV4, ip_proto=IPPROTO_IGMP), to_ctrl),
        add(TABLE, PRIO_MISS, parser.OFPMatch(), to_ctrl),
        add(TABLE_DST, PRIO_SSM_DROP, parser.OFPMatch(eth_type=ETH_IPV4, ipv4_dst=SSM_NET), []),
        add(TABLE_DST, PRIO_MISS, parser.OFPMatch(), to_ctrl),
    ]


_TO_DST_TABLE = [parser.OFPInstructionGotoTable(TABLE_DST)]


def source_flow(dpid: int, port: int, mac: str, idle_timeout: int) -> Msg:
    """A learned host's frames pass the source table; the switch removes the entry (and
    tells us: OFPFF_SEND_FLOW_REM) after ``idle_timeout`` s without a frame from it."""
    return parser.OFPFlowMod(datapath(dpid), cookie=COOKIE_SOURCE, table_id=TABLE,
                             command=ofp.OFPFC_ADD, priority=PRIO_SOURCE,
                             idle_timeout=idle_timeout, flags=ofp.OFPFF_SEND_FLOW_REM,
                             match=parser.OFPMatch(in_port=port, eth_src=mac),
                             instructions=_TO_DST_TABLE)


def source_flow_delete(dpid: int, port: int, mac: str) -> Msg:
    return parser.OFPFlowMod(datapath(dpid), cookie=COOKIE_SOURCE, cookie_mask=FULL_MASK,
                             table_id=TABLE, command=ofp.OFPFC_DELETE_STRICT,
                             priority=PRIO_SOURCE, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                             match=parser.OFPMatch(in_port=port, eth_src=mac))


def link_port_flow(dpid: int, port: int) -> Msg:
    """Frames arriving over an inter-switch link pass the source table: their sources
    were checked at the edge switch they entered."""
    return parser.OFPFlowMod(datapath(dpid), cookie=COOKIE_SOURCE, table_id=TABLE,
                             command=ofp.OFPFC_ADD, priority=PRIO_LINK_PORT,
                             flags=ofp.OFPFF_SEND_FLOW_REM, match=parser.OFPMatch(in_port=port),
                             instructions=_TO_DST_TABLE)


def link_port_flow_delete(dpid: int, port: int) -> Msg:
    return parser.OFPFlowMod(datapath(dpid), cookie=COOKIE_SOURCE, cookie_mask=FULL_MASK,
                             table_id=TABLE, command=ofp.OFPFC_DELETE_STRICT,
                             priority=PRIO_LINK_PORT, out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY, match=parser.OFPMatch(in_port=port))


def unicast_flow(dpid: int, eth_dst: str, out_port: int, idle_timeout: int = 120) -> Msg:
    return parser.OFPFlowMod(datapath(dpid), cookie=COOKIE_UNICAST, table_id=TABLE_DST,
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


def role_request(dpid: int, master: bool, generation: int) -> Msg:
    """OFPRoleRequest MASTER or SLAVE with ``generation`` (controller.election): the
    switch refuses one older than the newest it has seen (OFPRRFC_STALE)."""
    return parser.OFPRoleRequest(datapath(dpid), ofp.OFPCR_ROLE_MASTER if master else ofp.OFPCR_ROLE_SLAVE,
                                 generation & ((1 << 64) - 1))
