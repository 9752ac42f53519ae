"""The one set of probe programs the labs run inside host namespaces: ping, a UDP
sender (paced, numbered datagrams, or a full-speed blast with or without GSO), a
multicast capture on the wire, and an IGMP member. Each is a short Python script run
with ``sys.executable -c``, so a probe needs nothing installed in the namespace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from hostagent.net import SOL_UDP, UDP_SEGMENT
from lab.sh import HOST_IFACE, LabError, NetnsHosts

DGRAM = 1472  # one 1500-MTU frame of UDP payload
GSO_SEGS = 44  # datagrams per GSO send (44 x 1472 < 65,507)

# ICMP echo for machines without iputils-ping (argv: ip count wait); exit 0 on any reply.
PING = r"""
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

# UDP sender (argv: dest port mode interval count seconds [iface-ip]). mode "plain": one
# datagram per send, "gso": GSO_SEGS datagrams per send. Each send starts with its 8-byte
# sequence number. interval 0 = as fast as it goes. Stops after count sends or seconds,
# then prints the rate it achieved in Mbit/s.
# With MODELCAST_SEND_LOG=FILE in its environment it also writes "seq time" per send
# there (flushed every 100 sends): when each datagram left, also the ones that were lost.
SEND = r"""
import os, socket, struct, sys, time
dest, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
log = open(os.environ["MODELCAST_SEND_LOG"], "w") if os.environ.get("MODELCAST_SEND_LOG") else None
interval, count, secs = float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
if len(sys.argv) > 7:
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(sys.argv[7]))
buf = bytearray(%(dgram)d * (%(segs)d if mode == "gso" else 1))
cmsg = [(%(sol_udp)d, %(udp_segment)d, struct.pack("=H", %(dgram)d))] if mode == "gso" else []
sent = 0
t0 = time.monotonic()
end = t0 + secs
for seq in range(count):
    struct.pack_into("!Q", buf, 0, seq)
    try:
        sent += s.sendmsg([buf], cmsg, 0, (dest, port))
    except (BlockingIOError, ConnectionRefusedError):
        pass
    if log is not None:
        log.write(f"{seq} {time.time():.6f}\n")
        if seq %% 100 == 99:
            log.flush()
    now = time.monotonic()
    if now >= end:
        break
    if interval:
        time.sleep(max(0.0, t0 + (seq + 1) * interval - now))
print(sent * 8 / max(1e-9, time.monotonic() - t0) / 1e6, flush=True)
""" % {"dgram": DGRAM, "segs": GSO_SEGS, "sol_udp": SOL_UDP, "udp_segment": UDP_SEGMENT}

# Captures UDP datagrams whose destination lies in a CIDR (argv: cidr outfile) as they
# arrive at the host's NIC (AF_PACKET: no socket-level join, so no IGMP report): "a
# non-receiver got nothing" is checked where it matters, on the wire. One line per
# datagram: the first 8 payload bytes as a number (the SEND probe's sequence) and the time
# the kernel received it (SO_TIMESTAMPNS: a capture process starved of CPU reads late, but
# its times are still the arrivals).
CAPTURE = r"""
import socket, struct, sys, time
net, bits = sys.argv[1].split("/") if "/" in sys.argv[1] else (sys.argv[1], "32")
mask = (0xFFFFFFFF << (32 - int(bits))) & 0xFFFFFFFF
want = int.from_bytes(socket.inet_aton(net), "big") & mask
s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0800))
try:  # 16 MiB: a capture starved of CPU for a while must not drop what reached the NIC
    s.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root)
except OSError:
    pass
s.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_TIMESTAMPNS: when the kernel got it, not when we read it
s.bind(("%(iface)s", 0))
out = open(sys.argv[2], "w", buffering=1)
print("ready", flush=True)
while True:
    data, anc, _, addr = s.recvmsg(65536, 64)
    stamp = next((struct.unpack("=qq", d[:16]) for lvl, kind, d in anc if lvl == socket.SOL_SOCKET and kind == 35), None)
    if addr[2] == 4 or len(data) < 28 or data[9] != 17:
        continue
    if int.from_bytes(data[16:20], "big") & mask != want:
        continue
    ihl = (data[0] & 15) * 4
    seq = int.from_bytes(data[ihl + 8: ihl + 16], "big")
    out.write(f"{seq} {stamp[0] + stamp[1] / 1e9 if stamp else time.time():.6f}\n")
""" % {"iface": HOST_IFACE}

# Joins a group by socket option, so the kernel sends the IGMP report (argv: mode group
# source hold iface-ip); mode "ssm" = IGMPv3 INCLUDE(source), else any-source (an IGMPv2
# report with force_igmp_version=2). Leaves after ``hold`` seconds.
MEMBER = r"""
import socket, sys, time
mode, group, source, hold = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
ifaddr = socket.inet_aton(sys.argv[5])
if mode == "ssm":  # struct ip_mreq_source is group, interface, source
    mreq = socket.inet_aton(group) + ifaddr + socket.inet_aton(source)
    add, drop = 39, 40  # IP_ADD_SOURCE_MEMBERSHIP / IP_DROP_SOURCE_MEMBERSHIP (Linux)
else:
    mreq = socket.inet_aton(group) + ifaddr
    add, drop = socket.IP_ADD_MEMBERSHIP, socket.IP_DROP_MEMBERSHIP
s.setsockopt(socket.IPPROTO_IP, add, mreq)
print("joined", flush=True)
time.sleep(hold)
s.setsockopt(socket.IPPROTO_IP, drop, mreq)
print("left", flush=True)
time.sleep(2)
"""


def send(lab: NetnsHosts, host: Any, group: str, port: int, interval: float,
         count: int, log: Optional[Path] = None) -> subprocess.Popen:
    """Start numbered datagrams from ``host`` to ``group:port``, one every ``interval`` s;
    with ``log``, each one's send time is written there ("seq time" lines)."""
    env = dict(os.environ, MODELCAST_SEND_LOG=str(log)) if log is not None else None
    return lab.popen(host, sys.executable, "-c", SEND, group, port, "plain", interval, count,
                     1e9, stdout=subprocess.DEVNULL, env=env)


def blast(prefix: Sequence[str], dest: str, port: int, mode: str, secs: float,
          iface: Optional[str] = None) -> float:
    """Mbit/s a Python sender reaches in ``secs`` (``mode`` "plain" or "gso"), run under
    ``prefix`` (e.g. ``lab.cmd(host)``, or ``[]`` in this namespace); NaN if it failed."""
    argv = [*prefix, sys.executable, "-c", SEND, dest, str(port), mode, "0", str(1 << 62),
            str(secs)] + ([iface] if iface else [])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=secs + 20)
    try:
        return float(out.stdout.strip()) if out.returncode == 0 else float("nan")
    except ValueError:
        return float("nan")


def member(lab: NetnsHosts, host: Any, mode: str, group: str, source: str, hold: float,
           iface_ip: str) -> subprocess.Popen:
    """Join ``group`` from ``host`` by IGMP (``mode`` "ssm" or "v2") for ``hold`` seconds."""
    return lab.popen(host, sys.executable, "-c", MEMBER, mode, group, source, hold, iface_ip,
                     stdout=subprocess.PIPE, text=True)


class Capture:
    """UDP datagrams to ``cidr`` (a group, or e.g. ``232.0.0.0/8``) seen on a host's NIC
    since the capture started; readable at any time."""

    def __init__(self, lab: NetnsHosts, host: Any, cidr: str, workdir: Path) -> None:
        self.host = host
        self.path = Path(workdir) / f"capture-{host}-{cidr.replace('/', '_')}.txt"
        self.path.write_text("")
        self.proc = lab.popen(host, sys.executable, "-c", CAPTURE, cidr, str(self.path),
                              stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise LabError(f"multicast capture on {host} did not start (exit {self.proc.poll()})")

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

    def stop(self) -> int:
        """Stop capturing; how many datagrams it saw."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        return len(self.records())
