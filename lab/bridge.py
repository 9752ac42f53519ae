"""A throwaway kernel-bridge lab: one Linux bridge, N network-namespace hosts on veths.

Why not the OVS lab (``lab.ovs``): Open vSwitch's userspace datapath tops out near
200 Mbit/s on two cores. Host-agent tests and benchmarks only need L2 multicast
flooding, which a kernel bridge with ``mcast_snooping 0`` does at kernel speed.

Every name starts with the lab's ``base`` (``mb`` + a random tag) and is recorded as it
is created, so ``stop()`` removes exactly what this instance made (also after a partial
start) and kills only the processes it started, by PID.
"""

from __future__ import annotations

import secrets
from typing import Optional

from lab import loss
from lab.sh import HOST_IFACE, NetnsHosts, leftovers, require, sh


class BridgeLab(NetnsHosts):
    """``hosts`` namespaces (hosts 0..n-1) at 10.<a>.<b>.(i+1)/24 on one kernel bridge."""

    def __init__(self, hosts: int, mtu: int = 1500) -> None:
        super().__init__()
        if not 1 <= hosts <= 200:
            raise ValueError("1..200 hosts")
        if not 1280 <= mtu <= 9000:
            raise ValueError(f"mtu must be 1280..9000, got {mtu}")
        self.mtu = mtu  # 9000: the jumbo frames GPU fabrics run
        self.base = f"mb{secrets.token_hex(3)}"
        self.bridge = f"{self.base}br"
        self.count = hosts
        a, b = 100 + secrets.randbelow(100), secrets.randbelow(256)  # 10.100-199.x: lab-only
        self._prefix = f"10.{a}.{b}"
        self._links: list[str] = []
        self._netns: list[str] = []
        self.loss_method: dict[int, str] = {}

    # ------------------------------------------------------------------ names

    def ns(self, host: int) -> str:
        return f"{self.base}h{host}"

    def veth(self, host: int) -> str:
        """Bridge-side end of host's link (egress towards the host)."""
        return f"{self.base}v{host}"

    def ip(self, host: int) -> str:
        return f"{self._prefix}.{host + 1}"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Build everything; on any failure tear down what exists and re-raise."""
        require(ovs=False)
        try:
            self._links.append(self.bridge)
            sh(["ip", "link", "add", self.bridge, "mtu", str(self.mtu), "type", "bridge",
                "mcast_snooping", "0"], what="create bridge")
            sh(["ip", "link", "set", self.bridge, "up"], what="bridge up")
            for i in range(self.count):
                self._add_host(i)
        except BaseException:
            self.stop()
            raise

    def _add_host(self, i: int) -> None:
        ns, veth = self.ns(i), self.veth(i)
        self._netns.append(ns)
        sh(["ip", "netns", "add", ns], what=f"create netns for host {i}")
        self._links.append(veth)
        sh(["ip", "link", "add", veth, "mtu", str(self.mtu), "type", "veth", "peer", "name",
            HOST_IFACE, "mtu", str(self.mtu), "netns", ns], what=f"host {i}: veth")
        sh(["ip", "link", "set", veth, "master", self.bridge, "up"], what=f"host {i}: attach")
        x = ["ip", "-n", ns]
        sh([*x, "link", "set", "lo", "up"], what=f"host {i}: lo up")
        sh([*x, "addr", "add", f"{self.ip(i)}/24", "dev", HOST_IFACE], what=f"host {i}: address")
        sh([*x, "link", "set", HOST_IFACE, "up"], what=f"host {i}: eth0 up")
        # No default route in a bare namespace: multicast needs an explicit one.
        sh([*x, "route", "add", "224.0.0.0/4", "dev", HOST_IFACE], what=f"host {i}: multicast route")

    def gateway(self) -> str:
        """Give the root namespace an address on the lab's bridge (``.254``) and return
        it: a service the test runs itself (a stand-in controller) is then reachable
        from every host. It goes with the bridge."""
        ip = f"{self._prefix}.254"
        sh(["ip", "addr", "replace", f"{ip}/24", "dev", self.bridge], what="bridge gateway address")
        return ip

    def add_address(self, host: int, ip: str) -> None:
        """A second address on a host's interface (e.g. a victim address an attacker
        watches, to see whether anything is reflected to it)."""
        sh(["ip", "-n", self.ns(host), "addr", "add", f"{ip}/24", "dev", HOST_IFACE], what=f"host {host}: address")

    @property
    def subnet(self) -> str:
        """The hosts' /24 as a prefix ending in a dot (``"10.123.45."``)."""
        return self._prefix + "."

    def stop(self) -> None:
        """Kill our processes by PID, then delete our links and namespaces. Idempotent."""
        self.stop_procs()
        for ns in self._netns:
            self.kill_ns(ns)  # only processes inside our own namespaces
        for link in reversed(self._links):
            sh(["ip", "link", "del", link], check=False)
        for ns in self._netns:
            sh(["ip", "netns", "del", ns], check=False)
        self._links, self._netns = [], []

    def leftovers(self) -> list[str]:
        """This lab's objects that still exist (for cleanup tests)."""
        return leftovers(self.base)

    # ------------------------------------------------------------------ impairments

    def add_loss(self, host: int, kind: str, port: Optional[int] = None, pct: float = 1.0) -> str:
        """Drop datagrams towards ``host`` (``lab.loss.add``); returns the method used."""
        self.loss_method[host] = loss.add(self.ns(host), self.veth(host), kind, port, pct=pct)
        return self.loss_method[host]

    def segment_towards(self, host: int) -> None:
        """Hand ``host`` UDP GSO super-packets as single datagrams: the bridge port towards
        it segments them, as a switch forwards frames, so loss rules inside the host drop
        datagrams (as a lossy link does), not a sender's whole batch of up to 44 at once."""
        sh(["ethtool", "-K", self.veth(host), "tx-udp-segmentation", "off"],
           what=f"host {host}: segment UDP GSO at the bridge")

    def loss_counters(self, host: int) -> str:
        """The loss rules with their counters (for failure messages)."""
        return loss.counters(self.ns(host), self.veth(host), self.loss_method.get(host, ""))

    def loss_dropped(self, host: int) -> int:
        """Datagrams the loss rules towards ``host`` dropped so far."""
        return loss.dropped(self.ns(host), self.veth(host), self.loss_method.get(host, ""))
