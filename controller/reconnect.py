"""The switch (re)connect sequence, as a small pure state machine.

A switch that connects may already hold our trees (after a controller restart or a
control-channel flap a healthy switch keeps forwarding), so before touching it the
controller reads what it holds of ours and only fixes the differences:

1. ``features(dpid)``: the base flows (on OFPT_FEATURES_REPLY).
2. ``start(dpid)``: a flow-stats request (our cookie only) and a group-desc request.
3. ``on_reply(dpid, reply, ports)`` for every multipart reply part: once both answers
   are complete, the switch's state is read (``SwitchState.from_tables``), every port it
   reports down becomes ``port_down`` and ``switch_enter`` diffs against the rest. The
   result is a ``Reconciled`` whose plan the caller installs.

The Ryu app and the simulated fabric (``lab.fakeof``) drive this same class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller import ofmsgs
from controller.core import MulticastCore, Plan, SwitchState


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
    flows: list[tuple[int, int, int | None]] = field(default_factory=list)
    groups: dict[int, tuple[int, list[list[int | None]]]] = field(default_factory=dict)
    flows_done: bool = False
    groups_done: bool = False


@dataclass
class Reconciled:
    """A switch's reads are complete: what it held of ours and the plan that fixes it."""

    dpid: int
    present: SwitchState
    plan: Plan


class Reconnect:
    """Per-switch reads in progress over one core; replies of switches not being read
    (late, or after a disconnect) are ignored."""

    def __init__(self, core: MulticastCore) -> None:
        self.core = core
        self._reads: dict[int, _Reads] = {}

    @staticmethod
    def features(dpid: int) -> list[ofmsgs.Msg]:
        """What a switch gets as soon as it connects, before its state is read."""
        return ofmsgs.base_flows(dpid)

    def start(self, dpid: int) -> list[ofmsgs.Msg]:
        """Begin (or restart) reading a switch; returns the requests to send it."""
        self._reads[dpid] = _Reads()
        return [ofmsgs.flow_stats_request(dpid), ofmsgs.group_desc_request(dpid)]

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
            st.flows.extend((f.cookie, f.priority, f.match.get("in_port")) for f in reply.body)
            st.flows_done |= last
        elif isinstance(reply, parser.OFPGroupDescStatsReply):
            for g in reply.body:
                st.groups[g.group_id] = (g.type, [
                    [a.port for a in b.actions if isinstance(a, parser.OFPActionOutput)]
                    + [None for a in b.actions if not isinstance(a, parser.OFPActionOutput)]
                    for b in g.buckets])
            st.groups_done |= last
        else:
            raise TypeError(f"not a reconnect reply: {type(reply).__name__}")
        if not (st.flows_done and st.groups_done):
            return None
        del self._reads[dpid]
        present = SwitchState.from_tables(st.flows, st.groups, self.core.groups)
        plan = Plan()
        for desc in ports:
            if desc.port_no < ofp.OFPP_MAX and port_is_down(desc):
                plan.extend(self.core.port_down(dpid, desc.port_no))
        plan.extend(self.core.switch_enter(dpid, present))
        return Reconciled(dpid, present, plan)
