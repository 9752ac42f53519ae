"""What a switch can do beyond plain OpenFlow 1.3, and what follows when it cannot:
meters (its frames to the controller rate-limited, a flooding host port held to a meter
of its own), fast-failover groups (the links leaving it protected), Open vSwitch's
Nicira actions (a detour ends in one flow per link). Learnt from the switch's
description and feature replies, and from the first refusal of a message that uses one.

It owns these decisions and the log line that tells the operator what a switch lost or
got back; a change is a ``Change``: messages for the switch now, a plan for the fabric.
It must not touch switches or Ryu's events (the app passes in the values it read and
sends what comes back), and it is asked only while this instance leads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller import ofmsgs
from controller.core import MulticastCore, Plan
from controller.punt import QUARANTINE_S
from controller.reconnect import Reconnect
from controller.topoview import TopologyView

log = logging.getLogger("modelcast.capabilities")

NICIRA, FAST_FAILOVER, METERS = "nicira", "fast-failover", "meters"
# why a refusal of each kind means the switch lacks it (its log line)
REFUSED = {NICIRA: "refused an experimenter action (Open vSwitch's Nicira actions)",
           FAST_FAILOVER: "refused a fast-failover group (bad type)",
           METERS: "refused our punt meters or a flow using them"}
# what a switch said of itself: (capability, has it, why we think so)
Said = tuple[str, bool, str]


# -- what is asked and what the answers mean (messages built without a live datapath) ---

def desc_request(dpid: int) -> ofmsgs.Msg:
    """The switch's description (OFPMP_DESC): whether it is Open vSwitch (``speaks_nicira``)."""
    return parser.OFPDescStatsRequest(ofmsgs.datapath(dpid), 0)


def desc_text(field: bytes | str) -> str:
    """A description field of OFPMP_DESC as text (Ryu parses them as bytes, NUL padding
    stripped)."""
    if isinstance(field, bytes):
        field = field.decode("ascii", "replace")
    return field.strip("\0 ")


def speaks_nicira(mfr_desc: bytes | str, hw_desc: bytes | str) -> bool:
    """Whether a switch that describes itself so has Open vSwitch's Nicira actions (move,
    load, resubmit: ``protect.rejoin_actions``). Open vSwitch answers mfr "Nicira, Inc."
    and hw "Open vSwitch" (OVS 2.x and 3.x); anything else is taken to lack them."""
    return desc_text(mfr_desc) == "Nicira, Inc." or desc_text(hw_desc) == "Open vSwitch"


def group_features_request(dpid: int) -> ofmsgs.Msg:
    """The group types the switch has (OFPMP_GROUP_FEATURES): fast failover is optional
    in OpenFlow 1.3 (``has_fast_failover``)."""
    return parser.OFPGroupFeaturesStatsRequest(ofmsgs.datapath(dpid), 0)


def has_fast_failover(types: int) -> bool | None:
    """Whether group features' ``types`` bitmap lists OFPGT_FF; None when it lists
    nothing (a switch that does not fill it in: its refusals tell, ``refused_fast_failover``)."""
    return bool(types & (1 << ofp.OFPGT_FF)) if types else None


def refused_fast_failover(err_type: int, code: int, data: bytes) -> bool:
    """An OFPT_ERROR refusing a group's type where the request it quotes (``data``: at
    least its first 64 bytes) is a group-mod of an OFPGT_FF group."""
    return (err_type == ofp.OFPET_GROUP_MOD_FAILED and code == ofp.OFPGMFC_BAD_TYPE and len(data) > 10
            and data[1] == ofp.OFPT_GROUP_MOD and data[10] == ofp.OFPGT_FF)


def meter_features_request(dpid: int) -> ofmsgs.Msg:
    """How many meters the switch has (OFPMP_METER_FEATURES): meters are optional in
    OpenFlow 1.3, and the punt flows pass ``ofmsgs.METERS`` (``has_meters``)."""
    return parser.OFPMeterFeaturesStatsRequest(ofmsgs.datapath(dpid), 0)


def has_meters(max_meter: int) -> bool:
    """Whether a switch with ``max_meter`` meters (its meter features) holds ours."""
    return max_meter >= max(ofmsgs.METERS)


def refuses_meters(err_type: int, code: int, data: bytes) -> bool:
    """An OFPT_ERROR saying the switch cannot hold our punt meters, by the request it
    quotes (``data``; any when it quotes none): a meter-mod of ours refused (not because
    the meter is there already: ``ofmsgs.benign_error``), a flow refused for its meter, or
    meter-mod or the meter instruction unknown to it."""
    kind = data[1] if len(data) > 1 else None
    if err_type == ofp.OFPET_METER_MOD_FAILED:
        return code != ofp.OFPMMFC_METER_EXISTS and (kind != ofp.OFPT_METER_MOD or ofmsgs.meter_of_error(data) in ofmsgs.METERS)
    if err_type == ofp.OFPET_BAD_REQUEST and code == ofp.OFPBRC_BAD_TYPE:
        return kind == ofp.OFPT_METER_MOD
    if err_type == ofp.OFPET_BAD_INSTRUCTION and code == ofp.OFPBIC_UNSUP_INST:
        return kind == ofp.OFPT_FLOW_MOD  # (ours use apply, goto and meter: the first two are required)
    return False


def capability_requests(dpid: int) -> list[ofmsgs.Msg]:
    """What a switch is asked first when it connects (or on a takeover): its description
    and its group and meter features, each answered before the tables are read."""
    return [desc_request(dpid), group_features_request(dpid), meter_features_request(dpid)]


def refuses_nicira(err_type: int, code: int) -> bool:
    """An OFPT_ERROR a switch without Nicira actions answers one of ours with: an
    experimenter (vendor) or experimenter action it does not know."""
    return err_type == ofp.OFPET_BAD_ACTION and code in (ofp.OFPBAC_BAD_EXPERIMENTER, ofp.OFPBAC_BAD_EXP_TYPE)


@dataclass
class Change:
    """What the app does after a switch's capability changed: send ``msgs`` now, apply
    ``plan`` (for ``reason``), and audit the switch soon when ``audit``."""

    msgs: list[tuple[int, ofmsgs.Msg]] = field(default_factory=list)
    plan: Plan = field(default_factory=Plan)
    reason: str = ""
    audit: bool = False


def refused(err_type: int, code: int, data: bytes) -> str | None:
    """The capability an OFPT_ERROR says its switch lacks (``data``: the refused request's
    first bytes); None when it says nothing of the kind."""
    return (NICIRA if refuses_nicira(err_type, code) else
            FAST_FAILOVER if refused_fast_failover(err_type, code, data) else
            METERS if refuses_meters(err_type, code, data) else None)


def known(core: MulticastCore, rc: Reconnect, dpid: int, lacking: str | None) -> bool:
    """Whether the switch is already known to lack it: the refusals of messages sent
    before the first was heard are expected (logged quietly)."""
    return {NICIRA: not core.nicira, FAST_FAILOVER: dpid in core.no_ff,
            METERS: dpid in rc.unmetered, None: False}[lacking]


def meter_features(body: list[Any]) -> Said | None:
    """A meter-features reply (asked for with the description)."""
    if not body:
        return None
    return METERS, has_meters(body[0].max_meter), f"has {body[0].max_meter} meters (its meter features)"


def group_features(types: int) -> Said | None:
    """A group-features reply's ``types`` bitmap (nothing said when it is empty)."""
    on = has_fast_failover(types)
    if on is None:
        return None
    return FAST_FAILOVER, on, ("has fast-failover groups" if on else
                               "has no fast-failover groups (its group features)")


def description(d: Any) -> Said | None:
    """A description reply: a switch that is not Open vSwitch lacks Nicira actions."""
    if speaks_nicira(d.mfr_desc, d.hw_desc):
        return None
    return NICIRA, False, "is not Open vSwitch ({})".format(", ".join(
        repr(desc_text(f)) for f in (d.mfr_desc, d.hw_desc, d.sw_desc)))


def change(core: MulticastCore, rc: Reconnect, dpid: int, said: Said) -> Change | None:
    """What follows from a switch having (or lacking) a capability; None when nothing
    changes (it was known, or the feature is off anyway)."""
    what, on, why = said
    if what == METERS:
        return _meters(rc, dpid, on, why)
    if what == FAST_FAILOVER:
        return _fast_failover(core, dpid, on, why)
    return _without_nicira(core, dpid, why) if not on else None


def _meters(rc: Reconnect, dpid: int, on: bool, why: str) -> Change | None:
    """Without meters a switch's frames to the controller are not rate-limited (as
    ``--punt-rate 0`` for it), and a port flooding the controller cannot be held to a
    meter of its own. Its base flows go again, and it is audited for whatever else the
    refusal left out."""
    if rc.punt_rate <= 0 or on != (dpid in rc.unmetered):
        return None
    (rc.unmetered.discard if on else rc.unmetered.add)(dpid)
    (log.info if on else log.warning)(
        "switch %#x %s: its frames to the controller %s", dpid, why,
        "pass its punt meters again" if on else "are not rate-limited (as with --punt-rate 0 for it)")
    return Change(msgs=[(dpid, m) for m in rc.features(dpid)], audit=True)


def _fast_failover(core: MulticastCore, dpid: int, on: bool, why: str) -> Change | None:
    """Without fast-failover groups, the links leaving a switch wait for the
    controller's reroute."""
    if on != (dpid in core.no_ff) or not core.protection:
        return None
    t0 = time.perf_counter()
    plan = core.set_fast_failover(dpid, on)
    (log.info if on else log.warning)(
        "switch %#x %s: the links leaving it are %s: %d messages for %d groups in %.1f ms", dpid, why,
        "protected again" if on else "not protected (a failure there waits for the controller's reroute)",
        len(plan), len(plan.groups), (time.perf_counter() - t0) * 1000)
    return Change(plan=plan, reason="fast-failover")


def _without_nicira(core: MulticastCore, dpid: int, why: str) -> Change | None:
    """One switch without Open vSwitch's Nicira actions: from now on every detour ends
    in one flow per group and link, plain OpenFlow 1.3 (``--no-nicira``), on every switch."""
    if not core.nicira:
        return None
    t0 = time.perf_counter()
    plan = core.set_nicira(False)
    log.warning("switch %#x %s: detours now end in one flow per group and link, plain OpenFlow 1.3, "
                "as with --no-nicira (start with it to skip this step): %d messages for %d groups "
                "in %.1f ms", dpid, why, len(plan), len(plan.groups), (time.perf_counter() - t0) * 1000)
    return Change(plan=plan, reason="plain-openflow")


def quarantine(view: TopologyView, rc: Reconnect, limit: int, dpid: int,
               port: int) -> list[tuple[int, ofmsgs.Msg]]:
    """A port sent the controller more than ``limit`` frames in a second: if it is a host
    port on a switch with meters, its frames to the controller pass a meter of their own
    for a while (``controller.punt``), so it cannot take its switch's budget from the
    others. The messages that do it (none otherwise)."""
    if not view.edge_port(dpid, port):
        return []  # (an inter-switch link carries many hosts' frames: never quarantined)
    if not rc.metered(dpid):
        log.warning("switch %#x port %d sent the controller more than %d frames in 1 s (a host "
                    "flooding new addresses or discovery frames?), but the switch has no meters "
                    "to hold it to", dpid, port, limit)
        return []
    log.warning("switch %#x port %d sent the controller more than %d frames in 1 s (a host "
                "flooding new addresses or discovery frames?): its frames to the controller "
                "pass a meter of their own (%d/s) for %d s", dpid, port, limit, limit, QUARANTINE_S)
    return [(dpid, m) for m in ofmsgs.quarantine_flows(dpid, port, limit, QUARANTINE_S)]
