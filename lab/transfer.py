"""Reusable orchestration of a real model distribution on the Open vSwitch lab.

One place that knows how to bring up ``modelcast-controller`` + a ``topologies.lab.Lab``,
start ``modelcast send`` / ``modelcast recv`` in host namespaces, inject loss, watch the
transfer's progress on the wire, and verify and summarise the outcome. ``make demo``
(``topologies.demo``), the end-to-end tests (``tests/test_e2e.py``) and benchmarks all
drive it, so the thing the demo shows is the thing CI tests.

Pieces, each usable alone:

* ``Controller`` -- the controller as a subprocess on free ports (OpenFlow on loopback;
  REST on loopback or on the lab's management network, where host agents reach it).
* ``Fabric`` -- controller + lab (jumbo frames, management network), hosts learned by the
  controller; port counters.
* ``Transfer`` -- one sender, many receivers, one model file; mid-transfer hooks (wait for
  a fraction sent, kill/restart a receiver, late joiners, IGMP-only receivers) and
  ``finish()`` -> ``TransferReport`` (digests checked here, independently of the agents).

Every process is started through the lab (killed by PID at teardown) or owned by
``Controller``; every object is removed by ``Fabric.stop()`` on all paths.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Callable, Iterable, Optional, Sequence

import requests

from lab.bridge import add_loss as _add_loss
from lab.bridge import clear_loss as _clear_loss
from lab.bridge import loss_dropped as _loss_dropped
from lab.models import ModelFile, file_digest, make_model  # noqa: F401  (re-exported)
from lab.controller import VENV_BIN, Controller, Say, quiet as _quiet, stamp_printer  # noqa: F401
from lab.ovs import Lab, LabError
from topologies.spec import Topology

RunnerError = LabError  # one error type for every lab step


# ------------------------------------------------------------------------ fabric


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


_PORT_RX = re.compile(r"rx pkts=(\d+), bytes=(\d+)")
_PORT_TX = re.compile(r"tx pkts=(\d+), bytes=(\d+)")


class Fabric:
    """The controller, a lab of ``topology`` wired to it (jumbo frames, as GPU fabrics run;
    a management network on which host agents reach the REST API); every host
    made known to the controller (hosts are learned from their own traffic). Use as a
    context manager: teardown happens on every path, Ctrl-C included."""

    def __init__(self, topology: Topology, workdir: Path, algorithm: str = "spt",
                 token: Optional[str] = None, say: Say = _quiet, mtu: int = 9000) -> None:
        self.topology = topology
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.say = say
        self.controller = Controller(self.workdir, token=token or secrets.token_hex(8),
                                     algorithm=algorithm, say=say)
        self.mtu = mtu
        self.lab: Optional[Lab] = None

    def __enter__(self) -> "Fabric":
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---------------------------------------------------------------- lifecycle

    def start(self, learn_timeout: float = 60) -> None:
        """Controller up, lab built, links discovered, hosts learned; undone on failure."""
        topo = self.topology
        try:
            self.say(f"building lab {topo.name}: {len(topo.switches)} OVS bridges (userspace "
                     f"datapath, MTU {self.mtu}), {len(topo.links)} links, {len(topo.hosts)} "
                     "host namespaces on a management network")
            self.lab = Lab(topo, controller=self.controller.of_target, mgmt=True, mtu=self.mtu)
            self.lab.start()
            self.controller.rest_host = self.lab.mgmt_gateway
            self.say(f"starting modelcast-controller (algorithm {self.controller.algorithm})")
            self.controller.start()
            self.say(f"lab {self.lab.base} up; waiting for the controller to discover "
                     f"{len(topo.links)} links (LLDP)")
            self.controller.wait_topology(len(topo.switches), len(topo.links), timeout=learn_timeout)
            self.say(f"host agents reach the REST API at {self.url}")
            self.learn_hosts(timeout=learn_timeout)
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
                raise RunnerError(f"hosts {[h.name for h in pending]} cannot reach {first.name} "
                                  f"through the fabric\n{self.controller.log_text()}")
        while True:
            known = {h["ip"] for h in self.controller.api("GET", "/v1/topology").json()["hosts"]}
            if known >= {h.ip for h in topo.hosts}:
                break
            if time.monotonic() > deadline:
                raise RunnerError(f"controller knows only {sorted(known)}\n{self.controller.log_text()}")
            time.sleep(0.3)
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
        if self.controller.proc is not None:
            self.controller.stop()
        if errors:
            raise RunnerError("; ".join(errors))

    # ---------------------------------------------------------------- helpers

    @property
    def url(self) -> str:
        """Controller URL as seen from inside any host namespace (and from the root one)."""
        return self.controller.url

    def ip(self, host: str) -> str:
        return self.topology.host(host).ip

    def name(self, host_or_ip: str) -> str:
        return self.topology.host(host_or_ip).name

    def _lab(self) -> Lab:
        if self.lab is None:
            raise RunnerError("fabric not started")
        return self.lab

    def host_port_iface(self, host: str) -> str:
        """The root-namespace (switch side) interface of a host's link."""
        h = self.topology.host(host)
        return self._lab().switch_port_iface(h.dpid, h.port)

    def port_counters(self, host: str) -> PortCounters:
        """OVS's own counters for the switch port a host is attached to."""
        h = self.topology.host(host)
        lab = self._lab()
        out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-ports", lab.bridge(h.dpid),
                              str(h.port)], capture_output=True, text=True, timeout=10)
        rx, tx = _PORT_RX.search(out.stdout), _PORT_TX.search(out.stdout)
        if out.returncode or not rx or not tx:
            raise RunnerError(f"ovs-ofctl dump-ports {lab.bridge(h.dpid)} {h.port}: "
                              f"{(out.stderr or out.stdout).strip()}")
        return PortCounters(int(rx.group(1)), int(rx.group(2)), int(tx.group(1)), int(tx.group(2)))

    def wire_bytes(self, host: str, towards_host: bool) -> int:
        """Kernel byte counter of a host's link (cheap enough to poll every few ms):
        ``towards_host`` = switch -> host, else host -> switch."""
        iface = self.host_port_iface(host)
        stat = "tx_bytes" if towards_host else "rx_bytes"
        return int(Path(f"/sys/class/net/{iface}/statistics/{stat}").read_text())

    def add_loss(self, host: str, kind: str, port: Optional[int] = None,
                 all_ip: bool = False) -> str:
        """Random (1%) or bursty loss on the link towards ``host``; returns the method."""
        return _add_loss(self._lab().ns(host), self.host_port_iface(host), kind, port, all_ip)

    def clear_loss(self, host: str) -> None:
        _clear_loss(self._lab().ns(host), self.host_port_iface(host))

    def loss_dropped(self, host: str, method: str) -> Optional[int]:
        return _loss_dropped(self._lab().ns(host), self.host_port_iface(host), method)

    def groups(self) -> list[dict]:
        return self.controller.api("GET", "/v1/groups").json()

    def find_group(self, model: str, source_ip: str) -> Optional[dict]:
        for g in self.groups():
            if g["model"] == model and g["source"] == source_ip:
                return g
        return None

    def set_link(self, a: int, b: int, up: bool) -> None:
        self.say(f"link {self.topology.switches[a]}-{self.topology.switches[b]} "
                 f"{'UP' if up else 'DOWN'}")
        self._lab().set_link(a, b, up)

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
                label += " -> " + " ".join(sorted(hosts_at[dpid], key=_natural))
            lines.append(label if top else f"{prefix}{'└─ ' if last else '├─ '}{label}")
            kids_of = sorted(children.get(dpid, []))
            for i, child in enumerate(kids_of):
                walk(child, prefix if top else prefix + ("   " if last else "│  "),
                     i == len(kids_of) - 1, False)

        walk(root, "", True, True)
        return "\n".join(lines)


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


# ------------------------------------------------------------------------ agents


@dataclass
class AgentRun:
    """One ``modelcast send|recv`` process in a host namespace."""

    host: str
    role: str
    argv: list[str]
    proc: subprocess.Popen
    stdout: Path
    stderr: Path
    started: float
    summary: Optional[dict] = None
    returncode: Optional[int] = None
    killed: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.killed = True
        self.returncode = self.proc.returncode

    def wait(self, timeout: float) -> Optional[dict]:
        """Wait for exit; parse its one-line JSON summary. Kills it (by PID) on timeout."""
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.returncode = self.proc.wait(10)
            raise RunnerError(f"{self.role} on {self.host} did not finish within {timeout:.0f}s; "
                              f"stderr: {self.stderr_tail()}") from None
        text = self.stdout.read_text(errors="replace").strip()
        if text:
            try:
                self.summary = json.loads(text.splitlines()[-1])
            except ValueError:
                self.summary = None
        return self.summary

    def stderr_tail(self, n: int = 2000) -> str:
        try:
            return self.stderr.read_text(errors="replace")[-n:].strip()
        except OSError:
            return ""


# Counts UDP datagrams to 232.0.0.0/8 arriving at a host's NIC (AF_PACKET: no socket-level
# join, so no IGMP report). Prints the count when told to stop (SIGTERM).
_PROBE = r"""
import signal, socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0800))
s.bind(("eth0", 0))
n = 0
def done(*_):
    print(n, flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, done)
print("ready", flush=True)
while True:
    data, addr = s.recvfrom(65536)
    if addr[2] != 4 and len(data) >= 20 and data[9] == 17 and data[16] == 232:
        n += 1
"""


class MulticastProbe:
    """How many SSM (232/8) UDP datagrams reached a host's NIC while it ran: the check
    that a host outside the tree got nothing."""

    def __init__(self, fabric: Fabric, host: str) -> None:
        self.host = host
        self.proc = fabric._lab().popen(host, sys.executable, "-c", _PROBE, stdout=subprocess.PIPE,
                                        text=True, start_new_session=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RunnerError(f"multicast probe on {host} did not start")

    def stop(self) -> int:
        """Stop the capture; the number of datagrams it saw."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=10)
        lines = [x for x in (out or "").split() if x.isdigit()]
        if not lines:
            raise RunnerError(f"multicast probe on {self.host} gave no count")
        return int(lines[-1])


# ------------------------------------------------------------------------ transfer


@dataclass
class ReceiverResult:
    host: str
    ip: str
    ok: bool  # exit 0, JSON digest_ok, and our own hash of the output matches
    digest: Optional[str]
    seconds: Optional[float]
    summary: Optional[dict]  # last run's JSON summary
    runs: int  # processes started for this receiver (2+ after a restart)
    join: str  # "rest" or "igmp"
    loss: Optional[str]  # loss method on its link, if any
    loss_dropped: Optional[int]
    error: Optional[str]
    summaries: list[dict] = field(default_factory=list)  # one per run that printed one


@dataclass
class TransferReport:
    name: str
    model: str
    size: int
    digest: str
    sender: str
    ok: bool
    seconds: float  # sender's transfer time (first datagram .. all verified / finished)
    wall: float  # sender process start .. last receiver verified, incl. REST and tree setup
    goodput_mbit: float
    sender_summary: Optional[dict]
    sender_link: PortCounters  # delta of OVS counters on the sender's switch port
    receivers: list[ReceiverResult]
    tree: str
    group: dict
    events: list[tuple[float, str]]
    probes: dict[str, int]  # non-receiver host -> multicast datagrams seen
    errors: list[str]

    @property
    def repair_pct(self) -> float:
        s = self.sender_summary or {}
        sent = s.get("bytes_sent") or 0
        return 100.0 * (s.get("repair_bytes") or 0) / sent if sent else 0.0

    def format(self) -> str:
        """A human-readable summary (the demo prints it; tests print it on failure)."""
        s = self.sender_summary or {}
        mb = self.size / 1e6
        link = self.sender_link
        lines = [
            f"transfer {self.name!r}: {'OK' if self.ok else 'FAILED'} -- model {self.model}, "
            f"{mb:.1f} MB, blake3 {self.digest[:16]}...",
            f"  time            {self.seconds:.2f} s sender transfer ({self.wall:.2f} s incl. "
            f"tree setup and last verification)",
            f"  goodput         {self.goodput_mbit:.1f} Mbit/s per receiver; "
            f"{self.goodput_mbit * len(self.receivers):.1f} Mbit/s delivered in total",
            f"  sender link     {link.rx_bytes / 1e6:.1f} MB / {link.rx_packets} packets into the "
            f"fabric (OVS port counters) = {link.rx_bytes / max(1, self.size):.3f} x the file "
            f"for {len(self.receivers)} receivers (unicast copies would be "
            f"{len(self.receivers)} x)",
            f"  repairs         {self.repair_pct:.2f}% of sent bytes ({s.get('repair_bytes', 0)} B: "
            f"{s.get('repair_bytes_unicast', 0)} unicast, {s.get('repair_bytes_multicast', 0)} "
            f"multicast), {s.get('nacks', 0)} NACKs",
            f"  group           {self.group.get('address')}:{self.group.get('port')} "
            f"(id {self.group.get('id')}, {self.group.get('algorithm')} tree)",
            "  tree            " + self.tree.replace("\n", "\n                  "),
            "  receivers",
        ]
        for r in self.receivers:
            sm = r.summary or {}
            extra = []
            if r.join != "rest":
                extra.append(f"joined by {r.join}")
            if r.runs > 1:
                extra.append(f"restarted, resumed {sm.get('resumed_chunks', 0)} chunks")
            if r.loss:
                extra.append(f"loss {r.loss}" + (f" ({r.loss_dropped} dropped)"
                                                 if r.loss_dropped is not None else ""))
            lines.append(
                f"    {r.host:5} {r.ip:11} {'verified' if r.ok else 'FAILED  '} "
                f"{(sm.get('goodput_mbit') or 0):6.1f} Mbit/s  nacks {sm.get('nacks', 0):4} "
                f"repairs {sm.get('repairs_received', 0):5}"
                + (f"  [{'; '.join(extra)}]" if extra else "")
                + (f"  error: {r.error}" if r.error else ""))
        for host, n in sorted(self.probes.items(), key=lambda x: _natural(x[0])):
            lines.append(f"    {host:5} not a receiver: {n} multicast datagrams reached its NIC")
        if self.events:
            lines.append("  events          " + "; ".join(f"+{t:.2f}s {e}" for t, e in self.events))
        for e in self.errors:
            lines.append(f"  ERROR           {e}")
        return "\n".join(lines)


def _failure(run: AgentRun, timed_out: bool) -> str:
    """One line on why an agent failed: timeout, its JSON error, or its last stderr line."""
    if timed_out:
        return "still running at the deadline (killed)"
    err = (run.summary or {}).get("error")
    if err:
        return str(err)
    lines = run.stderr_tail(400).splitlines()
    return f"exit {run.returncode}" + (f": {lines[-1]}" if lines else "")


class Transfer:
    """One model file from ``sender`` to ``receivers`` through a controller-built tree.

    Typical use::

        with Transfer(fabric, model, "h1", ["h3", "h5"], rate=100, name="basic") as t:
            t.start_receivers()
            t.start_sender()
            report = t.finish()

    Receivers join over REST (``modelcast recv --controller``), or by IGMPv3 only
    (``--group ADDR:PORT`` without a controller; start those after the sender created
    the group). ``__exit__`` kills whatever is still running and deletes the group."""

    def __init__(self, fabric: Fabric, model: ModelFile, sender: str, receivers: Sequence[str],
                 rate: float, name: str = "transfer", workdir: Optional[Path] = None,
                 model_name: Optional[str] = None, expect_receivers: Optional[int] = -1,
                 shared_key: bool = False, chunk_size: Optional[int] = None,
                 sender_timeout: float = 60, receiver_timeout: float = 30,
                 say: Optional[Say] = None) -> None:
        self.fabric = fabric
        self.model = model
        self.sender_host = fabric.name(sender)
        self.receiver_hosts = [fabric.name(r) for r in receivers]
        self.rate = rate
        self.name = name
        self.workdir = Path(workdir or fabric.workdir / name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.model_name = model_name or f"{name}-{model.digest[:12]}"
        # -1: expect every receiver (the sender waits for all to be installed and verified);
        # None: don't tell the sender (late joiners: it cannot wait for them up front).
        self.expect = len(self.receiver_hosts) if expect_receivers == -1 else expect_receivers
        self.key_file: Optional[Path] = None
        if shared_key:  # IGMP-only receivers cannot fetch the controller's session key
            self.key_file = self.workdir / "session.key"
            self.key_file.write_text(secrets.token_hex(32) + "\n")
        self.chunk_size = chunk_size
        self.sender_timeout = sender_timeout
        self.receiver_timeout = receiver_timeout
        self.say = say or fabric.say
        self.sender: Optional[AgentRun] = None
        self.runs: dict[str, list[AgentRun]] = {}
        self.join_kind: dict[str, str] = {}
        self.loss: dict[str, str] = {}
        self.probes: dict[str, MulticastProbe] = {}
        self.events: list[tuple[float, str]] = []
        self.group: dict = {}
        self.tree_text = ""
        self._t0: Optional[float] = None
        self._link0: Optional[PortCounters] = None
        self._wire0: int = 0
        self._rx0: dict[str, int] = {}
        self._finished = False

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---------------------------------------------------------------- setup

    def out_path(self, host: str) -> Path:
        return self.workdir / f"{host}.bin"

    def _cli(self, *args: str) -> list[str]:
        return [str(VENV_BIN / "modelcast"), *args]

    def _start(self, host: str, role: str, argv: list[str]) -> AgentRun:
        n = len(self.runs.get(host, [])) if role == "recv" else 0
        stdout = self.workdir / f"{role}-{host}-{n}.json"
        stderr = self.workdir / f"{role}-{host}-{n}.log"
        with open(stdout, "w") as out, open(stderr, "w") as err:
            proc = self.fabric._lab().popen(host, *argv, stdout=out, stderr=err,
                                            start_new_session=True)
        return AgentRun(host, role, argv, proc, stdout, stderr, time.monotonic())

    def add_loss(self, host: str, kind: str) -> str:
        """Inject ``kind`` loss ("random" 1% / "bursty") on the link towards ``host``."""
        host = self.fabric.name(host)
        method = self.fabric.add_loss(host, kind)
        self.loss[host] = method
        self.say(f"[{self.name}] {kind} loss towards {host}: {method}")
        return method

    def start_probes(self, hosts: Iterable[str]) -> None:
        """Count multicast reaching hosts that are not receivers (should stay 0)."""
        for h in hosts:
            h = self.fabric.name(h)
            self.probes[h] = MulticastProbe(self.fabric, h)
        self.say(f"[{self.name}] capturing multicast on non-receivers {sorted(self.probes, key=_natural)}")

    def start_receiver(self, host: str, igmp: bool = False) -> AgentRun:
        """Start (or restart, same --out: it resumes) ``modelcast recv`` on ``host``."""
        host = self.fabric.name(host)
        ip = self.fabric.ip(host)
        src = self.fabric.ip(self.sender_host)
        args = ["recv", "--source", src, "--out", str(self.out_path(host)), "--ip", ip,
                "--json", "--timeout", str(self.receiver_timeout)]
        if igmp:
            g = self.wait_group_created()
            args += ["--group", f"{g['address']}:{g['port']}"]
        else:
            args += ["--controller", self.fabric.url, "--token", self.fabric.controller.token,
                     "--model", self.model_name]
        if self.key_file is not None:
            args += ["--key-file", str(self.key_file)]
        run = self._start(host, "recv", self._cli(*args))
        self.runs.setdefault(host, []).append(run)
        self.join_kind[host] = "igmp" if igmp else "rest"
        verb = "restarted" if len(self.runs[host]) > 1 else "started"
        text = (f"receiver {host} ({ip}) {verb}, pid {run.proc.pid}, joins by "
                f"{'IGMPv3 (no REST call)' if igmp else 'REST'}")
        if self._t0 is not None:  # mid-transfer: part of the report's timeline
            self.event(text)
        else:
            self.say(f"[{self.name}] {text}")
        return run

    def start_receivers(self, hosts: Optional[Iterable[str]] = None, wait_joined: bool = True,
                        timeout: float = 30) -> None:
        """Start REST receivers (default: all) and wait until the controller installed them."""
        hosts = [self.fabric.name(h) for h in (hosts if hosts is not None else self.receiver_hosts)]
        for h in hosts:
            self.start_receiver(h)
        if wait_joined and hosts:
            self.wait_installed([self.fabric.ip(h) for h in hosts], timeout)

    def wait_group_created(self, timeout: float = 30) -> dict:
        """The group for (model, sender) once somebody created it over REST."""
        src = self.fabric.ip(self.sender_host)
        deadline = time.monotonic() + timeout
        while True:
            g = self.fabric.find_group(self.model_name, src)
            if g is not None:
                self.group = g
                return g
            if time.monotonic() > deadline:
                raise RunnerError(f"[{self.name}] group for {self.model_name} never created")
            self._check_alive()
            time.sleep(0.1)

    def wait_installed(self, ips: Sequence[str], timeout: float = 30) -> dict:
        """Until the controller reports every ip in ``ips`` installed in the group."""
        deadline = time.monotonic() + timeout
        g = self.wait_group_created(timeout)
        while True:
            g = self.fabric.controller.api("GET", f"/v1/groups/{g['id']}").json()
            if all(g.get("receivers", {}).get(ip) == "installed" for ip in ips):
                self.group = g
                self.tree_text = self.fabric.describe_tree(g)
                self.say(f"[{self.name}] controller installed group {g['id']} "
                         f"{g['address']}:{g['port']} for {len(g['receivers'])} receivers")
                return g
            if time.monotonic() > deadline:
                raise RunnerError(f"[{self.name}] receivers {list(ips)} not installed after "
                                  f"{timeout:.0f}s: {g.get('receivers')}\n"
                                  + self._stderr_tails())
            self._check_alive()
            time.sleep(0.1)

    def refresh_tree(self) -> dict:
        """Re-read the group (e.g. after a reroute) so the report shows the current tree."""
        g = self.fabric.controller.api("GET", f"/v1/groups/{self.group['id']}").json()
        self.group = g
        self.tree_text = self.fabric.describe_tree(g)
        return g

    def _check_alive(self) -> None:
        for host, runs in self.runs.items():
            r = runs[-1]
            if not r.alive() and not r.killed and r.proc.returncode not in (0, None):
                raise RunnerError(f"[{self.name}] receiver {host} exited {r.proc.returncode}: "
                                  f"{r.stderr_tail()}")
        if self.sender is not None and not self.sender.alive() and self.sender.proc.returncode:
            raise RunnerError(f"[{self.name}] sender exited {self.sender.proc.returncode}: "
                              f"{self.sender.stderr_tail()}")

    def start_sender(self) -> AgentRun:
        """Start ``modelcast send``; it creates/looks up the group over REST, waits for the
        tree (and ``expect`` receivers), then streams at up to ``rate`` Mbit/s."""
        lab_host = self.sender_host
        args = ["send", str(self.model.path), "--controller", self.fabric.url,
                "--token", self.fabric.controller.token, "--model", self.model_name,
                "--ip", self.fabric.ip(lab_host), "--rate", str(self.rate), "--json",
                "--timeout", str(self.sender_timeout), "--poll", "0.1"]
        if self.expect is not None:
            args += ["--receivers", str(self.expect)]
        if self.key_file is not None:
            args += ["--key-file", str(self.key_file)]
        if self.chunk_size:
            args += ["--chunk-size", str(self.chunk_size)]
        self._link0 = self.fabric.port_counters(lab_host)
        self._wire0 = self.fabric.wire_bytes(lab_host, towards_host=False)
        self._rx0 = {h.name: self.fabric.wire_bytes(h.name, towards_host=True)
                     for h in self.fabric.topology.hosts}
        self.sender = self._start(lab_host, "send", self._cli(*args))
        self._t0 = time.monotonic()
        self.say(f"[{self.name}] sender {lab_host} started, pid {self.sender.proc.pid}: "
                 f"{self.model.size / 1e6:.1f} MB at <= {self.rate:g} Mbit/s to "
                 f"{self.expect if self.expect is not None else 'any number of'} receivers")
        return self.sender

    def event(self, text: str) -> None:
        t = time.monotonic() - (self._t0 or time.monotonic())
        self.events.append((t, text))
        self.say(f"[{self.name}] {text}")

    # ---------------------------------------------------------------- progress

    def sent_fraction(self) -> float:
        """Bytes the sender put on its link since it started, as a fraction of the file."""
        return (self.fabric.wire_bytes(self.sender_host, towards_host=False) - self._wire0) / self.model.size

    def received_fraction(self, host: str) -> float:
        """Bytes delivered to ``host``'s NIC since the sender started, per file size."""
        host = self.fabric.name(host)
        return (self.fabric.wire_bytes(host, towards_host=True) - self._rx0.get(host, 0)) / self.model.size

    def wait_until(self, pred: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise RunnerError(f"[{self.name}] timed out after {timeout:.0f}s waiting for {what}"
                                  f"\nsender: {self.sender.stderr_tail() if self.sender else '-'}")
            self._check_alive()
            time.sleep(0.005)

    def wait_sent(self, fraction: float, timeout: float = 60) -> None:
        """Block until the sender's link carried ``fraction`` of the file."""
        self.wait_until(lambda: self.sent_fraction() >= fraction,
                        f"the sender to send {fraction:.0%} of the file", timeout)

    def wait_received(self, host: str, fraction: float, timeout: float = 60) -> None:
        self.wait_until(lambda: self.received_fraction(host) >= fraction,
                        f"{host} to receive {fraction:.0%} of the file", timeout)

    def kill_receiver(self, host: str, sig: int = signal.SIGKILL) -> None:
        host = self.fabric.name(host)
        run = self.runs[host][-1]
        got = self.received_fraction(host)
        run.kill(sig)
        self.event(f"receiver {host} killed ({signal.Signals(sig).name}) after ~{got:.0%} arrived")

    # ---------------------------------------------------------------- finish

    def finish(self, timeout: float = 180) -> TransferReport:
        """Wait for the sender and every receiver, verify each output file's BLAKE3
        against the model, collect counters and build the report."""
        if self.sender is None:
            raise RunnerError("finish() before start_sender()")
        deadline = time.monotonic() + timeout
        errors: list[str] = []
        results: list[ReceiverResult] = []
        for host in self.receiver_hosts:
            if host not in self.runs:
                errors.append(f"receiver {host} was never started")
        for host, runs in self.runs.items():
            run = runs[-1]
            timed_out = False
            try:
                run.wait(max(1.0, deadline - time.monotonic()))
            except RunnerError:
                timed_out = True
            s = run.summary or {}
            digest = file_digest(self.out_path(host))
            ok = run.returncode == 0 and bool(s.get("digest_ok")) and digest == self.model.digest \
                and s.get("file_digest") == self.model.digest
            err = None
            if not ok:
                err = _failure(run, timed_out) if run.returncode != 0 or timed_out else \
                    f"output digest {digest and digest[:16]} != model {self.model.digest[:16]}"
                errors.append(f"receiver {host}: {err}")
            method = self.loss.get(host)
            results.append(ReceiverResult(
                host=host, ip=self.fabric.ip(host), ok=ok, digest=digest,
                seconds=s.get("seconds"), summary=run.summary, runs=len(runs),
                join=self.join_kind.get(host, "rest"), loss=method,
                loss_dropped=self.fabric.loss_dropped(host, method) if method else None,
                error=err, summaries=[r.summary for r in runs if r.summary]))
        timed_out = False
        try:
            self.sender.wait(max(1.0, deadline - time.monotonic()))
        except RunnerError:
            timed_out = True
        wall = time.monotonic() - self.sender.started  # all agents have exited by now
        s = self.sender.summary or {}
        if self.sender.returncode != 0 or timed_out:
            errors.append(f"sender {self.sender_host}: {_failure(self.sender, timed_out)}")
        link = self.fabric.port_counters(self.sender_host) - (self._link0 or PortCounters())
        probes = {h: p.stop() for h, p in self.probes.items()}
        self.probes.clear()
        for h, n in probes.items():
            if n:
                errors.append(f"non-receiver {h} got {n} multicast datagrams")
        results.sort(key=lambda r: _natural(r.host))
        self._finished = True
        report = TransferReport(
            name=self.name, model=self.model_name, size=self.model.size, digest=self.model.digest,
            sender=self.sender_host, ok=not errors and all(r.ok for r in results) and bool(results),
            seconds=float(s.get("seconds") or 0.0), wall=wall,
            goodput_mbit=float(s.get("goodput_mbit") or 0.0), sender_summary=self.sender.summary,
            sender_link=link, receivers=results, tree=self.tree_text or "(not captured)",
            group=self.group, events=self.events, probes=probes, errors=errors)
        self.say(f"[{self.name}] {'all ' + str(len(results)) + ' receivers verified' if report.ok else 'FAILED'}"
                 f" in {report.seconds:.2f}s")
        return report

    def _stderr_tails(self) -> str:
        parts = []
        for host, runs in self.runs.items():
            parts.append(f"--- {host}: {runs[-1].stderr_tail(600)}")
        if self.sender:
            parts.append(f"--- sender: {self.sender.stderr_tail(600)}")
        return "\n".join(parts)

    def close(self) -> None:
        """Kill what still runs (by PID), stop probes, remove loss rules, delete the group."""
        for runs in self.runs.values():
            for run in runs:
                if run.alive():
                    run.kill(signal.SIGKILL)
        if self.sender is not None and self.sender.alive():
            self.sender.kill(signal.SIGKILL)
        for p in self.probes.values():
            try:
                p.stop()
            except (RunnerError, subprocess.TimeoutExpired):
                p.proc.kill()
        self.probes.clear()
        if self.fabric.lab is not None:
            for host in self.loss:
                self.fabric.clear_loss(host)
        self.loss.clear()
        try:
            if self.fabric.controller.proc is not None:
                g = self.fabric.find_group(self.model_name, self.fabric.ip(self.sender_host))
                if g is not None:
                    self.fabric.controller.api("DELETE", f"/v1/groups/{g['id']}")
        except requests.RequestException:
            pass
