"""Helpers for tests on a real Open vSwitch lab: probes that send / capture UDP multicast
inside host namespaces. The controller subprocess (``Controller``) lives in
``topologies.runner`` (shared with the demo) and is re-exported here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.ovs import Lab, LabError, require_lab
from lab.controller import Controller  # noqa: F401  (re-exported for tests)


def skip_or_fail(reason: str) -> None:
    """Skip off CI, fail under CI=true: CI must prove the real thing."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"lab unavailable under CI=true: {reason}")
    pytest.skip(f"lab unavailable: {reason}")


def need_lab() -> None:
    try:
        require_lab()
    except LabError as exc:
        skip_or_fail(str(exc))


SENDER = r"""
import socket, struct, sys, time
group, port, interval, count = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
t0 = time.monotonic()
for seq in range(count):
    s.sendto(struct.pack("!Q", seq) + b"x" * 64, (group, port))
    time.sleep(max(0.0, t0 + (seq + 1) * interval - time.monotonic()))
"""

# Counts multicast arriving at the host's NIC (AF_PACKET): no socket-level join, so no
# IGMP report, and "a non-receiver got nothing" is checked where it matters, on the wire.
CAPTURE = r"""
import socket, struct, sys, time
group = socket.inet_aton(sys.argv[1])
s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0800))
s.bind(("eth0", 0))
out = open(sys.argv[2], "w", buffering=1)
while True:
    data, addr = s.recvfrom(4096)
    if addr[2] == 4 or len(data) < 36 or data[9] != 17 or data[16:20] != group:
        continue
    ihl = (data[0] & 15) * 4
    seq = struct.unpack("!Q", data[ihl + 8: ihl + 16])[0]
    out.write(f"{seq} {time.time():.4f}\n")
"""


class Probe:
    """A capture in one host namespace, readable at any time."""

    def __init__(self, lab: Lab, host: str, group: str, workdir: Path) -> None:
        self.path = workdir / f"capture-{host}-{group}.txt"
        self.path.write_text("")
        self.proc = lab.popen(host, sys.executable, "-c", CAPTURE, group, str(self.path))

    def records(self) -> list[tuple[int, float]]:
        out = []
        for line in self.path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                out.append((int(parts[0]), float(parts[1])))
        return out

    def seqs(self) -> list[int]:
        return [s for s, _ in self.records()]

    def since(self, t: float) -> list[int]:
        return [s for s, ts in self.records() if ts >= t]


def send(lab: Lab, host: str, group: str, port: int, interval: float, count: int) -> subprocess.Popen:
    return lab.popen(host, sys.executable, "-c", SENDER, group, str(port), str(interval), str(count))
