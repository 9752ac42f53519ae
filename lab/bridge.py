"""A throwaway kernel-bridge lab: one Linux bridge, N network-namespace hosts on veths.

Why not ``topologies.lab``: that builds Open vSwitch with the userspace datapath, which
tops out near 200 Mbit/s on two cores. Host-agent tests and benchmarks only need L2
multicast flooding, which a kernel bridge with ``mcast_snooping 0`` does at kernel speed.

Every name carries a random tag and is recorded as it is created, so ``stop()`` removes
exactly what this instance made (also after a partial start) and kills only the
processes it started, by PID. Loss injection prefers ``tc netem``; kernels built without
``sch_netem`` fall back to nftables rules inside the receiver's namespace (random loss
with ``numgen random``, bursty loss as a two-state model on a dynamic set).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from typing import Any, Optional, Sequence

IFACE = "eth0"


class NetLabError(RuntimeError):
    """The lab cannot be built or used here; the message says why."""


def _sh(cmd: Sequence[str], check: bool = True, timeout: float = 20, input: Optional[str] = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise NetLabError(f"`{' '.join(cmd)}` exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
    return proc


def lab_unavailable() -> Optional[str]:
    """None if this process can build the lab, else the reason (for a skip message)."""
    if os.geteuid() != 0:
        return f"the kernel-bridge lab needs root (uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not on PATH (install iproute2)"
    if _sh(["ip", "netns", "list"], check=False).returncode != 0:
        return "`ip netns` is unusable here"
    return None


class BridgeLab:
    """``hosts`` namespaces h0..h{n-1} at 10.<a>.<b>.(i+1)/24 on one kernel bridge."""

    def __init__(self, hosts: int) -> None:
        if not 1 <= hosts <= 200:
            raise ValueError("1..200 hosts")
        self.tag = secrets.token_hex(3)
        self.bridge = f"mcb{self.tag}"
        self.count = hosts
        a, b = 100 + secrets.randbelow(100), secrets.randbelow(256)  # 10.100-199.x: lab-only
        self._prefix = f"10.{a}.{b}"
        self._links: list[str] = []
        self._netns: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self.loss_method: dict[int, str] = {}

    # ------------------------------------------------------------------ names

    def ns(self, host: int) -> str:
        return f"mc{self.tag}h{host}"

    def veth(self, host: int) -> str:
        """Bridge-side end of host's link (egress towards the host)."""
        return f"mcv{self.tag}h{host}"

    def ip(self, host: int) -> str:
        return f"{self._prefix}.{host + 1}"

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "BridgeLab":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Build everything; on any failure tear down what exists and re-raise."""
        reason = lab_unavailable()
        if reason:
            raise NetLabError(reason)
        try:
            self._links.append(self.bridge)
            _sh(["ip", "link", "add", self.bridge, "type", "bridge", "mcast_snooping", "0"])
            _sh(["ip", "link", "set", self.bridge, "up"])
            for i in range(self.count):
                self._add_host(i)
        except BaseException:
            self.stop()
            raise

    def _add_host(self, i: int) -> None:
        ns, veth = self.ns(i), self.veth(i)
        self._netns.append(ns)
        _sh(["ip", "netns", "add", ns])
        self._links.append(veth)
        _sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", IFACE, "netns", ns])
        _sh(["ip", "link", "set", veth, "master", self.bridge, "up"])
        x = ["ip", "-n", ns]
        _sh([*x, "link", "set", "lo", "up"])
        _sh([*x, "addr", "add", f"{self.ip(i)}/24", "dev", IFACE])
        _sh([*x, "link", "set", IFACE, "up"])
        # No default route in a bare namespace: multicast needs an explicit one.
        _sh([*x, "route", "add", "224.0.0.0/4", "dev", IFACE])

    def stop(self) -> None:
        """Kill our processes by PID, then delete our links and namespaces. Idempotent."""
        from lab.ovs import kill_netns_pids, stop_processes

        stop_processes(self._procs)
        self._procs = []
        for ns in self._netns:
            kill_netns_pids(ns)  # only processes inside our own netns
        for link in reversed(self._links):
            _sh(["ip", "link", "del", link], check=False)
        for ns in self._netns:
            _sh(["ip", "netns", "del", ns], check=False)
        self._links, self._netns = [], []

    def leftovers(self) -> list[str]:
        """Names of this lab's objects that still exist (for cleanup tests)."""
        found = [n.split()[0] for n in _sh(["ip", "netns", "list"]).stdout.splitlines() if self.tag in n]
        found += [line.split(":")[1].strip() for line in _sh(["ip", "-o", "link"]).stdout.splitlines() if self.tag in line]
        return found

    # ------------------------------------------------------------------ use

    def cmd(self, host: int, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host), *map(str, argv)]

    def popen(self, host: int, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        """Start argv in host's namespace; stop() kills it by PID if still running."""
        proc = subprocess.Popen(self.cmd(host, argv), **kw)  # `ip netns exec` execs: same PID
        self._procs.append(proc)
        return proc

    def add_loss(self, host: int, kind: str, port: Optional[int] = None) -> str:
        """Drop datagrams towards ``host`` (see the module function ``add_loss``).
        Returns a description of the method used."""
        desc = add_loss(self.ns(host), self.veth(host), kind, port)
        self.loss_method[host] = desc
        return desc

    def loss_counters(self, host: int) -> str:
        """The loss rules with their counters (for failure messages)."""
        return loss_counters(self.ns(host), self.veth(host), self.loss_method.get(host, ""))


# ---------------------------------------------------------------------- loss injection
# Module functions so any lab (this bridge lab, the OVS lab in topologies/) can use them:
# all they need is a host's namespace and the root-namespace end of the link towards it.

LOSS_KINDS = ("random", "bursty")


def add_loss(netns: str, iface: str, kind: str, port: Optional[int] = None,
             all_ip: bool = False) -> str:
    """Drop datagrams towards the host in ``netns``: kind "random" (1%) or "bursty"
    (Gilbert-Elliott, netem ``gemodel 1% 20% 70% 0.1%``; see _nft_loss for the fallback).

    ``iface`` is the root-namespace end of the host's link (netem shapes its egress, i.e.
    traffic towards the host); kernels without ``sch_netem`` get nftables rules inside
    ``netns`` instead (UDP only, only ``udp dport PORT``, or with ``all_ip`` every IPv4
    packet, so TCP and UDP are compared under the same loss). Returns the method used."""
    if kind not in LOSS_KINDS:
        raise ValueError(f"loss kind must be one of {LOSS_KINDS}, got {kind!r}")
    spec = ["loss", "1%"] if kind == "random" else ["loss", "gemodel", "1%", "20%", "70%", "0.1%"]
    netem = _sh(["tc", "qdisc", "add", "dev", iface, "root", "netem", *spec], check=False)
    if netem.returncode == 0:
        return "netem " + " ".join(spec)
    if "unknown" in netem.stderr.lower():  # kernel built without sch_netem
        return _nft_loss(netns, kind, port, all_ip)
    raise NetLabError(f"tc netem on {iface}: {netem.stderr.strip()}")


def clear_loss(netns: str, iface: str) -> None:
    """Remove what ``add_loss`` installed (either method); absent rules are fine."""
    _sh(["tc", "qdisc", "del", "dev", iface, "root"], check=False)
    if shutil.which("nft"):
        _sh(["ip", "netns", "exec", netns, "nft", "delete", "table", "inet", "mcloss"], check=False)


def _nft_loss(netns: str, kind: str, port: Optional[int], all_ip: bool = False) -> str:
    if shutil.which("nft") is None:
        raise NetLabError("kernel has no sch_netem and `nft` is not installed (apt-get install nftables)")
    match = f"udp dport {port} " if port else ("meta nfproto ipv4 " if all_ip else "meta l4proto udp ")
    if kind == "random":
        rules = f"{match}numgen random mod 1000 < 10 counter drop"
    else:
        # Two-state burst model. Every 500th packet (the first one included, so even
        # a short test sees a burst) enters the bad state by adding a timed set
        # element; while it lives (~one jiffy, up to 4 ms) 70% of packets drop. At
        # lab rates that is runs of tens of datagrams: longer, rarer bursts than
        # netem's gemodel 1% 20% 70% (mean run ~5). Note a "packet" here may be a
        # GSO/GRO train of up to 44 datagrams (so may netem's, on the veth).
        rules = (
            f"{match}ip protocol @bad numgen random mod 100 < 70 counter drop\n"
            f"    {match}numgen inc mod 500 < 1 add @bad {{ ip protocol timeout 1ms }} counter drop"
        )
    script = (
        "table inet mcloss {\n"
        "  set bad { type inet_proto; flags dynamic,timeout; }\n"
        "  chain pre {\n"
        "    type filter hook prerouting priority -300; policy accept;\n"
        f"    {rules}\n"
        "  }\n"
        "}\n"
    )
    _sh(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=script)
    return f"nft {kind}"


def loss_counters(netns: str, iface: str, method: str = "") -> str:
    """The loss rules with their counters (for failure messages and reports)."""
    if method.startswith("netem"):
        return _sh(["tc", "-s", "qdisc", "show", "dev", iface], check=False).stdout
    return _sh(["ip", "netns", "exec", netns, "nft", "list", "table", "inet", "mcloss"], check=False).stdout


def loss_dropped(netns: str, iface: str, method: str = "") -> Optional[int]:
    """Packets the loss rules dropped so far (None if unknown): proof loss was injected."""
    text = loss_counters(netns, iface, method)
    if method.startswith("netem"):
        m = re.search(r"dropped (\d+)", text)
        return int(m.group(1)) if m else None
    counts = [int(x) for x in re.findall(r"counter packets (\d+)", text)]
    return sum(counts) if counts else None
