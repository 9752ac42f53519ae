"""Instantiate a ``spec.Topology`` on real Open vSwitch with network-namespace hosts.

Why not Mininet: Mininet names everything globally (``s1``, ``s1-eth1``, ``h1-eth0``) and
deletes same-named leftovers before building, so two labs -- or a lab and a developer's
Mininet session -- clobber each other, and ``mn -c`` removes everything Mininet-shaped.
This lab gives every object a per-instance tag, records each name as it is created, and
tears down exactly those names again (also after a partial start, Ctrl-C, or at exit).

The machines have no openvswitch kernel module, so bridges use the userspace datapath
(``datapath_type=netdev``); TCP through it needs tx checksum offload off on the host side.
Its ports are packet sockets in ovs-vswitchd, with the kernel's default receive buffer
(``net.core.rmem_default``, 208 KB: ~16 ms of 100 Mbit/s); when the lab's own agents keep
the 2 CPUs busy, ovs-vswitchd is off-CPU longer than that and drops on the tree's first
hops, a loss no hardware switch would add. So the lab raises the default to
``PORT_RCVBUF`` while ovs-vswitchd opens its ports and restores it at once
(``_port_buffers``).

Usage::

    with Lab(spec.linear(3), controller=None, fail_mode="standalone") as lab:
        lab.run("h1", "ping", "-c", "1", "10.0.0.3")

CLI: ``python -m lab.ovs up leaf-spine:2,4,2 [--controller tcp:127.0.0.1:6653]``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python lab/ovs.py` rather than `-m lab.ovs`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.probes import PING
from lab.sh import HOST_IFACE, VSCTL, LabError, NetnsHosts, fmt, log, require, sh
from topologies.spec import Host, Link, Topology, TopologyError, parse

IFNAMSIZ = 15  # Linux interface names are at most 15 characters
PORT_RCVBUF = 16 * 1024 * 1024  # ovs-vswitchd's packet socket per port: ~1.3 s of 100 Mbit/s
RMEM_DEFAULT = Path("/proc/sys/net/core/rmem_default")
STATE_DIR = Path(os.environ.get("MODELCAST_LAB_STATE", "/run/modelcast-lab"))
ETC_NETNS = Path("/etc/netns")
MGMT_IFACE = "mgmt0"


@contextlib.contextmanager
def _port_buffers(size: int = PORT_RCVBUF) -> Any:
    """``net.core.rmem_default`` at least ``size`` inside the block, the old value again
    after it: a socket takes its receive buffer from it when it is created, so the
    ports ovs-vswitchd opens meanwhile keep the larger one and nothing else on the
    machine notices. Labs building at the same time (other processes) take turns on a
    lock file, so none of them restores the value while another is still opening ports;
    the value it had is kept in the state directory meanwhile, so the next lab puts it
    back if one was killed before it could."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    saved = STATE_DIR / "rmem_default.orig"  # there only while raised: a lab killed meanwhile
    with open(STATE_DIR / "rmem.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            old = int(saved.read_text() if saved.exists() else RMEM_DEFAULT.read_text())
        except (OSError, ValueError):
            old = size
        raised = old < size
        if raised:
            try:
                saved.write_text(str(old))
                RMEM_DEFAULT.write_text(str(size))
                log.info("lab: ovs-vswitchd's new ports get %d MiB receive buffers (net.core.rmem_default "
                         "raised while they open, %d again after)", size >> 20, old)
            except OSError as exc:
                log.warning("lab: cannot raise net.core.rmem_default to %d (%s): ovs-vswitchd's ports "
                            "keep %d-byte buffers and may drop when the CPUs are busy", size, exc, old)
                raised = False
        try:
            yield
        finally:
            if raised:
                RMEM_DEFAULT.write_text(str(old))
                saved.unlink(missing_ok=True)


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


class Lab(NetnsHosts):
    """A topology on OVS bridges with one network namespace per host; same dpids, OpenFlow
    port numbers, IPs and MACs as the spec. Use as a context manager so it always tears
    down. Not thread-safe: build, use and stop it from one thread. ``controller``: an
    OpenFlow target, or several separated by spaces (every switch connects to each)."""

    def __init__(self, topology: Topology, controller: str | None = "tcp:127.0.0.1:6653",
                 prefix: str = "mc", fail_mode: str = "secure", stp: bool | None = None,
                 mgmt: bool = False, mtu: int = 1500) -> None:
        super().__init__()
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

    def ip(self, host: str) -> str:
        """A host's address, by host name (or IP)."""
        try:
            return self.topology.host(host).ip
        except KeyError as exc:
            raise LabError(str(exc)) from None

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
        """Persist the created names so ``python -m lab.ovs down TAG`` can clean up
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
            sh([*VSCTL, "list-br"]).stdout,
            sh(["ip", "netns", "list"]).stdout,
            sh(["ip", "-o", "link"]).stdout,
        ])
        for _ in range(100):
            tag = secrets.token_hex(2)
            if f"{self.prefix}{tag}" not in existing:
                return tag
        raise LabError("could not find an unused lab tag")

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Build bridges, veths and namespaces. On any failure (including Ctrl-C) tear down
        what was built and raise (LabError with the failing command, or the interrupt)."""
        if self.started:
            raise LabError(f"lab {self.base} already started")
        require()
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
            sh(["ip", "link", "add", a_if, "mtu", str(self.mtu), "type", "veth", "peer", "name",
                 b_if, "mtu", str(self.mtu)], what="create inter-switch veth")
            for ifname, dpid, port in ((a_if, link.a, link.a_port), (b_if, link.b, link.b_port)):
                self._ports[(dpid, port)] = ifname
                bridge_ports[dpid].append((ifname, port))
                self._root_if_up(ifname)

        # Hosts: a namespace each, with eth0 = the far end of a veth from the switch port.
        for h in topo.hosts:
            self._build_host(h)
            bridge_ports[h.dpid].append((self._ports[(h.dpid, h.port)], h.port))

        # Bridges: one ovs-vsctl transaction each, ports pinned to the spec's numbers
        # (ovs-vsctl returns once ovs-vswitchd has opened them).
        with _port_buffers():
            for dpid in sorted(topo.switches):
                self._build_bridge(dpid, bridge_ports[dpid])
        self._verify_ofports()
        if self.mgmt:
            self._build_mgmt()

    def _build_mgmt(self) -> None:
        br, gw = f"{self.base}mg", self.mgmt_gateway
        log.info("lab %s: management network %s/24 on bridge %s", self.base, gw, br)
        self._record("link", br)
        sh(["ip", "link", "add", br, "type", "bridge"], what="create management bridge")
        sh(["ip", "addr", "add", f"{gw}/24", "dev", br], what="management gateway address")
        self._root_if_up(br)
        for i, h in enumerate(self.topology.hosts, start=1):
            root_if, ns = f"{self.base}m{i}", self._netns[h.name]
            self._record("link", root_if)
            sh(["ip", "link", "add", root_if, "type", "veth", "peer", "name", MGMT_IFACE,
                 "netns", ns], what=f"{h.name}: management veth")
            sh(["ip", "link", "set", root_if, "master", br], what=f"{h.name}: attach mgmt")
            self._root_if_up(root_if)
            x = ["ip", "netns", "exec", ns]
            sh([*x, "ip", "addr", "add", f"{self.mgmt_ip(h.name)}/24", "dev", MGMT_IFACE],
                what=f"{h.name}: management address")
            sh([*x, "ip", "link", "set", MGMT_IFACE, "up"], what=f"{h.name}: mgmt0 up")

    def _root_if_up(self, ifname: str) -> None:
        # No IPv6 on lab links: router solicitations and MLD reports would otherwise reach
        # the controller as packet-ins and pollute multicast tests.
        try:
            Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6").write_text("1")
        except OSError:
            pass
        sh(["ip", "link", "set", ifname, "up"], what=f"bring up {ifname}")

    def _build_host(self, h: Host) -> None:
        ns = f"{self.base}-{h.name}"
        sw_if = self._ifname(h.dpid, h.port)
        log.info("lab %s: host %s %s %s in netns %s on %s port %d (%s)", self.base, h.name,
                 h.ip, h.mac, ns, self.topology.switches[h.dpid], h.port, sw_if)
        self._record("netns", ns)
        sh(["ip", "netns", "add", ns], what=f"create netns for {h.name}")
        self._netns[h.name] = ns
        self._write_etc(ns)
        self._record("link", sw_if)
        # Create the host end directly inside the namespace so "eth0" never exists in (or
        # collides with anything in) the root namespace.
        sh(["ip", "link", "add", sw_if, "mtu", str(self.mtu), "type", "veth", "peer", "name",
             HOST_IFACE, "address", h.mac, "mtu", str(self.mtu), "netns", ns],
            what=f"create veth for {h.name}")
        self._ports[(h.dpid, h.port)] = sw_if
        self._root_if_up(sw_if)
        x = ["ip", "netns", "exec", ns]
        sh([*x, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
             "net.ipv6.conf.default.disable_ipv6=1"], check=False)
        sh([*x, "ip", "link", "set", "lo", "up"], what=f"{h.name}: lo up")
        sh([*x, "ip", "addr", "add", f"{h.ip}/8", "dev", HOST_IFACE], what=f"{h.name}: address")
        sh([*x, "ip", "link", "set", HOST_IFACE, "up"], what=f"{h.name}: eth0 up")
        # Userspace OVS does not fill in offloaded checksums: without this TCP stalls.
        sh([*x, "ethtool", "-K", HOST_IFACE, "tx", "off"], what=f"{h.name}: tx offload off")
        sh([*x, "ip", "route", "add", "224.0.0.0/4", "dev", HOST_IFACE],
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
        cmd = [*VSCTL, "add-br", br, "--", "set", "bridge", br, "datapath_type=netdev",
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
            # Several targets (space-separated): one Controller record each, e.g. the
            # instances of a controller run as several (controller.election).
            targets = self.controller.split()
            for i, target in enumerate(targets):
                cmd += ["--", f"--id=@c{i}", "create", "Controller", f'target="{target}"',
                        "max_backoff=1000"]
            cmd += ["--", "set", "bridge", br,
                    f"controller=[{','.join(f'@c{i}' for i in range(len(targets)))}]"]
        sh(cmd, what=f"create bridge {br}")

    def _verify_ofports(self) -> None:
        """ofport_request is a request: a port that fails to open gets -1 and a clash gets
        another number. Check every port in one query."""
        out = sh([*VSCTL, "--format=json", "--columns=name,ofport,error", "list",
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
        self.stop_procs()
        failures: list[str] = []
        bridges = [n for k, n in self._created if k == "bridge"]
        if bridges:
            cmd: list[str] = list(VSCTL)
            for br in bridges:
                cmd += ["--", "--if-exists", "del-br", br]
            proc = sh(cmd, check=False)
            if proc.returncode:
                failures.append(f"`{fmt(cmd)}`: {proc.stderr.strip()}")
        # A netdev bridge's local port is a tap device that may outlive del-br.
        links = {n for k, n in self._created if k in ("link", "bridge")}
        if links:
            present = set(sh(["ip", "-o", "link"], check=False).stdout.split())
            for ifname in sorted(links):
                if f"{ifname}:" in present or any(p.startswith(f"{ifname}@") for p in present):
                    proc = sh(["ip", "link", "del", ifname], check=False)
                    if proc.returncode and "Cannot find device" not in proc.stderr:
                        failures.append(f"ip link del {ifname}: {proc.stderr.strip()}")
        for kind, name in self._created:
            if kind == "netns" and Path(f"/run/netns/{name}").exists():
                self.kill_ns(name)
                proc = sh(["ip", "netns", "del", name], check=False)
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

    # ---------------------------------------------------------------- using the lab

    def ping(self, src: str, dst: str, count: int = 2, wait: float = 2) -> bool:
        """True if ``src`` gets an echo reply from ``dst`` (host name or IP). Uses
        ``ping -c COUNT -W WAIT``; without iputils-ping, a raw-socket ICMP echo in Python."""
        ip = self.topology.host(dst).ip if not dst[:1].isdigit() else dst
        if shutil.which("ping"):
            return self.run(src, "ping", "-n", "-c", count, "-W", wait, ip, check=False,
                            timeout=count * (wait + 1) + 5).returncode == 0
        return self.run(src, sys.executable, "-c", PING, ip, str(count), str(wait),
                        check=False, timeout=count * (wait + 1) + 5).returncode == 0

    def set_link(self, a: int, b: int, up: bool) -> None:
        """Take the inter-switch link a-b down or up by setting both veth ends down/up, so
        OVS sees carrier loss and sends PortStatus (link down) on both switches."""
        link = self._link(a, b)
        state = "up" if up else "down"
        for dpid, port in ((link.a, link.a_port), (link.b, link.b_port)):
            ifname = self.switch_port_iface(dpid, port)
            sh(["ip", "link", "set", ifname, state], what=f"set link {a}-{b} {state}")
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
    parser = argparse.ArgumentParser(prog="python -m lab.ovs",
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
            require()
            print("lab OK: root, ip netns, ethtool, ovs-vswitchd with the netdev datapath")
            return 0
        if args.cmd == "down":
            require()
            cleanup_state(args.base)
            return 0
        try:
            topo = parse(args.topology)
        except (TopologyError, ValueError, OSError) as exc:
            print(f"error: bad topology {args.topology!r}: {exc}", file=sys.stderr)
            return 2
        require()
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
