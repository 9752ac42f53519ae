"""The controller's view of the fabric, fed by discovery events (switch/link/port/host
up and down). Kept separate from tree logic so both can be driven by tests directly."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from functools import lru_cache

import networkx as nx

from controller.errors import InvalidAddress, UnknownHost
from topologies.spec import Topology


@dataclass(frozen=True)
class HostLoc:
    ip: str
    mac: str
    dpid: int
    port: int
    # (dpid, port) made once: every tree reaching the host holds it among its ends
    at: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", (self.dpid, self.port))


@dataclass(frozen=True, order=True)
class LinkKey:
    """An inter-switch link, normalised so that ``a < b`` (or ``a == b``: port order)."""

    a: int
    a_port: int
    b: int
    b_port: int

    @staticmethod
    def make(a: int, a_port: int, b: int, b_port: int) -> "LinkKey":
        if (a, a_port) <= (b, b_port):
            return LinkKey(a, a_port, b, b_port)
        return LinkKey(b, b_port, a, a_port)

    def port_of(self, dpid: int) -> int:
        return self.a_port if dpid == self.a else self.b_port

    def far_end(self, dpid: int, port: int) -> int:
        """The switch at the other end from ``dpid``'s port ``port``."""
        return self.b if (self.a, self.a_port) == (dpid, port) else self.a


_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}")  # canonical: what ipaddress prints


def is_ipv4(text: str) -> bool:
    """A dotted-quad IPv4 address as ``ipaddress`` accepts it (no leading zeros), in one
    regex match: ~10x faster than parsing, for bodies naming thousands of addresses."""
    return _DOTTED.fullmatch(text) is not None


@lru_cache(maxsize=1 << 16)  # the same few thousand host addresses are checked constantly
def check_unicast(ip: str, what: str = "host") -> str:
    """Normalise an IPv4 unicast address or raise InvalidAddress naming the field."""
    if isinstance(ip, str) and _DOTTED.fullmatch(ip):  # canonical already: no parse
        if ip in ("0.0.0.0", "255.255.255.255") or 224 <= int(ip[:ip.index(".")]) <= 239:
            raise InvalidAddress(f"{what} address {ip} is not a unicast host address")
        return ip
    try:
        addr = ipaddress.IPv4Address(str(ip).strip())
    except ValueError as exc:
        raise InvalidAddress(f"{what} address {ip!r} is not an IPv4 address") from exc
    if addr.is_multicast or addr.is_unspecified or str(addr) == "255.255.255.255":
        raise InvalidAddress(f"{what} address {ip} is not a unicast host address")
    return str(addr)


def known_hosts(receivers: object, hosts: dict) -> set | frozenset | None:
    """``receivers`` (a set, frozenset, list or tuple) as a set when every one is a key of
    ``hosts``, whose addresses are canonical: they need no ``check_unicast`` each again
    (64 per group on fat-tree:16); else None. A set or frozenset is returned as given, a
    list or tuple as a new frozenset."""
    if type(receivers) in (set, frozenset):
        rset = receivers
    elif type(receivers) in (list, tuple):
        try:
            rset = frozenset(receivers)
        except TypeError:  # (unhashable: check_unicast names it)
            return None
    else:
        return None
    return rset if rset <= hosts.keys() else None


EDGE_LOG = 4096


class TopologyView:
    """Switches, links (with port numbers), port state and host attachment points.

    ``graph`` holds only what can forward right now: live switches joined by links whose
    both ports are up. Link and host knowledge survives a switch leaving, so the switch's
    return restores its links without waiting for rediscovery. ``version`` increases on
    every change that can alter paths (used to cache per-source shortest-path DAGs)."""

    def __init__(self) -> None:
        self.switches: set[int] = set()
        self.links: set[LinkKey] = set()
        self.port_link: dict[tuple[int, int], LinkKey] = {}  # either end -> its link
        self.ports_down: set[tuple[int, int]] = set()
        # drained (held out of every tree and detour, though up): links by their two
        # switches, and switches (every link of theirs)
        self.held: set[frozenset[int]] = set()
        self.held_switches: set[int] = set()
        self.damped: set[frozenset[int]] = set()  # flapping links held out for a while (controller.damping)
        self.hosts: dict[str, HostLoc] = {}
        self.graph: nx.Graph = nx.Graph()
        # the live graph again as plain dicts, switch -> neighbour -> port towards it: tree
        # code walks it thousands of times per change, and networkx's views cost a call each
        self.nbr_ports: dict[int, dict[int, int]] = {}
        self.version = 0
        # increases whenever a host's attachment may change (hosts, switches, port
        # states): a tree computed at the same value reaches the same receivers' ports
        self.attach = 0
        self._host_ports: dict[tuple[int, int], int] = {}  # (switch, port) -> hosts there
        # How ``graph`` changed, for caches that patch instead of recomputing: every edge
        # added or removed (u, v, added), the last EDGE_LOG of them, numbered from
        # ``edge_log_start``; ``removals`` counts switches leaving (no patching those).
        self.edge_log: list[tuple[int, int, bool]] = []
        self.edge_log_start = 0
        self.removals = 0

    @classmethod
    def from_topology(cls, topo: Topology) -> "TopologyView":
        view = cls()
        for dpid in topo.switches:
            view.add_switch(dpid)
        for link in topo.links:
            view.add_link(link.a, link.a_port, link.b, link.b_port)
        for h in topo.hosts:
            view.add_host(h.ip, h.mac, h.dpid, h.port)
        return view

    # -- queries ---------------------------------------------------------------------
    def host(self, ip: str) -> HostLoc:
        ip = check_unicast(ip)
        try:
            return self.hosts[ip]
        except KeyError:
            raise UnknownHost(f"host {ip} is not known to the controller "
                              "(not yet seen on an edge port, nor declared)") from None

    def host_attached(self, loc: HostLoc) -> bool:
        """A host can send/receive iff its switch is live and its edge port is up."""
        return loc.dpid in self.switches and (loc.dpid, loc.port) not in self.ports_down

    def link_port(self, dpid: int, neighbour: int) -> int:
        return self.nbr_ports[dpid][neighbour]

    def edge_port(self, dpid: int, port: int) -> bool:
        """True for a port with no known inter-switch link: where hosts are learned."""
        return (dpid, port) not in self.port_link

    def hosts_at(self, dpid: int, port: int | None = None) -> list[str]:
        return [h.ip for h in self.hosts.values()
                if h.dpid == dpid and (port is None or h.port == port)]

    # -- events (each returns True when forwarding paths may have changed) -------------
    def add_switch(self, dpid: int) -> bool:
        if dpid in self.switches:
            return False
        self.switches.add(dpid)
        self.graph.add_node(dpid)
        self.nbr_ports[dpid] = {}
        for link in self.links:
            self._refresh(link)
        self.attach += 1
        self.version += 1
        return True

    def remove_switch(self, dpid: int) -> bool:
        if dpid not in self.switches:
            return False
        self.switches.discard(dpid)
        self.graph.remove_node(dpid)
        self.removals += 1
        for n in self.nbr_ports.pop(dpid, {}):
            self.nbr_ports[n].pop(dpid, None)
        self.ports_down = {p for p in self.ports_down if p[0] != dpid}
        self.attach += 1
        self.version += 1
        return True

    def add_link(self, a: int, a_port: int, b: int, b_port: int) -> bool:
        key = LinkKey.make(a, a_port, b, b_port)
        if key in self.links:
            return False
        # A port holds one link: a rediscovered port replaces its stale link.
        for end in ((a, a_port), (b, b_port)):
            k = self.port_link.get(end)
            if k is not None:
                self.remove_link(k.a, k.a_port, k.b, k.b_port)
        self.links.add(key)
        self.port_link[(a, a_port)] = self.port_link[(b, b_port)] = key
        # A host wrongly learned on what is now known to be a link port is forgotten.
        for ip, loc in list(self.hosts.items()):
            if (loc.dpid, loc.port) in ((a, a_port), (b, b_port)):
                self._unplace(self.hosts.pop(ip))
        self._refresh(key)
        self.version += 1
        return True

    def remove_link(self, a: int, a_port: int, b: int, b_port: int) -> bool:
        key = LinkKey.make(a, a_port, b, b_port)
        if key not in self.links:
            return False
        self.links.discard(key)
        del self.port_link[(key.a, key.a_port)], self.port_link[(key.b, key.b_port)]
        self._refresh(key)
        self.version += 1
        return True

    def port_down(self, dpid: int, port: int) -> bool:
        if (dpid, port) in self.ports_down:
            return False
        self.ports_down.add((dpid, port))
        if (dpid, port) in self.port_link:
            self._refresh(self.port_link[(dpid, port)])
        if (dpid, port) in self._host_ports:  # (no host there: no attachment changes)
            self.attach += 1
        self.version += 1
        return True

    def port_up(self, dpid: int, port: int) -> bool:
        if (dpid, port) not in self.ports_down:
            return False
        self.ports_down.discard((dpid, port))
        if (dpid, port) in self.port_link:
            self._refresh(self.port_link[(dpid, port)])
        if (dpid, port) in self._host_ports:  # (no host there: no attachment changes)
            self.attach += 1
        self.version += 1
        return True

    def add_host(self, ip: str, mac: str, dpid: int, port: int) -> bool:
        ip = check_unicast(ip)
        loc = HostLoc(ip, mac.lower(), dpid, port)
        was = self.hosts.get(ip)
        if was == loc:
            return False
        if was is not None:
            self._unplace(was)
        self.hosts[ip] = loc
        at = (dpid, port)
        self._host_ports[at] = self._host_ports.get(at, 0) + 1
        self.attach += 1
        self.version += 1
        return True

    def remove_host(self, ip: str) -> bool:
        loc = self.hosts.pop(check_unicast(ip), None)
        if loc is None:
            return False
        self._unplace(loc)
        self.version += 1
        return True

    def _unplace(self, loc: HostLoc) -> None:
        """A host left ``loc`` (its attachment changes)."""
        at = (loc.dpid, loc.port)
        n = self._host_ports[at] - 1
        if n:
            self._host_ports[at] = n
        else:
            del self._host_ports[at]
        self.attach += 1

    def hold(self, a: int, b: int | None, on: bool) -> list[tuple[int, int, bool]] | None:
        """Hold the links between switches ``a`` and ``b`` (``b`` None: every link of
        switch ``a``) out of the graph (``on``), or give them back: up and known, they
        carry nothing (a drain for maintenance). Returns the graph's edge changes (a, b,
        added), None when the hold was already so."""
        return self._hold((a, self.held_switches) if b is None else (frozenset((a, b)), self.held), a, b, on)

    def damp(self, a: int, b: int, on: bool) -> list[tuple[int, int, bool]] | None:
        """``hold`` for a flapping link (``controller.damping``): apart from drains, so
        giving one back leaves the other."""
        return self._hold((frozenset((a, b)), self.damped), a, b, on)

    def _hold(self, what: tuple, a: int, b: int | None, on: bool) -> list[tuple[int, int, bool]] | None:
        key, bag = what
        if (key in bag) == on:
            return None
        (bag.add if on else bag.discard)(key)
        since = self.edge_count
        for link in [k for k in self.links if a in (k.a, k.b) and (b is None or {k.a, k.b} == {a, b})]:
            self._refresh(link)
        self.version += 1
        return list(self.edge_changes(since) or ())

    def _refresh(self, link: LinkKey) -> None:
        live = (link in self.links and link.a in self.switches and link.b in self.switches
                and (link.a, link.a_port) not in self.ports_down
                and (link.b, link.b_port) not in self.ports_down
                and not ((self.held or self.damped) and (frozenset((link.a, link.b)) in self.held
                                                         or frozenset((link.a, link.b)) in self.damped))
                and link.a not in self.held_switches and link.b not in self.held_switches)
        if live:
            if not self.graph.has_edge(link.a, link.b):
                self._log(link.a, link.b, True)
            self.graph.add_edge(link.a, link.b, ports={link.a: link.a_port, link.b: link.b_port},
                                key=link)
            self.nbr_ports[link.a][link.b] = link.a_port
            self.nbr_ports[link.b][link.a] = link.b_port
        elif self.graph.has_edge(link.a, link.b) and self.graph.edges[link.a, link.b]["key"] == link:
            self.graph.remove_edge(link.a, link.b)
            self._log(link.a, link.b, False)
            self.nbr_ports[link.a].pop(link.b, None)
            self.nbr_ports[link.b].pop(link.a, None)

    def _log(self, a: int, b: int, added: bool) -> None:
        self.edge_log.append((a, b, added))
        if len(self.edge_log) > 2 * EDGE_LOG:
            del self.edge_log[:EDGE_LOG]
            self.edge_log_start += EDGE_LOG

    def edge_changes(self, since: int) -> list[tuple[int, int, bool]] | None:
        """Edge changes numbered ``since`` onwards, or None when they are no longer kept."""
        if since < self.edge_log_start:
            return None
        return self.edge_log[since - self.edge_log_start:]

    @property
    def edge_count(self) -> int:
        """The number of the next edge change (what ``edge_changes`` takes)."""
        return self.edge_log_start + len(self.edge_log)
