"""NACK-implosion scaling benchmark on the in-memory network (virtual time).

``python -m bench.scale [--receivers 8,16,...,1024] [--loss 0.01] [--size-mb 1] [--json]``

One sender, N receivers, each link dropping datagrams independently with probability
``--loss`` (both directions, every datagram type). For each N, with and without FEC, it
reports what the sender has to cope with: first-pass losses (summed over receivers, and
distinct datagrams lost by anyone), NACK datagrams arriving at the sender and per lost
datagram, repair bytes by kind as % of the file, and whether every receiver verified the
file. The question it answers: does the sender's repair work per loss stay flat as the
group grows?
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

from hostagent import wire
from hostagent.receiver import ReceiverConfig
from hostagent.sender import SenderConfig
from lab.netsim import SENDER_ADDR, Sim, SourceBackedSink

_SEQ = struct.Struct("!Q")


@dataclass
class Row:
    receivers: int
    fec_k: int
    lost: int  # first-pass DATA datagrams dropped, summed over receivers
    lost_distinct: int  # distinct sequence numbers lost by at least one receiver
    nacks: int  # NACK datagrams that reached the sender
    nacks_per_distinct: float
    nacks_per_loss: float
    repair_unicast_pct: float
    repair_multicast_pct: float
    repair_parity_pct: float
    repair_pct: float
    repair_bytes_per_loss: float
    proactive_pct: float
    fec_decodes: int
    completed: int
    all_verified: bool
    virtual_seconds: float
    wall_seconds: float


def run_one(
    receivers: int,
    loss: float,
    size: int,
    fec_k: int,
    fec_overhead: float = 0.0,
    seed: int = 1,
    chunk_size: int = 256 * 1024,
    payload_size: int = 1400,
    rate_mbit: float = 1000.0,
) -> Row:
    """One transfer; the same seed gives the same file and the same loss pattern draws."""
    data = random.Random(seed).randbytes(size)
    rng = random.Random(seed * 7919 + receivers)
    rand = rng.random
    lost_seqs: set[int] = set()
    lost = [0]

    def drop(now: float, src: object, dst: object, datagram: bytes) -> bool:
        if rand() >= loss:
            return False
        if src == SENDER_ADDR and datagram[3] == wire.T_DATA:
            lost[0] += 1
            lost_seqs.add(_SEQ.unpack_from(datagram, wire.HEADER_LEN)[0])
        return True

    cfg = SenderConfig(
        chunk_size=chunk_size, payload_size=payload_size, rate_bps=rate_mbit * 1e6,
        expected_receivers=receivers, fec_k=fec_k, fec_overhead=fec_overhead,
    )
    sim = Sim(data, cfg, seed=seed, loss=drop, sink_factory=lambda: SourceBackedSink(data))
    for _ in range(receivers):
        sim.add_receiver(ReceiverConfig())
    started = time.perf_counter()
    sim.run(until=600)
    wall = time.perf_counter() - started
    st = sim.sender.stats
    ok = [
        r for r in sim.receivers
        if r.receiver is not None and r.receiver.complete and r.receiver.manifest is not None
        and r.receiver.manifest.file_digest == sim.sender.file_digest
    ]
    pct = lambda b: round(100 * b / max(1, size), 2)  # noqa: E731
    n_lost = lost[0]
    return Row(
        receivers=receivers, fec_k=fec_k, lost=n_lost, lost_distinct=len(lost_seqs),
        nacks=st.nacks_received,
        nacks_per_distinct=round(st.nacks_received / max(1, len(lost_seqs)), 3),
        nacks_per_loss=round(st.nacks_received / max(1, n_lost), 3),
        repair_unicast_pct=pct(st.repair_bytes_unicast), repair_multicast_pct=pct(st.repair_bytes_multicast),
        repair_parity_pct=pct(st.repair_bytes_parity), repair_pct=pct(st.repair_bytes),
        repair_bytes_per_loss=round(st.repair_bytes / max(1, n_lost), 1),
        proactive_pct=pct(st.parity_bytes_proactive),
        fec_decodes=sum(r.receiver.stats.fec_decodes for r in sim.receivers if r.receiver is not None),
        completed=len(ok), all_verified=len(ok) == receivers,
        virtual_seconds=round(sim.now, 3), wall_seconds=round(wall, 2),
    )


_COLUMNS = [
    ("receivers", "N", 5), ("fec_k", "fec", 4), ("lost", "lost", 6), ("lost_distinct", "dist", 5),
    ("nacks", "nacks", 6), ("nacks_per_distinct", "n/dist", 7), ("nacks_per_loss", "n/loss", 7),
    ("repair_unicast_pct", "uc%", 7), ("repair_multicast_pct", "mc%", 7), ("repair_parity_pct", "par%", 6),
    ("repair_pct", "rep%", 7), ("repair_bytes_per_loss", "B/loss", 7), ("all_verified", "ok", 5),
    ("virtual_seconds", "vsec", 6), ("wall_seconds", "wall", 6),
]


def format_table(rows: list[Row]) -> str:
    head = " ".join(f"{title:>{w}}" for _, title, w in _COLUMNS)
    lines = [head]
    for row in rows:
        values = asdict(row)
        lines.append(" ".join(f"{str(values[key]):>{w}}" for key, _, w in _COLUMNS))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--receivers", default="8,16,32,64,128,256,512,1024", help="comma-separated group sizes")
    parser.add_argument("--loss", type=float, default=0.01, help="independent loss per link and datagram")
    parser.add_argument("--size-mb", type=float, default=1.0, help="file size in MiB (small: N copies are simulated)")
    parser.add_argument("--fec-k", type=int, default=32, help="datagrams per FEC block for the FEC runs")
    parser.add_argument("--fec-overhead", type=float, default=0.0, help="proactive parity for the FEC runs")
    parser.add_argument("--no-fec", action="store_true", help="only the runs without FEC")
    parser.add_argument("--only-fec", action="store_true", help="only the runs with FEC")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="one JSON object per run instead of a table")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.receivers.split(",") if x.strip()]
    modes = [0] if args.no_fec else [args.fec_k] if args.only_fec else [0, args.fec_k]
    size = int(args.size_mb * 1024 * 1024)
    rows: list[Row] = []
    if not args.json:
        print(f"# independent loss {args.loss:.2%} per link, file {size} bytes, seed {args.seed}", flush=True)
    for n in sizes:
        for k in modes:
            row = run_one(n, args.loss, size, k, args.fec_overhead if k else 0.0, args.seed)
            rows.append(row)
            if args.json:
                print(json.dumps(asdict(row)), flush=True)
            else:
                lines = format_table([row]).splitlines()
                if len(rows) == 1:
                    print(lines[0])
                print(lines[1], flush=True)
    return 0 if all(r.all_verified for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
