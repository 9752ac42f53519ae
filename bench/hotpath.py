"""The host agent's per-byte CPU, without a network: what issue 10's "CPU per GB" is made of.

    python -m bench.hotpath [--size-mb 64] [--runs 3] [--no-key] [--json]

A clean jumbo stream (8904-byte payloads, 1 MiB chunks, MAC'd as a controller run is) is
recorded once from a real ``Sender`` and fed to a real ``Receiver`` writing a file in
/dev/shm, in GRO super-packets of 7 datagrams through one reused buffer, as
``hostagent.net`` hands them over; the sender side is one pass of ``datagrams_to_send``
over a file (no manifest pass). ``receiver`` runs the clean-stream path in C where it is
built, ``receiver_python`` the same receiver with it in Python (``hostagent.fastrun``),
alternating. CPU is the process's user+system time per GB of file,
medians of ``--runs``. The kernel's share of a real transfer (socket copies, softirq) is
not in it; ``python -m bench.agent`` measures that, noisily, beside UFTP.

The same run times the floor no Python can remove as long as both checks stay: one tag
per datagram (``mac_floor``: what ``wire`` uses, AES-GMAC for DATA) and one BLAKE3 digest
per chunk over the same bytes (``digest_floor``) -- their sum is what a receiver pays for
crypto alone; ``blake3_mac_floor`` is the keyed BLAKE3 MAC per datagram that wire version
1 used, timed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import blake3

from bench.machine import describe, machine
from bench.memory import steady_memory
from hostagent import fastrun, wire
from hostagent.common import MemorySource
from hostagent.net import FileSink, FileSource
from hostagent.receiver import Receiver, ReceiverConfig
from hostagent.sender import Sender, SenderConfig

GB = 1 << 30
PAYLOAD, DATAGRAM, CHUNK, GRO_SEGMENTS = 8904, 8952, 1 << 20, 7
SENDER = ("10.0.0.1", 5000)


def _config(key: Optional[bytes]) -> SenderConfig:
    return SenderConfig(chunk_size=CHUNK, payload_size=PAYLOAD, max_datagram=DATAGRAM, key=key,
                        rate_bps=1e12, initial_rate_fraction=1.0)


def record_stream(data: bytes, key: Optional[bytes]) -> list[bytes]:
    """Every datagram of the sender's first pass: manifest pages, DATA, END."""
    sender = Sender(MemorySource(data), _config(key), 0.0, rng=random.Random(1))
    out: list[bytes] = []
    now = 0.0
    while sender.stream_position < sender.layout.total_seq or not out or wire.peek_type(out[-1]) != wire.T_END:
        now += 0.001
        out.extend(raw for raw, _ in sender.datagrams_to_send(now))
    return out


def super_packets(stream: list[bytes]) -> list[tuple[bytes, int]]:
    """(blob, segment size) as UDP GRO returns them: equal-sized datagrams back to back,
    a shorter one ending a batch; 0 for a lone datagram."""
    batches: list[list[bytes]] = []
    for raw in stream:
        last = batches[-1] if batches else None
        if last and len(last) < GRO_SEGMENTS and len(raw) <= len(last[0]) and len(last[-1]) == len(last[0]):
            last.append(raw)
        else:
            batches.append([raw])
    return [(b"".join(b), len(b[0]) if len(b) > 1 else 0) for b in batches]


def _cpu(fn: Callable[[], None]) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def receive_cpu(packets: list[tuple[bytes, int]], key: Optional[bytes], size: int, work: str,
                pure: bool = False) -> float:
    """CPU seconds per GB for a receiver to take the stream into a file and verify it;
    ``pure``: with its clean-stream path in Python, not C (``hostagent.fastrun``)."""
    path = tempfile.mktemp(prefix="modelcast-hotpath-", dir=work)
    sink = FileSink(path)
    rx = Receiver(sink, ReceiverConfig(receiver_id=1, key=key), 0.0, rng=random.Random(2))
    buf = bytearray(65535)
    saved = fastrun.verify_run, fastrun.compact_run
    if pure:
        fastrun.verify_run, fastrun.compact_run = fastrun.verify_run_py, fastrun.compact_run_py

    def feed() -> None:
        for i, (blob, seg) in enumerate(packets):
            buf[: len(blob)] = blob
            rx.receive_batch(memoryview(buf)[: len(blob)], seg, SENDER, 1.0 + i * 1e-5)

    try:
        cpu = _cpu(feed)
        if not rx.complete:
            raise RuntimeError("the receiver did not complete the clean stream")
    finally:
        fastrun.verify_run, fastrun.compact_run = saved
        sink.close()
        for p in (path, sink.state_path):
            if os.path.exists(p):
                os.unlink(p)
    return cpu / (size / GB)


def send_cpu(path: str, key: Optional[bytes], size: int) -> float:
    """CPU seconds per GB for a sender's first pass over a file (manifest not included)."""
    with FileSource(path) as source:
        sender = Sender(source, _config(key), 0.0, rng=random.Random(1))

        def stream() -> None:
            now = 0.0
            while sender.stream_position < sender.layout.total_seq:
                now += 0.001
                sender.datagrams_to_send(now)

        return _cpu(stream) / (size / GB)


def floors(stream: list[bytes], data: bytes, key: bytes, size: int) -> tuple[float, float, float]:
    """(per-datagram tag, per-chunk digest, per-datagram keyed BLAKE3) alone, CPU s per GB."""
    views = [memoryview(raw)[: len(raw) - wire.MAC_LEN] for raw in stream]
    mac = _cpu(lambda: [wire._tag(key, v) for v in views])
    digest = _cpu(lambda: [wire.chunk_digest(memoryview(data)[k : k + CHUNK]) for k in range(0, size, CHUNK)])
    blake = _cpu(lambda: [blake3.blake3(v, key=key).digest(length=wire.MAC_LEN) for v in views])
    return mac / (size / GB), digest / (size / GB), blake / (size / GB)


def run(args: argparse.Namespace) -> dict[str, Any]:
    size = int(args.size_mb * (1 << 20))
    key = None if args.no_key else wire.derive_key(b"bench.hotpath")
    rng, piece = random.Random(3), 64 << 20  # (randbytes takes at most 2^31 bits at once)
    data = b"".join(rng.randbytes(min(piece, size - at)) for at in range(0, size, piece))
    work = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    src = tempfile.mktemp(prefix="modelcast-hotpath-src-", dir=work)
    with open(src, "wb") as f:
        f.write(data)
    try:
        stream = record_stream(data, key)
        packets = super_packets(stream)
        rows: dict[str, list[float]] = {"receiver": [], "receiver_python": [], "sender": [], "mac_floor": [],
                                        "digest_floor": [], "blake3_mac_floor": []}
        with steady_memory(Path(work), 4 * size):  # every run's copy into equally warm memory (bench.memory)
            for _ in range(args.runs):
                rows["receiver"].append(receive_cpu(packets, key, size, work))
                rows["receiver_python"].append(receive_cpu(packets, key, size, work, pure=True))
                rows["sender"].append(send_cpu(src, key, size))
                if key is not None:
                    mac, digest, blake = floors(stream, data, key, size)
                    rows["mac_floor"].append(mac)
                    rows["digest_floor"].append(digest)
                    rows["blake3_mac_floor"].append(blake)
    finally:
        os.unlink(src)
    return {"machine": machine(), "size_mb": args.size_mb, "runs": args.runs, "keyed": key is not None,
            "native": fastrun.NATIVE,
            "datagrams": len(stream), "super_packets": len(packets),
            "cpu_s_per_gb": {k: round(statistics.median(v), 3) for k, v in rows.items() if v},
            "raw": {k: [round(x, 3) for x in v] for k, v in rows.items() if v}}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-key", action="store_true", help="no MAC (a --group run without --key-file)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
        return 0
    cpu = result["cpu_s_per_gb"]
    print(f"hot path, {describe(result['machine'])}: {args.size_mb:g} MB, "
          f"{'MAC on' if result['keyed'] else 'no MAC'}, medians of {args.runs}")
    for name, value in cpu.items():
        print(f"  {name:16s} {value:5.2f} s/GB")
    if "mac_floor" in cpu:
        crypto = cpu["mac_floor"] + cpu["digest_floor"]
        print(f"  receiver minus crypto floor {cpu['receiver'] - crypto:5.2f} s/GB "
              f"(crypto {crypto / cpu['receiver']:.0%} of it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
