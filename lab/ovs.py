"""Instantiate a ``spec.Topology`` on real Open vSwitch with network-namespace hosts.

Why not Mininet: Mininet names everything globally (``s1``, ``s1-eth1``, ``h1-eth0``) and
deletes same-named leftovers before building, so two labs -- or a lab and a developer's
Mininet session -- clobber each other, and ``mn -c`` removes everything Mininet-shaped.
This lab gives every object a per-instance tag, records each name as it is created, and
tears down exactly those names again (also after a partial start, Ctrl-C, or at exit).

The machines have no openvswitch kernel module, so bridges use the userspace datapath
(``datapath_type=netdev``); TCP through it needs tx checksum offload off on the host side.

Usage::

    with Lab(spec.linear(3), controller=None, fail_mode="standalone") as lab:
        lab.run("h1", "ping", "-c", "1", "10.0.0.3")

CLI: ``python -m topologies.lab up leaf-spine:2,4,2 [--controller tcp:127.0.0.1:6653]``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Sequence

if __package__ in (None, ""):  # `python topologies/lab.py` rather than `-m topologies.lab`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.spec import Host, Link, Topology, TopologyError, parse

log = logging.getLogger("modelcast.lab")

IFNAMSIZ = 15  # Linux interface names are at most 15 characters
STATE_DIR = Path(os.environ.get("MODELCAST_LAB_STATE", "/run/modelcast-lab"))
HOST_IFACE = "eth0"
ETC_NETNS = Path("/etc/netns")
MGMT_IFACE = "mgmt0"
_VSCTL = ("ovs-vsctl", "--timeout=20")


# ICMP echo for machines without iputils-ping (argv: ip count wait); exit 0 on any reply.
_PY_PING = r"""
import os, select, socket, struct, sys, time
ip, count, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
ident = os.getpid() & 0xFFFF
def csum(b):
    b += b"\0" * (len(b) % 2)
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    t = (t >> 16) + (t & 0xFFFF); t += t >> 16
    return ~t & 0xFFFF
for seq in range(count):
    body = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"modelcast"
    s.sendto(body[:2] + struct.pack("!H", csum(body)) + body[4:], (ip, 0))
    end = time.monotonic() + wait
    while (left := end - time.monotonic()) > 0:
        if not select.select([s], [], [], left)[0]:
            break
        data, addr = s.recvfrom(2048)
        hl = (data[0] & 15) * 4
        if addr[0] == ip and data[hl] == 0 and struct.unpack("!H", data[hl + 4:hl + 6])[0] == ident:
            sys.exit(0)
sys.exit(1)
"""


class LabError(RuntimeError):
    """Building, using or checking the lab failed; the message names the command and its
    stderr so a failure is diagnosable from a CI log alone."""


def _fmt(cmd: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(c)) for c in cmd)


def _sh(cmd: Sequence[str], check: bool = True, timeout: float = 30, what: str = "",
        shown: Sequence[str] | None = None, **popen_kw: Any) -> subprocess.CompletedProcess:
    """Run a command (output captured as text unless the caller redirects it) and turn a
    failure into a LabError with context: ``what`` it was for and the command as the user
    would recognise it (``shown``, e.g. without the ``ip netns exec`` prefix)."""
    cmd = [str(c) for c in cmd]
    pretty = _fmt(shown if shown is not None else cmd)
    prefix = f"{what}: " if what else ""
    popen_kw.setdefault("text", True)
    if "stdout" not in popen_kw and "stderr" not in popen_kw:
        popen_kw.setdefault("capture_output", True)
    log.debug("$ %s", _fmt(cmd))
    try:
        proc = subprocess.run(cmd, timeout=timeout, **popen_kw)
    except FileNotFoundError as exc:
        raise LabError(f"{prefix}command not found: {cmd[0]} (running `{pretty}`)") from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{prefix}`{pretty}` timed out after {timeout}s; output: "
                       f"{exc.stdout!r} {exc.stderr!r}") from exc
    if check and proc.returncode != 0:
        raise LabError(f"{prefix}`{pretty}` exited {proc.returncode}: "
                       f"{(proc.stderr or proc.stdout or '').strip()}")
    return proc


def stop_processes(procs: list[subprocess.Popen], grace: float = 3) -> None:
    """SIGTERM our processes (by PID), then SIGKILL whatever is still running after
    ``grace`` seconds in all."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill_netns_pids(ns: str) -> list[int]:
    """Processes still running inside one of *our* namespaces (e.g. forked by a child we
    started) would keep it alive: SIGTERM, then SIGKILL, by PID. Returns those signalled."""
    pids = [int(p) for p in _sh(["ip", "netns", "pids", ns], check=False).stdout.split()
            if p.isdigit()]
    signalled: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            break
        signalled = sorted(set(signalled) | set(alive))
        time.sleep(0.2)
        pids = alive
    return signalled


def require_lab() -> None:
    """Raise LabError with a precise reason unless this process can build a lab: root,
    ``ip netns``, ``ethtool`` and a reachable ovs-vswitchd that supports the userspace
    (netdev) datapath. Tests turn the reason into a skip (or a failure under CI)."""
    if os.geteuid() != 0:
        raise LabError(f"the OVS lab needs root (running as uid {os.geteuid()})")
    for tool in ("ovs-vsctl", "ip", "ethtool"):
        if shutil.which(tool) is None:
            raise LabError(f"`{tool}` is not on PATH (install openvswitch-switch, iproute2, "
                           "ethtool; see scripts/lab-deps.sh)")
    try:
        _sh([*_VSCTL[:1], "--timeout=5", "show"], timeout=10, what="ovs-vsctl unreachable")
        types = _sh([*_VSCTL[:1], "--timeout=5", "get", "Open_vSwitch", ".",
                     "datapath_types"], timeout=10).stdout
    except LabError as exc:
        raise LabError(f"{exc} -- is ovs-vswitchd running? start it with "
                       "`/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random`"
                       ) from None
    if "netdev" not in types:
        raise LabError(f"ovs-vswitchd does not offer the userspace datapath (datapath_types="
                       f"{types.strip()}); the lab needs datapath_type=netdev")
    _sh(["ip", "netns", "list"], timeout=10, what="`ip netns` unusable")


def has_loop(topology: Topology) -> bool:
    """True if the inter-switch links contain a cycle (union-find over the links)."""
    parent = {d: d for d in topology.switches}

    def root(d: int) -> int:
        while parent[d] != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d

    for link in topology.links:
        ra, rb = root(link.a), root(link.b)
        if ra == rb:
            return True
        parent[ra] = rb
    return False


# --------------------------------------------------------------------------------------
# Process-wide cleanup: every started lab is stopped at exit and on SIGTERM/SIGHUP.

_live: "set[Lab]" = set()  # strong refs: a started-but-dropped lab is still cleaned at exit
_live_lock = threading.Lock()


def _stop_all() -> None:
    with _live_lock:
        labs = list(_live)
    for lab in labs:
        try:
            lab.stop()
        except Exception:  # noqa: BLE001 -- best effort at interpreter exit
            log.exception("lab %s: cleanup at exit failed", lab.tag)


atexit.register(_stop_all)


class Lab:
    """A topology on OVS bridges with one network namespace per host; same dpids, OpenFlow
    port numbers, IPs and MACs as the spec. Use as a context manager so it always tears
    down. Not thread-safe: build, use and stop it from one thread."""

    def __init__(self, topology: Topology, controller: str | None = "tcp:127.0.0.1:6653",
                 prefix: str = "mc", fail_mode: str = "secure", stp: bool | None = None,
                 mgmt: bool = False, mtu: int = 1500) -> None:
        if fail_mode not in ("secure", "standalone"):
            raise LabError(f"fail_mode must be 'secure' or 'standalone', got {fail_mode!r}")
        if not prefix.isalnum() or not 1 <= len(prefix) <= 4:
            raise LabError(f"prefix must be 1-4 alphanumeric characters, got {prefix!r}")
        self.topology = topology.validate()
        self.controller = controller
        self.prefix = prefix
        self.fail_mode = fail_mode
        # A standalone (learning-switch) fabric with a loop floods forever; RSTP breaks the
        # loop (converges in ~3 s here; classic STP takes ~30 s). Default: on exactly then.
        self.stp = (fail_mode == "standalone" and has_loop(topology)) if stp is None else stp
        # A management network (root-namespace Linux bridge, one ``mgmt0`` per host) lets
        # agents in the hosts reach the controller's REST API, as they would over a real
        # out-of-band network; the data plane stays on the OpenFlow fabric.
        self.mgmt = mgmt
        if not 1280 <= mtu <= 9000:
            raise LabError(f"mtu must be 1280..9000, got {mtu}")
        self.mtu = mtu  # 9000: the jumbo frames GPU fabrics run; every data-plane link gets it
        if mgmt and len(topology.hosts) > 253:
            raise LabError("the management network holds at most 253 hosts")
        self.tag = ""
        self.started = False
        self._created: list[tuple[str, str]] = []  # (kind, name), in creation order
        self._procs: list[subprocess.Popen] = []
        self._bridges: dict[int, str] = {}
        self._ports: dict[tuple[int, int], str] = {}  # (dpid, ofport) -> OVS-side ifname
        self._netns: dict[str, str] = {}  # host name -> netns name
        self._ifseq = 0

    # ---------------------------------------------------------------- names and lookups

    @property
    def base(self) -> str:
        """``prefix + tag``: the start of every name this lab creates."""
        return f"{self.prefix}{self.tag}"

    def _ifname(self, dpid: int, port: int) -> str:
        name = f"{self.base}s{dpid}p{port}"
        if len(name) > IFNAMSIZ:  # huge custom dpids/ports: fall back to a counter
            self._ifseq += 1
            name = f"{self.base}i{self._ifseq}"
        return name

    def bridge(self, dpid: int) -> str:
        """OVS bridge name of switch ``dpid``."""
        try:
            return self._bridges[dpid]
        except KeyError:
            raise LabError(f"lab {self.base}: no switch with dpid {dpid} "
                           f"(have {sorted(self._bridges)})") from None

    def ns(self, host: str) -> str:
        """Network namespace of a host, by host name or IP address."""
        try:
            h = self.topology.host(host)
        except KeyError as exc:
            raise LabError(str(exc)) from None
        if h.name not in self._netns:
            raise LabError(f"lab {self.base}: host {h.name} has no namespace (lab not started?)")
        return self._netns[h.name]

    def host_iface(self, host: str) -> str:
        """The host-side interface inside its namespace (always ``eth0``, as in Mininet)."""
        self.ns(host)
        return HOST_IFACE

    def switch_port_iface(self, dpid: int, port: int) -> str:
        """The OVS-side interface of OpenFlow port ``port`` on ``dpid`` (for tc netem/tbf)."""
        try:
            return self._ports[(dpid, port)]
        except KeyError:
            raise LabError(f"lab {self.base}: switch {dpid} has no port {port}") from None

    def _link(self, a: int, b: int) -> Link:
        for link in self.topology.links:
            if (link.a, link.b) in ((a, b), (b, a)):
                return link
        raise LabError(f"lab {self.base}: no link between switches {a} and {b}")

    @property
    def mgmt_gateway(self) -> str:
        """The root namespace's address on the management network (where the controller's
        REST API should listen for agents in the hosts)."""
        if not self.mgmt or not self.tag:
            raise LabError(f"lab {self.base or '(not started)'} has no management network")
        return f"169.254.{int(self.tag, 16) % 250 + 1}.254"

    def mgmt_ip(self, host: str) -> str:
        index = self.topology.hosts.index(self.topology.host(host)) + 1
        return self.mgmt_gateway.rsplit(".", 1)[0] + f".{index}"

    # ---------------------------------------------------------------- bookkeeping

    def _record(self, kind: str, name: str) -> None:
        """Remember an object *before* creating it, so a failure half-way through the
        creating command still gets cleaned up (every delete tolerates absence)."""
        self._created.append((kind, name))
        self._save_state()

    def _save_state(self) -> None:
        """Persist the created names so ``python -m topologies.lab down TAG`` can clean up
        after a lab whose process was SIGKILLed."""
        if not self.tag:
            return
        try:
            STATE_DIR.mkdir(parents=True, exist_ok=True)
            path = STATE_DIR / f"{self.base}.json"
            if self._created:
                path.write_text(json.dumps({"pid": os.getpid(), "created": self._created}))
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            log.debug("lab %s: cannot write state file: %s", self.base, exc)

    def _pick_tag(self) -> str:
        """A random 4-hex tag not used by any existing bridge, netns or interface."""
        existing = " ".join([
            _sh([*_VSCTL, "list-br"]).stdout,
            _sh(["ip", "netns", "list"]).stdout,
            _sh(["ip", "-o", "link"]).stdout,
        ])
        for _ in range(100):
            tag = secrets.token_hex(2)
            if f"{self.prefix}{tag}" not in existing:
                return tag
        raise LabError("could not find an unused lab tag")

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> "Lab":
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Build bridges, veths and namespaces. On any failure (including Ctrl-C) tear down
        what was built and raise (LabError with the failing command, or the interrupt)."""
        if self.started:
            raise LabError(f"lab {self.base} already started")
        require_lab()
        self.tag = self._pick_tag()
        self.started = True
        with _live_lock:
            _live.add(self)
        t0 = time.monotonic()
        topo = self.topology
        log.info("lab %s: building %s (%d switches, %d links, %d hosts), controller=%s, "
                 "fail_mode=%s, rstp=%s", self.base, topo.name, len(topo.switches),
                 len(topo.links), len(topo.hosts), self.controller, self.fail_mode, self.stp)
        if self.fail_mode == "standalone" and not self.stp and has_loop(topo):
            log.warning("lab %s: standalone mode on a topology with loops and RSTP off: "
                        "broadcasts will loop forever", self.base)
        try:
            self._build()
        except BaseException as exc:
            log.error("lab %s: start failed (%s); tearing down what was built", self.base,
                      exc if isinstance(exc, LabError) else type(exc).__name__)
            try:
                self.stop()
            except Exception as cleanup:  # noqa: BLE001
                log.error("lab %s: cleanup after failed start also failed: %s", self.base,
                          cleanup)
            if isinstance(exc, (LabError, KeyboardInterrupt, SystemExit)):
                raise
            raise LabError(f"lab {self.base}: start failed: {exc!r}") from exc
        log.info("lab %s: up in %.1fs", self.base, time.monotonic() - t0)

    def _build(self) -> None:
        topo = self.topology
        for dpid in sorted(topo.switches):
            self._bridges[dpid] = f"{self.base}s{dpid}"
            if len(self._bridges[dpid]) > IFNAMSIZ:
                self._bridges[dpid] = f"{self.base}b{len(self._bridges)}"
        bridge_ports: dict[int, list[tuple[str, int]]] = {d: [] for d in topo.switches}

        # Inter-switch links: one veth pair per link, both ends stay in the root namespace.
        for link in topo.links:
            a_if, b_if = self._ifname(link.a, link.a_port), self._ifname(link.b, link.b_port)
            log.info("lab %s: link %s:%d <-> %s:%d (%s <-> %s)", self.base,
                     topo.switches[link.a], link.a_port, topo.switches[link.b], link.b_port,
                     a_if, b_if)
            self._record("link", a_if)
            self._record("link", b_if)
            _sh(["ip", "link", "add", a_if, "mtu", str(self.mtu), "type", "veth", "peer", "name",
                 b_if, "mtu", str(self.mtu)], what="create inter-switch veth")
            for ifname, dpid, port in ((a_if, link.a, link.a_port), (b_if, link.b, link.b_port)):
                self._ports[(dpid, port)] = ifname
                bridge_ports[dpid].append((ifname, port))
                self._root_if_up(ifname)

        # Hosts: a namespace each, with eth0 = the far end of a veth from the switch port.
        for h in topo.hosts:
            self._build_host(h)
            bridge_ports[h.dpid].append((self._ports[(h.dpid, h.port)], h.port))

        # Bridges: one ovs-vsctl transaction each, ports pinned to the spec's numbers.
        for dpid in sorted(topo.switches):
            self._build_bridge(dpid, bridge_ports[dpid])
        self._verify_ofports()
        if self.mgmt:
            self._build_mgmt()

    def _build_mgmt(self) -> None:
        br, gw = f"{self.base}mg", self.mgmt_gateway
        log.info("lab %s: management network %s/24 on bridge %s", self.base, gw, br)
        self._record("link", br)
        _sh(["ip", "link", "add", br, "type", "bridge"], what="create management bridge")
        _sh(["ip", "addr", "add", f"{gw}/24", "dev", br], what="management gateway address")
        self._root_if_up(br)
        for i, h in enumerate(self.topology.hosts, start=1):
            root_if, ns = f"{self.base}m{i}", self._netns[h.name]
            self._record("link", root_if)
            _sh(["ip", "link", "add", root_if, "type", "veth", "peer", "name", MGMT_IFACE,
                 "netns", ns], what=f"{h.name}: management veth")
            _sh(["ip", "link", "set", root_if, "master", br], what=f"{h.name}: attach mgmt")
            self._root_if_up(root_if)
            x = ["ip", "netns", "exec", ns]
            _sh([*x, "ip", "addr", "add", f"{self.mgmt_ip(h.name)}/24", "dev", MGMT_IFACE],
                what=f"{h.name}: management address")
            _sh([*x, "ip", "link", "set", MGMT_IFACE, "up"], what=f"{h.name}: mgmt0 up")

    def _root_if_up(self, ifname: str) -> None:
        # No IPv6 on lab links: router solicitations and MLD reports would otherwise reach
        # the controller as packet-ins and pollute multicast tests.
        try:
            Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6").write_text("1")
        except OSError:
            pass
        _sh(["ip", "link", "set", ifname, "up"], what=f"bring up {ifname}")

    def _build_host(self, h: Host) -> None:
        ns = f"{self.base}-{h.name}"
        sw_if = self._ifname(h.dpid, h.port)
        log.info("lab %s: host %s %s %s in netns %s on %s port %d (%s)", self.base, h.name,
                 h.ip, h.mac, ns, self.topology.switches[h.dpid], h.port, sw_if)
        self._record("netns", ns)
        _sh(["ip", "netns", "add", ns], what=f"create netns for {h.name}")
        self._netns[h.name] = ns
        self._write_etc(ns)
        self._record("link", sw_if)
        # Create the host end directly inside the namespace so "eth0" never exists in (or
        # collides with anything in) the root namespace.
        _sh(["ip", "link", "add", sw_if, "mtu", str(self.mtu), "type", "veth", "peer", "name",
             HOST_IFACE, "address", h.mac, "mtu", str(self.mtu), "netns", ns],
            what=f"create veth for {h.name}")
        self._ports[(h.dpid, h.port)] = sw_if
        self._root_if_up(sw_if)
        x = ["ip", "netns", "exec", ns]
        _sh([*x, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
             "net.ipv6.conf.default.disable_ipv6=1"], check=False)
        _sh([*x, "ip", "link", "set", "lo", "up"], what=f"{h.name}: lo up")
        _sh([*x, "ip", "addr", "add", f"{h.ip}/8", "dev", HOST_IFACE], what=f"{h.name}: address")
        _sh([*x, "ip", "link", "set", HOST_IFACE, "up"], what=f"{h.name}: eth0 up")
        # Userspace OVS does not fill in offloaded checksums: without this TCP stalls.
        _sh([*x, "ethtool", "-K", HOST_IFACE, "tx", "off"], what=f"{h.name}: tx offload off")
        _sh([*x, "ip", "route", "add", "224.0.0.0/4", "dev", HOST_IFACE],
            what=f"{h.name}: multicast route")

    def _write_etc(self, ns: str) -> None:
        """Per-namespace /etc/hosts (every lab host by name) and a resolver that fails at
        once: `ip netns exec` mounts /etc/netns/NS/* over /etc. Without it, programs that
        look up a peer's name (UFTP's uftpd does) wait seconds for an unreachable DNS."""
        etc = ETC_NETNS / ns
        self._record("etc", str(etc))
        etc.mkdir(parents=True, exist_ok=True)
        hosts = "127.0.0.1 localhost\n" + "".join(f"{h.ip} {h.name}\n" for h in self.topology.hosts)
        (etc / "hosts").write_text(hosts)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _build_bridge(self, dpid: int, ports: list[tuple[str, int]]) -> None:
        br = self._bridges[dpid]
        log.info("lab %s: bridge %s = %s dpid %016x ports %s", self.base, br,
                 self.topology.switches[dpid], dpid,
                 ", ".join(f"{p}={n}" for n, p in sorted(ports, key=lambda x: x[1])))
        self._record("bridge", br)
        cmd = [*_VSCTL, "add-br", br, "--", "set", "bridge", br, "datapath_type=netdev",
               f"other-config:datapath-id={dpid:016x}", "protocols=OpenFlow13",
               f"fail_mode={self.fail_mode}", "other-config:disable-in-band=true",
               f"other-config:dp-desc={self.topology.switches[dpid]}"]
        if self.stp:
            cmd += ["rstp_enable=true"]
        for ifname, port in sorted(ports, key=lambda x: x[1]):
            cmd += ["--", "add-port", br, ifname, "--", "set", "Interface", ifname,
                    f"ofport_request={port}", f"mtu_request={self.mtu}"]
        if self.controller:
            # Reconnect within 1 s (default backoff grows to 8 s): a restarted controller
            # regains every switch at once.
            cmd += ["--", "set-controller", br, self.controller,
                    "--", "set", "controller", br, "max_backoff=1000"]
        _sh(cmd, what=f"create bridge {br}")

    def _verify_ofports(self) -> None:
        """ofport_request is a request: a port that fails to open gets -1 and a clash gets
        another number. Check every port in one query."""
        out = _sh([*_VSCTL, "--format=json", "--columns=name,ofport,error", "list",
                   "Interface"], what="list interfaces").stdout
        got: dict[str, tuple[Any, Any]] = {}
        for name, ofport, error in json.loads(out)["data"]:
            got[name] = (ofport, error)
        bad = []
        for (dpid, port), ifname in sorted(self._ports.items()):
            ofport, error = got.get(ifname, (None, None))
            if ofport != port:
                err = error if isinstance(error, str) else ""
                bad.append(f"{ifname} on {self.bridge(dpid)}: ofport {ofport}, wanted {port}"
                           + (f" ({err})" if err else ""))
        if bad:
            raise LabError(f"lab {self.base}: OpenFlow port numbers differ from the spec: "
                           + "; ".join(bad))

    def stop(self) -> None:
        """Idempotent teardown of exactly what this lab created (by recorded name): kill its
        processes, delete its bridges, veths and namespaces. Errors are logged, not raised,
        until everything has been tried; then a LabError lists what could not be removed."""
        if not self.started and not self._created:
            return
        log.info("lab %s: tearing down", self.base)
        self._kill_procs()
        failures: list[str] = []
        bridges = [n for k, n in self._created if k == "bridge"]
        if bridges:
            cmd: list[str] = list(_VSCTL)
            for br in bridges:
                cmd += ["--", "--if-exists", "del-br", br]
            proc = _sh(cmd, check=False)
            if proc.returncode:
                failures.append(f"`{_fmt(cmd)}`: {proc.stderr.strip()}")
        # A netdev bridge's local port is a tap device that may outlive del-br.
        links = {n for k, n in self._created if k in ("link", "bridge")}
        if links:
            present = set(_sh(["ip", "-o", "link"], check=False).stdout.split())
            for ifname in sorted(links):
                if f"{ifname}:" in present or any(p.startswith(f"{ifname}@") for p in present):
                    proc = _sh(["ip", "link", "del", ifname], check=False)
                    if proc.returncode and "Cannot find device" not in proc.stderr:
                        failures.append(f"ip link del {ifname}: {proc.stderr.strip()}")
        for kind, name in self._created:
            if kind == "netns" and Path(f"/run/netns/{name}").exists():
                self._kill_ns_pids(name)
                proc = _sh(["ip", "netns", "del", name], check=False)
                if proc.returncode:
                    failures.append(f"ip netns del {name}: {proc.stderr.strip()}")
            elif kind == "etc" and Path(name).parent == ETC_NETNS:
                shutil.rmtree(name, ignore_errors=True)
        self._created = []
        self._bridges.clear()
        self._ports.clear()
        self._netns.clear()
        self._save_state()
        self.started = False
        with _live_lock:
            _live.discard(self)
        if failures:
            raise LabError(f"lab {self.base}: teardown incomplete: " + "; ".join(failures))
        log.info("lab %s: torn down", self.base)

    def _kill_procs(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                log.info("lab %s: stopping pid %d (%s)", self.base, proc.pid,
                         _fmt(proc.args) if isinstance(proc.args, list) else proc.args)
        stop_processes(self._procs)
        self._procs = []

    def _kill_ns_pids(self, ns: str) -> None:
        killed = kill_netns_pids(ns)
        if killed:
            log.info("lab %s: killed leftover processes %s in %s", self.base, killed, ns)

    # ---------------------------------------------------------------- using the lab

    def run(self, host: str, *cmd: str, check: bool = True, timeout: float = 30,
            **popen_kw: Any) -> subprocess.CompletedProcess:
        """Run ``cmd`` in a host's namespace and wait. Output is captured as text unless
        overridden; with ``check`` a non-zero exit raises LabError with its stderr."""
        log.debug("lab %s: [%s] %s", self.base, host, _fmt(cmd))
        return _sh(["ip", "netns", "exec", self.ns(host), *cmd], check, timeout, f"[{host}]",
                   shown=cmd, **popen_kw)

    def popen(self, host: str, *cmd: str, **kw: Any) -> subprocess.Popen:
        """Start ``cmd`` in the background in a host's namespace; stop() kills it by PID."""
        full = ["ip", "netns", "exec", self.ns(host), *map(str, cmd)]
        proc = subprocess.Popen(full, **kw)  # ip netns exec execs: proc.pid is cmd's PID
        self._procs.append(proc)
        log.info("lab %s: [%s] started pid %d: %s", self.base, host, proc.pid, _fmt(cmd))
        return proc

    def ping(self, src: str, dst: str, count: int = 2, wait: float = 2) -> bool:
        """True if ``src`` gets an echo reply from ``dst`` (host name or IP). Uses
        ``ping -c COUNT -W WAIT``; without iputils-ping, a raw-socket ICMP echo in Python."""
        ip = self.topology.host(dst).ip if not dst[:1].isdigit() else dst
        if shutil.which("ping"):
            return self.run(src, "ping", "-n", "-c", count, "-W", wait, ip, check=False,
                            timeout=count * (wait + 1) + 5).returncode == 0
        return self.run(src, sys.executable, "-c", _PY_PING, ip, str(count), str(wait),
                        check=False, timeout=count * (wait + 1) + 5).returncode == 0

    def set_link(self, a: int, b: int, up: bool) -> None:
        """Take the inter-switch link a-b down or up by setting both veth ends down/up, so
        OVS sees carrier loss and sends PortStatus (link down) on both switches."""
        link = self._link(a, b)
        state = "up" if up else "down"
        for dpid, port in ((link.a, link.a_port), (link.b, link.b_port)):
            ifname = self.switch_port_iface(dpid, port)
            _sh(["ip", "link", "set", ifname, state], what=f"set link {a}-{b} {state}")
        log.info("lab %s: link %s-%s %s", self.base, self.topology.switches[a],
                 self.topology.switches[b], state)

    def describe(self) -> str:
        """Human-readable table of switches and hosts (for the CLI and logs)."""
        lines = [f"lab {self.base}: {self.topology.name}"]
        for dpid, name in sorted(self.topology.switches.items()):
            lines.append(f"  switch {name:8} dpid {dpid:016x} bridge {self._bridges.get(dpid)}")
        for h in self.topology.hosts:
            lines.append(f"  host {h.name:6} {h.ip:12} {h.mac}  netns {self._netns.get(h.name)}"
                         f"  on {self.topology.switches[h.dpid]} port {h.port}")
        if self._netns:
            example = next(iter(self._netns.values()))
            lines.append(f"  e.g.: ip netns exec {example} ping 10.0.0.1")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------- CLI

def cleanup_state(base: str) -> None:
    """Remove what a crashed lab recorded in its state file (``/run/modelcast-lab``)."""
    path = STATE_DIR / f"{base}.json"
    if not path.exists():
        known = ", ".join(p.stem for p in STATE_DIR.glob("*.json")) or "none"
        raise LabError(f"no state file {path}; known: {known}")
    data = json.loads(path.read_text())
    lab = Lab(Topology("leftover"), prefix=base[:-4] or "mc")
    lab.tag = base[-4:]
    lab._created = [tuple(x) for x in data["created"]]  # type: ignore[misc]
    lab.started = True
    lab.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topologies.lab",
                                     description="Open vSwitch + netns lab for modelcast")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build a topology and wait for Ctrl-C, then tear down")
    up.add_argument("topology", help="e.g. linear:3, ring:4, leaf-spine:2,4,2, fat-tree:4, "
                                     "file:PATH")
    up.add_argument("--controller", default="tcp:127.0.0.1:6653",
                    help="OpenFlow controller target, or 'none' (default %(default)s)")
    up.add_argument("--fail-mode", choices=("secure", "standalone"),
                    help="default: secure with a controller, standalone without")
    up.add_argument("--stp", action=argparse.BooleanOptionalAction, default=None,
                    help="RSTP on the bridges (default: on for standalone with loops)")
    up.add_argument("--prefix", default="mc")
    up.add_argument("-v", "--verbose", action="store_true")
    down = sub.add_parser("down", help="remove the leftovers of a killed lab by its name")
    down.add_argument("base", help="prefix+tag, e.g. mc1a2b (see /run/modelcast-lab)")
    sub.add_parser("check", help="say whether this machine can run the lab")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.cmd == "check":
            require_lab()
            print("lab OK: root, ip netns, ethtool, ovs-vswitchd with the netdev datapath")
            return 0
        if args.cmd == "down":
            require_lab()
            cleanup_state(args.base)
            return 0
        try:
            topo = parse(args.topology)
        except (TopologyError, ValueError, OSError) as exc:
            print(f"error: bad topology {args.topology!r}: {exc}", file=sys.stderr)
            return 2
        require_lab()
        controller = None if args.controller.lower() in ("none", "") else args.controller
        fail_mode = args.fail_mode or ("secure" if controller else "standalone")
        # SIGINT (even if inherited as ignored, e.g. a background job of a script),
        # SIGTERM and SIGHUP -> KeyboardInterrupt, so the `with` block tears down.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.default_int_handler)
        with Lab(topo, controller=controller, prefix=args.prefix, fail_mode=fail_mode,
                 stp=args.stp) as lab:
            print(lab.describe(), flush=True)
            print("lab is up; press Ctrl-C to tear it down", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                print("\ntearing down", flush=True)
        return 0
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; lab torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
