"""A controller plus an Open vSwitch lab wired to it: the fabric every real transfer,
the demo, the end-to-end tests and the distribution benchmark run on.

Jumbo frames as GPU fabrics run, a management network on which host agents reach the
REST API, every host made known to the controller; OVS port counters and kernel byte
counters of the hosts' links; loss on a host's link.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Optional

from lab import loss
from lab.controller import Controller, Say, quiet
from lab.ovs import Lab
from lab.sh import LabError
from topologies.spec import Topology


@dataclass(frozen=True)
class PortCounters:
    """One OVS port's counters as the switch reports them (``ovs-ofctl dump-ports``);
    rx = from the attached host into the switch, tx = from the switch to the host."""

    rx_packets: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    tx_bytes: int = 0

    def __sub__(self, other: "PortCounters") -> "PortCounters":
        return PortCounters(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


_PORT = re.compile(r"port\s+(\w+): rx pkts=(\d+), bytes=(\d+).*?tx pkts=(\d+), bytes=(\d+)", re.S)


def dump_ports(bridge: str, port: Optional[int] = None) -> dict[int, PortCounters]:
    """OVS's counters of a bridge's OpenFlow ports (all, or one), by port number; the
    bridge's LOCAL port is left out (no lab traffic uses it)."""
    cmd = ["ovs-ofctl", "-O", "OpenFlow13", "dump-ports", bridge] + ([str(port)] if port else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    found = {int(m[0]): PortCounters(*map(int, m[1:])) for m in _PORT.findall(out.stdout)
             if m[0].isdigit()}
    if out.returncode or not found or (port is not None and port not in found):
        raise LabError(f"{' '.join(cmd)}: {(out.stderr or out.stdout).strip()}")
    return found


class Fabric:
    """The controller, a lab of ``topology`` wired to it (jumbo frames, as GPU fabrics run;
    a management network on which host agents reach the REST API); every host
    made known to the controller (hosts are learned from their own traffic). Use as a
    context manager: teardown happens on every path, Ctrl-C included."""

    def __init__(self, topology: Topology, workdir: Path, algorithm: str = "spt",
                 token: Optional[str] = None, say: Say = quiet, mtu: int = 9000,
                 instances: int = 1, store: Optional[str] = None) -> None:
        self.topology = topology
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.say = say
        token = token or secrets.token_hex(8)
        # several instances of one controller (``store``: etcd://...), every switch
        # connected to each of them, agents configured with all of their URLs
        self.controllers = [Controller(self.workdir, token=token, algorithm=algorithm, say=say,
                                       store=store, name=f"controller{i}" if instances > 1 else "controller")
                            for i in range(instances)]
        self.mtu = mtu
        self.lab: Optional[Lab] = None

    def __enter__(self) -> "Fabric":
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---------------------------------------------------------------- lifecycle

    def start(self, learn_timeout: float = 60, ping_hosts: bool = True) -> None:
        """Controller up, lab built, links discovered, hosts learned; undone on failure.
        ``ping_hosts=False`` (the demo): no host sends anything first, as in a cluster whose
        hosts never broadcast; the controller finds each by its own first frames (a
        receiver's IGMP join, the sender's datagrams) or by ARP probes for an address a
        group names, and a receiver it has not found yet is ``pending``."""
        topo = self.topology
        try:
            self.say(f"building lab {topo.name}: {len(topo.switches)} OVS bridges (userspace "
                     f"datapath, MTU {self.mtu}), {len(topo.links)} links, {len(topo.hosts)} "
                     "host namespaces on a management network")
            self.lab = Lab(topo, controller=" ".join(c.of_target for c in self.controllers),
                           mgmt=True, mtu=self.mtu)
            self.lab.start()
            for c in self.controllers:
                c.rest_host = self.lab.mgmt_gateway
                self.say(f"starting modelcast-controller (algorithm {c.algorithm})")
                c.start()
            self.say(f"lab {self.lab.base} up; waiting for the controller to discover "
                     f"{len(topo.links)} links (LLDP)")
            self.controller.wait_topology(len(topo.switches), len(topo.links), timeout=learn_timeout)
            self.say(f"host agents reach the REST API at {self.url}")
            if ping_hosts:
                self.learn_hosts(timeout=learn_timeout)
            else:
                self.say("hosts send nothing first: the controller finds them by their own "
                         "frames and by ARP probes for the addresses a group names")
        except BaseException:
            self.stop()
            raise

    def learn_hosts(self, timeout: float = 60) -> None:
        """Let every host send a packet (ping the first host) so the controller learns
        where it is attached; wait until /v1/topology lists all of them."""
        assert self.lab is not None
        topo = self.topology
        first = topo.hosts[0]
        self.say(f"hosts ping {first.name} so the controller learns where each is attached")
        deadline = time.monotonic() + timeout
        pending = [h for h in topo.hosts if h is not first]
        while pending:
            pending = [h for h in pending if not self.lab.ping(h.name, first.name, count=1, wait=2)]
            if pending and time.monotonic() > deadline:
                raise LabError(f"hosts {[h.name for h in pending]} cannot reach {first.name} "
                                  f"through the fabric\n{self.controller.log_text()}")
        want = {h.ip for h in topo.hosts}
        self.controller.wait(self.controller.client.topology,
                             lambda t: {h["ip"] for h in t["hosts"]} >= want,
                             f"the controller to know all {len(want)} hosts",
                             max(1.0, deadline - time.monotonic()), 0.3)
        self.say(f"controller knows all {len(topo.hosts)} hosts")

    def stop(self) -> None:
        """Tear down everything this fabric made: agents (by PID), bridges, veths,
        namespaces and the controller. Idempotent; raises if something could
        not be removed (after trying everything)."""
        errors: list[str] = []
        if self.lab is not None:
            self.say(f"tearing down lab {self.lab.base or '(not started)'}")
            try:
                self.lab.stop()
            except LabError as exc:
                errors.append(str(exc))
            self.lab = None
        for c in self.controllers:
            if c.proc is not None:
                c.stop()
        if errors:
            raise LabError("; ".join(errors))

    # ---------------------------------------------------------------- helpers

    @property
    def controller(self) -> Controller:
        """The (first live) controller instance: the one to ask for reads and waits."""
        return next((c for c in self.controllers if c.proc is not None and c.proc.poll() is None),
                    self.controllers[0])

    @property
    def url(self) -> str:
        """Controller URL as seen from inside any host namespace (and from the root one):
        with several instances, all of their URLs (``--controller A,B,C``)."""
        return ",".join(c.url for c in self.controllers)

    def ip(self, host: str) -> str:
        return self.topology.host(host).ip

    def name(self, host_or_ip: str) -> str:
        return self.topology.host(host_or_ip).name

    def live_lab(self) -> Lab:
        """The started lab (LabError if the fabric is not up)."""
        if self.lab is None:
            raise LabError("fabric not started")
        return self.lab

    def host_port_iface(self, host: str) -> str:
        """The root-namespace (switch side) interface of a host's link."""
        h = self.topology.host(host)
        return self.live_lab().switch_port_iface(h.dpid, h.port)

    def port_counters(self, host: str) -> PortCounters:
        """OVS's own counters for the switch port a host is attached to."""
        h = self.topology.host(host)
        return dump_ports(self.live_lab().bridge(h.dpid), h.port)[h.port]

    def link_bytes(self) -> dict[tuple[str, str], int]:
        """Bytes every link of the fabric carried so far, once per direction, keyed
        (from, to) by switch and host names, from OVS's port counters: an inter-switch
        direction is the sending port's tx, a host's uplink its switch port's rx, its
        downlink that port's tx. Subtract two snapshots for what a run put on the fabric."""
        topo, lab = self.topology, self.live_lab()
        ports = {dpid: dump_ports(lab.bridge(dpid)) for dpid in topo.switches}
        names = topo.switches
        out: dict[tuple[str, str], int] = {}
        for link in topo.links:
            out[(names[link.a], names[link.b])] = ports[link.a][link.a_port].tx_bytes
            out[(names[link.b], names[link.a])] = ports[link.b][link.b_port].tx_bytes
        for h in topo.hosts:
            c = ports[h.dpid][h.port]
            out[(h.name, names[h.dpid])] = c.rx_bytes
            out[(names[h.dpid], h.name)] = c.tx_bytes
        return out

    def wire_bytes(self, host: str, towards_host: bool) -> int:
        """Kernel byte counter of a host's link (cheap enough to poll every few ms):
        ``towards_host`` = switch -> host, else host -> switch."""
        iface = self.host_port_iface(host)
        stat = "tx_bytes" if towards_host else "rx_bytes"
        return int(Path(f"/sys/class/net/{iface}/statistics/{stat}").read_text())

    def add_loss(self, host: str, kind: str, port: Optional[int] = None,
                 all_ip: bool = False) -> str:
        """Random (1%) or bursty loss on the link towards ``host``; returns the method."""
        return loss.add(self.live_lab().ns(host), self.host_port_iface(host), kind, port, all_ip)

    def clear_loss(self, host: str) -> None:
        loss.clear(self.live_lab().ns(host), self.host_port_iface(host))

    def loss_dropped(self, host: str, method: str) -> int:
        """Packets the loss rules towards ``host`` dropped so far (LabError if unreadable)."""
        return loss.dropped(self.live_lab().ns(host), self.host_port_iface(host), method)

    def find_group(self, model: str, source_ip: str) -> Optional[dict]:
        """The group the controller holds for (model, source), if any."""
        for g in self.controller.client.list_groups():
            if g["model"] == model and g["source"] == source_ip:
                return g
        return None

    def set_link(self, a: int, b: int, up: bool) -> None:
        self.say(f"link {self.topology.switches[a]}-{self.topology.switches[b]} "
                 f"{'UP' if up else 'DOWN'}")
        self.live_lab().set_link(a, b, up)

    def describe_tree(self, group: dict) -> str:
        """The group's tree as an indented switch tree with the hosts each leaf feeds."""
        tree = group.get("tree") or {}
        names = self.topology.switches
        children: dict[int, list[int]] = {}
        parents: set[int] = set()
        kids: set[int] = set()
        for parent, child in tree.get("links", []):
            children.setdefault(parent, []).append(child)
            parents.add(parent)
            kids.add(child)
        hosts_at: dict[int, list[str]] = {}
        for dpid, ports in (tree.get("out_ports") or {}).items():
            for h in self.topology.hosts:
                if h.dpid == int(dpid) and h.port in ports:
                    hosts_at.setdefault(int(dpid), []).append(h.name)
        try:
            root = self.topology.host(group["source"]).dpid
        except KeyError:
            root = next(iter(parents - kids), None)
        if root is None:
            return "(no tree)"
        lines: list[str] = []

        def walk(dpid: int, prefix: str, last: bool, top: bool) -> None:
            label = names.get(dpid, str(dpid))
            if top:
                src = self.name(group["source"])
                label += f" (source {src})"
            if hosts_at.get(dpid):
                label += " -> " + " ".join(sorted(hosts_at[dpid], key=natural))
            lines.append(label if top else f"{prefix}{'└─ ' if last else '├─ '}{label}")
            kids_of = sorted(children.get(dpid, []))
            for i, child in enumerate(kids_of):
                walk(child, prefix if top else prefix + ("   " if last else "│  "),
                     i == len(kids_of) - 1, False)

        walk(root, "", True, True)
        return "\n".join(lines)


def natural(name: str) -> tuple:
    """Sort key that puts h2 before h10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
