"""The controller benchmark beyond fat-tree:16 (not a test): every topology family at a
few sizes and receiver counts, each run in a fresh process as ``bench.controller`` is.

    python -m bench.controller_sweep [--runs 3] [--failures 20] [--json] [--plot PNG]

One row per case: the build and the reroutes as ratios to the reference timed in the
same run (``bench.controller``'s), next to what explains them: the reference's time per
tree (a BFS over the whole graph: tiny on a small one) and the messages per group and per
failed group (what the controller must build whatever the graph). The ratio targets of
issue 12 were set on fat-tree:16 x64; a tree that reaches most of a small graph, or a
failure that turns half of each tree around (a ring), costs more messages than the
reference's whole search, and the table shows where that is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.machine import describe, machine

# (topology, receivers per group, groups or None for --groups): fat-tree:16 x64 first,
# then other families and sizes, then fat-tree up to 9,826 hosts (k = 34) at 256
# receivers and 100 to 4,000 groups, whose time and memory per group should stay flat
CASES: tuple[tuple[str, int, int | None], ...] = (
    ("fat-tree:16", 64, None), ("fat-tree:16", 8, None), ("fat-tree:16", 256, None),
    ("fat-tree:12", 32, None), ("fat-tree:8", 16, None), ("fat-tree:8", 64, None),
    ("leaf-spine:8,32,16", 32, None), ("leaf-spine:4,16,8", 16, None),
    ("ring:24", 8, None), ("linear:16", 8, None),
    ("fat-tree:16", 256, 4000), ("fat-tree:24", 256, None),
    ("fat-tree:34", 256, 100), ("fat-tree:34", 256, None),
)


def one(topology: str, receivers: int, failures: int, groups: int) -> dict[str, Any]:
    """One ``bench.controller`` run in a process of its own (a fresh heap, as measured)."""
    cmd = [sys.executable, "-m", "bench.controller", "--topology", topology, "--groups", str(groups),
           "--receivers", str(receivers), "--failures", str(failures), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench.controller {topology} x{receivers} failed (exit {done.returncode}): "
                         f"{done.stderr.strip()[-400:]}")
    return json.loads(done.stdout)


def row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs of one case: medians with their range, and the per-group figures."""
    first = runs[0]

    def span(key: str) -> list[float] | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return [min(values), statistics.median(values), max(values)] if values else None

    groups = first["groups"]
    ref_us = statistics.median(r["reference_trees_s"] for r in runs) / groups * 1e6
    failed = first["affected_groups"]
    return {
        "topology": first["topology"], "switches": first["switches"], "hosts": first["hosts"],
        "receivers": first["receivers"], "runs": len(runs),
        "trees_vs_reference": span("trees_vs_reference"),
        "trees_vs_reference_cpu": span("trees_vs_reference_cpu"),
        "reroute_vs_reference_cpu_p99": span("reroute_vs_reference_cpu_p99"),
        "reference_us_per_tree": round(ref_us, 1),
        "groups": groups,
        "build_us_per_group": round(statistics.median(r["trees_total_s"] for r in runs) / groups * 1e6, 1),
        # the same per message: a group's work is its messages (a tree of 256 receivers
        # spans ~2.6 x the switches on fat-tree:34 that it does on fat-tree:16)
        "build_us_per_message": round(statistics.median(r["trees_total_s"] for r in runs)
                                      / first["messages_total"] * 1e6, 2),
        "rss_mb": statistics.median(r["rss_mb"] for r in runs),
        "rss_per_group_kb": statistics.median(r["rss_per_group_kb"] for r in runs),
        "messages_per_group": round(first["messages_total"] / groups, 1),
        "messages_per_failed_group": round(first["messages_per_failure"] / failed, 1) if failed else None,
        "failures": first["link_failures"], "bridges_not_failed": first["bridges_not_failed"],
        "max_link_load_ratio": first["max_link_load_ratio"],
        "max_link_load_ratio_even_split": first["max_link_load_ratio_even_split"],
        "max_link_load_over_even_split": first["max_link_load_over_even_split"],
        "machine": first["machine"],
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Time and memory per group against the number of groups, one line per fabric, for
    the cases of 256 receivers (fat-tree:16 to fat-tree:34): flat lines are what scales."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("build_us_per_group", "build per group (µs)"), ("build_us_per_message", "build per message (µs)"),
              ("rss_per_group_kb", "memory per group (KB of RSS)")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    fabrics = sorted({(r["hosts"], r["topology"]) for r in rows if r["receivers"] == 256})
    for hosts, topology in fabrics:
        pts = sorted((r for r in rows if r["topology"] == topology and r["receivers"] == 256),
                     key=lambda r: r["groups"])
        for ax, (key, _) in zip(axes, panels):
            ax.plot([r["groups"] for r in pts], [r[key] for r in pts], marker="o",
                    label=f"{topology.split(',')[0]} ({hosts} hosts)")
    for ax, (_, label) in zip(axes, panels):
        ax.set_xscale("log")
        ax.set_xlabel("groups of 256 receivers")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"controller build, protection on ({describe(rows[0]['machine'])})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _fmt(span: list[float] | None) -> str:
    return "-" if span is None else f"{span[1]:.2f} ({span[0]:.2f}-{span[2]:.2f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.controller_sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="fresh-process runs per case")
    ap.add_argument("--failures", type=int, default=20, help="link failures per run")
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--case", action="append", metavar="TOPOLOGY@RECEIVERS[xGROUPS]",
                    help="a case instead of the default list, e.g. fat-tree:8@64 or "
                         "fat-tree:34@256x4000 (repeatable)")
    ap.add_argument("--json", action="store_true", help="one JSON object per case")
    ap.add_argument("--plot", type=Path, metavar="PNG",
                    help="also plot time and memory per group of the 256-receiver cases")
    ap.add_argument("--rows", type=Path, metavar="JSONL",
                    help="plot the rows of an earlier --json run instead of running (with --plot)")
    args = ap.parse_args(argv)
    if args.rows:
        if not args.plot:
            ap.error("--rows is read only to --plot")
        plot([json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()], args.plot)
        return 0
    if args.runs < 1 or args.groups < 1 or args.failures < 0:
        ap.error("--runs and --groups must be at least 1, --failures at least 0")
    cases = list(CASES)
    if args.case:
        cases = []
        for case in args.case:
            topology, _, size = case.rpartition("@")
            receivers, _, groups = size.partition("x")
            if not topology or not receivers.isdigit() or int(receivers) < 1 or (
                    groups and (not groups.isdigit() or int(groups) < 1)):
                ap.error(f"--case {case!r}: expected TOPOLOGY@RECEIVERS[xGROUPS], e.g. fat-tree:8@64")
            cases.append((topology, int(receivers), int(groups) if groups else None))
    print(f"# {machine()}", file=sys.stderr)
    if not args.json:
        print(f"{'topology':22} {'rcv':>4} {'groups':>6} {'build/ref (median, range)':>27} {'CPU':>6} "
              f"{'reroute CPU p99/ref':>22} {'ref us/tree':>11} {'us/group':>8} {'us/msg':>6} "
              f"{'msgs/group':>10} {'msgs/failed':>11} {'RSS MB':>7} {'KB/group':>8} {'load':>6} "
              f"{'floor':>6} {'/even':>6}")
    rows = []
    for topology, receivers, groups in cases:
        n = groups or args.groups
        r = row([one(topology, receivers, args.failures, n) for _ in range(args.runs)])
        rows.append(r)
        if args.json:
            print(json.dumps(r), flush=True)
            continue
        cpu = r["trees_vs_reference_cpu"]
        print(f"{r['topology']:22} {receivers:4} {n:6} {_fmt(r['trees_vs_reference']):>27} {cpu[1]:6.2f} "
              f"{_fmt(r['reroute_vs_reference_cpu_p99']):>22} {r['reference_us_per_tree']:11.1f} "
              f"{r['build_us_per_group']:8.1f} {r['build_us_per_message']:6.2f} {r['messages_per_group']:10.1f} "
              f"{r['messages_per_failed_group'] or '-':>11} {r['rss_mb']:7.0f} {r['rss_per_group_kb']:8.1f} "
              f"{r['max_link_load_ratio']:6.3f} {r['max_link_load_ratio_even_split']:6.3f} "
              f"{r['max_link_load_over_even_split']:6.3f}", flush=True)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
