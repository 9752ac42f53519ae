"""One description of a lab topology, from which both the simulation graph and the
Mininet/OVS lab are derived, so ports and addresses can never disagree between them."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # networkx is imported lazily: Mininet's Debian Python may lack it
    import networkx as nx


class TopologyError(ValueError):
    """A topology definition is inconsistent (duplicate names, reused ports, ...)."""


@dataclass(frozen=True)
class Host:
    name: str
    ip: str
    mac: str
    dpid: int
    port: int


@dataclass(frozen=True)
class Link:
    """An inter-switch link; ``a_port`` is on switch ``a``, ``b_port`` on switch ``b``."""

    a: int
    a_port: int
    b: int
    b_port: int


@dataclass
class Topology:
    name: str
    switches: dict[int, str] = field(default_factory=dict)  # dpid -> switch name
    hosts: list[Host] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)

    def host(self, key: str) -> Host:
        """Look a host up by name or IP address."""
        for h in self.hosts:
            if key in (h.name, h.ip):
                return h
        raise KeyError(f"no host named or addressed {key!r} in topology {self.name}")

    def switch_dpid(self, name: str) -> int:
        for dpid, n in self.switches.items():
            if n == name:
                return dpid
        raise KeyError(f"no switch named {name!r} in topology {self.name}")

    def graph(self) -> nx.Graph:
        """Switch nodes are dpids (int), host nodes are IPv4 strings; every edge carries
        ``ports`` = {node: port number on that node} (hosts use port 0 for eth0)."""
        import networkx as nx

        g = nx.Graph(name=self.name)
        for dpid, name in self.switches.items():
            g.add_node(dpid, kind="switch", name=name)
        for link in self.links:
            g.add_edge(link.a, link.b, ports={link.a: link.a_port, link.b: link.b_port})
        for h in self.hosts:
            g.add_node(h.ip, kind="host", name=h.name, mac=h.mac)
            g.add_edge(h.ip, h.dpid, ports={h.ip: 0, h.dpid: h.port})
        return g

    def validate(self) -> "Topology":
        """Reject definitions a switch or Mininet would reject, with a message naming the
        offending element."""
        used: set[tuple[int, int]] = set()

        def claim(dpid: int, port: int, what: str) -> None:
            if dpid not in self.switches:
                raise TopologyError(f"{what}: unknown switch dpid {dpid}")
            if port < 1:
                raise TopologyError(f"{what}: port numbers start at 1, got {port}")
            if (dpid, port) in used:
                raise TopologyError(f"{what}: port {port} of {self.switches[dpid]} already used")
            used.add((dpid, port))

        pairs: set[frozenset[int]] = set()
        for link in self.links:
            what = f"link {self.switches.get(link.a, link.a)}-{self.switches.get(link.b, link.b)}"
            if link.a == link.b:
                raise TopologyError(f"{what}: a switch cannot link to itself")
            pair = frozenset((link.a, link.b))
            if pair in pairs:
                raise TopologyError(f"{what}: parallel links between two switches are not supported")
            pairs.add(pair)
            claim(link.a, link.a_port, what)
            claim(link.b, link.b_port, what)
        names: set[str] = set(self.switches.values())
        if len(names) != len(self.switches):
            raise TopologyError("duplicate switch names")
        ips: set[str] = set()
        macs: set[str] = set()
        for h in self.hosts:
            if h.name in names:
                raise TopologyError(f"host {h.name}: name already used")
            names.add(h.name)
            try:
                ipaddress.IPv4Address(h.ip)
            except ValueError as exc:
                raise TopologyError(f"host {h.name}: bad IPv4 address {h.ip!r}") from exc
            if h.ip in ips or h.mac in macs:
                raise TopologyError(f"host {h.name}: IP or MAC already used")
            ips.add(h.ip)
            macs.add(h.mac)
            claim(h.dpid, h.port, f"host {h.name}")
        return self


def host_ip(index: int) -> str:
    """Host number ``index`` (1-based) gets 10.0.0.0/8 + index, as Mininet numbers hosts."""
    return str(ipaddress.IPv4Address(0x0A000000 + index))


def host_mac(index: int) -> str:
    return ":".join(f"{b:02x}" for b in index.to_bytes(6, "big"))


class Builder:
    """Allocates dpids, port numbers and addresses in a fixed order so that a family with
    the same parameters always yields the same topology."""

    def __init__(self, name: str) -> None:
        self.topo = Topology(name)
        self._next_port: dict[int, int] = {}
        self._by_name: dict[str, int] = {}

    def switch(self, name: str, dpid: int | None = None) -> int:
        dpid = dpid if dpid is not None else len(self.topo.switches) + 1
        if dpid in self.topo.switches or name in self._by_name:
            raise TopologyError(f"switch {name} (dpid {dpid}) defined twice")
        self.topo.switches[dpid] = name
        self._by_name[name] = dpid
        self._next_port[dpid] = 1
        return dpid

    def _port(self, dpid: int, port: int | None) -> int:
        if port is None:
            port = self._next_port[dpid]
        self._next_port[dpid] = max(self._next_port[dpid], port + 1)
        return port

    def dpid(self, switch: int | str) -> int:
        if isinstance(switch, str):
            if switch not in self._by_name:
                raise TopologyError(f"unknown switch {switch!r}")
            return self._by_name[switch]
        if switch not in self.topo.switches:
            raise TopologyError(f"unknown switch dpid {switch!r}")
        return switch

    def link(self, a: int | str, b: int | str, a_port: int | None = None,
             b_port: int | None = None) -> Link:
        da, db = self.dpid(a), self.dpid(b)
        link = Link(da, self._port(da, a_port), db, self._port(db, b_port))
        self.topo.links.append(link)
        return link

    def host(self, switch: int | str, name: str | None = None, ip: str | None = None,
             mac: str | None = None, port: int | None = None) -> Host:
        index = len(self.topo.hosts) + 1
        dpid = self.dpid(switch)
        h = Host(name or f"h{index}", ip or host_ip(index), mac or host_mac(index), dpid,
                 self._port(dpid, port))
        self.topo.hosts.append(h)
        return h

    def done(self) -> Topology:
        return self.topo.validate()


def _positive(name: str, value: int, minimum: int = 1) -> int:
    value = int(value)
    if value < minimum:
        raise TopologyError(f"{name} must be >= {minimum}, got {value}")
    return value


def linear(n: int = 3, hosts_per_switch: int = 1) -> Topology:
    """A chain s1-s2-...-sn: no redundancy, the simplest multi-hop tree."""
    n, hps = _positive("n", n), _positive("hosts_per_switch", hosts_per_switch, 0)
    b = Builder(f"linear:{n},{hps}")
    sws = [b.switch(f"s{i}") for i in range(1, n + 1)]
    for x, y in zip(sws, sws[1:]):
        b.link(x, y)
    for s in sws:
        for _ in range(hps):
            b.host(s)
    return b.done()


def ring(n: int = 4, hosts_per_switch: int = 1) -> Topology:
    """A ring of n switches: two paths between any pair, the smallest fabric to reroute on."""
    n, hps = _positive("n", n, 3), _positive("hosts_per_switch", hosts_per_switch, 0)
    b = Builder(f"ring:{n},{hps}")
    sws = [b.switch(f"s{i}") for i in range(1, n + 1)]
    for i, s in enumerate(sws):
        b.link(s, sws[(i + 1) % n])
    for s in sws:
        for _ in range(hps):
            b.host(s)
    return b.done()


def leaf_spine(spines: int = 2, leaves: int = 4, hosts_per_leaf: int = 2) -> Topology:
    """Every leaf links to every spine: the usual data-centre fabric with parallel paths."""
    spines = _positive("spines", spines)
    leaves = _positive("leaves", leaves)
    hpl = _positive("hosts_per_leaf", hosts_per_leaf, 0)
    b = Builder(f"leaf-spine:{spines},{leaves},{hpl}")
    sp = [b.switch(f"spine{i}") for i in range(1, spines + 1)]
    lf = [b.switch(f"leaf{i}") for i in range(1, leaves + 1)]
    for leaf in lf:  # uplinks first: port i on a leaf goes to spine i
        for spine in sp:
            b.link(leaf, spine)
    for leaf in lf:
        for _ in range(hpl):
            b.host(leaf)
    return b.done()


def fat_tree(k: int = 4, hosts_per_edge: int | None = None) -> Topology:
    """The k-ary fat tree (Al-Fares et al.): k pods of k/2 edge and k/2 aggregation switches,
    (k/2)^2 cores; by default k/2 hosts per edge switch (k^3/4 hosts)."""
    k = _positive("k", k, 2)
    if k % 2:
        raise TopologyError(f"fat-tree k must be even, got {k}")
    half = k // 2
    hpe = half if hosts_per_edge is None else _positive("hosts_per_edge", hosts_per_edge, 0)
    b = Builder(f"fat-tree:{k},{hpe}")
    cores = [b.switch(f"c{i}") for i in range(half * half)]
    pods = []
    for p in range(k):
        aggs = [b.switch(f"a{p}_{i}") for i in range(half)]
        edges = [b.switch(f"e{p}_{i}") for i in range(half)]
        pods.append((aggs, edges))
    for aggs, edges in pods:
        for j, agg in enumerate(aggs):  # agg j reaches cores j*half .. j*half+half-1
            for c in range(half):
                b.link(agg, cores[j * half + c])
        for edge in edges:
            for agg in aggs:
                b.link(edge, agg)
    for _, edges in pods:
        for edge in edges:
            for _ in range(hpe):
                b.host(edge)
    return b.done()


def from_dict(data: dict[str, Any], invent: bool = True) -> Topology:
    """Load ``{"name", "switches": [{"name", "dpid"?}], "links": [{"a","b","a_port"?,"b_port"?}
    or ["s1","s2"]], "hosts": [{"name"?, "switch", "ip"?, "mac"?, "port"?}]}``. The
    controller's ``GET /v1/topology`` loads too (switches as dpids, links and hosts by
    dpid), so a fabric it found can be saved and pinned (``modelcast-controller --fabric``).
    ``invent=False``: a host without its own ``ip`` and ``mac`` is an error instead of
    getting the lab's next addresses (a pinned fabric's hosts are real ones)."""
    try:
        b = Builder(str(data.get("name", "custom")))
        for sw in data["switches"]:
            if isinstance(sw, int) and not isinstance(sw, bool):  # a dpid (GET /v1/topology)
                sw = {"name": f"s{sw}", "dpid": sw}
            sw = {"name": sw} if isinstance(sw, str) else sw
            b.switch(sw["name"], sw.get("dpid"))
        for link in data.get("links", []):
            if isinstance(link, (list, tuple)):
                link = {"a": link[0], "b": link[1]}
            b.link(link["a"], link["b"], link.get("a_port"), link.get("b_port"))
        for i, h in enumerate(data.get("hosts", [])):
            if not invent and not (h.get("ip") and h.get("mac")):
                raise TopologyError(f"host {h.get('name') or i + 1}: no ip and mac of its own")
            b.host(h["switch"] if "switch" in h else h["dpid"], h.get("name"), h.get("ip"),
                   h.get("mac"), h.get("port"))
    except (KeyError, TypeError, AttributeError) as exc:
        raise TopologyError(f"malformed topology definition: {exc!r}") from exc
    return b.done()


def from_file(path: str | Path, invent: bool = True) -> Topology:
    """Load a topology from a ``.json`` or ``.yaml``/``.yml`` file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TopologyError(f"cannot read topology file {path}: {exc.strerror}") from exc
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: top level must be a mapping")
    return from_dict(data, invent)


FAMILIES = {
    "linear": linear,
    "ring": ring,
    "leaf-spine": leaf_spine,
    "fat-tree": fat_tree,
}


def parse(spec: str, invent: bool = True) -> Topology:
    """Build a topology from ``family:arg,arg`` (e.g. ``fat-tree:4``, ``leaf-spine:2,4,2``)
    or ``file:PATH``; underscores and dashes are interchangeable in the family name.
    ``invent``: as for ``from_dict`` (a file's hosts; a family's are the lab's)."""
    family, _, args = spec.partition(":")
    family = family.strip().replace("_", "-")
    if family == "file":
        return from_file(args, invent)
    if family not in FAMILIES:
        raise TopologyError(
            f"unknown topology family {family!r}; known: {', '.join(sorted(FAMILIES))}, file")
    try:
        values: Iterable[int] = [int(a) for a in args.split(",") if a.strip()]
    except ValueError as exc:
        raise TopologyError(f"topology {spec!r}: arguments must be integers") from exc
    try:
        return FAMILIES[family](*values)
    except TypeError as exc:
        raise TopologyError(f"topology {spec!r}: {exc}") from exc
