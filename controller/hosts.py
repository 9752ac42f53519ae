"""Host discovery: where every host attaches, including hosts that never broadcast.

Pure: inputs are what the switches report (a punted frame's source, a source entry that
idled out, a port going down) and ``now``; outputs are ``Actions``: group changes for
``Service.apply`` and switch messages to send at once. The Ryu app only forwards events.

A host is learned from its first frame (table 0 passes only learned sources, as faucet's
eth_src table), or found by ARP probes (sender 0.0.0.0, RFC 5227) when a group names an
address not seen yet; a silent host (its source entry idled out) that does not answer
``probe_tries`` probes, or whose port went down, is forgotten and its groups re-planned.
Nothing moves a known host: a frame claiming its address from another port or MAC is
``refused`` and the incumbent probed (it stays if it answers); pinned (``--fabric``) and
declared (``POST /v1/hosts``) hosts are never taken over by a claimant. The rules in
full: docs/controller.md, "Finding hosts".
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ryu.lib.packet import arp, ethernet, packet
from ryu.ofproto import ofproto_v1_3 as ofp

from controller import ofmsgs
from controller.core import MulticastCore, Plan
from controller.errors import CoreError
from controller.topoview import TopologyView
from controller.unicast import flood_ports

HOST_IDLE_S = 300  # a source entry's idle timeout: silence this long starts the probes
PROBE_INTERVAL_S = 1.0
PROBE_TRIES = 3  # unanswered probes before a silent host is forgotten
WANTED_MAX_INTERVAL_S = 30.0  # slowest probing for a named host not found yet
# named addresses probed per timer step (each probe is a packet-out per switch): a group
# naming 18,000 unknown receivers is probed over ~2 minutes, not in one hub stall
MAX_PROBES_PER_TICK = 32
PROBE_MAC = "02:4d:43:00:00:01"  # locally administered ("MC"): the probes' sender
BROADCAST = "ff:ff:ff:ff:ff:ff"


@dataclass
class Actions:
    """What a discovery step decided: ``plan`` goes through ``Service.apply`` (groups
    re-planned for hosts found or forgotten), ``msgs`` to the switches at once."""

    plan: Plan = field(default_factory=Plan)
    msgs: list[tuple[int, ofmsgs.Msg]] = field(default_factory=list)
    learned: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # claims on a known host's address
    contested: list[str] = field(default_factory=list)  # ... that started probing its holder
    spoofed: list[str] = field(default_factory=list)  # ... on a pinned (--fabric) or declared host's


@dataclass
class _Probing:
    next_at: float
    interval: float
    tries: int = 0


def arp_probe(ip: str, eth_dst: str = BROADCAST) -> bytes:
    """An ARP request for ``ip`` from ``PROBE_MAC`` with sender IP 0.0.0.0: the owner
    answers (to ``PROBE_MAC``), and no host caches a mapping for it."""
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(eth_dst, PROBE_MAC, ethernet.ether.ETH_TYPE_ARP))
    pkt.add_protocol(arp.arp_ip(arp.ARP_REQUEST, PROBE_MAC, "0.0.0.0", "00:00:00:00:00:00", ip))
    pkt.serialize()
    return bytes(pkt.data)


def source_table(view: TopologyView, dpid: int, idle_s: int = HOST_IDLE_S) -> list[ofmsgs.Msg]:
    """A switch's share of the source table as the view knows it (sent when it connects):
    every known inter-switch link port, and every known host attached to it."""
    msgs = [ofmsgs.link_port_flow(dpid, port) for (d, port) in sorted(view.port_link) if d == dpid]
    msgs += [ofmsgs.source_flow(dpid, h.port, h.mac, idle_s)
             for h in sorted(view.hosts.values(), key=lambda h: (h.port, h.ip)) if h.dpid == dpid]
    return msgs


class HostDiscovery:
    """Learning, probing and forgetting hosts for one core (see the module docstring)."""

    def __init__(self, core: MulticastCore, idle_s: int = HOST_IDLE_S,
                 probe_interval_s: float = PROBE_INTERVAL_S, probe_tries: int = PROBE_TRIES,
                 wanted_max_interval_s: float = WANTED_MAX_INTERVAL_S,
                 pinned: Mapping[str, tuple[str, int, int]] | None = None,
                 reserved: Mapping[str, tuple[str, int, int]] | None = None) -> None:
        self.core = core
        self.pinned = dict(pinned or {})  # address -> (mac, dpid, port): see ``pin``
        # address -> (mac, dpid, port) of declared hosts: the service's own dict, read live
        self.reserved: Mapping[str, tuple[str, int, int]] = reserved if reserved is not None else {}
        self.idle_s = idle_s
        self.probe_interval_s = probe_interval_s
        self.probe_tries = probe_tries
        self.wanted_max_interval_s = wanted_max_interval_s
        self._wanted: dict[str, _Probing] = {}  # named by a group, not seen yet
        self._suspects: dict[str, _Probing] = {}  # known, but its source entry idled out

    @property
    def view(self) -> TopologyView:
        return self.core.view

    def pin(self) -> Plan:
        """Place every pinned host where the fabric says (also over a different place a
        saved state had): at start, and after the core is rebuilt."""
        plan = Plan()
        for ip, (mac, dpid, port) in sorted(self.pinned.items()):
            plan.extend(self.core.host_add(ip, mac, dpid, port))  # (moves it from elsewhere)
        return plan

    def looking_for(self) -> list[str]:
        """Addresses being probed for (named by a group, not found yet)."""
        return sorted(self._wanted)

    # -- what the switches report ------------------------------------------------------
    def seen(self, ip: str, mac: str, dpid: int, port: int, from_dst_table: bool = False) -> Actions:
        """A frame from ``ip``/``mac`` arrived on edge port ``dpid``:``port``: learn the
        host and let its frames through the source table. ``from_dst_table``: the switch
        punted it from the destination table, so its source entry is in place. A known
        host elsewhere is not moved (see the module docstring: ``refused``, and the
        incumbent is probed)."""
        acts = Actions()
        mac = mac.lower()
        known = self.view.hosts.get(ip)
        place = self.pinned.get(ip) or self.reserved.get(ip)
        if place is not None and place != (mac, dpid, port):
            acts.refused.append(ip)  # (its frame is dropped; the pinned or declared host stays)
            acts.spoofed.append(ip)
            return acts
        if known is not None and (known.dpid, known.port, known.mac) != (dpid, port, mac) \
                and self.view.host_attached(known):
            acts.refused.append(ip)
            if ip not in self._suspects:  # probe the incumbent now (``tick`` sends it)
                self._suspects[ip] = _Probing(float("-inf"), self.probe_interval_s)
                acts.contested.append(ip)
            return acts
        try:
            acts.plan = self.core.host_add(ip, mac, dpid, port)
        except CoreError:  # not a unicast host address
            return acts
        self._wanted.pop(ip, None)
        self._suspects.pop(ip, None)
        if known is None or (known.dpid, known.port, known.mac) != (dpid, port, mac):
            acts.learned.append(ip)
            if known is not None:
                acts.msgs += self._unless_used(known.dpid, known.port, known.mac)
        elif from_dst_table:
            return acts
        acts.msgs.append((dpid, ofmsgs.source_flow(dpid, port, mac, self.idle_s)))
        return acts

    def idle(self, dpid: int, port: int, mac: str, now: float) -> None:
        """The switch removed a source entry after ``idle_s`` without a frame: probe the
        hosts behind it (``tick`` sends the probes)."""
        mac = mac.lower()
        for h in self.view.hosts.values():
            if (h.dpid, h.port, h.mac) == (dpid, port, mac) and h.ip not in self._suspects \
                    and h.ip not in self.pinned:
                self._suspects[h.ip] = _Probing(now, self.probe_interval_s)

    def port_down(self, dpid: int, port: int) -> Actions:
        """Hosts on a port that went down are gone: forget them now (their groups keep
        them as receivers, looked for again)."""
        acts = Actions()
        for ip in sorted(self.view.hosts_at(dpid, port)):
            if ip not in self.pinned:  # (a pinned one is unreachable until the port is up)
                self._forget(ip, acts)
        return acts

    def link_up(self, a: int, a_port: int, b: int, b_port: int) -> list[tuple[int, ofmsgs.Msg]]:
        """Both ends of a discovered link pass frames on to the destination table."""
        return [(a, ofmsgs.link_port_flow(a, a_port)), (b, ofmsgs.link_port_flow(b, b_port))]

    def link_down(self, a: int, a_port: int, b: int, b_port: int) -> list[tuple[int, ofmsgs.Msg]]:
        """A lost link's ports are edge ports again: their sources are learned."""
        return [(d, ofmsgs.link_port_flow_delete(d, p)) for d, p in ((a, a_port), (b, b_port))
                if (d, p) not in self.view.port_link]

    def switch_flows(self, dpid: int) -> list[ofmsgs.Msg]:
        return source_table(self.view, dpid, self.idle_s)

    # -- timers --------------------------------------------------------------------------
    def tick(self, now: float, switch_ports: Mapping[int, Iterable[int]]) -> Actions:
        """Probes that are due, and suspects that stayed silent forgotten. ``switch_ports``
        are the connected switches and their port numbers (probes leave through them).
        Call often (the app: every 0.25 s); it does nothing until something is due."""
        acts = Actions()
        for ip, pr in list(self._suspects.items()):
            h = self.view.hosts.get(ip)
            if h is None:
                del self._suspects[ip]
            elif now >= pr.next_at and pr.tries >= self.probe_tries:
                self._forget(ip, acts)
            elif now >= pr.next_at:
                if h.dpid in switch_ports:
                    acts.msgs.append((h.dpid, ofmsgs.packet_out(
                        h.dpid, ofp.OFPP_CONTROLLER, [h.port], arp_probe(ip, h.mac))))
                pr.tries += 1
                pr.next_at = now + self.probe_interval_s
        missing = self._missing()
        for ip in set(self._wanted) - missing:
            del self._wanted[ip]
        for ip in missing:
            self._wanted.setdefault(ip, _Probing(now, self.probe_interval_s))
        due = heapq.nsmallest(MAX_PROBES_PER_TICK, ((pr.next_at, ip) for ip, pr in self._wanted.items()
                                                    if now >= pr.next_at))
        for _, ip in due:  # the longest-waiting first
            pr = self._wanted[ip]
            frame = arp_probe(ip)
            for d, ports in sorted(switch_ports.items()):
                out = flood_ports(self.view, d, ports)
                if out:
                    acts.msgs.append((d, ofmsgs.packet_out(d, ofp.OFPP_CONTROLLER, out, frame)))
            pr.tries += 1
            pr.next_at = now + pr.interval
            pr.interval = min(pr.interval * 2, self.wanted_max_interval_s)
        return acts

    # -- internals -----------------------------------------------------------------------
    def _missing(self) -> set[str]:
        """Addresses groups name that the view does not know. Only groups whose tree
        misses someone can name one (a known, reached host is not missing)."""
        hosts = self.view.hosts
        out: set[str] = set()
        for g in self.core.groups.values():
            if g.tree is None or g.tree.unreachable:
                out.update(ip for ip in (g.source, *g.receivers) if ip not in hosts)
        return out

    def _forget(self, ip: str, acts: Actions) -> None:
        h = self.view.hosts.get(ip)
        self._suspects.pop(ip, None)
        if h is None:
            return
        acts.plan.extend(self.core.host_remove(ip))
        acts.forgotten.append(ip)
        acts.msgs += self._unless_used(h.dpid, h.port, h.mac)

    def _unless_used(self, dpid: int, port: int, mac: str) -> list[tuple[int, ofmsgs.Msg]]:
        """Delete a source entry no known host needs any more (one MAC may carry several
        addresses)."""
        if any((h.dpid, h.port, h.mac) == (dpid, port, mac) for h in self.view.hosts.values()):
            return []
        return [(dpid, ofmsgs.source_flow_delete(dpid, port, mac))]
