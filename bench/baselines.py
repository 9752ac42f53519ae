"""What users would otherwise run, on the same lab as modelcast: N parallel TCP streams
from the model server (unicast fan-out) and UFTP 4.10 (NACK-based multicast file
transfer in C). Each run reports the same numbers as a modelcast run: time until every
receiver holds a verified copy, bytes on the sender's link, CPU seconds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.models import file_digest
from lab.sh import NetnsHosts

# Runs a command and writes its exit status and the CPU seconds it (and its children)
# used: per-process CPU of programs started in other namespaces, without ptrace or perf.
CPU_WRAP = r"""
import json, resource, signal, subprocess, sys, time
t0 = time.monotonic()
p = subprocess.Popen(sys.argv[2:])
signal.signal(signal.SIGTERM, lambda *_: p.terminate())  # stop the child, then report
rc = p.wait()
u = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "cpu_s": u.ru_utime + u.ru_stime, "wall_s": time.monotonic() - t0}, f)
"""

TCP_SERVER = r"""
import socket, sys, threading
path, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = socket.create_server(("0.0.0.0", port), backlog=n)
print("listening", flush=True)
def serve(conn):
    with conn, open(path, "rb") as f:
        conn.sendfile(f)
threads = []
for _ in range(n):
    conn, _ = srv.accept()
    t = threading.Thread(target=serve, args=(conn,)); t.start(); threads.append(t)
for t in threads:
    t.join()
"""

TCP_CLIENT = r"""
import socket, sys
import blake3
host, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
h = blake3.blake3()
s = socket.create_connection((host, port))
buf = bytearray(1 << 20)
with open(out, "wb") as f:
    while True:
        n = s.recv_into(buf)
        if not n:
            break
        h.update(memoryview(buf)[:n]); f.write(memoryview(buf)[:n])
print(h.hexdigest(), flush=True)
"""


@dataclass
class RunResult:
    method: str
    receivers: int
    seconds: float
    ok: bool
    sender_link_bytes: int
    file_bytes: int
    repair_bytes: int | None = None
    cpu_sender_s: float | None = None
    cpu_receivers_s: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def tx_bytes(lab: NetnsHosts, host: str) -> int:
    """Bytes the host's NIC has sent: what the model server's link carried."""
    iface = lab.host_iface(host)
    return int(lab.run(host, "cat", f"/sys/class/net/{iface}/statistics/tx_bytes").stdout)


def wrapped(lab: NetnsHosts, host: str, stats: Path, *cmd: str, **kw: Any) -> subprocess.Popen:
    return lab.popen(host, sys.executable, "-c", CPU_WRAP, str(stats), *cmd, **kw)


def read_stats(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"rc": None, "cpu_s": None}


def wait_all(procs: list[subprocess.Popen], deadline: float) -> bool:
    """Wait for every process until ``deadline`` (monotonic); False if one still runs."""
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True


def tcp_fanout(lab: NetnsHosts, sender: str, receivers: list[str], path: Path, work: Path,
               port: int = 9000, timeout: float = 900) -> RunResult:
    """The model server today: one TCP stream per receiver, all at once."""
    work.mkdir(parents=True, exist_ok=True)
    want = file_digest(path)
    before = tx_bytes(lab, sender)
    srv_stats = work / "tcp-server.json"
    server = wrapped(lab, sender, srv_stats, sys.executable, "-c", TCP_SERVER, str(path),
                     str(port), str(len(receivers)), stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    server.stdout.readline()  # "listening"
    sender_ip = lab.ip(sender)
    t0 = time.monotonic()
    clients = []
    for r in receivers:
        out = work / f"tcp-{r}.bin"
        clients.append((r, out, work / f"tcp-{r}.json", wrapped(
            lab, r, work / f"tcp-{r}.json", sys.executable, "-c", TCP_CLIENT, sender_ip, str(port),
            str(out), stdout=subprocess.PIPE, text=True)))
    finished = wait_all([c[3] for c in clients], t0 + timeout)
    seconds = time.monotonic() - t0
    wait_all([server], time.monotonic() + 10)
    oks = {}
    for r, out, _, proc in clients:
        if proc.poll() is None:
            proc.kill()
        got = proc.stdout.read().strip() if proc.stdout else ""
        oks[r] = got == want
        out.unlink(missing_ok=True)
    return RunResult("tcp", len(receivers), seconds, finished and all(oks.values()),
                     tx_bytes(lab, sender) - before, path.stat().st_size, 0,
                     read_stats(srv_stats)["cpu_s"],
                     sum(read_stats(c[2])["cpu_s"] or 0 for c in clients), {"verified": oks})


# UFTP with authenticated datagrams, as modelcast's are: AES-256-GCM on every packet, an
# ephemeral ECDH key exchange signed with a fresh ECDSA key (nothing to provision).
UFTP_GCM = ("-Y", "aes256-gcm", "-h", "sha256", "-e", "ecdh_ecdsa", "-K", "prime256v1")
UFTPD_GCM = ("-K", "ec:prime256v1")  # the client's own ECDSA key, which that key exchange needs


def uftp(lab: NetnsHosts, sender: str, receivers: list[str], path: Path, work: Path, group: str,
         rate_mbit: float, timeout: float = 900, mtu: int = 1500,
         extra: tuple[str, ...] = (), cipher: tuple[str, ...] = ("-Y", "none")) -> RunResult:
    """UFTP 4.10 on the controller's tree for ``group`` (the caller creates it): uftpd on
    every receiver, uftp on the sender at ``rate_mbit``, by default encryption off (no
    authentication either: the cheapest UFTP; ``cipher=UFTP_GCM`` authenticates every
    datagram, the same protection class as modelcast's tags), data blocks that fill the
    MTU (as modelcast's datagrams do). Its defaults are otherwise kept: on this LAN its
    protocol rounds take milliseconds (measured: 32 MB to 4 receivers at 190 Mbit/s in 1.47 s)."""
    work.mkdir(parents=True, exist_ok=True)
    want = file_digest(path)
    daemons = []
    for r in receivers:
        d = work / f"uftp-{r}"
        (d / "tmp").mkdir(parents=True, exist_ok=True)
        daemons.append((r, d, wrapped(lab, r, work / f"uftpd-{r}.json", "uftpd", "-d", "-D", str(d),
                                      "-T", str(d / "tmp"), "-L", str(d / "log"), "-M", group,
                                      "-I", lab.host_iface(r), *(UFTPD_GCM if cipher == UFTP_GCM else ()),
                                      stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)))
    time.sleep(1.0)  # uftpd binds and joins
    before = tx_bytes(lab, sender)
    stats = work / "uftp.json"
    t0 = time.monotonic()
    block = max(512, min(mtu - 200, 8800))  # its manual: ~100-200 below the MTU; 8800 max
    if cipher != ("-Y", "none"):
        block = min(block, 8700)  # UFTP 4.10.2 with aes256-gcm aborts ("double free") at -b 8800
    proc = wrapped(lab, sender, stats, "uftp", "-R", str(int(rate_mbit * 1000)), "-I",
                   lab.host_iface(sender), "-M", group, "-P", group, *cipher,
                   "-b", str(block), *extra,
                   "-H", ",".join(lab.ip(r) for r in receivers),
                   "-S", str(work / "uftp-status.txt"), "-L", str(work / "uftp.log"), str(path),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finished = wait_all([proc], t0 + timeout)
    seconds = time.monotonic() - t0
    if not finished:
        proc.kill()
    sent = tx_bytes(lab, sender) - before
    oks = {}
    for r, d, p in daemons:
        out = d / path.name
        oks[r] = out.exists() and file_digest(out) == want
        p.terminate()
    wait_all([p for _, _, p in daemons], time.monotonic() + 10)
    cpu_rx = sum(read_stats(work / f"uftpd-{r}.json")["cpu_s"] or 0 for r, _, _ in daemons)
    for _, d, _ in daemons:
        shutil.rmtree(d, ignore_errors=True)
    size = path.stat().st_size
    # UFTP does not report its retransmitted bytes; its overhead shows in sender_link_bytes.
    return RunResult("uftp", len(receivers), seconds, finished and all(oks.values()), sent,
                     size, None, read_stats(stats)["cpu_s"], cpu_rx, {"verified": oks})
