"""Side-by-side distribution benchmark on the Open vSwitch lab (root):

    python -m bench.distribution [--size-mb 128] [--rate-cap 200] [--receivers 1,2,4,8]
                               [--runs 3] [--loss 0,1] [--methods tcp,uftp,modelcast]
                               [--out docs/bench] [--smoke]

One fabric (controller + leaf-spine lab, jumbo frames) serves every run. The sender's
link is capped with ``tc tbf`` to stand for the model server's NIC; the same file goes to
N receivers spread over the other leaves by

- **tcp**: N parallel TCP streams from the sender (what a model server does today);
- **uftp**: UFTP 4.10 on a controller-built tree, at the cap;
- **modelcast**: ``modelcast send``/``recv`` through the controller, at the cap.

Each run records the time until every receiver holds a verified copy (digest checked
here), bytes on the sender's link (its NIC counter), repair bytes and CPU seconds. Loss is
1% random on every receiver link, for all protocols alike. Writes ``results.json`` (all
raw numbers), ``results.md`` (medians) and ``results.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import baselines as B
from lab import loss as impair
from lab.controller import stamp_printer
from lab.fabric import Fabric
from lab.models import make_model
from lab.sh import LabError
from lab.transfer import Transfer
from topologies.spec import TopologyError, parse

METHODS = ("tcp", "uftp", "modelcast")


def receivers_for(fabric: Fabric, sender: str, n: int) -> list[str]:
    """N receivers round-robin over the leaves other than the sender's (every tree then
    branches at the spine and at each leaf, as in a real rollout)."""
    topo = fabric.topology
    src = topo.host(sender)
    by_switch: dict[int, list[str]] = {}
    for h in topo.hosts:
        if h.dpid != src.dpid:
            by_switch.setdefault(h.dpid, []).append(h.name)
    columns = list(by_switch.values())
    order = [col[i] for i in range(max(map(len, columns))) for col in columns if i < len(col)]
    if n > len(order):
        raise SystemExit(f"error: {n} receivers need more hosts off the sender's leaf "
                         f"than {topo.name} has ({len(order)})")
    return order[:n]


def run_modelcast(fabric: Fabric, model: Any, sender: str, rcv: list[str], rate: float,
                  name: str, work: Path) -> B.RunResult:
    lab = fabric.live_lab()
    before = B.tx_bytes(lab, sender)
    with Transfer(fabric, model, sender, rcv, rate=rate, name=name, workdir=work / name,
                  receiver_timeout=120, sender_timeout=120) as t:
        t.start_receivers()
        t.start_sender()
        report = t.finish(timeout=900)
        sent = B.tx_bytes(lab, sender) - before
        s = report.sender_summary or {}
        rx_cpu = sum((r.summary or {}).get("cpu_s") or 0 for r in report.receivers)
        for r in report.receivers:
            Path(t.out_path(r.host)).unlink(missing_ok=True)
    # Time = the sender's own clock from its first datagram to the last receiver's verified
    # completion: the UFTP runs likewise start after the controller installed their tree
    # (the REST round trips and tree setup before it are reported as wall_s).
    return B.RunResult("modelcast", len(rcv), report.seconds, report.ok, sent, model.size,
                       s.get("repair_bytes"), s.get("cpu_s"), rx_cpu,
                       {"wall_s": report.wall, "errors": report.errors[:5],
                        "nacks": s.get("nacks")})


def run_uftp(fabric: Fabric, model: Any, sender: str, rcv: list[str], rate: float, name: str,
             work: Path, index: int) -> B.RunResult:
    ctl = fabric.controller
    address = f"232.200.{index // 250}.{index % 250 + 1}"
    r = ctl.api("POST", "/v1/groups", json={
        "model": name, "source": fabric.ip(sender), "address": address,
        "receivers": [fabric.ip(h) for h in rcv]})
    if r.status_code not in (200, 201):
        raise SystemExit(f"error: controller refused the UFTP group: {r.text}")
    gid = r.json()["id"]
    try:
        ctl.wait_group(gid, lambda g: g.get("state") == "installed", timeout=30)
        return B.uftp(fabric.live_lab(), sender, rcv, model.path, work / name, address, rate,
                      mtu=fabric.mtu)
    finally:
        ctl.api("DELETE", f"/v1/groups/{gid}")


def medians(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = sorted({(r["loss_pct"], r["method"], r["receivers"]) for r in results})
    rows = []
    for loss, method, n in keys:
        rs = [r for r in results if (r["loss_pct"], r["method"], r["receivers"]) == (loss, method, n)]
        ok = [r for r in rs if r["ok"]]

        def med(field: str) -> float | None:
            vals = [r[field] for r in ok if r.get(field) is not None]
            return statistics.median(vals) if vals else None

        walls = [r["detail"].get("wall_s", r["seconds"]) for r in ok]
        rows.append({"loss_pct": loss, "method": method, "receivers": n, "runs": len(rs),
                     "ok_runs": len(ok), "seconds": med("seconds"),
                     "wall_s": statistics.median(walls) if walls else None,
                     "link_ratio": (med("sender_link_bytes") or 0) / rs[0]["file_bytes"],
                     "repair_bytes": med("repair_bytes"), "cpu_sender_s": med("cpu_sender_s"),
                     "cpu_receivers_s": med("cpu_receivers_s")})
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [f"Distribution of a {meta['size_mb']:g} MB file from one sender whose link is capped "
           f"at {meta['rate_cap']:g} Mbit/s, on {meta['topology']} (Open vSwitch userspace "
           f"datapath, MTU {meta['mtu']}), median of {meta['runs']} runs, {meta['date']}, "
           f"{meta['cpus']} CPUs.", "",
           "`time` runs from the first data packet (modelcast) or the process start (UFTP, TCP: "
           "their handshakes take milliseconds) to the last verified copy; `wall` adds, for "
           "modelcast, Python start-up, the REST calls and waiting for the tree (the UFTP runs' "
           "tree is installed before their clock starts).", "",
           "| loss | method | N | time s | wall s | T(N)/T(1) | sender link / file | repair MB | CPU sender s | CPU receivers s | ok |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {(r["loss_pct"], r["method"]): r["seconds"] for r in rows if r["receivers"] == min(
        x["receivers"] for x in rows)}
    for r in rows:
        t1 = base.get((r["loss_pct"], r["method"]))
        ratio = f"{r['seconds'] / t1:.2f}" if r["seconds"] and t1 else "-"
        fmt = (lambda v, f: "-" if v is None else format(v, f))
        out.append(f"| {r['loss_pct']:g}% | {r['method']} | {r['receivers']} | {fmt(r['seconds'], '.2f')} | "
                   f"{fmt(r['wall_s'], '.2f')} | "
                   f"{ratio} | {r['link_ratio']:.3f} | {fmt(None if r['repair_bytes'] is None else r['repair_bytes'] / 1e6, '.2f')} | "
                   f"{fmt(r['cpu_sender_s'], '.2f')} | {fmt(r['cpu_receivers_s'], '.2f')} | {r['ok_runs']}/{r['runs']} |")
    out += ["", "modelcast vs UFTP (time ratio, lower is better):", ""]
    for r in rows:
        if r["method"] != "modelcast" or not r["seconds"]:
            continue
        u = next((x for x in rows if x["method"] == "uftp" and x["receivers"] == r["receivers"]
                  and x["loss_pct"] == r["loss_pct"]), None)
        if u and u["seconds"]:
            out.append(f"- loss {r['loss_pct']:g}%, N={r['receivers']}: "
                       f"{r['seconds'] / u['seconds']:.2f} x UFTP's time")
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, Any]], path: Path, meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"tcp": "tab:red", "uftp": "tab:blue", "modelcast": "tab:green"}
    for method in METHODS:
        for loss in sorted({r["loss_pct"] for r in rows}):
            pts = [(r["receivers"], r["seconds"], r["link_ratio"]) for r in rows
                   if r["method"] == method and r["loss_pct"] == loss and r["seconds"]]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            style = "-" if loss == 0 else "--"
            label = f"{method}, {loss:g}% loss"
            ax1.plot(xs, [p[1] for p in pts], style, marker="o", color=colors[method], label=label)
            ax2.plot(xs, [p[2] for p in pts], style, marker="o", color=colors[method], label=label)
    for ax in (ax1, ax2):
        ax.set_xlabel("receivers N")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    ax1.set_ylabel("seconds until every receiver verified")
    ax1.set_title(f"{meta['size_mb']:g} MB, sender link capped at {meta['rate_cap']:g} Mbit/s")
    ax2.set_ylabel("bytes on the sender's link / file size")
    ax2.set_title("traffic out of the model server")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace) -> int:
    say = stamp_printer()
    topo = parse(args.topology)
    ns = [int(x) for x in args.receivers.split(",")]
    losses = [float(x) for x in args.loss.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    bad = set(methods) - set(METHODS)
    if bad:
        raise SystemExit(f"error: unknown method(s) {', '.join(sorted(bad))}; use {', '.join(METHODS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base_dir = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    work = Path(tempfile.mkdtemp(prefix="modelcast-bench-", dir=base_dir))
    meta = {"size_mb": args.size_mb, "rate_cap": args.rate_cap, "topology": topo.name,
            "mtu": args.mtu, "runs": args.runs, "receivers": ns, "loss_pct": losses,
            "methods": methods, "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
            "kernel": platform.release()}
    say(f"benchmark: {meta}")
    results: list[dict[str, Any]] = []
    rate = args.rate_cap * 0.95  # agents pace just under the NIC cap
    with Fabric(topo, work, say=say, mtu=args.mtu) as fabric:
        sender = fabric.topology.hosts[0].name
        model = make_model(work / "model.bin", int(args.size_mb * 1024 * 1024))
        impair.cap_rate(fabric.live_lab(), sender, args.rate_cap)
        index = 0
        for loss in losses:
            for n in ns:
                rcv = receivers_for(fabric, sender, n)
                for h in rcv:
                    fabric.clear_loss(h)
                    if loss:
                        fabric.add_loss(h, "random", all_ip=True)
                for run_no in range(args.runs):
                    for method in methods:
                        index += 1
                        name = f"{method}-l{loss:g}-n{n}-r{run_no}"
                        if method == "tcp":
                            res = B.tcp_fanout(fabric.live_lab(), sender, rcv, model.path, work / name)
                        elif method == "uftp":
                            res = run_uftp(fabric, model, sender, rcv, rate, name, work, index)
                        else:
                            res = run_modelcast(fabric, model, sender, rcv, rate, name, work)
                        row = {"loss_pct": loss, "run": run_no, **res.as_dict()}
                        results.append(row)
                        say(f"{name}: {'ok' if res.ok else 'FAILED'} {res.seconds:.2f}s, "
                            f"link {res.sender_link_bytes / model.size:.3f} x file")
                for h in rcv:
                    fabric.clear_loss(h)
    rows = medians(results)
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": results, "medians": rows},
                                                 indent=1))
    md = markdown(rows, meta)
    (out / "results.md").write_text(md)
    plot(rows, out / "results.png", meta)
    print(md)
    say(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'results.png'}")
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0 if all(r["ok"] for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.distribution",
                                 description="TCP fan-out vs UFTP vs modelcast on the OVS lab")
    ap.add_argument("--topology", default="leaf-spine:2,4,3")
    ap.add_argument("--size-mb", type=float, default=128)
    ap.add_argument("--rate-cap", type=float, default=200, help="sender link cap, Mbit/s")
    ap.add_argument("--receivers", default="1,2,4,8")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--loss", default="0,1", help="percent random loss on receiver links")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--out", default="docs/bench")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny file, N=1,2, one run, no loss (what CI runs)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.size_mb, args.receivers, args.runs, args.loss = 4, "1,2", 1, "0"
    if os.geteuid() != 0:
        print("error: the benchmark builds an Open vSwitch lab: run it as root", file=sys.stderr)
        return 1
    try:
        return run(args)
    except (TopologyError, LabError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
