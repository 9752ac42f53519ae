"""The switch (re)connect sequence, as a small pure state machine.

A switch that connects may already hold our trees (after a controller restart or a
control-channel flap a healthy switch keeps forwarding), so before touching it the
controller reads what it holds of ours and only fixes the differences:

1. ``features(dpid)``: the base flows and the switch's share of the source table (known
   link ports and hosts, ``controller.hosts``), on OFPT_FEATURES_REPLY.
2. ``start(dpid)``: a flow-stats request (our cookie only) and a group-desc request.
3. ``on_reply(dpid, reply, ports)`` for every multipart reply part: once both answers
   are complete, the switch's state is read (``SwitchState.from_tables``), every port it
   reports down becomes ``port_down`` and ``switch_enter`` diffs against the rest; base
   flows or link-port entries missing from the tables are re-sent. The result is a
   ``Reconciled`` whose plan the caller installs.

The same read is the **audit** of a connected switch (``start(dpid, audit=True)``, when
``AuditClock`` says it is due): whatever was deleted or changed behind the controller's
back (``ovs-ofctl del-flows``/``del-groups``, a hand-edited group) is put back, exactly
the intended state and nothing else. An audit whose switch changed in between (a plan
was sent to it) is void: its answer no longer describes what the switch must hold.

The Ryu app and the simulated fabric (``lab.fakeof``) drive this same class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller import ofmsgs
from controller.core import MulticastCore, Plan, SwitchState
from controller.hosts import HOST_IDLE_S, source_table
from controller.settings import Settings


def port_is_down(desc: Any) -> bool:
    """An OFPPort the switch reports unusable: link down or administratively down."""
    return bool(desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN)


def port_status(reason: int, desc: Any) -> bool | None:
    """What an OFPT_PORT_STATUS means for forwarding: True when the port went down
    (or was deleted), False when it is up, None for reserved ports (LOCAL, ...)."""
    if desc.port_no >= ofp.OFPP_MAX:
        return None
    return reason == ofp.OFPPR_DELETE or port_is_down(desc)


@dataclass
class _Reads:
    flows: list[tuple[int, int, dict[str, Any], tuple]] = field(default_factory=list)
    groups: dict[int, tuple[int, list[tuple[int, tuple]]]] = field(default_factory=dict)
    base: set[tuple] = field(default_factory=set)  # keys of base and link-port entries held
    flows_done: bool = False
    groups_done: bool = False
    audit_of: int | None = None  # an audit: the core's change count for the switch at start


@dataclass
class Reconciled:
    """A switch's reads are complete: what it held of ours and the plan that fixes it.
    ``audit``: it was an audit; ``void``: an audit overtaken by a change (no plan)."""

    dpid: int
    present: SwitchState
    plan: Plan
    audit: bool = False
    void: bool = False


def _oxm_name(field_name: str) -> str:
    """A field by its OXM name: Ryu reads Open vSwitch's NXM_OF_IP_DST as ``ipv4_dst_nxm``."""
    return field_name[:-4] if field_name.endswith("_nxm") else field_name


def normalise_actions(actions: Iterable[Any]) -> tuple:
    """Ryu action objects in the core's normalised form (``ofmsgs.actions`` inverted);
    an action we never install reads as ("?", name), which matches nothing intended."""
    out = []
    for a in actions:
        if isinstance(a, parser.OFPActionOutput):
            out.append(("output", a.port))
        elif isinstance(a, parser.OFPActionGroup):
            out.append(("group", a.group_id))
        elif isinstance(a, parser.OFPActionPopVlan):
            out.append(("pop_vlan",))
        elif isinstance(a, parser.OFPActionPushVlan):
            out.append(("push_vlan", a.ethertype))
        elif isinstance(a, parser.OFPActionSetField):
            out.append(("set_field", a.key, a.value))
        elif isinstance(a, parser.NXActionRegMove):  # (OVS reports its fields by their NXM names)
            out.append(("move", _oxm_name(a.src_field), a.src_ofs, _oxm_name(a.dst_field), a.dst_ofs, a.n_bits))
        elif isinstance(a, parser.NXActionResubmitTable):
            out.append(("resubmit", a.in_port, a.table_id))
        elif isinstance(a, parser.NXActionRegLoad) and a.dst == "in_port_nxm" and a.ofs_nbits == 15:
            out.append(("set_field", "in_port", a.value))  # (how ofmsgs sends that set-field)
        else:
            out.append(("?", type(a).__name__))
    return tuple(out)


def _flow_actions(instructions: Iterable[Any]) -> tuple:
    """A flow's apply-actions; any other instruction makes it read as not ours."""
    out: tuple = ()
    for ins in instructions:
        if isinstance(ins, parser.OFPInstructionActions) and ins.type == ofp.OFPIT_APPLY_ACTIONS:
            out += normalise_actions(ins.actions)
        else:
            out += (("?", type(ins).__name__),)
    return out


# flows whose actions are read back: detour flows and links' rejoins (compared whole), and
# (S,G) flows (one pointing at a turn group, ofmsgs.turn_id, is left by a move cut short
# and rewritten; the first switch's carries the version stamp) and a move's version flows
_READ_ACTIONS = (ofmsgs.PRIO_DETOUR, ofmsgs.PRIO_REJOIN, ofmsgs.PRIO_SG, ofmsgs.PRIO_VERSION)


def _base_key(table_id: int, priority: int, match: Any) -> tuple:
    return (table_id, priority, tuple(sorted(match.items())))


def removal_is_drift(core: MulticastCore, dpid: int, cookie: int) -> bool:
    """A switch reported one of our entries removed: is it one the controller still
    means to have there (drift: audit the switch), or one of a group, or a switch of a
    group's tree, that is gone (we deleted it ourselves; its report can come after our
    plan finished)? Shared entries (detour transit flows, unicast) always count."""
    gid = cookie & ~ofmsgs.COOKIE_MASK
    if gid >= 1 << 32:  # a shared entry's cookie, not a group's
        return True
    group = core.groups.get(gid)
    return group is not None and group.tree is not None and dpid in group.tree.entries


class AuditClock:
    """When each connected switch is due for an audit: every ``interval_s``, never while
    plans are still being installed (their effect is not on the switch yet), never while
    its tables are being read anyway -- and, per switch, taking at most ``share`` of the
    time: reading and parsing a switch's tables grows with its entries (thousands of
    groups, with protection several flows each, cost the controller seconds per read in
    Ryu's parser), so a read that took D seconds is not repeated for D / share."""

    def __init__(self, interval_s: float, share: float = 0.02) -> None:
        self.interval_s = interval_s
        self.share = share
        self._next: dict[int, float] = {}
        self._began: dict[int, float] = {}

    def soon(self, dpid: int) -> None:
        """Audit this switch at the next opportunity (it reported one of our entries
        deleted, and not by us)."""
        self._next[dpid] = float("-inf")

    def due(self, now: float, connected: Iterable[int], busy: bool,
            reading: Iterable[int] = ()) -> list[int]:
        if self.interval_s <= 0:
            return []
        connected = set(connected)
        for dpid in set(self._next) - connected:
            del self._next[dpid]
        if busy:
            return []
        out = []
        skip = set(reading)
        for dpid in sorted(connected):
            at = self._next.setdefault(dpid, now + self.interval_s)
            if now >= at and dpid not in skip:
                out.append(dpid)
                self._next[dpid] = now + self.interval_s
                self._began[dpid] = now
        return out

    def finished(self, dpid: int, now: float) -> None:
        """The audit of ``dpid`` that ``due`` started is done (its tables were read and
        compared): the next one waits for the read's cost."""
        began = self._began.pop(dpid, None)
        if began is not None and dpid in self._next and self._next[dpid] != float("-inf"):
            self._next[dpid] = max(self._next[dpid], now + (now - began) / self.share)

class Reconnect:
    """Per-switch reads in progress over one core; replies of switches not being read
    (late, or after a disconnect) are ignored."""

    def __init__(self, core: MulticastCore, host_idle_s: int = HOST_IDLE_S,
                 punt_rate: int = Settings.punt_rate, punt_port_rate: int = Settings.punt_port_rate) -> None:
        self.core = core
        self.host_idle_s = host_idle_s
        self.punt_rate = punt_rate  # the switches' punt meter (0: none; controller.settings)
        self.punt_port_rate = punt_port_rate  # their quarantine meter (0: none; controller.punt)
        # switches without meters (optional in OpenFlow 1.3: their meter features, or a
        # refusal): their frames to the controller go unmetered, as with punt_rate 0
        self.unmetered: set[int] = set()
        self._reads: dict[int, _Reads] = {}

    def features(self, dpid: int) -> list[ofmsgs.Msg]:
        """What a switch gets as soon as it connects, before its state is read: its punt
        meter, the base flows, and the source-table entries of the links and hosts
        already known (after a controller restart they are re-asserted, identical entries
        replace themselves)."""
        rate = self.punt_rate if self.metered(dpid) else 0
        return (ofmsgs.punt_meter(dpid, rate, port_rate=self.punt_port_rate)
                + ofmsgs.base_flows(dpid, rate > 0)
                + source_table(self.core.view, dpid, self.host_idle_s))

    def metered(self, dpid: int) -> bool:
        """Whether the switch's frames to the controller pass its punt meters."""
        return self.punt_rate > 0 and dpid not in self.unmetered

    def start(self, dpid: int, audit: bool = False) -> list[ofmsgs.Msg]:
        """Begin (or restart) reading a switch; returns the requests to send it."""
        self._reads[dpid] = _Reads(audit_of=self.core.changes[dpid] if audit else None)
        return [ofmsgs.flow_stats_request(dpid), ofmsgs.group_desc_request(dpid)]

    def reading(self) -> set[int]:
        """Switches whose tables are being read."""
        return set(self._reads)

    def forget(self, dpid: int) -> None:
        """The switch disconnected: an unfinished read of it is void."""
        self._reads.pop(dpid, None)

    def on_reply(self, dpid: int, reply: Any, ports: Iterable[Any] = ()) -> Reconciled | None:
        """Take one part of a flow-stats or group-desc reply. ``ports`` are the switch's
        OFPPort descriptions as it reports them (Ryu's ``Datapath.ports``), read only when
        the reads complete. Returns the result once both replies are complete."""
        st = self._reads.get(dpid)
        if st is None:
            return None
        last = not reply.flags & ofp.OFPMPF_REPLY_MORE
        if isinstance(reply, parser.OFPFlowStatsReply):
            st.flows.extend((f.cookie, f.priority, dict(f.match.items()),
                             _flow_actions(f.instructions) if f.priority in _READ_ACTIONS else ())
                            for f in reply.body)
            st.base.update(_base_key(f.table_id, f.priority, f.match) for f in reply.body
                           if f.cookie in (ofmsgs.COOKIE_TAG, ofmsgs.COOKIE_SOURCE))
            st.flows_done |= last
        elif isinstance(reply, parser.OFPGroupDescStatsReply):
            for g in reply.body:
                st.groups[g.group_id] = (g.type, [(b.watch_port, normalise_actions(b.actions))
                                                  for b in g.buckets])
            st.groups_done |= last
        else:
            raise TypeError(f"not a reconnect reply: {type(reply).__name__}")
        if not (st.flows_done and st.groups_done):
            return None
        del self._reads[dpid]
        present = SwitchState.from_tables(st.flows, st.groups, self.core.groups)
        audit = st.audit_of is not None
        if audit and st.audit_of != self.core.changes[dpid]:
            return Reconciled(dpid, present, Plan(), audit=True, void=True)
        plan = Plan()
        # base flows and link-port entries someone deleted (host entries are not checked:
        # they idle out by design, and a host without one is re-learned from its next frame)
        expected = [m for m in self.features(dpid) if isinstance(m, parser.OFPFlowMod)
                    and (m.cookie == ofmsgs.COOKIE_TAG or m.priority == ofmsgs.PRIO_LINK_PORT)]
        missing = [m for m in expected if _base_key(m.table_id, m.priority, m.match) not in st.base]
        for meter in ofmsgs.METERS:  # one deleted by hand took the flows using it along
            using = [m for m in expected if ofmsgs.meter_of(m) == meter]
            if using and all(m in missing for m in using):
                plan.phases[0] += [(dpid, m) for m in ofmsgs.punt_meter(dpid, self.punt_rate, (meter,))]
        plan.phases[0] += [(dpid, m) for m in missing]
        plan.extend(self.core.ports_down(dpid, [desc.port_no for desc in ports
                                                if desc.port_no < ofp.OFPP_MAX and port_is_down(desc)]))
        plan.extend(self.core.switch_enter(dpid, present))
        return Reconciled(dpid, present, plan, audit=audit)
