"""Link impairments for any lab: loss towards a host, and rate caps on a host's NIC.

All a function needs is a host's namespace and the root-namespace end of the link
towards it. Loss prefers ``tc netem`` on that link; kernels built without ``sch_netem``
(these machines) get nftables rules inside the receiver's namespace instead (random loss
with ``numgen random``, bursty loss as a two-state model on a dynamic set). Every rule
counts what it drops, so a test can prove loss really happened (``dropped``).
"""

from __future__ import annotations

import re
import shutil
from typing import Optional

from lab.sh import LabError, NetnsHosts, sh

KINDS = ("random", "bursty")
_TABLE = "mcloss"


def add(netns: str, iface: str, kind: str, port: Optional[int] = None,
        all_ip: bool = False, pct: float = 1.0) -> str:
    """Drop datagrams towards the host in ``netns``: kind "random" (``pct`` %, default 1)
    or "bursty" (Gilbert-Elliott, netem ``gemodel 1% 20% 70% 0.1%``; see ``_nft`` for the
    fallback).

    ``iface`` is the root-namespace end of the host's link (netem shapes its egress, i.e.
    traffic towards the host); nftables rules match UDP only, only ``udp dport PORT``, or
    with ``all_ip`` every IPv4 packet (so TCP and UDP are compared under the same loss).
    Returns the method used (pass it to ``dropped``/``counters``)."""
    if kind not in KINDS:
        raise ValueError(f"loss kind must be one of {KINDS}, got {kind!r}")
    if not 0 < pct <= 100 or (kind == "bursty" and pct != 1.0):
        raise ValueError(f"loss pct must be in (0, 100] and only set for random loss, got {pct}")
    spec = ["loss", f"{pct:g}%"] if kind == "random" else ["loss", "gemodel", "1%", "20%", "70%", "0.1%"]
    netem = sh(["tc", "qdisc", "add", "dev", iface, "root", "netem", *spec], check=False)
    if netem.returncode == 0:
        return "netem " + " ".join(spec)
    if "unknown" in netem.stderr.lower():  # kernel built without sch_netem
        return _nft(netns, kind=kind, port=port, all_ip=all_ip, per_mille=round(pct * 10))
    raise LabError(f"tc netem on {iface}: {netem.stderr.strip()}")


def clear(netns: str, iface: str) -> None:
    """Remove what ``add`` installed (either method); absent rules are fine."""
    sh(["tc", "qdisc", "del", "dev", iface, "root"], check=False)
    if shutil.which("nft"):
        sh(["ip", "netns", "exec", netns, "nft", "delete", "table", "inet", _TABLE], check=False)


def _nft(netns: str, kind: str, port: Optional[int], all_ip: bool, per_mille: int) -> str:
    if shutil.which("nft") is None:
        raise LabError("kernel has no sch_netem and `nft` is not installed (apt-get install nftables)")
    match = f"udp dport {port} " if port else ("meta nfproto ipv4 " if all_ip else "meta l4proto udp ")
    if kind == "random":
        rules = f"{match}numgen random mod 1000 < {per_mille} counter drop"
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
        f"table inet {_TABLE} {{\n"
        "  set bad { type inet_proto; flags dynamic,timeout; }\n"
        "  chain pre {\n"
        "    type filter hook prerouting priority -300; policy accept;\n"
        f"    {rules}\n"
        "  }\n"
        "}\n"
    )
    sh(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=script, what="install nftables loss")
    return f"nft {kind}"


def counters(netns: str, iface: str, method: str) -> str:
    """The loss rules with their counters, as the kernel shows them (for failure messages)."""
    if method.startswith("netem"):
        return sh(["tc", "-s", "qdisc", "show", "dev", iface], check=False).stdout
    return sh(["ip", "netns", "exec", netns, "nft", "list", "table", "inet", _TABLE],
              check=False).stdout


def dropped(netns: str, iface: str, method: str) -> int:
    """Packets the loss rules dropped so far: the proof that loss was injected. Raises
    LabError if the counters cannot be read (never a silent "unknown")."""
    text = counters(netns, iface, method)
    if method.startswith("netem"):
        m = re.search(r"dropped (\d+)", text)
        found = [m.group(1)] if m else []
    else:
        found = re.findall(r"counter packets (\d+)", text)
    if not found:
        raise LabError(f"cannot read the drop counters of {method!r} towards {netns}: {text.strip()!r}")
    return sum(int(x) for x in found)


def cap_rate(lab: NetnsHosts, host: object, mbit: float, burst: str = "512kb") -> None:
    """Cap what ``host`` sends to ``mbit`` Mbit/s (``tc tbf`` on its own NIC), standing for
    a slower NIC, in any lab."""
    lab.run(host, "tc", "qdisc", "replace", "dev", lab.host_iface(host), "root", "tbf",
            "rate", f"{mbit}mbit", "burst", burst, "latency", "50ms")


def add_stall(iface: str, every: int, count: int) -> str:
    """Loss every receiver shares: of each ``every`` packets entering a kernel bridge from
    ``iface`` (the sender's link, root-namespace end), drop the last ``count`` in a row
    before the bridge copies them -- a switch that stops forwarding for a moment, as Open
    vSwitch's userspace datapath does when it is off the CPU (not at the very start: the
    first stall comes after ``every - count`` packets). Returns the nftables table to pass
    to ``clear_stall``; ``stall_dropped`` reads its counter."""
    if not 0 < count < every:
        raise ValueError(f"need 0 < count < every, got {count}, {every}")
    if shutil.which("nft") is None:
        raise LabError("a stall needs `nft` (apt-get install nftables)")
    table = f"mcstall_{iface}"
    script = (
        f"table bridge {table} {{\n"
        "  chain pre {\n"
        "    type filter hook prerouting priority -300; policy accept;\n"
        f"    iifname \"{iface}\" meta protocol ip numgen inc mod {every} >= {every - count} counter drop\n"
        "  }\n"
        "}\n"
    )
    sh(["nft", "-f", "-"], input=script, what="install a bridge stall")
    return table


def stall_dropped(table: str) -> int:
    """Packets ``add_stall``'s rule dropped so far."""
    text = sh(["nft", "list", "table", "bridge", table], check=False).stdout
    found = re.findall(r"counter packets (\d+)", text)
    if not found:
        raise LabError(f"cannot read the stall counter of {table}: {text.strip()!r}")
    return sum(int(x) for x in found)


def clear_stall(table: str) -> None:
    sh(["nft", "delete", "table", "bridge", table], check=False)
