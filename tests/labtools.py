"""Helpers for tests on a real Open vSwitch lab: the controller as a subprocess, and
probes that send / capture UDP multicast inside host namespaces."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from topologies.lab import Lab, LabError, require_lab

VENV_BIN = Path(sys.executable).parent


def need_lab() -> None:
    """Skip off CI, fail under CI=true: CI must prove the real thing."""
    try:
        require_lab()
    except LabError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"lab unavailable under CI=true: {exc}")
        pytest.skip(f"lab unavailable: {exc}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Controller:
    """``modelcast-controller`` on loopback with its own ports, state file and log."""

    def __init__(self, workdir: Path, token: str = "test-token", algorithm: str = "spt") -> None:
        self.of_port = free_port()
        self.rest_port = free_port()
        self.workdir = workdir
        self.state = workdir / "controller-state.json"
        self.token = token
        self.algorithm = algorithm
        self.proc: subprocess.Popen | None = None
        self.logs: list[Path] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def of_target(self) -> str:
        return f"tcp:127.0.0.1:{self.of_port}"

    def start(self) -> None:
        logf = self.workdir / f"controller-{len(self.logs)}.log"
        self.logs.append(logf)
        cmd = [str(VENV_BIN / "modelcast-controller"), "--ofp-tcp-listen-port", str(self.of_port),
               "--ofp-listen-host", "127.0.0.1", "--wsapi-host", "127.0.0.1",
               "--wsapi-port", str(self.rest_port), "--state-file", str(self.state),
               "--token", self.token, "--algorithm", self.algorithm]
        with open(logf, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"controller exited {self.proc.returncode}:\n{self.log_text()}")
            try:
                if requests.get(self.url + "/v1/health", timeout=1).ok:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        raise RuntimeError(f"controller REST did not come up:\n{self.log_text()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace")[-6000:] for p in self.logs if p.exists())

    def api(self, method: str, path: str, **kw: Any) -> requests.Response:
        headers = kw.pop("headers", {})
        headers.setdefault("Authorization", f"Bearer {self.token}")
        return requests.request(method, self.url + path, headers=headers, timeout=15, **kw)

    def wait_topology(self, switches: int, links: int, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        topo: dict = {}
        while time.monotonic() < deadline:
            topo = self.api("GET", "/v1/topology").json()
            up = [link for link in topo.get("links", []) if link.get("up", True)]
            if len(topo.get("switches", [])) >= switches and len(up) >= links:
                return topo
            time.sleep(0.3)
        raise AssertionError(f"topology not discovered in {timeout}s: {topo}\n{self.log_text()}")

    def wait_group(self, gid: int, pred, timeout: float = 15) -> dict:
        deadline = time.monotonic() + timeout
        g: dict = {}
        while time.monotonic() < deadline:
            g = self.api("GET", f"/v1/groups/{gid}").json()
            if pred(g):
                return g
            time.sleep(0.05)
        raise AssertionError(f"group {gid} never reached the expected state: {g}\n{self.log_text()}")


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
