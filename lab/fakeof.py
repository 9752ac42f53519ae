"""A simulated OpenFlow 1.3 fabric: switches that apply the controller's real Ryu messages
with OF1.3 semantics, wired as a ``Topology``, so tests can *trace a packet* and assert
where copies arrive instead of asserting that some flow exists.

The idea follows faucet's ``clib/fakeoftable.py``; unlike it, group types are simulated
as the spec says (fast-failover takes the first live bucket, not every bucket), and a
switch answers malformed requests with the ``OFError`` a real switch would send.

Behaviour worth knowing (each is tested in ``test_fakeof.py``):

* Lookup: highest priority wins; among *equal-priority overlapping* entries the one
  installed first wins (OF1.3 leaves this undefined; an ADD that replaces an entry with
  the same match and priority keeps the old entry's position).
* ``DELETE``/``DELETE_STRICT`` honour ``out_port``/``out_group`` literally, as OVS does:
  only ``OFPP_ANY``/``OFPG_ANY`` mean "no filter". Ryu's defaults are 0, so a delete built
  without them removes nothing here, exactly as on a real switch.
* A flow or bucket naming a group that does not exist is refused (``OFPBAC_BAD_OUT_GROUP``);
  ipv4/ip_proto matches without the matching ``eth_type`` are refused (``OFPBMC_BAD_PREREQ``).
* A packet is never sent back out its ingress port unless the action says ``OFPP_IN_PORT``.
* Two Nicira actions are modelled as Open vSwitch runs them: ``move`` (bits of one
  modelled field into another) and ``resubmit`` (a lookup in a table as if the packet had
  come in on another port -- for the lookup only: OVS restores the real ingress before
  the entry's actions run, so they never output there without ``OFPP_IN_PORT``; header
  changes made by them stay); and ``load`` into NXM_OF_IN_PORT, which changes the ingress
  for what follows (outputs to the real one are then allowed; OVS refuses the same as an
  OpenFlow set-field, and so does this switch).
* SELECT groups pick the first live bucket (deterministic, where a real switch hashes).
* Messages sent to a switch that is down are discarded (the connection is gone) and
  counted in ``FakeFabric.discarded``; a switch coming back up has empty tables.
* Flow-stats and group-desc requests are answered (``FakeSwitch.request``) in parts of
  ``reply_part_size`` entries, all but the last flagged ``OFPMPF_REPLY_MORE``; flow stats
  honour table, cookie/mask, match and out_port/out_group like a delete does.
  ``FakeFabric.connect`` drives the controller's reconnect state machine against a switch.
"""

from __future__ import annotations

import collections
import ipaddress
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple

from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller import ofmsgs
from topologies.spec import Host, Topology

if TYPE_CHECKING:  # the controller's reconnect state machine, driven by ``FakeFabric.connect``
    from controller.reconnect import Reconciled, Reconnect

# --------------------------------------------------------------------------- errors

_CODE_PREFIX = {
    ofp.OFPET_BAD_REQUEST: "OFPBRC_",
    ofp.OFPET_BAD_ACTION: "OFPBAC_",
    ofp.OFPET_BAD_INSTRUCTION: "OFPBIC_",
    ofp.OFPET_BAD_MATCH: "OFPBMC_",
    ofp.OFPET_FLOW_MOD_FAILED: "OFPFMFC_",
    ofp.OFPET_GROUP_MOD_FAILED: "OFPGMFC_",
}


def _const_name(prefix: str, value: int) -> str:
    for name in dir(ofp):
        if name.startswith(prefix) and getattr(ofp, name) == value:
            return name
    return str(value)


class OFError(Exception):
    """What a real switch would answer with an OFPT_ERROR; ``type``/``code`` are the
    ``ofp.OFPET_*`` / per-type code constants so tests compare against the spec's names."""

    def __init__(self, type: int, code: int, detail: str = "", dpid: int | None = None,
                 meter_id: int | None = None) -> None:
        self.type = type
        self.code = code
        self.detail = detail
        self.dpid = dpid
        self.meter_id = meter_id  # the meter a meter-mod error is about
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"dpid {self.dpid}: " if self.dpid is not None else ""
        prefix = _CODE_PREFIX.get(self.type)
        code = _const_name(prefix, self.code) if prefix else str(self.code)
        return (f"{where}{_const_name('OFPET_', self.type)}/{code}"
                + (f": {self.detail}" if self.detail else ""))

    def __repr__(self) -> str:
        return f"OFError({self})"


# --------------------------------------------------------------------------- match fields

_IPV4_FIELDS = ("ipv4_src", "ipv4_dst")
_MAC_FIELDS = ("eth_src", "eth_dst")
_WIDTH = {"in_port": 32, "eth_type": 16, "ip_proto": 8, "ipv4_src": 32, "ipv4_dst": 32,
          "eth_src": 48, "eth_dst": 48, "vlan_vid": 13}
#: Fields a traced packet carries; a flow matching any other field never matches it.
MODELLED_FIELDS = frozenset(_WIDTH)
_SETTABLE = frozenset(("ipv4_src", "ipv4_dst", "eth_src", "eth_dst", "ip_proto", "vlan_vid"))


def _to_int(fname: str, value: Any) -> int:
    if fname in _IPV4_FIELDS:
        return int(ipaddress.IPv4Address(value))
    if fname in _MAC_FIELDS:
        return int(str(value).replace(":", "").replace("-", ""), 16)
    return int(value)


def _from_int(fname: str, value: int) -> Any:
    if fname in _IPV4_FIELDS:
        return str(ipaddress.IPv4Address(value))
    if fname in _MAC_FIELDS:
        return ":".join(f"{b:02x}" for b in value.to_bytes(6, "big"))
    return value


def _compile(fname: str, value: Any) -> tuple[Any, int | None]:
    """Field value as ``(int value, int mask)``; unmodelled fields as ``(raw, None)``, which
    only ever compare by equality."""
    if fname not in _WIDTH:
        return (value, None)
    full = (1 << _WIDTH[fname]) - 1
    if isinstance(value, tuple):
        val, mask = _to_int(fname, value[0]), _to_int(fname, value[1])
    else:
        val, mask = _to_int(fname, value), full
    return (val & mask, mask)


def _readable(fname: str, compiled: tuple[Any, int | None]) -> Any:
    """Canonical readable form stored in ``FlowEntry.match``: equal semantics, equal value."""
    val, mask = compiled
    if mask is None:
        return val
    if mask == (1 << _WIDTH[fname]) - 1:
        return _from_int(fname, val)
    return (_from_int(fname, val), _from_int(fname, mask))


def _normalise_match(match: Any) -> dict[str, Any]:
    if match is None:
        return {}
    items = match.items() if hasattr(match, "items") else dict(match).items()
    return {k: _readable(k, _compile(k, v)) for k, v in items}


def _check_prereqs(match: dict[str, Any]) -> None:
    """OF1.3 §7.2.3.6: ipv4 fields need eth_type=IPv4, ip_proto needs an IP eth_type."""
    eth_type = match.get("eth_type")
    if any(f in match for f in _IPV4_FIELDS) and eth_type != 0x0800:
        raise OFError(ofp.OFPET_BAD_MATCH, ofp.OFPBMC_BAD_PREREQ,
                      f"ipv4 match without eth_type=0x0800: {match}")
    if "ip_proto" in match and eth_type not in (0x0800, 0x86DD):
        raise OFError(ofp.OFPET_BAD_MATCH, ofp.OFPBMC_BAD_PREREQ,
                      f"ip_proto match without an IP eth_type: {match}")


def _packet_matches(match: dict[str, Any], pkt: dict[str, int]) -> bool:
    for fname, value in match.items():
        if fname not in pkt:
            return False
        val, mask = _compile(fname, value)
        if mask is None or (pkt[fname] & mask) != val:
            return False
    return True


def _covers(general: dict[str, Any], specific: dict[str, Any]) -> bool:
    """True if every packet matching ``specific`` matches ``general`` (non-strict
    MODIFY/DELETE select entries this way)."""
    for fname, value in general.items():
        if fname not in specific:
            return False
        gv, gm = _compile(fname, value)
        sv, sm = _compile(fname, specific[fname])
        if gm is None or sm is None:
            if (gv, gm) != (sv, sm):
                return False
        elif (sm & gm) != gm or (sv & gm) != gv:
            return False
    return True


def _overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    for fname in a.keys() & b.keys():
        av, am = _compile(fname, a[fname])
        bv, bm = _compile(fname, b[fname])
        if am is None or bm is None:
            if (av, am) != (bv, bm):
                return False
        elif (av & am & bm) != (bv & am & bm):
            return False
    return True


# --------------------------------------------------------------------------- actions

Action = tuple  # ("output", port) | ("group", group_id) | ("set_field", field, value) |
#                 ("move", src, src_ofs, dst, dst_ofs, n_bits) | ("resubmit", in_port, table) |
#                 ("push_vlan", ethertype) | ("pop_vlan",)
# A packet's ``vlan_vid`` (OFPVID_PRESENT | id) is there only while it carries a tag.
Instruction = tuple  # ("apply", actions) | ("write", actions) | ("clear", ()) | ("goto", table) | ("meter", id)

_RESERVED_OUT = frozenset((ofp.OFPP_IN_PORT, ofp.OFPP_FLOOD, ofp.OFPP_ALL, ofp.OFPP_CONTROLLER))
_UNMODELLED_OUT = {ofp.OFPP_TABLE: "OFPP_TABLE", ofp.OFPP_NORMAL: "OFPP_NORMAL",
                   ofp.OFPP_LOCAL: "OFPP_LOCAL"}


def _normalise_actions(actions: Iterable[Any] | None) -> tuple[Action, ...]:
    out: list[Action] = []
    for act in actions or ():
        if isinstance(act, parser.OFPActionOutput):
            port = act.port
            if port in _UNMODELLED_OUT:
                raise TypeError(f"fake fabric does not model output to {_UNMODELLED_OUT[port]}")
            if port == 0 or (port > ofp.OFPP_MAX and port not in _RESERVED_OUT):
                raise OFError(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT, f"output to {port:#x}")
            out.append(("output", port))
        elif isinstance(act, parser.OFPActionGroup):
            out.append(("group", act.group_id))
        elif isinstance(act, parser.OFPActionPushVlan):
            if act.ethertype not in (0x8100, 0x88A8):
                raise OFError(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_ARGUMENT, f"push_vlan {act.ethertype:#x}")
            out.append(("push_vlan", act.ethertype))
        elif isinstance(act, parser.OFPActionPopVlan):
            out.append(("pop_vlan",))
        elif isinstance(act, parser.OFPActionSetField):
            if act.key == "vlan_vid" and not act.value & ofp.OFPVID_PRESENT:  # (as OVS answers it)
                raise OFError(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_SET_ARGUMENT, "set_field vlan_vid without OFPVID_PRESENT")
            if act.key == "in_port":  # (as OVS answers an OpenFlow set-field of it)
                raise OFError(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_SET_ARGUMENT, "set_field in_port")
            if act.key not in _SETTABLE:
                raise TypeError(f"fake fabric does not model set_field {act.key}")
            out.append(("set_field", act.key, _readable(act.key, _compile(act.key, act.value))))
        elif isinstance(act, parser.NXActionRegMove):
            for fname, ofs in ((act.src_field, act.src_ofs), (act.dst_field, act.dst_ofs)):
                if fname not in _WIDTH or fname == "in_port":
                    raise TypeError(f"fake fabric does not model move with {fname}")
                if act.n_bits < 1 or ofs + act.n_bits > _WIDTH[fname]:
                    raise OFError(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_ARGUMENT,
                                  f"move of {act.n_bits} bits at {ofs} in {fname}")
            out.append(("move", act.src_field, act.src_ofs, act.dst_field, act.dst_ofs, act.n_bits))
        elif isinstance(act, parser.NXActionRegLoad):
            if act.dst != "in_port_nxm" or act.ofs_nbits != 15:
                raise TypeError(f"fake fabric does not model load into {act.dst} ({act.ofs_nbits:#x})")
            out.append(("set_field", "in_port", act.value))
        elif isinstance(act, parser.NXActionResubmitTable):
            if act.table_id == 0xFF:  # (OVS: "the current table"; ours always name one)
                raise TypeError("fake fabric does not model resubmit to the current table")
            out.append(("resubmit", act.in_port, act.table_id))
        else:
            raise TypeError(f"fake fabric does not model action {type(act).__name__}")
    return tuple(out)


_INSTRUCTION_ORDER = {"meter": -1, "apply": 0, "clear": 1, "write": 2, "goto": 3}  # OF1.3 §5.9


def _normalise_instructions(instructions: Iterable[Any] | None) -> tuple[Instruction, ...]:
    out: list[Instruction] = []
    for ins in instructions or ():
        if isinstance(ins, parser.OFPInstructionActions):
            kind = {ofp.OFPIT_APPLY_ACTIONS: "apply", ofp.OFPIT_WRITE_ACTIONS: "write",
                    ofp.OFPIT_CLEAR_ACTIONS: "clear"}[ins.type]
            out.append((kind, _normalise_actions(ins.actions)))
        elif isinstance(ins, parser.OFPInstructionGotoTable):
            out.append(("goto", ins.table_id))
        elif isinstance(ins, parser.OFPInstructionMeter):
            out.append(("meter", ins.meter_id))  # (rates are not modelled: every frame passes)
        else:
            raise TypeError(f"fake fabric does not model instruction {type(ins).__name__}")
    kinds = [i[0] for i in out]
    if len(set(kinds)) != len(kinds):
        raise OFError(ofp.OFPET_BAD_INSTRUCTION, ofp.OFPBIC_DUP_INST, f"{kinds}")
    return tuple(sorted(out, key=lambda i: _INSTRUCTION_ORDER[i[0]]))


def _actions_of(instructions: Iterable[Instruction]) -> Iterable[Action]:
    for kind, payload in instructions:
        if kind in ("apply", "write"):
            yield from payload


_INSTRUCTION_TYPE = {"apply": ofp.OFPIT_APPLY_ACTIONS, "write": ofp.OFPIT_WRITE_ACTIONS,
                     "clear": ofp.OFPIT_CLEAR_ACTIONS}


def _parser_instructions(instructions: Iterable[Instruction]) -> list[Any]:
    return [parser.OFPInstructionGotoTable(payload) if kind == "goto"
            else parser.OFPInstructionMeter(payload) if kind == "meter"
            else parser.OFPInstructionActions(_INSTRUCTION_TYPE[kind], ofmsgs.actions(payload))
            for kind, payload in instructions]


def _sort_key(obj: Any) -> str:
    return repr(obj)


# --------------------------------------------------------------------------- tables

class FlowEntry(NamedTuple):
    """One installed flow. ``match`` holds canonical readable values ('10.0.0.1', or
    (value, mask) when masked); ``instructions`` are normalised tuples such as
    ``(("apply", (("group", 7),)),)`` so tests can read them and snapshots can compare them."""

    priority: int
    match: dict[str, Any]
    instructions: tuple[Instruction, ...]
    cookie: int
    table_id: int
    idle_timeout: int = 0  # time is not modelled: ``FakeSwitch.expire_idle`` acts it out
    flags: int = 0

    def key(self) -> tuple:
        return (self.table_id, self.priority, tuple(sorted(self.match.items())),
                self.instructions, self.cookie)


class Bucket(NamedTuple):
    actions: tuple[Action, ...]
    watch_port: int = ofp.OFPP_ANY
    watch_group: int = ofp.OFPG_ANY
    weight: int = 0


class GroupEntry(NamedTuple):
    type: int
    buckets: tuple[Bucket, ...]


@dataclass
class _Result:
    """What one switch did with one packet: (port, packet) outputs before port resolution."""

    outputs: list[tuple[int, dict[str, int]]] = field(default_factory=list)
    misses: int = 0
    notes: list[str] = field(default_factory=list)
    meters: list[int] = field(default_factory=list)  # the meters it passed, in order


class FakeSwitch:
    """Flow and group tables of one switch, changed only through OpenFlow messages.

    ``port_live`` tells fast-failover/select groups whether a watched port is up; the
    fabric supplies it, a standalone switch treats every port as live. ``nicira`` False:
    a switch that is not Open vSwitch, without its Nicira actions (move, load,
    resubmit): it refuses them as an OpenFlow 1.3 switch refuses an unknown
    experimenter's action, and describes itself (OFPMP_DESC) as another vendor's.
    ``fast_failover`` False: it has no OFPGT_FF groups (optional in OpenFlow 1.3), refuses
    them (bad type) and says so in its group features. ``meters`` False: no meters
    (optional too): a meter-mod is refused (out of meters), its meter features say 0."""

    #: what Open vSwitch 3.1 answers to OFPMP_DESC (mfr, hw, sw, serial, dp) as Ryu parses
    #: it (bytes), and a switch without Nicira actions
    OVS_DESC = (b"Nicira, Inc.", b"Open vSwitch", b"3.1.0", b"None", b"None")
    PLAIN_DESC = (b"Example Networks", b"OF-1.3 ASIC switch", b"1.0", b"0001", b"plain")
    reports_group_types = True  # (False: its group features leave the types bitmap 0, as some switches do)

    _IGNORED = (parser.OFPBarrierRequest, parser.OFPEchoRequest, parser.OFPFeaturesRequest,
                parser.OFPGetConfigRequest, parser.OFPSetConfig, parser.OFPSetAsync,
                parser.OFPGetAsyncRequest, parser.OFPRoleRequest, parser.OFPMultipartRequest)

    def __init__(self, dpid: int, port_live: Callable[[int], bool] | None = None, nicira: bool = True,
                 fast_failover: bool = True, meters: bool = True) -> None:
        self.dpid = dpid
        self.nicira = nicira
        self.has_meters = meters
        self.max_meter = 65536 if meters else 0  # (what its meter features say)
        # the group types it has (OFPMP_GROUP_FEATURES): fast failover is optional in OF1.3
        self.group_types = (ofp.OFPGT_ALL, ofp.OFPGT_SELECT, ofp.OFPGT_INDIRECT) + (
            (ofp.OFPGT_FF,) if fast_failover else ())
        self.flows: list[FlowEntry] = []
        self.groups: dict[int, GroupEntry] = {}
        self.meters: dict[int, tuple] = {}  # meter id -> (flags, ((band type, rate, burst), ...))
        # packets counted as ``process`` runs them (every packet ``PACKET_BYTES`` long): per
        # flow (by ``FlowEntry.key``), per group and per bucket, as flow and group stats say
        self.flow_packets: collections.Counter = collections.Counter()
        self.group_packets: collections.Counter = collections.Counter()
        self.bucket_packets: collections.Counter = collections.Counter()  # (gid, bucket index) -> packets
        self.up = True
        self._port_live = port_live or (lambda port: True)

    def reset(self) -> None:
        """Empty every table, as a rebooted switch is."""
        self.flows = []
        self.groups = {}
        self.meters = {}
        for counts in (self.flow_packets, self.group_packets, self.bucket_packets):
            counts.clear()

    # ---- messages

    def apply(self, msg: Any) -> None:
        """Apply one message atomically: on ``OFError`` the tables are unchanged."""
        try:
            if isinstance(msg, parser.OFPFlowMod):
                self._flow_mod(msg)
            elif isinstance(msg, parser.OFPGroupMod):
                self._group_mod(msg)
            elif isinstance(msg, parser.OFPMeterMod):
                self._meter_mod(msg)
            elif isinstance(msg, self._IGNORED):
                return
            else:
                raise TypeError(f"fake switch does not model {type(msg).__name__}")
        except OFError as err:
            err.dpid = self.dpid
            raise

    def _check_actions(self, actions: Iterable[Action], groups: dict[int, GroupEntry]) -> None:
        """Refuse what this switch would: Nicira actions on a plain switch, a missing group."""
        actions = tuple(actions)
        if not self.nicira:
            for a in actions:
                if a[0] in ("move", "resubmit") or a[:2] == ("set_field", "in_port"):
                    raise OFError(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_EXPERIMENTER, f"Nicira action {a[0]}")
        for act in actions:
            if act[0] == "group" and act[1] not in groups:
                raise OFError(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_GROUP,
                              f"group {act[1]} does not exist")

    def _selected(self, msg: Any, match: dict[str, Any], strict: bool,
                  out_filters: bool) -> list[int]:
        """Indices of entries a MODIFY/DELETE or a flow-stats request addresses (table,
        match, cookie and, for deletes and stats, the out_port/out_group filters)."""
        hits = []
        for i, entry in enumerate(self.flows):
            if msg.table_id != ofp.OFPTT_ALL and entry.table_id != msg.table_id:
                continue
            if (entry.cookie & msg.cookie_mask) != (msg.cookie & msg.cookie_mask):
                continue
            if strict:
                if entry.priority != msg.priority or entry.match != match:
                    continue
            elif not _covers(match, entry.match):
                continue
            if out_filters:
                acts = list(_actions_of(entry.instructions))
                if msg.out_port != ofp.OFPP_ANY and ("output", msg.out_port) not in acts:
                    continue
                if msg.out_group != ofp.OFPG_ANY and ("group", msg.out_group) not in acts:
                    continue
            hits.append(i)
        return hits

    def _flow_mod(self, msg: Any) -> None:
        match = _normalise_match(msg.match)
        _check_prereqs(match)
        cmd = msg.command
        if cmd in (ofp.OFPFC_DELETE, ofp.OFPFC_DELETE_STRICT):
            doomed = set(self._selected(msg, match, cmd == ofp.OFPFC_DELETE_STRICT, True))
            self.flows = [e for i, e in enumerate(self.flows) if i not in doomed]
            return
        if cmd not in (ofp.OFPFC_ADD, ofp.OFPFC_MODIFY, ofp.OFPFC_MODIFY_STRICT):
            raise OFError(ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_BAD_COMMAND, f"command {cmd}")
        if msg.table_id > ofp.OFPTT_MAX:
            raise OFError(ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_BAD_TABLE_ID,
                          f"table {msg.table_id} is only valid for deletes")
        instructions = _normalise_instructions(msg.instructions)
        for kind, payload in instructions:
            if kind == "goto" and payload <= msg.table_id:
                raise OFError(ofp.OFPET_BAD_INSTRUCTION, ofp.OFPBIC_BAD_TABLE_ID,
                              f"goto {payload} from table {msg.table_id}")
        self._check_actions(_actions_of(instructions), self.groups)
        for act in _actions_of(instructions):  # (as OVS: a move needs its fields' prerequisites)
            if act[0] == "move" and {act[1], act[3]} & set(_IPV4_FIELDS) and match.get("eth_type") != 0x0800:
                raise OFError(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_MATCH_INCONSISTENT,
                              f"move {act[1]}->{act[3]} without eth_type=0x0800 in {match}")
        for kind, payload in instructions:
            if kind == "meter" and payload not in self.meters:
                raise OFError(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_UNKNOWN_METER,
                              f"flow uses meter {payload}", meter_id=payload)
        if cmd != ofp.OFPFC_ADD:
            # OF1.3: modify changes instructions only (cookie kept) and never adds.
            for i in self._selected(msg, match, cmd == ofp.OFPFC_MODIFY_STRICT, False):
                self.flows[i] = self.flows[i]._replace(instructions=instructions)
            return
        new = FlowEntry(msg.priority, match, instructions, msg.cookie, msg.table_id,
                        msg.idle_timeout, msg.flags)
        for i, entry in enumerate(self.flows):
            if (entry.table_id, entry.priority, entry.match) == (new.table_id, new.priority, match):
                self.flows[i] = new  # identical match+priority: replaced in place
                return
        if msg.flags & ofp.OFPFF_CHECK_OVERLAP:
            for entry in self.flows:
                if (entry.table_id == new.table_id and entry.priority == new.priority
                        and _overlaps(entry.match, match)):
                    raise OFError(ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_OVERLAP, f"{match}")
        self.flows.append(new)

    def _meter_mod(self, msg: Any) -> None:
        mid, cmd = msg.meter_id, msg.command
        if not self.has_meters:
            raise OFError(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_OUT_OF_METERS, "no meters", meter_id=mid)
        if cmd == ofp.OFPMC_DELETE:  # OF1.3 §5.7: the flows that use it go with it
            gone = set(self.meters) if mid == ofp.OFPM_ALL else {mid} & set(self.meters)
            for m in gone:
                del self.meters[m]
            self.flows = [e for e in self.flows if not any(k == "meter" and v in gone
                                                           for k, v in e.instructions)]
            return
        if cmd not in (ofp.OFPMC_ADD, ofp.OFPMC_MODIFY):
            raise OFError(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_BAD_COMMAND, f"command {cmd}", meter_id=mid)
        if cmd == ofp.OFPMC_ADD and mid in self.meters:
            raise OFError(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_METER_EXISTS, f"meter {mid}", meter_id=mid)
        if cmd == ofp.OFPMC_MODIFY and mid not in self.meters:
            raise OFError(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_UNKNOWN_METER, f"meter {mid}", meter_id=mid)
        self.meters[mid] = (msg.flags, tuple((b.type, b.rate, b.burst_size) for b in msg.bands))

    def _group_mod(self, msg: Any) -> None:
        gid, cmd = msg.group_id, msg.command
        if cmd == ofp.OFPGC_DELETE:
            gone = set(self.groups) if gid == ofp.OFPG_ALL else {gid} & set(self.groups)
            for g in gone:
                del self.groups[g]
            # OF1.3 §6.5: flows forwarding to a deleted group are removed too.
            self.flows = [e for e in self.flows
                          if not any(a[0] == "group" and a[1] in gone
                                     for a in _actions_of(e.instructions))]
            return
        if cmd not in (ofp.OFPGC_ADD, ofp.OFPGC_MODIFY):
            raise OFError(ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_COMMAND, f"command {cmd}")
        if gid > ofp.OFPG_MAX:
            raise OFError(ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_INVALID_GROUP, f"group {gid:#x}")
        if msg.type not in self.group_types:
            raise OFError(ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_TYPE, f"type {msg.type}")
        if cmd == ofp.OFPGC_ADD and gid in self.groups:
            raise OFError(ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_GROUP_EXISTS, f"group {gid}")
        if cmd == ofp.OFPGC_MODIFY and gid not in self.groups:
            raise OFError(ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_UNKNOWN_GROUP, f"group {gid}")
        buckets = tuple(Bucket(_normalise_actions(b.actions), b.watch_port, b.watch_group,
                               b.weight) for b in msg.buckets or ())
        if msg.type == ofp.OFPGT_INDIRECT and len(buckets) != 1:
            raise OFError(ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_INVALID_GROUP,
                          f"indirect group {gid} needs exactly one bucket, got {len(buckets)}")
        for b in buckets:
            self._check_actions(b.actions, self.groups)
            if b.watch_group != ofp.OFPG_ANY and b.watch_group not in self.groups:
                raise OFError(ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_INVALID_GROUP,
                              f"watch_group {b.watch_group} does not exist")
        self.groups[gid] = GroupEntry(msg.type, buckets)

    # ---- multipart requests

    #: entries per multipart reply part: small, so every reader meets OFPMPF_REPLY_MORE
    reply_part_size = 4
    PACKET_BYTES = 1000  # every traced packet's length, for byte counters

    def request(self, msg: Any) -> list[Any]:
        """Answer a flow-stats or group-desc request with its reply parts, every part but
        the last flagged ``OFPMPF_REPLY_MORE``, as a switch with a small buffer would; a
        description, group-features or meter-features request with its one reply."""
        if isinstance(msg, parser.OFPFlowStatsRequest):
            reply = parser.OFPFlowStatsReply
            body = [parser.OFPFlowStats(
                table_id=e.table_id, duration_sec=0, duration_nsec=0, priority=e.priority,
                idle_timeout=e.idle_timeout, hard_timeout=0, flags=e.flags, cookie=e.cookie,
                packet_count=self.flow_packets[e.key()],
                byte_count=self.flow_packets[e.key()] * self.PACKET_BYTES, match=parser.OFPMatch(**e.match),
                instructions=_parser_instructions(e.instructions))
                for e in (self.flows[i] for i in self._selected(
                    msg, _normalise_match(msg.match), False, True))]
        elif isinstance(msg, parser.OFPGroupFeaturesStatsRequest):
            types = sum(1 << t for t in self.group_types) if self.reports_group_types else 0
            return [parser.OFPGroupFeaturesStatsReply(msg.datapath, body=parser.OFPGroupFeaturesStats(
                types, ofp.OFPGFC_CHAINING, [0xFFFFFF00] * 4, [0] * 4), flags=0)]
        elif isinstance(msg, parser.OFPMeterFeaturesStatsRequest):
            return [parser.OFPMeterFeaturesStatsReply(msg.datapath, body=[parser.OFPMeterFeaturesStats(
                self.max_meter, 1 << ofp.OFPMBT_DROP, ofp.OFPMF_PKTPS | ofp.OFPMF_BURST, 1, 0)], flags=0)]
        elif isinstance(msg, parser.OFPDescStatsRequest):
            return [parser.OFPDescStatsReply(msg.datapath, body=parser.OFPDescStats(
                *(self.OVS_DESC if self.nicira else self.PLAIN_DESC)), flags=0)]
        elif isinstance(msg, parser.OFPGroupStatsRequest):
            reply = parser.OFPGroupStatsReply
            size = self.PACKET_BYTES
            body = [parser.OFPGroupStats(
                length=0, group_id=gid, ref_count=0, packet_count=self.group_packets[gid],
                byte_count=self.group_packets[gid] * size, duration_sec=0, duration_nsec=0,
                bucket_stats=[parser.OFPBucketCounter(self.bucket_packets[(gid, i)],
                                                      self.bucket_packets[(gid, i)] * size)
                              for i in range(len(g.buckets))])
                for gid, g in sorted(self.groups.items())
                if msg.group_id in (gid, ofp.OFPG_ALL)]
        elif isinstance(msg, parser.OFPGroupDescStatsRequest):
            reply = parser.OFPGroupDescStatsReply
            body = [parser.OFPGroupDescStats(g.type, gid, [
                parser.OFPBucket(b.weight, b.watch_port, b.watch_group, ofmsgs.actions(b.actions))
                for b in g.buckets]) for gid, g in sorted(self.groups.items())]
        else:
            raise TypeError(f"fake switch does not answer {type(msg).__name__}")
        n = self.reply_part_size
        parts = [body[i:i + n] for i in range(0, len(body), n)] or [[]]
        return [reply(msg.datapath, body=part,
                      flags=ofp.OFPMPF_REPLY_MORE if i < len(parts) - 1 else 0)
                for i, part in enumerate(parts)]

    def expire_idle(self, cookie: int | None = None) -> list[FlowEntry]:
        """Remove the entries that have an idle timeout (only those with ``cookie``, if
        given), as the switch does once they saw no packet for that long. Returns the ones
        flagged OFPFF_SEND_FLOW_REM: those the switch reports (OFPT_FLOW_REMOVED)."""
        gone = [e for e in self.flows if e.idle_timeout and cookie in (None, e.cookie)]
        self.flows = [e for e in self.flows if e not in gone]
        return [e for e in gone if e.flags & ofp.OFPFF_SEND_FLOW_REM]

    # ---- state

    def snapshot(self) -> tuple:
        """Tables as a comparable value, independent of installation order."""
        flows = tuple(sorted((e.key() for e in self.flows), key=_sort_key))
        return (flows, tuple(sorted(self.groups.items())))

    # ---- forwarding

    def _bucket_live(self, bucket: Bucket, depth: int = 0) -> bool:
        # As OVS does: a bucket watching nothing is live.
        if bucket.watch_port == ofp.OFPP_ANY and bucket.watch_group == ofp.OFPG_ANY:
            return True
        if bucket.watch_port != ofp.OFPP_ANY and self._port_live(bucket.watch_port):
            return True
        return bucket.watch_group != ofp.OFPG_ANY and self._group_live(bucket.watch_group, depth)

    def _group_live(self, gid: int, depth: int = 0) -> bool:
        group = self.groups.get(gid)
        if group is None or depth > 16:
            return False
        return any(self._bucket_live(b, depth + 1) for b in group.buckets)

    def _run_actions(self, actions: Iterable[Action], pkt: dict[str, int], res: _Result,
                     depth: int) -> None:
        for act in actions:
            kind = act[0]
            if kind == "output":
                res.outputs.append((act[1], dict(pkt)))
            elif kind == "group":
                self._run_group(act[1], dict(pkt), res, depth + 1)
            elif kind == "push_vlan":
                if "vlan_vid" in pkt:
                    res.notes.append(f"s{self.dpid}: a second VLAN tag pushed (not modelled): dropped")
                    return
                pkt["vlan_vid"] = ofp.OFPVID_PRESENT  # (OF1.3 §5.12: a new outermost tag, VID 0)
            elif kind == "pop_vlan":
                if "vlan_vid" not in pkt:  # (OVS: a no-op; a sign the tree's tagging is off)
                    res.notes.append(f"s{self.dpid}: pop_vlan on an untagged packet")
                pkt.pop("vlan_vid", None)
            elif kind == "set_field" and act[1] == "vlan_vid" and "vlan_vid" not in pkt:
                res.notes.append(f"s{self.dpid}: set_field vlan_vid on an untagged packet: ignored")
            elif kind == "move":
                _, src, src_ofs, dst, dst_ofs, n_bits = act  # (prerequisites checked when added)
                mask = (1 << n_bits) - 1
                pkt[dst] = pkt[dst] & ~(mask << dst_ofs) | ((pkt[src] >> src_ofs) & mask) << dst_ofs
            elif kind == "resubmit":
                if depth > 16:
                    res.notes.append(f"s{self.dpid}: resubmits too deep, dropped")
                    return
                self._pipeline(pkt, act[2], res, depth + 1,
                               None if act[1] == ofp.OFPP_IN_PORT else act[1])
            else:
                pkt[act[1]] = _compile(act[1], act[2])[0]

    def _run_group(self, gid: int, pkt: dict[str, int], res: _Result, depth: int) -> None:
        group = self.groups.get(gid)
        if group is None:
            res.notes.append(f"s{self.dpid}: group {gid} missing, dropped")
            return
        if depth > 16:
            res.notes.append(f"s{self.dpid}: group chain too deep at {gid}, dropped")
            return
        if group.type == ofp.OFPGT_ALL:
            chosen = list(range(len(group.buckets)))
        elif group.type == ofp.OFPGT_INDIRECT:
            chosen = [0][:len(group.buckets)]
        else:  # FF and SELECT: the first live bucket (SELECT: deterministic stand-in for hashing)
            chosen = [i for i, b in enumerate(group.buckets) if self._bucket_live(b)][:1]
            if not chosen:
                res.notes.append(f"s{self.dpid}: group {gid} has no live bucket, dropped")
        self.group_packets[gid] += 1
        for i in chosen:
            self.bucket_packets[(gid, i)] += 1
            b = group.buckets[i]
            self._run_actions(b.actions, dict(pkt), res, depth)

    def process(self, pkt: dict[str, int]) -> _Result:
        """Run one packet (``pkt['in_port']`` set) through the pipeline from table 0."""
        res = _Result()
        self._pipeline(dict(pkt), 0, res, 0)
        return res

    def _pipeline(self, pkt: dict[str, int], table: int, res: _Result, depth: int,
                  look_in_port: int | None = None) -> None:
        """The tables from ``table`` on, then the action set, for ``pkt`` (changed in place);
        ``look_in_port``: the first lookup as if it had come in there (a resubmit's)."""
        action_set: dict[Any, Action] = {}
        while True:
            entry = self._lookup(table, pkt if look_in_port is None else dict(pkt, in_port=look_in_port))
            look_in_port = None
            if entry is None:
                res.misses += 1
                res.notes.append(f"s{self.dpid}: table {table} miss for {describe(pkt)}")
                return
            self.flow_packets[entry.key()] += 1
            goto = None
            for kind, payload in entry.instructions:
                if kind == "meter":
                    res.meters.append(payload)  # (every frame passes: rates are not modelled)
                    continue
                if kind == "apply":
                    self._run_actions(payload, pkt, res, depth)
                elif kind == "clear":
                    action_set.clear()
                elif kind == "write":
                    for act in payload:
                        action_set[act[1] if act[0] == "set_field" else act[0]] = act
                else:
                    goto = payload
            if goto is None:
                break
            table = goto
        sets = [a for a in action_set.values() if a[0] == "set_field"]
        self._run_actions(sets, pkt, res, depth)
        if "group" in action_set:  # OF1.3 §5.10: a group in the set overrides output
            self._run_actions([action_set["group"]], pkt, res, depth)
        elif "output" in action_set:
            self._run_actions([action_set["output"]], pkt, res, depth)

    def _lookup(self, table: int, pkt: dict[str, int]) -> FlowEntry | None:
        best: FlowEntry | None = None
        for entry in self.flows:  # strict ">" keeps the first-installed among equals
            if entry.table_id == table and (best is None or entry.priority > best.priority) \
                    and _packet_matches(entry.match, pkt):
                best = entry
        return best


# --------------------------------------------------------------------------- fabric

def describe(pkt: dict[str, int]) -> str:
    return " ".join(f"{k}={_from_int(k, v)}" for k, v in sorted(pkt.items()))


@dataclass
class Trace:
    """Where the copies of one injected packet went."""

    #: host IP -> copies that reached its port (whatever their destination; the source too)
    delivered: collections.Counter[str] = field(default_factory=collections.Counter)
    #: host IP -> copies that reached it still carrying a VLAN tag (a tree's version tag
    #: must come off at every port towards a host; also counted in ``delivered``)
    tagged: collections.Counter[str] = field(default_factory=collections.Counter)
    #: directed (from dpid, to dpid) -> copies that crossed that link
    link_copies: collections.Counter[tuple[int, int]] = field(default_factory=collections.Counter)
    loops: bool = False
    dropped_at: list[int] = field(default_factory=list)
    #: dpid -> copies sent to OFPP_CONTROLLER (never counted as delivered)
    to_controller: collections.Counter[int] = field(default_factory=collections.Counter)
    #: (dpid, headers with in_port, readable values) of each copy sent to the controller:
    #: what its packet-in would carry
    punted: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    #: the meter each of ``punted`` passed on its switch (None: none)
    punt_meters: list[int | None] = field(default_factory=list)
    #: human-readable notes (drops, misses, loops): put ``trace.log`` in assert messages
    log: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Copy:
    dpid: int
    pkt: tuple[tuple[str, int], ...]  # includes in_port
    path: frozenset  # (dpid, pkt) pairs this copy's ancestors were processed at
    hops: int


class FakeFabric:
    """Switches of a ``Topology`` joined by its links, with hosts on their ports."""

    def __init__(self, topology: Topology, plain: Iterable[int] = (), no_ff: Iterable[int] = (),
                 no_meters: Iterable[int] = ()) -> None:
        """``plain``: the switches without Open vSwitch's Nicira actions, ``no_ff`` those
        without fast-failover groups, ``no_meters`` those without meters (``FakeSwitch``)."""
        self.topology = topology
        plain, no_ff, no_meters = set(plain), set(no_ff), set(no_meters)
        self.switches: dict[int, FakeSwitch] = {
            dpid: FakeSwitch(dpid, port_live=lambda port, d=dpid: self.port_live(d, port), nicira=dpid not in plain,
                             fast_failover=dpid not in no_ff, meters=dpid not in no_meters)
            for dpid in topology.switches}
        self.hosts: dict[str, Host] = {h.ip: h for h in topology.hosts}
        # (dpid, port) -> Host, or (peer dpid, peer port)
        self._attached: dict[tuple[int, int], Host | tuple[int, int]] = {}
        self._link_up: dict[frozenset[int], bool] = {}
        for link in topology.links:
            self._attached[(link.a, link.a_port)] = (link.b, link.b_port)
            self._attached[(link.b, link.b_port)] = (link.a, link.a_port)
            self._link_up[frozenset((link.a, link.b))] = True
        for h in topology.hosts:
            self._attached[(h.dpid, h.port)] = h
        #: dpid -> messages discarded because the switch was down
        self.discarded: collections.Counter[int] = collections.Counter()

    # ---- control

    def apply(self, dpid: int, msg: Any) -> None:
        sw = self.switches[dpid]
        if not sw.up:
            self.discarded[dpid] += 1
            return
        sw.apply(msg)

    def apply_all(self, msgs: Iterable[tuple[int, Any]]) -> list[OFError]:
        """Apply in order; a switch's error does not stop later messages (as on the wire)."""
        errors: list[OFError] = []
        for dpid, msg in msgs:
            try:
                self.apply(dpid, msg)
            except OFError as err:
                errors.append(err)
        return errors

    def set_link(self, a: int, b: int, up: bool) -> None:
        key = frozenset((a, b))
        if key not in self._link_up:
            raise KeyError(f"no link between {a} and {b} in {self.topology.name}")
        self._link_up[key] = up

    def set_switch(self, dpid: int, up: bool) -> None:
        """Down: forwards nothing and its links are dead. Up again: rebooted, empty tables."""
        sw = self.switches[dpid]
        if up and not sw.up:
            sw.reset()
        sw.up = up

    def port_live(self, dpid: int, port: int) -> bool:
        """A host port is live while its switch is; a link port while the link and both ends are."""
        peer = self._attached.get((dpid, port))
        if peer is None or not self.switches[dpid].up:
            return False
        if isinstance(peer, Host):
            return True
        return self._link_up[frozenset((dpid, peer[0]))] and self.switches[peer[0]].up

    def request(self, dpid: int, msg: Any) -> list[Any]:
        """A multipart request's reply parts; none from a switch that is down."""
        sw = self.switches[dpid]
        if not sw.up:
            self.discarded[dpid] += 1
            return []
        return sw.request(msg)

    def ports(self, dpid: int) -> dict[int, Any]:
        """The switch's wired ports as it describes them (Ryu's ``Datapath.ports``):
        ``OFPPS_LINK_DOWN`` on every port that cannot carry traffic right now."""
        return {p: parser.OFPPort(
            port_no=p, hw_addr=_from_int("eth_src", 0x020000000000 | (dpid & 0xFFFF) << 16 | p),
            name=f"s{dpid}-eth{p}".encode(), config=0,
            state=0 if self.port_live(dpid, p) else ofp.OFPPS_LINK_DOWN, curr=0, advertised=0,
            supported=0, peer=0, curr_speed=0, max_speed=0)
            for d, p in sorted(self._attached) if d == dpid}

    def connect(self, dpid: int, session: Reconnect) -> tuple[Reconciled | None, list[OFError]]:
        """Connect a switch to the controller's own reconnect state machine, as the Ryu
        app does: its features messages, then its stats requests answered from this
        switch's tables and its ports, the replies fed back and the resulting plan applied.
        Returns the result (None when the switch is down) and the errors the switch raised."""
        errors = [e for e in self.apply_all((dpid, m) for m in session.features(dpid))
                  if not ofmsgs.benign_error(e.type, e.code, e.meter_id)]  # (as the app does)
        done, more = self.audit(dpid, session, audit=False)
        return done, errors + more

    def audit(self, dpid: int, session: Reconnect, audit: bool = True,
              between: Callable[[], None] | None = None) -> tuple[Reconciled | None, list[OFError]]:
        """The controller's audit of a connected switch: its tables read through the
        controller's own reconnect state machine and the resulting plan applied (a void
        audit's is empty). ``between`` runs after the switch answered and before the
        answers reach the controller (e.g. a change the audit must not undo)."""
        replies = [r for req in session.start(dpid, audit=audit) for r in self.request(dpid, req)]
        if between is not None:
            between()
        done = None
        for reply in replies:
            done = session.on_reply(dpid, reply, self.ports(dpid).values()) or done
        if done is None:
            session.forget(dpid)
            return None, []
        return done, [e for e in self.apply_all(done.plan)
                      if not ofmsgs.benign_error(e.type, e.code, e.meter_id)]  # (as the app does)

    def packet_out_hosts(self, dpid: int, msg: Any) -> list[Host]:
        """The hosts a packet-out's frame reaches directly: those on the live ports its
        output actions name (frames sent into inter-switch links are not followed)."""
        if not self.switches[dpid].up:
            return []
        out = []
        for act in msg.actions:
            peer = self._attached.get((dpid, getattr(act, "port", None)))
            if isinstance(peer, Host) and self.port_live(dpid, act.port):
                out.append(peer)
        return out

    def snapshot(self) -> tuple:
        return (tuple((dpid, sw.up, sw.snapshot()) for dpid, sw in sorted(self.switches.items())),
                tuple(sorted((tuple(sorted(k)), v) for k, v in self._link_up.items())))

    # ---- data plane

    def _headers(self, src: Host, dst_ip: str, eth_type: int, ip_proto: int) -> dict[str, int]:
        dst_addr = ipaddress.IPv4Address(dst_ip)
        if dst_addr.is_multicast:  # RFC 1112: 01:00:5e + low 23 bits of the group
            eth_dst = 0x01005E000000 | (int(dst_addr) & 0x7FFFFF)
        elif dst_ip in self.hosts:
            eth_dst = _to_int("eth_dst", self.hosts[dst_ip].mac)
        else:
            eth_dst = 0xFFFFFFFFFFFF
        pkt = {"in_port": src.port, "eth_type": eth_type, "eth_src": _to_int("eth_src", src.mac),
               "eth_dst": eth_dst}
        if eth_type in (0x0800, 0x86DD):
            pkt["ip_proto"] = ip_proto
        if eth_type == 0x0800:
            pkt["ipv4_src"] = _to_int("ipv4_src", src.ip)
            pkt["ipv4_dst"] = int(dst_addr)
        return pkt

    def trace(self, src_ip: str, dst_ip: str, eth_type: int = 0x0800, ip_proto: int = 17,
              max_hops: int = 64, max_copies: int = 100_000, eth_dst: str | None = None,
              between: Callable[[int], None] | None = None) -> Trace:
        """Inject one packet at ``src_ip``'s port and follow every copy to its end.
        ``eth_dst`` overrides the destination MAC (default: derived from ``dst_ip``).
        ``between(dpid)`` runs before each copy is processed at switch ``dpid`` (the
        first, the injected packet's, too): a test changes the tables there, so copies in
        flight meet a fabric that changes under them.

        A copy that revisits a (switch, in_port) with the same headers, or crosses more than
        ``max_hops`` switches, ends and sets ``loops``; so does exhausting ``max_copies``."""
        src = self.hosts[src_ip]
        result = Trace()
        start = self._headers(src, dst_ip, eth_type, ip_proto)
        if eth_dst is not None:
            start["eth_dst"] = _to_int("eth_dst", eth_dst)
        queue = deque([_Copy(src.dpid, tuple(sorted(start.items())), frozenset(), 0)])
        processed = 0
        while queue:
            copy = queue.popleft()
            processed += 1
            if processed > max_copies:
                result.loops = True
                result.log.append(f"gave up after {max_copies} copies (a storm)")
                break
            if between is not None:
                between(copy.dpid)
            sw = self.switches[copy.dpid]
            if not sw.up:
                result.log.append(f"s{copy.dpid} is down: copy lost")
                continue
            here = (copy.dpid, copy.pkt)
            if here in copy.path or copy.hops >= max_hops:
                result.loops = True
                result.log.append(f"loop at s{copy.dpid}: {describe(dict(copy.pkt))}")
                continue
            pkt = dict(copy.pkt)
            res = sw.process(pkt)
            result.log.extend(res.notes)
            result.dropped_at.extend([copy.dpid] * res.misses)
            path = copy.path | {here}
            for port, out in res.outputs:
                in_port = out["in_port"]  # (a set_field in_port's, if one ran: as OVS)
                if port == ofp.OFPP_CONTROLLER:
                    result.to_controller[copy.dpid] += 1
                    result.punted.append((copy.dpid, {k: _from_int(k, v) if k != "in_port" else v
                                                      for k, v in out.items()}))
                    result.punt_meters.append(res.meters[-1] if res.meters else None)
                    continue
                if port in (ofp.OFPP_FLOOD, ofp.OFPP_ALL):
                    ports = sorted(p for (d, p) in self._attached
                                   if d == copy.dpid and p != in_port and self.port_live(d, p))
                elif port == ofp.OFPP_IN_PORT:
                    ports = [in_port]
                elif port == in_port:
                    result.log.append(f"s{copy.dpid}: output to ingress port {port} "
                                      "without OFPP_IN_PORT: dropped")
                    continue
                else:
                    ports = [port]
                for p in ports:
                    self._emit(copy.dpid, p, out, path, copy.hops + 1, result, queue)
        return result

    def _emit(self, dpid: int, port: int, pkt: dict[str, int], path: frozenset, hops: int,
              result: Trace, queue: deque) -> None:
        peer = self._attached.get((dpid, port))
        if peer is None:
            result.log.append(f"s{dpid}: output to unused port {port}: dropped")
        elif isinstance(peer, Host):
            result.delivered[peer.ip] += 1
            if "vlan_vid" in pkt:
                result.tagged[peer.ip] += 1
                result.log.append(f"s{dpid}: a tagged copy delivered to {peer.ip} on port {port}")
        elif not self.port_live(dpid, port):
            result.log.append(f"s{dpid}: port {port} to s{peer[0]} is down: dropped")
        else:
            result.link_copies[(dpid, peer[0])] += 1
            moved = dict(pkt, in_port=peer[1])
            queue.append(_Copy(peer[0], tuple(sorted(moved.items())), path, hops))
