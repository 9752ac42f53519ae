"""A change of the fabric -- a port down or up, a link discovered or lost, a switch
gone -- as the core's reroute plan plus the source-table messages host discovery asks
for, with the one log line an operator reads (what changed, how many groups moved, what
it cost to compute).

It owns whether a discovered link is believed (``LinkGate``'s verdict, counted in the
metrics), these log lines and the matching events (``controller.events``: the change
itself, the fast-failover switch-over it caused, the reroute with its why). It must not touch switches or Ryu's events (the app passes
dpids and ports and sends what comes back), nor decide who leads (it is asked only while
this instance leads).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from controller import ofmsgs
from controller.core import MulticastCore, Plan
from controller.hosts import HostDiscovery
from controller.service import Service

log = logging.getLogger("modelcast.topology")


@dataclass
class Change:
    """What the app does after the fabric changed: send ``msgs`` at once, apply ``plan``
    (a reroute), flush the unicast paths, and save the view."""

    plan: Plan
    msgs: list[tuple[int, ofmsgs.Msg]] = field(default_factory=list)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def _rerouted(core: MulticastCore, plan: Plan, why: str, t0: float) -> None:
    """The "reroute" event of a change that moved trees (none when it moved nothing)."""
    if plan.groups:
        core.events.emit("reroute", groups=plan.groups, why=why, messages=len(plan),
                         moved=len(plan.moved), compute_ms=round(_ms(t0), 2))


def port(core: MulticastCore, dpid: int, port: int, down: bool) -> Plan:
    """A port went down (or up): the groups that crossed it move at once (LLDP would
    notice a lost link only after ~10 s)."""
    t0 = time.perf_counter()
    link = core.view.port_link.get((dpid, port))
    was_down = (dpid, port) in core.view.ports_down
    plan = core.port_down(dpid, port) if down else core.port_up(dpid, port)
    if len(plan) or down:
        log.info("port %#x:%d %s: %d groups rerouted, %d messages, computed in %.1f ms",
                 dpid, port, "down" if down else "up", len(plan.groups), len(plan), _ms(t0))
    if was_down == down:  # (a PortStatus that changes nothing -- e.g. a carrier flag
        return plan  # moving while the port stays up -- is no event)
    where = {"dpid": dpid, "port": port}
    if link is not None:
        where["link"] = [[link.a, link.a_port], [link.b, link.b_port]]
    core.events.emit("port_down" if down else "port_up", **where)
    if down and link is not None and plan.groups and core.protection:
        # the switches' fast-failover groups watching the port took their backup buckets
        # for these trees before the controller heard of it (controller.failover)
        core.events.emit("failover", groups=plan.groups, **where)
    _rerouted(core, plan, f"port {dpid:#x}:{port} {'down' if down else 'up'}", t0)
    return plan


def link_up(service: Service, discovery: HostDiscovery, a: int, a_port: int, b: int,
            b_port: int) -> Change | None:
    """A link discovered (signed LLDP, ``controller.lldpauth``): believed unless the
    link gate refuses it; None when it is refused or was known already."""
    view = service.core.view
    refused = service.gate.check(view, a, a_port, b, b_port)
    if refused is not None:  # (Ryu reports a link once while its frames keep arriving)
        service.metrics.links_refused.labels(why=refused.kind).inc()
        log.warning("link %#x:%d <-> %#x:%d not believed: %s", a, a_port, b, b_port, refused.why)
        service.events.emit("link_refused", link=[[a, a_port], [b, b_port]], why=refused.why)
        return None
    suspects = [ip for p in ((a, a_port), (b, b_port)) for ip in service.gate.hosts_at(view, *p)]
    before = view.version
    t0 = time.perf_counter()
    plan = service.core.link_add(a, a_port, b, b_port)
    if service.core.view.version == before:
        return None
    log.info("link %#x:%d <-> %#x:%d discovered", a, a_port, b, b_port)
    service.events.emit("link_up", link=[[a, a_port], [b, b_port]])
    _rerouted(service.core, plan, f"link {a:#x}:{a_port} <-> {b:#x}:{b_port} discovered", t0)
    if suspects:
        log.warning("link %#x:%d <-> %#x:%d discovered where host %s was attached: the host "
                    "is forgotten (if that port is not cabled to a switch, a host is relaying "
                    "discovery frames: pin the fabric with --fabric)", a, a_port, b, b_port,
                    ", ".join(suspects))
    return Change(plan, discovery.link_up(a, a_port, b, b_port))


def link_down(core: MulticastCore, discovery: HostDiscovery, a: int, a_port: int, b: int,
              b_port: int) -> Change | None:
    """A link lost (LLDP stopped seeing it); None when it was not known."""
    before = core.view.version
    t0 = time.perf_counter()
    plan = core.link_remove(a, a_port, b, b_port)
    if core.view.version == before:
        return None
    log.info("link %#x:%d <-> %#x:%d lost: %d groups rerouted in %.1f ms",
             a, a_port, b, b_port, len(plan.groups), _ms(t0))
    core.events.emit("link_down", link=[[a, a_port], [b, b_port]])
    _rerouted(core, plan, f"link {a:#x}:{a_port} <-> {b:#x}:{b_port} lost", t0)
    return Change(plan, discovery.link_down(a, a_port, b, b_port))


def switch_left(core: MulticastCore, dpid: int) -> Plan:
    """A switch disconnected: it is gone from the view, its groups rerouted."""
    t0 = time.perf_counter()
    plan = core.switch_leave(dpid)
    log.warning("switch %#x disconnected: %d groups rerouted in %.1f ms", dpid, len(plan.groups), _ms(t0))
    core.events.emit("switch_lost", dpid=dpid)
    _rerouted(core, plan, f"switch {dpid:#x} disconnected", t0)
    return plan
