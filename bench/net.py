"""Measure, don't assume: goodput of the real CLI next to a raw Python UDP blast.

``python -m bench.net [--size-mb 200] [--rate 2000] [--big]``

1. raw blast on loopback: one ``sendto`` per 1472-byte datagram vs one GSO ``sendmsg``
   per 44 datagrams (the ceiling a Python sender can reach);
2. ``modelcast send``/``recv`` on loopback, sender GSO off vs on (receiver GRO on);
3. a kernel-bridge netns lab (root only): raw blast, then 1 vs 4 receivers;
4. ``--big``: a 1 GB transfer to /dev/shm, reporting the receiver's peak RSS.

All traffic stays on loopback or inside namespaces this script creates and removes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from lab.models import make_key_file, make_model
from lab.probes import blast
from lab.sh import free_port

REPO = Path(__file__).resolve().parent.parent

def _cli(prefix: list[str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, "-m", "hostagent.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)


def transfer(src: Path, outdir: Path, group: str, sender_ip: str, receivers: list[tuple[list[str], str]],
             sender_prefix: list[str], rate: float, gso: bool) -> dict:
    """One CLI transfer; returns sender and receiver summaries."""
    key = ["--key-file", str(make_key_file(outdir / "bench.key"))]  # authenticated, as real runs are
    extra = ["--gso"] if gso else ["--no-gso"]
    procs = []
    outs = []
    for i, (prefix, iface) in enumerate(receivers):
        out = outdir / f"bench-out-{i}.bin"
        outs.append(out)
        procs.append(_cli(prefix, "recv", "--group", group, "--source", sender_ip, "--interface", iface,
                          "--out", str(out), "--json", "--timeout", "60", *key))
    try:
        time.sleep(0.5)
        sender = _cli(sender_prefix, "send", str(src), "--group", group, "--interface", sender_ip, "--ttl",
                      "0" if sender_ip.startswith("127.") else "1", "--receivers", str(len(receivers)),
                      "--rate", str(rate), "--json", "--timeout", "60", *key, *extra)
        s_out, s_err = sender.communicate(timeout=600)
        r = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for out in outs:
            out.unlink(missing_ok=True)
    if sender.returncode != 0:
        return {"error": s_err.strip()[-300:] or s_out}
    return {"sender": json.loads(s_out), "receivers": [json.loads(o) if o.strip() else {"error": e[-300:]} for o, e in r]}


def _row(label: str, res: dict) -> str:
    if "error" in res:
        return f"  {label:<38} FAILED: {res['error']}"
    s = res["sender"]
    rx = res["receivers"]
    rx_good = min(r.get("goodput_mbit", 0) for r in rx)
    rss = max(r.get("peak_rss_mb", 0) for r in rx)
    repair = 100 * s["repair_bytes"] / max(1, s["bytes"])
    return (f"  {label:<38} sender {s['goodput_mbit']:>7.1f} Mbit/s  slowest receiver {rx_good:>7.1f} Mbit/s  "
            f"repair {repair:4.1f}%  nacks {s['nacks']:>4}  rate-cuts {s['rate_decreases']:>3}  "
            f"gso={s['gso']} rx-rss {rss:.0f} MB")


def _loopback_group() -> str:
    return f"239.255.{random.randint(1, 254)}.{random.randint(1, 254)}:{free_port(socket.SOCK_DGRAM)}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.net", description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--rate", type=float, default=3000.0, help="sender rate cap, Mbit/s")
    parser.add_argument("--blast-seconds", type=float, default=1.0)
    parser.add_argument("--big", action="store_true", help="also move 1 GB to /dev/shm and report receiver RSS")
    parser.add_argument("--no-lab", action="store_true")
    args = parser.parse_args(argv)
    shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
    print(f"# {os.cpu_count()} CPUs, {os.uname().release}, files in {shm}, {args.size_mb} MB, cap {args.rate:g} Mbit/s")

    print("raw Python UDP blast, loopback unicast (1472-byte datagrams, no receiver):")
    for mode in ("plain", "gso"):
        print(f"  {mode:<6} {blast([], '127.0.0.1', free_port(socket.SOCK_DGRAM), mode, args.blast_seconds):8.0f} Mbit/s")

    src = make_model(shm / f"bench-src-{os.getpid()}.bin", args.size_mb << 20, seed=1).path
    try:
        print(f"modelcast over loopback multicast, 1 receiver, {args.size_mb} MB:")
        for gso in (False, True):
            group = _loopback_group()
            res = transfer(src, shm, group, "127.0.0.1", [([], "127.0.0.1")], [], args.rate, gso)
            print(_row(f"send GSO {'on' if gso else 'off'}", res), flush=True)

        if not args.no_lab:
            from lab.bridge import BridgeLab, lab_unavailable

            reason = lab_unavailable()
            if reason:
                print(f"kernel-bridge lab skipped: {reason}")
            else:
                with BridgeLab(5) as lab:
                    pfx = lab.cmd
                    print("kernel-bridge netns lab (veth + Linux bridge):")
                    for mode in ("plain", "gso"):
                        rate = blast(pfx(0), "232.1.2.3", 40000, mode, args.blast_seconds, lab.ip(0))
                        print(f"  raw blast to group, {mode:<5} {rate:8.0f} Mbit/s")
                    for loss in (False, True):
                        if loss:  # 1% random loss on every receiver's link from now on
                            for h in range(1, 5):
                                lab.add_loss(h, "random")
                        for n in (1, 4):
                            for gso in (False, True):
                                group = f"232.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}:{random.randint(20000, 60000)}"
                                rx = [(pfx(h), "0.0.0.0") for h in range(1, n + 1)]
                                res = transfer(src, shm, group, lab.ip(0), rx, pfx(0), args.rate, gso)
                                label = (f"{n} receiver{'s' if n > 1 else ''}, {'1%' if loss else '0%'} loss, "
                                         f"GSO {'on' if gso else 'off'}")
                                print(_row(label, res), flush=True)
    finally:
        src.unlink(missing_ok=True)

    if args.big:
        big = make_model(shm / f"bench-big-{os.getpid()}.bin", 1 << 30, seed=2).path
        try:
            group = _loopback_group()
            res = transfer(big, shm, group, "127.0.0.1", [([], "127.0.0.1")], [], args.rate, True)
            print("1 GB over loopback to /dev/shm:")
            print(_row("1 receiver, send GSO on", res))
            if "receivers" in res:
                print(f"  receiver peak RSS {res['receivers'][0].get('peak_rss_mb')} MB, "
                      f"sender peak RSS {res['sender'].get('peak_rss_mb')} MB")
        finally:
            big.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
