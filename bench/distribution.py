"""Side-by-side distribution benchmark on the Open vSwitch lab (root):

    python -m bench.distribution [--size-mb 32] [--rate-cap 100] [--receivers 1,2,4,8,16]
                               [--runs 3] [--loss 0,1] [--out docs/bench] [--smoke]
                               [--methods tcp,uftp,modelcast,bittorrent,chain]

One fabric (controller + leaf-spine lab, jumbo frames) serves every run. Every host's NIC
is capped with ``tc tbf`` at the same rate, so a receiver can upload no faster than the
model server; the same file goes to N receivers spread over the leaves other than the
sender's by

- **tcp**: N parallel TCP streams from the sender (what a model server does today);
- **uftp**: UFTP 4.10 on a controller-built tree, at the cap;
- **modelcast**: ``modelcast send``/``recv`` through the controller, at the cap;
- **bittorrent**: opentracker + aria2c, every receiver re-uploading (``bench.bittorrent``);
- **chain**: a pipelined TCP chain through the receivers in topology order (``bench.chain``).

Each run records the time until every receiver holds a verified copy (digest checked
here), bytes on the sender's link (its NIC counter), the bytes every fabric link carried
in each direction (OVS port counters, ``bench.traffic``), repair bytes and CPU seconds.
Loss is 1% random on every receiver link, for all methods alike. Every method writes its
copies into equally warm memory and the methods take turns at going first, run by run
(``bench.memory``). Writes
``results.json`` (all raw numbers), ``results.md`` (medians) and ``results.png`` to
``--out``.
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
from bench.memory import in_turn, steady_memory
from bench.bittorrent import bittorrent, missing_tools
from bench.chain import chain
from bench.machine import describe, machine
from bench.traffic import summarize
from lab import loss as impair
from lab.controller import stamp_printer
from lab.fabric import Fabric
from lab.models import make_model
from lab.sh import LabError
from lab.transfer import Transfer
from topologies.spec import TopologyError, parse

METHODS = ("tcp", "uftp", "modelcast", "bittorrent", "chain")
SMOKE_TOPOLOGY = "leaf-spine:2,3,2"
TOPOLOGY = "leaf-spine:2,5,4"  # 16 receivers on 4 leaves, the sender alone on the first


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


SENDER_KEYS = ("stream_s", "rate_decreases", "lowest_rate_mbit", "final_rate_mbit", "loss_verdicts", "repairs_parity",
               "repairs_unicast", "repairs_multicast", "repair_bytes_unicast", "repair_bytes_multicast", "nacks")


def run_modelcast(fabric: Fabric, model: Any, sender: str, rcv: list[str], rate: float,
                  name: str, work: Path) -> B.RunResult:
    lab = fabric.live_lab()
    before = B.tx_bytes(lab, sender)
    # A key file of our own: the agents MAC every datagram with it whether or not they
    # would accept running without one.
    with Transfer(fabric, model, sender, rcv, rate=rate, name=name, workdir=work / name,
                  shared_key=True, receiver_timeout=120, sender_timeout=120) as t:
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
                        "nacks": s.get("nacks"),
                        # the sender's congestion response: how often and how far it cut its
                        # rate, and how it read each loss report (a slow run's first question)
                        "sender": {k: s.get(k) for k in SENDER_KEYS},
                        # per receiver: its own time, NACKs sent and repairs received
                        "receivers": {r.host: [(r.summary or {}).get(k) for k in
                                               ("seconds", "nacks", "repairs_received", "cpu_s")]
                                      for r in report.receivers}})


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


FABRIC_KEYS = ("total", "sender_link", "host_down", "host_up", "core", "peak")


def medians(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (loss, method, N): medians over the verified runs; byte counts as
    multiples of the file size."""
    keys = sorted({(r["loss_pct"], r["method"], r["receivers"]) for r in results})
    rows = []
    for loss, method, n in keys:
        rs = [r for r in results if (r["loss_pct"], r["method"], r["receivers"]) == (loss, method, n)]
        ok = [r for r in rs if r["ok"]]
        size = rs[0]["file_bytes"]

        def med(vals: list[Any]) -> float | None:
            vals = [v for v in vals if v is not None]
            return statistics.median(vals) if vals else None

        row = {"loss_pct": loss, "method": method, "receivers": n, "runs": len(rs),
               "ok_runs": len(ok), "seconds": med([r["seconds"] for r in ok]),
               "wall_s": med([r["detail"].get("wall_s", r["seconds"]) for r in ok]),
               "link_ratio": (med([r["sender_link_bytes"] for r in ok]) or 0) / size,
               "repair_bytes": med([r["repair_bytes"] for r in ok]),
               "cpu_sender_s": med([r["cpu_sender_s"] for r in ok]),
               "cpu_receivers_s": med([r["cpu_receivers_s"] for r in ok])}
        for k in FABRIC_KEYS:
            v = med([r["fabric"][k] for r in ok if "fabric" in r])
            row[f"fabric_{k}"] = None if v is None else v / size
        rows.append(row)
    return rows


def _fmt(v: float | None, f: str = ".2f") -> str:
    return "-" if v is None else format(v, f)


def _row(rows: list[dict[str, Any]], loss: float, method: str, n: int) -> dict[str, Any] | None:
    return next((r for r in rows if (r["loss_pct"], r["method"], r["receivers"]) == (loss, method, n)
                 and r["seconds"]), None)


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, each with its measured value: modelcast's time against the
    better of BitTorrent and the chain (N >= 4), its fabric bytes against theirs at the
    largest N, and its sender link."""
    out = []
    ns = sorted({r["receivers"] for r in rows})
    for loss in sorted({r["loss_pct"] for r in rows}):
        for n in (n for n in ns if n >= 4):
            mc = _row(rows, loss, "modelcast", n)
            peers = [r for r in (_row(rows, loss, m, n) for m in ("bittorrent", "chain")) if r]
            if not mc or not peers:
                continue
            best = min(peers, key=lambda r: r["seconds"])
            ratio = mc["seconds"] / best["seconds"]
            out.append(f"- time, loss {loss:g}%, N={n}: modelcast {mc['seconds']:.2f} s, best peer "
                       f"{best['method']} {best['seconds']:.2f} s: {ratio:.2f} x (target <= 1: "
                       f"{'met' if ratio <= 1 else 'not met'})")
        mc = _row(rows, loss, "modelcast", ns[-1])
        for m in ("bittorrent", "chain"):
            other = _row(rows, loss, m, ns[-1])
            if mc and other and mc["fabric_total"] and other["fabric_total"]:
                ratio = mc["fabric_total"] / other["fabric_total"]
                out.append(f"- fabric bytes, loss {loss:g}%, N={ns[-1]}: modelcast "
                           f"{mc['fabric_total']:.1f} x file, {m} {other['fabric_total']:.1f} x: "
                           f"{ratio:.2f} (target <= 0.33: {'met' if ratio <= 1 / 3 else 'not met'}); "
                           f"without the N host downlinks every method needs: "
                           f"{mc['fabric_total'] - mc['fabric_host_down']:.1f} x vs "
                           f"{other['fabric_total'] - other['fabric_host_down']:.1f} x")
        links = [r["link_ratio"] for r in rows if r["method"] == "modelcast" and r["loss_pct"] == loss]
        if links:
            out.append(f"- sender link, loss {loss:g}%: modelcast at most {max(links):.3f} x the "
                       f"file (target <= 1.05: {'met' if max(links) <= 1.05 else 'not met'})")
    return out


def pivot(rows: list[dict[str, Any]], key: str, fmt: str) -> list[str]:
    """``key`` per (loss, method) across N: the compact tables the README shows."""
    ns = sorted({r["receivers"] for r in rows})
    out = ["| loss | method | " + " | ".join(f"N={n}" for n in ns) + " |",
           "|---|---|" + "---|" * len(ns)]
    for loss in sorted({r["loss_pct"] for r in rows}):
        for method in METHODS:
            cells = [_row(rows, loss, method, n) for n in ns]
            if any(cells):
                out.append(f"| {loss:g}% | {method} | " + " | ".join(
                    _fmt(c[key] if c else None, fmt) + ("" if not c or c["ok_runs"] == c["runs"]
                                                        else f" ({c['ok_runs']}/{c['runs']} ok)")
                    for c in cells) + " |")
    return out


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [f"Distribution of a {meta['size_mb']:g} MB file from one sender to N receivers on "
           f"{meta['topology']} (Open vSwitch userspace datapath, MTU {meta['mtu']}); every "
           f"host's NIC capped at {meta['rate_cap']:g} Mbit/s (`tc tbf`, so receivers upload "
           f"no faster than the sender), "
           + (f"modelcast paced at {meta['modelcast_rate_share']:g} x that (its `--rate` counts the link's bytes), "
              f"UFTP at {meta.get('rate_share', 0.95):g} x" if "modelcast_rate_share" in meta else
              f"modelcast and UFTP paced at {meta.get('rate_share', 0.95):g} x that")
           + f"; median of {meta['runs']} runs, {meta['date']}, "
           f"{describe(meta['machine'])} at the start; 1-minute load during the runs "
           f"{meta.get('load_runs', '-')} (min/median/max, the benchmark's own processes "
           f"included).", "",
           "`time` runs from the first data packet (modelcast), the process start (UFTP, TCP, "
           "chain: their handshakes take milliseconds) or the receivers' start with the seeder "
           "already seeding (BitTorrent) to the last verified copy; `wall` adds, for "
           "modelcast, Python start-up, the REST calls and waiting for the tree. Byte columns "
           "are multiples of the file size: `sender link` is the sender NIC's counter; "
           "`fabric` sums the OVS port counters over every link and direction; `core` is the "
           "inter-switch links' part of it, `rx uplinks` the receivers' own uplinks "
           "(forwarding, ACKs, NACKs); `peak` is the busiest single link direction. Every "
           "method also puts N copies on the receivers' downlinks.", "",
           "| loss | method | N | time s | wall s | T(N)/T(1) | sender link | fabric | core | rx uplinks | peak link | repair MB | CPU sender s | CPU receivers s | ok |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    n1 = min(x["receivers"] for x in rows)
    base = {(r["loss_pct"], r["method"]): r["seconds"] for r in rows if r["receivers"] == n1}
    for r in rows:
        t1 = base.get((r["loss_pct"], r["method"]))
        ratio = f"{r['seconds'] / t1:.2f}" if r["seconds"] and t1 else "-"
        repair = None if r["repair_bytes"] is None else r["repair_bytes"] / 1e6
        out.append(f"| {r['loss_pct']:g}% | {r['method']} | {r['receivers']} | {_fmt(r['seconds'])} | "
                   f"{_fmt(r['wall_s'])} | {ratio} | {r['link_ratio']:.3f} | "
                   f"{_fmt(r['fabric_total'], '.1f')} | {_fmt(r['fabric_core'], '.1f')} | "
                   f"{_fmt(r['fabric_host_up'], '.2f')} | {_fmt(r['fabric_peak'], '.2f')} | "
                   f"{_fmt(repair)} | {_fmt(r['cpu_sender_s'])} | {_fmt(r['cpu_receivers_s'])} | "
                   f"{r['ok_runs']}/{r['runs']} |")
    out += ["", "Targets (issue 14):", "", *targets(rows)]
    out += ["", "Time until every receiver verified, s:", "", *pivot(rows, "seconds", ".2f"),
            "", "Bytes on all fabric links / file:", "", *pivot(rows, "fabric_total", ".1f"),
            "", "Bytes on the sender's link / file:", "", *pivot(rows, "link_ratio", ".3f"),
            "", "The receivers' own uplinks / file:", "", *pivot(rows, "fabric_host_up", ".2f"),
            "", "Busiest single link direction / file:", "", *pivot(rows, "fabric_peak", ".2f")]
    return "\n".join(out) + "\n"


COLORS = {"tcp": "tab:red", "uftp": "tab:blue", "modelcast": "tab:green",
          "bittorrent": "tab:purple", "chain": "tab:orange"}


def plot(rows: list[dict[str, Any]], path: Path, meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    panels = [("seconds", "seconds until every receiver verified",
               f"{meta['size_mb']:g} MB, every NIC capped at {meta['rate_cap']:g} Mbit/s"),
              ("link_ratio", "bytes on the sender's link / file size", "traffic out of the model server"),
              ("fabric_total", "bytes on all fabric links / file size",
               "total fabric traffic (every link, each direction)")]
    for method in METHODS:
        for loss in sorted({r["loss_pct"] for r in rows}):
            pts = [r for r in rows if r["method"] == method and r["loss_pct"] == loss and r["seconds"]]
            if not pts:
                continue
            style = "-" if loss == 0 else "--"
            for ax, (key, _, _) in zip(axes, panels):
                ax.plot([r["receivers"] for r in pts], [r[key] for r in pts], style, marker="o",
                        color=COLORS[method], label=f"{method}, {loss:g}% loss")
    for ax, (_, ylabel, title) in zip(axes, panels):
        ax.set_xlabel("receivers N")
        ax.set_xscale("log", base=2)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_one(fabric: Fabric, method: str, model: Any, sender: str, rcv: list[str], rate: float,
            name: str, work: Path, index: int) -> B.RunResult:
    """One distribution by ``method`` (one of METHODS)."""
    lab = fabric.live_lab()
    if method == "tcp":
        return B.tcp_fanout(lab, sender, rcv, model.path, work / name)
    if method == "uftp":
        return run_uftp(fabric, model, sender, rcv, rate, name, work, index)
    if method == "modelcast":
        return run_modelcast(fabric, model, sender, rcv, rate, name, work)
    if method == "bittorrent":
        return bittorrent(lab, sender, rcv, model.path, work / name)
    return chain(lab, fabric.topology, sender, rcv, model.path, work / name)


def run(args: argparse.Namespace) -> int:
    say = stamp_printer()
    topo = parse(args.topology)
    ns = [int(x) for x in args.receivers.split(",")]
    losses = [float(x) for x in args.loss.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    bad = set(methods) - set(METHODS)
    if bad:
        raise SystemExit(f"error: unknown method(s) {', '.join(sorted(bad))}; use {', '.join(METHODS)}")
    if "bittorrent" in methods and missing_tools():
        raise SystemExit(f"error: BitTorrent needs {', '.join(missing_tools())} "
                         "(bash scripts/lab-deps.sh installs them)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base_dir = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    work = Path(tempfile.mkdtemp(prefix="modelcast-bench-", dir=base_dir))
    meta = {"size_mb": args.size_mb, "rate_cap": args.rate_cap, "rate_share": args.rate_share,
            "modelcast_rate_share": args.modelcast_rate_share, "topology": topo.name,
            "mtu": args.mtu, "runs": args.runs, "receivers": ns, "loss_pct": losses,
            "methods": methods, "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
            "machine": machine(), "kernel": platform.release(), "caps": "every host"}
    say(f"benchmark: {meta}")
    results: list[dict[str, Any]] = []
    rates = {"modelcast": args.rate_cap * args.modelcast_rate_share,  # the rate-paced agents at the NIC cap
             "uftp": args.rate_cap * args.rate_share}
    # every method's copies into equally warm memory, the methods taking turns at going
    # first (bench.memory: on this VM a first write costs several times a rewrite)
    footprint = 2 * int(args.size_mb * (1 << 20)) * (1 + max(ns))
    with steady_memory(work, footprint) as steady, Fabric(topo, work, say=say, mtu=args.mtu) as fabric:
        meta["memory"] = steady
        sender = fabric.topology.hosts[0].name
        model = make_model(work / "model.bin", int(args.size_mb * 1024 * 1024))
        for h in fabric.topology.hosts:  # uploads as limited as the sender's, for everyone
            impair.cap_rate(fabric.live_lab(), h.name, args.rate_cap)
        index = 0
        for loss in losses:
            for n in ns:
                rcv = receivers_for(fabric, sender, n)
                for h in rcv:
                    fabric.clear_loss(h)
                    if loss:
                        fabric.add_loss(h, "random", all_ip=True)
                for run_no in range(args.runs):
                    for method in in_turn(methods, run_no):
                        index += 1
                        name = f"{method}-l{loss:g}-n{n}-r{run_no}"
                        links0 = fabric.link_bytes()
                        res = run_one(fabric, method, model, sender, rcv, rates.get(method, args.rate_cap),
                                      name, work, index)
                        traffic = summarize(fabric.topology, links0, fabric.link_bytes(), sender)
                        results.append({"loss_pct": loss, "run": run_no, **res.as_dict(),
                                        "fabric": traffic, "load_1m": os.getloadavg()[0]})
                        save_raw(out, meta, results)  # a run cut short keeps what it measured
                        say(f"{name}: {'ok' if res.ok else 'FAILED'} {res.seconds:.2f}s, "
                            f"sender link {res.sender_link_bytes / model.size:.3f} x file, "
                            f"fabric {traffic['total'] / model.size:.1f} x "
                            f"(peak {traffic['peak'] / model.size:.2f} x on {traffic['peak_link']})")
                for h in rcv:
                    fabric.clear_loss(h)
    meta["load_end"] = round(os.getloadavg()[0], 2)
    report(out, meta, results)
    say(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'results.png'}")
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0 if all(r["ok"] for r in results) else 1


def save_raw(out: Path, meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))


def report(out: Path, meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """results.json (raw runs and medians), results.md and results.png in ``out``."""
    loads = sorted(r["load_1m"] for r in results if r.get("load_1m") is not None)
    if loads:
        meta["load_runs"] = f"{loads[0]:.1f}/{statistics.median(loads):.1f}/{loads[-1]:.1f}"
    rows = medians(results)
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": results, "medians": rows},
                                                 indent=1))
    md = markdown(rows, meta)
    (out / "results.md").write_text(md)
    plot(rows, out / "results.png", meta)
    print(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.distribution",
                                 description="TCP fan-out, UFTP, modelcast, BitTorrent and a "
                                             "pipelined chain on the OVS lab")
    ap.add_argument("--topology", default=None,
                    help=f"default {TOPOLOGY} ({SMOKE_TOPOLOGY} with --smoke)")
    ap.add_argument("--size-mb", type=float, default=32)
    ap.add_argument("--rate-cap", type=float, default=100, help="every host's NIC cap, Mbit/s")
    ap.add_argument("--rate-share", type=float, default=0.99,
                    help="UFTP's --rate as a share of the cap (TCP takes what it gets)")
    ap.add_argument("--modelcast-rate-share", type=float, default=1.0,
                    help="modelcast's --rate as a share of the cap: it counts the link's bytes "
                         "(headers and framing), so the cap itself fills the link without overrunning it")
    ap.add_argument("--receivers", default="1,2,4,8,16")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--loss", default="0,1", help="percent random loss on receiver links")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--out", default="docs/bench")
    ap.add_argument("--render", metavar="RESULTS_JSON",
                    help="only rebuild results.md/.png in --out from a results.json (e.g. of a "
                         "run cut short); no lab")
    ap.add_argument("--smoke", action="store_true",
                    help="4 MB, N=2, one run of each method, no loss, a small lab (what CI runs)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.size_mb, args.receivers, args.runs, args.loss = 4, "2", 1, "0"
    args.topology = args.topology or (SMOKE_TOPOLOGY if args.smoke else TOPOLOGY)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        Path(args.out).mkdir(parents=True, exist_ok=True)
        report(Path(args.out), data["meta"], data["runs"])
        return 0
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
