"""A group's tree traced receiver by receiver (``GET /v1/groups/{id}/trace``, ``modelcast
trace``): each receiver's state and, when its packets cannot arrive yet, why; and its hops
from the source, each switch with the port the group enters on, the port towards the
receiver, the OpenFlow group, and -- when counters are given -- the live packet counts of
the (S,G) flow, the group and the bucket for that port. An operator finds the hop where
a count stops rising without mapping dpids and ports by hand.

It owns this view and the wording of the reasons. It must not change anything: it reads
the service's groups, the core's view and what switches are believed to hold, and the
counters ``controller.counters`` read.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from controller.counters import Reading
from controller.core import Group
from controller.persist import _ip_key

__all__ = ["trace"]

Read = Callable[[int, Iterable[int]], dict[int, Reading]]  # (gid, dpids) -> readings


def _path(g: Group, dpid: int) -> list[int]:
    """The switches from the tree's root to ``dpid`` (empty: not on the tree)."""
    if g.tree is None or dpid not in g.tree.parent:
        return []
    out = [dpid]
    while (up := g.tree.parent.get(out[-1])) is not None:
        out.append(up)
        if len(out) > len(g.tree.parent):  # (a loop would be a bug: never trace forever)
            return []
    return out[::-1]


def _count(pair: list[int] | None) -> dict[str, int] | None:
    return {"packets": pair[0], "bytes": pair[1]} if pair is not None else None


def trace(service: Any, g: Group, receivers: list[str], read: Read | None,
          now: Callable[[], float]) -> dict[str, Any]:
    """The trace of group ``g`` for ``receivers`` (``service``: the ``Service``, for
    receiver states and plans in flight; ``read``: live counters, or None for the tree
    alone; ``now``: the monotonic clock the readings' ages are measured with)."""
    view = service.core.view
    installed = service.core.installed
    paths = {ip: _path(g, view.hosts[ip].dpid) if ip in view.hosts else [] for ip in receivers}
    switches = sorted({d for p in paths.values() for d in p})
    readings = read(g.gid, switches) if read is not None and switches else {}
    at = now()
    out = []
    for ip in sorted(receivers, key=_ip_key):
        state = service.receiver_state(g, ip)
        hops = []
        path = paths[ip]
        for i, dpid in enumerate(path):
            want = g.tree.entries.get(dpid) if g.tree is not None else None
            held = installed.get(dpid, {}).get(g.gid)
            nxt = path[i + 1] if i + 1 < len(path) else None
            # (None: the link to the next switch is gone from the view)
            out_port = view.nbr_ports.get(dpid, {}).get(nxt) if nxt is not None else view.hosts[ip].port
            hop: dict[str, Any] = {
                "dpid": dpid, "in_port": want.in_port if want is not None else None,
                "out_port": out_port, "next": nxt if nxt is not None else ip, "group_id": g.gid,
                "held": want is not None and held == want,
                "port_up": out_port is not None and (dpid, out_port) not in view.ports_down
                and (nxt is None or view.graph.has_edge(dpid, nxt)),
            }
            reading = readings.get(dpid)
            if reading is not None:
                entry = held or want
                outs = sorted(entry.out_ports) if entry is not None else []
                bucket = reading.buckets[outs.index(out_port)] \
                    if out_port in outs and outs.index(out_port) < len(reading.buckets) else None
                flow = reading.flows.get(entry.in_port) if entry is not None else None
                hop["counters"] = {"flow": _count(flow), "group": _count(reading.group),
                                   "bucket": _count(bucket), "age_s": round(max(0.0, at - reading.at), 3)}
                if reading.error:
                    hop["counters"]["error"] = reading.error
            hops.append(hop)
        out.append({"ip": ip, "state": state, "why": _why(service, g, ip, state, hops),
                    "hops": hops})
    return {"group": g.gid, "model": g.model, "source": g.source, "address": g.address,
            "port": g.port, "state": service.group_state(g), "counters": read is not None,
            "receivers": out}


def _why(service: Any, g: Group, ip: str, state: str, hops: list[dict[str, Any]]) -> str | None:
    """Why a receiver's packets cannot arrive (or take a detour); None when they arrive
    the planned way."""
    view = service.core.view
    for hop in hops:
        if not hop["port_up"]:
            what = (f"switch {hop['dpid']} port {hop['out_port']} towards "
                    f"{'switch ' if isinstance(hop['next'], int) else ''}{hop['next']} is down")
            if service.core.protection and hop["dpid"] not in service.core.no_ff:
                return f"on a fast-failover detour: {what}; the controller is moving the tree"
            return f"{what}; the controller is moving the tree"
    if state == "installed":
        return None
    if ip not in view.hosts:
        return (f"host {ip} not found yet: the controller probes for it (ARP); is it up, "
                "with an address, on a switch port of this fabric?")
    if g.source not in view.hosts:
        return f"the group's source {g.source} is not found yet: the controller probes for it"
    if state == "unreachable":
        return (f"no path from the source's switch {view.hosts[g.source].dpid} to the receiver's "
                f"switch {view.hosts[ip].dpid}: the links between them are down, drained or damped")
    errors = service.errors_of(g.gid)
    if errors:
        return f"the switches refused the group's last plan: {errors[0]}"
    if service.plans_of(g.gid):
        return "waiting for the switches to confirm the group's plan (barriers)"
    missing = [h["dpid"] for h in hops if not h["held"]]
    if missing:
        gone = [d for d in missing if d not in view.switches]
        if gone:
            return f"switch {gone[0]} on the path is disconnected"
        return (f"switch {missing[0]} on the path does not hold the group's entry yet "
                "(connecting, or being read after a restart)")
    return "pending"
