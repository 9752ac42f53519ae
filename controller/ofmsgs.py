"""OpenFlow 1.3 messages built without a live datapath (faucet's valve_of pattern), so the
code that decides what a switch holds runs unchanged in tests and in the Ryu app.

Every flow of ours carries a cookie with ``COOKIE_TAG`` in its top 16 bits and the group
id in the low bits: reconciliation and teardown find exactly our state by cookie/mask.
(S,G), base and link-port entries carry ``OFPFF_SEND_FLOW_REM``: a switch reports any of
them that someone else deletes, and the controller audits that switch at once.
"""

from __future__ import annotations

import socket
import struct
import types
from functools import lru_cache
from typing import Any, Iterable

from ryu.ofproto import nicira_ext
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller.protect import FF_BASE, OWN_GROUP, TO_OWN_GROUP, ff_port

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
PRIO_DETOUR = 1100  # table 0: detoured copies (transit, a group's rejoin: controller.protect)
PRIO_REJOIN = 1099  # table 0: a detour's end shared by its link's groups (below a group's own)
PRIO_VERSION = 1001  # table 0: a moving tree's new entry, for copies of its new version
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


# Every copy of a group's packet carries a VLAN tag inside the fabric: the tree's first
# switch pushes it, every port towards a host pops it. Its id is the tree's *version*
# (one of two, ``VERSION_VIDS``): a move installs the new tree's changed entries for the
# new version beside the old ones, then flips the first switch's stamp in one message,
# so every packet travels wholly on the old tree or wholly on the new one
# (controller.plan; Reitblatt et al., "Abstractions for Network Update", SIGCOMM 2012).
VERSION_VIDS = (3900, 3901)
OFPVID_PRESENT = ofp.OFPVID_PRESENT
ETH_VLAN = 0x8100
POP = (("pop_vlan",),)  # (a bucket towards a host starts with it)


def stamp(color: int) -> tuple:
    """The actions stamping a copy with version ``color`` (0 or 1) at the tree's ingress."""
    return (("push_vlan", ETH_VLAN), ("set_field", "vlan_vid", OFPVID_PRESENT | VERSION_VIDS[color]))


def actions(acts: Iterable[tuple]) -> list:
    """Ryu action objects for normalised actions: ("output", port), ("group", id),
    ("set_field", field, value), and Nicira extensions Open vSwitch has: ("set_field",
    "in_port", port) changes the packet's ingress (OVS refuses it as an OpenFlow set-field:
    it is sent as Nicira's load into NXM_OF_IN_PORT), ("move", src_field, src_ofs,
    dst_field, dst_ofs, n_bits) copies bits of one header field into another, ("resubmit",
    in_port, table) looks the packet up again in ``table`` as if it had come in on
    ``in_port`` (for the lookup alone: the entry found runs with the real ingress);
    ("push_vlan", ethertype) and ("pop_vlan",)."""
    out: list = []
    for a in acts:
        if a[0] == "pop_vlan":
            out.append(parser.OFPActionPopVlan())
        elif a[0] == "push_vlan":
            out.append(parser.OFPActionPushVlan(a[1]))
        elif a[0] == "output":
            out.append(parser.OFPActionOutput(a[1], 0))
        elif a[0] == "group":
            out.append(parser.OFPActionGroup(a[1]))
        elif a[0] == "move":
            out.append(parser.NXActionRegMove(src_field=a[1], src_ofs=a[2], dst_field=a[3], dst_ofs=a[4],
                                              n_bits=a[5]))
        elif a[0] == "resubmit":
            out.append(parser.NXActionResubmitTable(in_port=a[1], table_id=a[2]))
        elif a[1] == "in_port":
            out.append(parser.NXActionRegLoad(ofs_nbits=nicira_ext.ofs_nbits(0, 15), dst="in_port_nxm", value=a[2]))
        else:
            out.append(parser.OFPActionSetField(**{a[1]: a[2]}))
    return out


# -- the messages of trees and their protection, packed as OpenFlow 1.3 bytes ---------
# A tree's entries and their protection are ~300,000 messages for 1000 groups on
# fat-tree:16. Ryu's constructors cost several microseconds each and its ``serialize``
# ~70 us at send time; these builders pack the wire bytes once instead (from cached
# pieces: a group's OXM fields, a port's bucket, an action list), into an object that IS
# a Ryu ``OFPFlowMod`` / ``OFPGroupMod`` for everything downstream:
# ``Datapath.send_msg`` sets its xid and sends the bytes; any other attribute
# (``match``, ``buckets``, ``command``...) is decoded from the bytes with Ryu's own parsers
# on first use (the simulated fabric, tests), so what they read is what the switch gets.
# The layouts are Ryu's pack strings; the OXM fields and actions are serialised by Ryu's
# own classes (once per distinct value); tests compare every builder with Ryu's
# constructors byte for byte.

_FLOW_FIXED = struct.Struct(ofp.OFP_HEADER_PACK_STR + ofp.OFP_FLOW_MOD_PACK_STR0[1:])
_GROUP_FIXED = struct.Struct(ofp.OFP_HEADER_PACK_STR + ofp.OFP_GROUP_MOD_PACK_STR[1:])
_MATCH_IN_PORT = struct.Struct("!HHII")  # ofp_match type + length, then the in_port OXM
_INSTRUCTION = struct.Struct(ofp.OFP_INSTRUCTION_ACTIONS_PACK_STR)
_BUCKET = struct.Struct(ofp.OFP_BUCKET_PACK_STR)
_XID = struct.Struct("!I")
_PORT = struct.Struct("!I")
_MATCH_AT = ofp.OFP_FLOW_MOD_SIZE - ofp.OFP_MATCH_SIZE  # where a flow-mod's match starts


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


class _Ready:
    """A message whose wire bytes (``_wire``, xid 0) were packed by the builders below.

    ``serialize`` (what ``Datapath.send_msg`` calls after giving it an xid) copies them
    with the xid set; every other message attribute is decoded from them on first read.
    ``_dpid``, ``_wire``, ``xid`` (None until sent) and ``buf`` (the bytes sent) are
    slots of the concrete classes: a message is built, numbered and serialised with no
    attribute dict (~300 per new tree; the dict was most of building one, and then of
    sending it: ~0.7 x the reference per 1000 new trees on fat-tree:16)."""

    def serialize(self) -> None:
        buf = bytearray(self._wire)
        xid = self.xid or 0
        _XID.pack_into(buf, 4, xid)
        self.xid, self.buf = xid, buf

    def __getattr__(self, name: str) -> Any:
        if name == "xid":  # (a message made without its builders: not sent yet)
            return None
        d = self.__dict__
        if name == "datapath":
            dp = d["datapath"] = datapath(self._dpid)
            return dp
        if name.startswith("_") or "_decoded" in d:
            raise AttributeError(name)
        self._load()
        if name not in d:
            raise AttributeError(name)
        return d[name]

    def _load(self) -> None:
        d = self.__dict__
        if "_decoded" not in d:
            d["_decoded"] = True
            for key, value in _decode(self._wire, self.datapath).__dict__.items():
                if key not in d and key != "xid":
                    d[key] = value

    def __repr__(self) -> str:  # (Ryu's lists the attributes it finds)
        self._load()
        return super().__repr__()


_SLOTS = ("_dpid", "_wire", "xid", "buf")


class ReadyFlowMod(_Ready, parser.OFPFlowMod):
    """An ``OFPFlowMod`` built as bytes (see ``_Ready``)."""

    __slots__ = _SLOTS


class ReadyGroupMod(_Ready, parser.OFPGroupMod):
    """An ``OFPGroupMod`` built as bytes (see ``_Ready``)."""

    __slots__ = _SLOTS


_new = object.__new__


def _decode(wire: bytes, dp: Any) -> Msg:
    """The Ryu message that serialises to ``wire`` (header fields other than the type are
    the caller's: version, length, xid)."""
    buf = bytearray(wire)
    if wire[1] == ofp.OFPT_FLOW_MOD:
        return parser.OFPFlowMod.parser(dp, ofp.OFP_VERSION, ofp.OFPT_FLOW_MOD, len(buf), 0, buf)
    command, gtype, gid = struct.unpack_from(ofp.OFP_GROUP_MOD_PACK_STR, buf, ofp.OFP_HEADER_SIZE)
    bucket_list, offset = [], ofp.OFP_GROUP_MOD_SIZE
    while offset < len(buf):
        b = parser.OFPBucket.parser(buf, offset)
        bucket_list.append(b)
        offset += b.len
    return parser.OFPGroupMod(dp, command, gtype, gid, bucket_list)


def _oxm(*fields: tuple[str, Any]) -> bytes:
    """OXM TLVs of ``fields`` ((name, user value), in OXM order), as Ryu's OFPMatch
    serialises them (no ofp_match header, no padding)."""
    m = parser.OFPMatch(**dict(fields))
    buf = bytearray()
    m.serialize(buf, 0)
    return bytes(buf[4:m.length])


def _oxm_header(name: str, sample: Any) -> bytes:
    """The TLV header Ryu writes for field ``name`` (unmasked): the hot fields' values are
    packed after it here, since Ryu's own conversion of an address costs ~30 us."""
    return _oxm((name, sample))[:4]


_OXM_IN_PORT = struct.unpack("!I", _oxm_header("in_port", 0))[0]
_OXM_ETH_DST = _oxm_header("eth_dst", "00:00:00:00:00:00")
_OXM_IPV4_SRC, _OXM_IPV4_DST = _oxm_header("ipv4_src", "0.0.0.0"), _oxm_header("ipv4_dst", "0.0.0.0")
_OXM_ETH_TYPE_IPV4 = _oxm(("eth_type", ETH_IPV4))
_PAD = [bytes(n) for n in range(8)]


def _ipv4(address: str) -> bytes:
    """A dotted-quad address's 4 bytes, as strict as ``ipaddress.IPv4Address`` (no leading
    zeros, no short forms) at a twentieth of its cost (~2.5 us: per new group)."""
    try:
        return socket.inet_pton(socket.AF_INET, address)
    except (OSError, TypeError):
        raise ValueError(f"not an IPv4 address: {address!r}") from None


@lru_cache(maxsize=65536)
def _sg_oxm(source: str, group: str) -> bytes:
    """eth_type IPv4, ipv4_src ``source``, ipv4_dst ``group``."""
    return _OXM_ETH_TYPE_IPV4 + _OXM_IPV4_SRC + _ipv4(source) + _OXM_IPV4_DST + _ipv4(group)


@lru_cache(maxsize=65536)
def _tag_oxm(mac: str) -> bytes:
    """eth_dst ``mac`` (aa:bb:cc:dd:ee:ff)."""
    value = bytes.fromhex(mac.replace(":", ""))
    if len(value) != 6 or len(mac) != 17:
        raise ValueError(f"not a MAC address: {mac!r}")
    return _OXM_ETH_DST + value


_TRANSIT_OXM = _oxm(("eth_type", ETH_IPV4), ("ipv4_dst", SSM_NET))


def _match_in_port(in_port: int, rest: bytes) -> bytes:
    """An ofp_match of in_port and then the TLVs ``rest``, padded: the in_port varies per
    switch, the rest per group."""
    length = ofp.OFP_MATCH_SIZE - 4 + 8 + len(rest)
    return _MATCH_IN_PORT.pack(ofp.OFPMT_OXM, length, _OXM_IN_PORT, in_port) + rest + _PAD[-length % 8]


_OUTPUT = struct.Struct(ofp.OFP_ACTION_OUTPUT_PACK_STR)
_GROUP = struct.Struct(ofp.OFP_ACTION_GROUP_PACK_STR)
_SET_FIELD = struct.Struct("!HH")  # (type, length), then the TLV and padding to 8 bytes
_HEADER_ONLY = struct.Struct(ofp.OFP_ACTION_HEADER_PACK_STR)
_PUSH = struct.Struct(ofp.OFP_ACTION_PUSH_PACK_STR)


def _action(a: tuple) -> bytes:
    """One normalised action (see ``actions``) as Ryu serialises it (max_len 0, as ours)."""
    if a[0] == "output":
        return _OUTPUT.pack(ofp.OFPAT_OUTPUT, ofp.OFP_ACTION_OUTPUT_SIZE, a[1], 0)
    if a[0] == "group":
        return _GROUP.pack(ofp.OFPAT_GROUP, ofp.OFP_ACTION_GROUP_SIZE, a[1])
    if a[0] == "pop_vlan":
        return _HEADER_ONLY.pack(ofp.OFPAT_POP_VLAN, ofp.OFP_ACTION_HEADER_SIZE)
    if a[0] == "push_vlan":
        return _PUSH.pack(ofp.OFPAT_PUSH_VLAN, ofp.OFP_ACTION_PUSH_SIZE, a[1])
    if a[0] in ("move", "resubmit") or a[1] == "in_port":  # (Nicira's: one per protected link, Ryu packs them)
        buf = bytearray()
        actions((a,))[0].serialize(buf, 0)
        return bytes(buf)
    tlv = _tag_oxm(a[2]) if a[1] == "eth_dst" else _oxm((a[1], a[2]))
    length = _pad8(4 + len(tlv))
    return _SET_FIELD.pack(ofp.OFPAT_SET_FIELD, length) + tlv + _PAD[length - 4 - len(tlv)]


@lru_cache(maxsize=65536)
def _actions(acts: tuple) -> bytes:
    return b"".join([_action(a) for a in acts])


@lru_cache(maxsize=65536)
def _apply(acts: tuple) -> bytes:
    """One OFPIT_APPLY_ACTIONS instruction."""
    body = _actions(acts)
    return _INSTRUCTION.pack(ofp.OFPIT_APPLY_ACTIONS, ofp.OFP_INSTRUCTION_ACTIONS_SIZE + len(body)) + body


@lru_cache(maxsize=65536)
def _to_group(gid: int) -> bytes:
    return _apply((("group", gid),))


@lru_cache(maxsize=1024)
def _add_layout(tag_len: int, rest_len: int, instructions_len: int) -> tuple[struct.Struct, int]:
    """The whole of a table-0 flow add as one pack: the fixed part, a match of in_port
    then two runs of TLVs (a tag's, a group's), its padding, the instructions; and the
    match's length."""
    match_len = ofp.OFP_MATCH_SIZE - 4 + 8 + tag_len + rest_len
    return struct.Struct(f"{_FLOW_FIXED.format}HHII{tag_len}s{rest_len}s{-match_len % 8}x"
                         f"{instructions_len}s"), match_len


def _flow_add(dpid: int, cookie_value: int, priority: int, in_port: int, tag_oxm: bytes,
              rest_oxm: bytes, instructions: bytes) -> Msg:
    """A table-0 flow add on ``in_port`` + the TLVs (out_port/out_group 0: Ryu's
    defaults), its removal reported."""
    layout, match_len = _add_layout(len(tag_oxm), len(rest_oxm), len(instructions))
    m = _new(ReadyFlowMod)
    m._dpid, m.xid = dpid, None
    m._wire = layout.pack(ofp.OFP_VERSION, ofp.OFPT_FLOW_MOD, layout.size, 0, cookie_value, 0, TABLE,
                          ofp.OFPFC_ADD, 0, 0, priority, ofp.OFP_NO_BUFFER, 0, 0, ofp.OFPFF_SEND_FLOW_REM,
                          ofp.OFPMT_OXM, match_len, _OXM_IN_PORT, in_port, tag_oxm, rest_oxm, instructions)
    return m


def _flow_delete(dpid: int, cookie_value: int, priority: int, match: bytes) -> Msg:
    """The table-0 flow of exactly this cookie, priority and match."""
    m = _new(ReadyFlowMod)
    m._dpid, m.xid = dpid, None
    m._wire = _FLOW_FIXED.pack(ofp.OFP_VERSION, ofp.OFPT_FLOW_MOD, _MATCH_AT + len(match), 0, cookie_value,
                               FULL_MASK, TABLE, ofp.OFPFC_DELETE_STRICT, 0, 0, priority, ofp.OFP_NO_BUFFER,
                               ofp.OFPP_ANY, ofp.OFPG_ANY, 0) + match
    return m


def _bucket(watch_port: int, acts: tuple) -> bytes:
    body = _actions(acts)
    return _BUCKET.pack(ofp.OFP_BUCKET_SIZE + len(body), 0, watch_port, ofp.OFPG_ANY) + body


def bucket_actions(in_port: int, out_ports: Iterable[int], ff: Iterable[int] = (),
                   edge: Iterable[int] = ()) -> list[tuple]:
    """An ALL group's buckets' actions: one per output port; a receiver behind the ingress
    port itself needs OFPP_IN_PORT, because a switch never sends a packet back out where
    it came in. A port protected by a fast-failover group ``ff`` (ids carry their port)
    goes through it; a port towards hosts (``edge``) takes the version tag off first."""
    via = {ff_port(f): f for f in ff}
    hosts = set(edge)
    return [(("group", via[p]),) if p in via else
            (POP if p in hosts else ()) + (("output", ofp.OFPP_IN_PORT if p == in_port else p),)
            for p in sorted(out_ports)]


def buckets(in_port: int, out_ports: Iterable[int], ff: Iterable[int] = (), edge: Iterable[int] = ()) -> bytes:
    """``bucket_actions`` packed."""
    return b"".join(_bucket(ofp.OFPP_ANY, acts) for acts in bucket_actions(in_port, out_ports, ff, edge))


@lru_cache(maxsize=65536)
def _shared_buckets(in_port: int, out_ports: tuple[int, ...], ff: tuple[int, ...], edge: tuple[int, ...]) -> bytes:
    """``buckets`` for a tree entry: the same few port sets recur on every switch."""
    return buckets(in_port, out_ports, ff, edge)


def _group_buckets(in_port: int, out_ports: Iterable[int], ff: Iterable[int] = (), edge: Iterable[int] = ()) -> bytes:
    if type(out_ports) is tuple and type(ff) is tuple and type(edge) is tuple:
        return _shared_buckets(in_port, out_ports, ff, edge)
    return buckets(in_port, out_ports, ff, edge)


def _group_mod(dpid: int, command: int, gid: int, body: bytes, gtype: int = ofp.OFPGT_ALL) -> Msg:
    m = _new(ReadyGroupMod)
    m._dpid, m.xid = dpid, None
    m._wire = _GROUP_FIXED.pack(ofp.OFP_VERSION, ofp.OFPT_GROUP_MOD, ofp.OFP_GROUP_MOD_SIZE + len(body),
                                0, command, gtype, gid) + body
    return m


def _all_group(dpid: int, command: int, gid: int, in_port: int, out_ports: Iterable[int],
                  ff: Iterable[int], edge: Iterable[int]) -> Msg:
    """An ALL group's add or modify (``buckets``)."""
    return _group_mod(dpid, command, gid, _group_buckets(in_port, out_ports, ff, edge))


def group_add(dpid: int, gid: int, in_port: int, out_ports: Iterable[int], ff: Iterable[int] = (),
              edge: Iterable[int] = ()) -> Msg:
    return _all_group(dpid, ofp.OFPGC_ADD, gid, in_port, out_ports, ff, edge)


def group_modify(dpid: int, gid: int, in_port: int, out_ports: Iterable[int], ff: Iterable[int] = (),
                 edge: Iterable[int] = ()) -> Msg:
    return _all_group(dpid, ofp.OFPGC_MODIFY, gid, in_port, out_ports, ff, edge)


def group_delete(dpid: int, gid: int) -> Msg:
    return _group_mod(dpid, ofp.OFPGC_DELETE, gid, b"")


_IN_PORT_AT = _MATCH_AT + 8  # a flow add's in_port value (after the match and TLV headers)


@lru_cache(maxsize=65536)
def _sg_flow(gid: int, source: str, group: str) -> tuple[bytes, bytes]:
    """Group ``gid``'s (S,G) flow add, before and after its in_port: the same on every
    switch of its tree."""
    wire = _flow_add(0, COOKIE_TAG | gid, PRIO_SG, 0, b"", _sg_oxm(source, group), _to_group(gid))._wire
    return wire[:_IN_PORT_AT], wire[_IN_PORT_AT + 4:]


_SG_FLOW = struct.Struct(f"!{_IN_PORT_AT}sI{len(_sg_flow.__wrapped__(1, '0.0.0.0', '232.0.0.0')[1])}s")


def flow_add(dpid: int, gid: int, in_port: int, source: str, group: str) -> Msg:
    """The (S,G) flow on the tree's ingress port, to the group's ALL group."""
    head, tail = _sg_flow(gid, source, group)
    m = _new(ReadyFlowMod)
    m._dpid, m.xid = dpid, None
    m._wire = _SG_FLOW.pack(head, in_port, tail)
    return m


@lru_cache(maxsize=4)
def _stamp(color: int) -> bytes:
    """``stamp(color)`` packed (Ryu packs the VLAN id's set-field: once per version)."""
    return _actions(stamp(color))


@lru_cache(maxsize=65536)
def _ingress(gid: int, source: str, group: str, color: int, target: int) -> tuple[bytes, bytes]:
    """The tree's first (S,G) flow, which stamps the version, before and after its in_port
    (one per group: its instruction packed from the version's actions and its group's)."""
    body = _stamp(color) + _GROUP.pack(ofp.OFPAT_GROUP, ofp.OFP_ACTION_GROUP_SIZE, target)
    apply = _INSTRUCTION.pack(ofp.OFPIT_APPLY_ACTIONS, ofp.OFP_INSTRUCTION_ACTIONS_SIZE + len(body)) + body
    wire = _flow_add(0, COOKIE_TAG | gid, PRIO_SG, 0, b"", _sg_oxm(source, group), apply)._wire
    return wire[:_IN_PORT_AT], wire[_IN_PORT_AT + 4:]


def ingress_add(dpid: int, gid: int, in_port: int, source: str, group: str, color: int,
                target: int | None = None) -> Msg:
    """The (S,G) flow at the tree's first switch, on the source's port: stamps version
    ``color`` and hands the copy to group ``target`` (default the group's own). Sent again
    with another color or target it replaces the flow (same match): a move's flip."""
    head, tail = _ingress(gid, source, group, color, gid if target is None else target)
    m = _new(ReadyFlowMod)
    m._dpid, m.xid = dpid, None
    m._wire = head + _PORT.pack(in_port) + tail
    return m


_OXM_VLAN_VID = _oxm_header("vlan_vid", 0)


@lru_cache(maxsize=65536)
def _version_oxm(source: str, group: str, color: int) -> bytes:
    """eth_type IPv4, the version's VLAN id, ipv4_src ``source``, ipv4_dst ``group``."""
    return (_OXM_ETH_TYPE_IPV4 + _OXM_VLAN_VID + struct.pack("!H", OFPVID_PRESENT | VERSION_VIDS[color])
            + _OXM_IPV4_SRC + _ipv4(source) + _OXM_IPV4_DST + _ipv4(group))


def version_flow(dpid: int, gid: int, in_port: int, source: str, group: str, color: int, target: int) -> Msg:
    """During a move, the copies of version ``color`` arriving on ``in_port`` go to group
    ``target`` (the switch's new entry); the others still take the (S,G) flow below it."""
    return _flow_add(dpid, COOKIE_TAG | gid, PRIO_VERSION, in_port, b"", _version_oxm(source, group, color),
                     _to_group(target))


def version_flow_delete(dpid: int, gid: int, in_port: int, source: str, group: str, color: int) -> Msg:
    return _flow_delete(dpid, cookie(gid), PRIO_VERSION, _match_in_port(in_port, _version_oxm(source, group, color)))


# While a tree moves, a switch whose entry changes holds the new one in a second ALL group
# (``turn_id``): the new version's copies reach it (by a version flow or the flow of a
# new in_port), the old version's still reach the group's own id (controller.plan).
TURN_BIT = 1 << 31  # turn group id: TURN_BIT | gid (gid <= core.MAX_GID keeps it below FF_BASE)


def turn_id(gid: int) -> int:
    return TURN_BIT | gid


def is_turn(group_id: int) -> bool:
    return group_id & TURN_BIT != 0 and group_id < FF_BASE


def flow_to(dpid: int, gid: int, in_port: int, source: str, group: str, target: int) -> Msg:
    """Group ``gid``'s (S,G) flow on ``in_port``, to group ``target`` (its turn group);
    ``flow_add`` with the same arguments points it back at ``gid`` (same match: replaced)."""
    return _flow_add(dpid, COOKIE_TAG | gid, PRIO_SG, in_port, b"", _sg_oxm(source, group), _to_group(target))


def flow_delete(dpid: int, gid: int, in_port: int, source: str, group: str) -> Msg:
    return _flow_delete(dpid, cookie(gid), PRIO_SG, _match_in_port(in_port, _sg_oxm(source, group)))


# -- fast-failover protection (controller.protect decides; these only build) ----------
# Actions are given in one normalised form, ("output", port) | ("group", id) |
# ("set_field", field, value): the core compares what it wants with what a switch reports
# in that form, and ``lab.fakeof`` uses the same one.


# An FF group as ``protect.ff_buckets`` makes every one: the link's bucket (output to the
# watched port), then the detour's (set eth_dst to the link's tag, output): one pack.
_FF_PAIR = struct.Struct(f"!{_BUCKET.format[1:]}{_OUTPUT.format[1:]}{_BUCKET.format[1:]}"
                         f"{_SET_FIELD.format[1:]}10s2x{_OUTPUT.format[1:]}")
_FF_SECOND = ofp.OFP_BUCKET_SIZE + 16 + ofp.OFP_ACTION_OUTPUT_SIZE  # the detour bucket's length


def _ff_buckets(bucket_specs: tuple) -> bytes:
    """Buckets of an FF group, ~13,000 of them on fat-tree:16 with 1000 groups, nearly all
    distinct (each names its link's tag): the usual shape in one pack, others as
    ``_bucket`` packs them."""
    if len(bucket_specs) == 2:
        (w1, a1), (w2, a2) = bucket_specs
        if len(a1) == 1 and a1[0][0] == "output" and len(a2) == 2 and a2[0][:2] == ("set_field", "eth_dst") \
                and a2[1][0] == "output":
            return _FF_PAIR.pack(ofp.OFP_BUCKET_SIZE + ofp.OFP_ACTION_OUTPUT_SIZE, 0, w1, ofp.OFPG_ANY,
                                 ofp.OFPAT_OUTPUT, ofp.OFP_ACTION_OUTPUT_SIZE, a1[0][1], 0,
                                 _FF_SECOND, 0, w2, ofp.OFPG_ANY, ofp.OFPAT_SET_FIELD, 16, _tag_oxm(a2[0][2]),
                                 ofp.OFPAT_OUTPUT, ofp.OFP_ACTION_OUTPUT_SIZE, a2[1][1], 0)
    return b"".join([_bucket(w, acts) for w, acts in bucket_specs])


def ff_group(dpid: int, ffid: int, bucket_specs: tuple, command: int = ofp.OFPGC_ADD) -> Msg:
    """An OFPGT_FF group from (watch_port, actions) buckets: the first live one forwards."""
    return _group_mod(dpid, command, ffid, _ff_buckets(bucket_specs), ofp.OFPGT_FF)


def _detour_match(in_port: int, tag: str, source: str | None, group: str | None) -> bytes:
    """OXM order: in_port, eth_dst, eth_type, ipv4_src/dst; transit (``source`` None):
    any SSM group's copy carrying the tag."""
    return _match_in_port(in_port, _tag_oxm(tag) + (_TRANSIT_OXM if source is None else _sg_oxm(source, group)))


def rejoin_actions(acts: tuple, group: str, gid: int, edge: tuple[int, ...] = ()) -> tuple:
    """A rejoin flow's whole actions for group ``gid`` (address ``group``) from the kept
    ones (``protect.TO_OWN_GROUP`` or outputs): restore the group's MAC first, then
    ``OWN_GROUP`` is the group's ALL group. Outputs to hosts (``edge``: the switch's ports
    towards receivers) go last, after the version tag is taken off."""
    whole = tuple(("group", gid) if a[0] == "group" and a[1] == OWN_GROUP else a for a in acts)
    hosts = tuple(a for a in whole if a[0] == "output" and a[1] in edge) if edge else ()
    if hosts:
        whole = tuple(a for a in whole if a not in hosts) + POP + hosts
    return (("set_field", "eth_dst", multicast_mac(group)),) + whole


def rejoin_kept(acts: tuple, group: str, gid: int, arrival: int = 0) -> tuple | None:
    """``rejoin_actions`` backwards (actions read off a switch, whose detour arrives on
    ``arrival``): the kept form (the one ``TO_OWN_GROUP`` when it is that, as the trees
    hold it), or None when they are not what the group's rejoin would do."""
    if not acts or acts[0] != ("set_field", "eth_dst", multicast_mac(group)):
        return None
    kept = tuple(("group", OWN_GROUP) if a == ("group", gid) else a for a in acts[1:])
    if POP[0] in kept:  # (outputs in port order again: as the trees keep them)
        kept = tuple(sorted((a for a in kept if a != POP[0]), key=lambda a: arrival if a == (
            "output", ofp.OFPP_IN_PORT) else ff_port(a[1]) if a[0] == "group" else a[1]))
    return TO_OWN_GROUP if kept == TO_OWN_GROUP else kept


@lru_cache(maxsize=65536)
def _rejoin_flow(cookie_value: int, source: str, group: str, acts: tuple, edge: tuple[int, ...] = ()
                 ) -> tuple[bytes, bytes]:
    """A group's rejoin flow add around its in_port and tag (what differs per link): ~10^5
    of them for 1000 groups, mostly with the same actions. ``acts`` as kept
    (``rejoin_actions``)."""
    acts = rejoin_actions(acts, group, cookie_value & ~COOKIE_MASK, edge)
    wire = _flow_add(0, cookie_value, PRIO_DETOUR, 0, _tag_oxm("00:00:00:00:00:00"),
                     _sg_oxm(source, group), _apply(acts))._wire
    return wire[:_IN_PORT_AT], wire[_IN_PORT_AT + 4 + len(_OXM_ETH_DST) + 6:]


def detour_flow(dpid: int, cookie_value: int, in_port: int, tag: str, acts: tuple,
                source: str | None = None, group: str | None = None, priority: int = PRIO_DETOUR,
                edge: tuple[int, ...] = ()) -> Msg:
    """A shared flow (``source`` None: cookie ``COOKIE_DETOUR``, a transit flow or, at
    ``PRIO_REJOIN``, a link's rejoin) or a group's rejoin flow (cookie of the group,
    ``acts`` as kept: ``rejoin_actions``) for copies tagged ``tag`` arriving on ``in_port``."""
    if source is None:
        return _flow_add(dpid, cookie_value, priority, in_port, _tag_oxm(tag), _TRANSIT_OXM, _apply(acts))
    head, tail = _rejoin_flow(cookie_value, source, group, acts, edge)
    m = _new(ReadyFlowMod)
    m._dpid, m.xid = dpid, None
    m._wire = head + _PORT.pack(in_port) + _tag_oxm(tag) + tail
    return m


_GROUP_HEAD = struct.Struct("!BBHIHBx")  # a group-mod before its group id
_ADD_PARTS: dict[tuple, tuple[bytes, bytes]] = {}  # (in_port, out_ports, ff, edge) -> around the gid
_MAX_PARTS = 1 << 16


def _add_parts(key: tuple) -> tuple[bytes, bytes]:
    """An ALL group add of entry ``key`` (in_port, out_ports, ff, edge) before and after
    its group id: the same for every group with that entry on any switch."""
    if len(_ADD_PARTS) >= _MAX_PARTS:
        _ADD_PARTS.clear()
    body = _shared_buckets(*key)
    parts = _ADD_PARTS[key] = (_GROUP_HEAD.pack(ofp.OFP_VERSION, ofp.OFPT_GROUP_MOD, ofp.OFP_GROUP_MOD_SIZE
                                                + len(body), 0, ofp.OFPGC_ADD, ofp.OFPGT_ALL), body)
    return parts


def edge_ports(ends: Iterable[tuple[int, int]]) -> dict[int, tuple[int, ...]]:
    """Switch -> its ports towards receivers (sorted), from a tree's (switch, port) ends:
    the buckets that take the version tag off."""
    out: dict[int, list[int]] = {}
    for dpid, port in ends:
        out.setdefault(dpid, []).append(port)
    return {d: tuple(sorted(ports)) for d, ports in out.items()}


def tree_adds(gid: int, source: str, group: str, dpids: Iterable[int], entries: dict[int, tuple],
                 out: list[tuple[int, Msg]], edge: dict[int, tuple[int, ...]], root: int | None,
                 color: int) -> None:
    """Appends to ``out`` what switches holding nothing of group ``gid`` must be sent
    for their ``entries`` (``SwitchEntry`` per dpid; those of ``dpids``, in that order):
    per switch ``group_add`` (``edge``: its ports towards hosts), ``flow_add`` (at
    ``root``, ``ingress_add`` stamping ``color``) and, with a rejoin, ``detour_flow``,
    byte for byte, in one loop. A new tree is ~100 switches and ~300 messages; one call
    per message and a cache lookup per piece was most of building them."""
    sg_head, sg_tail = _sg_flow(gid, source, group)
    sg_pack, port, gid_bytes = _SG_FLOW.pack, _PORT.pack, _PORT.pack(gid)
    parts_of, tags, edge_of = _ADD_PARTS.get, TAGS.get, edge.get
    ck = COOKIE_TAG | gid
    last: tuple | None = None  # the last rejoin's actions and their flow's bytes around in_port and tag
    head = tail = b""
    new, group_cls, flow_cls, add = _new, ReadyGroupMod, ReadyFlowMod, out.append
    for dpid in dpids:
        e = entries[dpid]
        key = (e[0], e[1], e[2], edge_of(dpid, ()))
        parts = parts_of(key)
        if parts is None:
            parts = _add_parts(key)
        m = new(group_cls)
        m._dpid, m.xid = dpid, None
        m._wire = parts[0] + gid_bytes + parts[1]
        add((dpid, m))
        if dpid == root:
            add((dpid, ingress_add(dpid, gid, e[0], source, group, color)))
        else:
            m = new(flow_cls)
            m._dpid, m.xid = dpid, None
            m._wire = sg_pack(sg_head, e[0], sg_tail)
            add((dpid, m))
        rejoin = e[3]
        if rejoin:
            arrival, link_tag, acts = rejoin
            if acts is not last or dpid in edge:  # (a group's rejoins mostly share one action list)
                head, tail = _rejoin_flow(ck, source, group, acts, edge_of(dpid, ()))
                last = acts
            tlv = tags(link_tag)
            if tlv is None:
                tlv = tag_tlv(link_tag)
            m = new(flow_cls)
            m._dpid, m.xid = dpid, None
            m._wire = b"".join((head, port(arrival), tlv, tail))
            add((dpid, m))


TAGS: dict[str, bytes] = {}  # link tag -> its eth_dst TLV (one per protected link port)


def tag_tlv(link_tag: str) -> bytes:
    """A link tag's TLV, kept in ``TAGS`` (bounded)."""
    if len(TAGS) >= _MAX_PARTS:
        TAGS.clear()
    tlv = TAGS[link_tag] = _tag_oxm(link_tag)
    return tlv


def detour_flow_delete(dpid: int, cookie_value: int, in_port: int, tag: str,
                       source: str | None = None, group: str | None = None, priority: int = PRIO_DETOUR) -> Msg:
    return _flow_delete(dpid, cookie_value, priority, _detour_match(in_port, tag, source, group))


def cookie_delete(dpid: int, gid: int) -> Msg:
    """Every flow of group ``gid`` (a group the controller no longer has)."""
    return parser.OFPFlowMod(datapath(dpid), cookie=cookie(gid), cookie_mask=FULL_MASK,
                             table_id=TABLE, command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY, match=parser.OFPMatch())


@lru_cache(maxsize=65536)  # (every re-protection of a group's entries asks again)
def multicast_mac(group: str) -> str:
    """RFC 1112: 01:00:5e + the low 23 bits of the group address."""
    a = [int(x) for x in group.split(".")]
    return f"01:00:5e:{a[1] & 0x7F:02x}:{a[2]:02x}:{a[3]:02x}"


PUNT_METER = 1  # the meter on every flow of ours that sends frames to the controller
LLDP_METER = 2  # the same for link discovery frames: a flood of those cannot starve the rest
QUARANTINE_METER = 3  # frames to the controller from quarantined host ports (controller.punt)
METERS = (PUNT_METER, LLDP_METER, QUARANTINE_METER)
PRIO_QUARANTINE_LLDP = 0xFFFF  # table 0: a quarantined port's discovery frames
PRIO_LLDP = 0xFFFE  # table 0: discovery frames to the controller
PRIO_QUARANTINE = 10  # both tables: a quarantined port's misses (above PRIO_MISS only)
COOKIE_QUARANTINE = COOKIE_TAG | (1 << 44)  # (expire by themselves; the audit leaves them)
LLDP_DST = "01:80:c2:00:00:0e"
ETH_LLDP = 0x88CC


def punt_meter(dpid: int, rate: int, meters: Iterable[int] = METERS, port_rate: int = 0) -> list[Msg]:
    """The switch's punt meters at ``rate`` frames/s each, ``QUARANTINE_METER`` at
    ``port_rate`` (none when 0) (bursts of twice that pass), before the flows that use
    them: an add (a switch that has one answers METER_EXISTS, which ``benign_error``
    tells the app to ignore) and a modify (the rate of this run). A meter cannot be
    replaced otherwise: deleting it deletes the flows that use it."""
    if rate <= 0:
        return []
    flags = ofp.OFPMF_PKTPS | ofp.OFPMF_BURST
    out = []
    for m in meters:
        r = port_rate if m == QUARANTINE_METER else rate
        if r > 0:
            bands = [parser.OFPMeterBandDrop(rate=r, burst_size=2 * r)]
            out += [parser.OFPMeterMod(datapath(dpid), command=cmd, flags=flags, meter_id=m, bands=bands)
                    for cmd in (ofp.OFPMC_ADD, ofp.OFPMC_MODIFY)]
    return out


def _to_controller(meter: int | None) -> list:
    """Instructions sending a frame to the controller, through ``meter`` if any."""
    out = parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [
        parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])
    return [out] if meter is None else [parser.OFPInstructionMeter(meter), out]


def quarantine_flows(dpid: int, port: int, port_rate: int, hold_s: int) -> list[Msg]:
    """Host port ``port`` sent the controller more than its share (``controller.punt``):
    for ``hold_s`` its frames to the controller -- discovery frames, membership reports,
    unknown sources, unknown destinations -- pass ``QUARANTINE_METER`` instead of the
    switch's meters, so it cannot crowd out the other ports' (their hosts are still
    learned, the switch's links still found). Its frames that other flows forward are
    not touched. The meter is re-added first (a switch that has it answers
    METER_EXISTS: benign)."""
    dp = datapath(dpid)
    to_ctrl = _to_controller(QUARANTINE_METER)

    def add(table: int, prio: int, match: parser.OFPMatch) -> Msg:
        return parser.OFPFlowMod(dp, cookie=COOKIE_QUARANTINE, table_id=table, command=ofp.OFPFC_ADD,
                                 priority=prio, hard_timeout=hold_s, match=match, instructions=to_ctrl)

    return punt_meter(dpid, port_rate, (QUARANTINE_METER,), port_rate)[:1] + [
        add(TABLE, PRIO_QUARANTINE_LLDP, parser.OFPMatch(in_port=port, eth_type=ETH_LLDP)),
        add(TABLE, PRIO_IGMP + 1, parser.OFPMatch(in_port=port, eth_type=ETH_IPV4, ip_proto=IPPROTO_IGMP)),
        add(TABLE, PRIO_QUARANTINE, parser.OFPMatch(in_port=port)),
        add(TABLE_DST, PRIO_QUARANTINE, parser.OFPMatch(in_port=port)),
    ]


def benign_error(err_type: int, code: int, meter_id: int | None) -> bool:
    """An error that only says a punt meter is already there (``punt_meter``'s add on a
    switch that kept its tables)."""
    return (err_type == ofp.OFPET_METER_MOD_FAILED and code == ofp.OFPMMFC_METER_EXISTS
            and meter_id in METERS)


def meter_of_error(data: bytes) -> int | None:
    """The meter id of the meter-mod an OFPT_ERROR quotes (its ``data``: the request's
    first bytes: header, command, flags, meter id)."""
    return int.from_bytes(data[12:16], "big") if len(data) >= 16 else None


def meter_of(msg: Any) -> int | None:
    """The meter a flow-mod sends through, if any."""
    return next((ins.meter_id for ins in getattr(msg, "instructions", ())
                 if isinstance(ins, parser.OFPInstructionMeter)), None)


def base_flows(dpid: int, metered: bool = False) -> list[Msg]:
    """Installed when a switch connects: IGMP to the controller; in the source table,
    unknown sources to the controller; in the destination table, unknown SSM traffic
    dropped (multicast is never flooded) and unknown destinations to the controller for
    unicast forwarding; and link discovery frames to the controller (Ryu's topology app
    is told not to install its own). ``metered``: the frames to the controller pass the
    switch's ``PUNT_METER``, discovery frames its ``LLDP_METER`` (``punt_meter`` first)."""
    dp = datapath(dpid)
    to_ctrl = _to_controller(PUNT_METER if metered else None)
    lldp = _to_controller(LLDP_METER if metered else None)

    def add(table: int, prio: int, match: parser.OFPMatch, inst: list) -> Msg:
        return parser.OFPFlowMod(dp, cookie=COOKIE_TAG, table_id=table, command=ofp.OFPFC_ADD,
                                 priority=prio, match=match, instructions=inst,
                                 flags=ofp.OFPFF_SEND_FLOW_REM)

    return [
        add(TABLE, PRIO_LLDP, parser.OFPMatch(eth_type=ETH_LLDP, eth_dst=LLDP_DST), lldp),
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
