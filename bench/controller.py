"""Controller benchmark (not a test): tree computation and failure handling at scale.

    python -m bench.controller --topology fat-tree:16 --groups 1000 --receivers 64 --json

Prints one JSON object. Absolute times do not carry between machines (single-thread
Python speed differs 3-5x between machines of the same kind), so every time is also given
as a ratio to a reference timed in the same run on the same graph: plain
``networkx.single_source_shortest_path`` trees from the same sources over the topology's
graph (switches and hosts), timed in slices between the groups being built (``build``).
``trees_vs_reference`` = ``trees_total_s`` / 1000 such trees
(``trees_vs_reference_cpu``, ``reroute_vs_reference_cpu_*``: the same in this process's
CPU time, which other work on a shared machine disturbs far less than wall-clock time);
``reroute_vs_reference_p99`` = p99 (nearest rank: of 100 failures the 99th) over failures
of (reroute time / the reference trees of that failure's affected groups, on the graph
without the failed link), ``*_max`` the worst;
``send_serialise_*``: what the Ryu shell then spends serialising every message of the
build as ``Datapath.send_msg`` does (timed apart, not in ``trees_*``). The machine (CPU
model, cores, load average at the start) is named in the output. ``max_link_load_ratio`` compares links that are alternatives to
each other (same tier pair and direction, e.g. every aggregation->edge link): multicast
trees fan out downwards, so comparing an edge uplink with an aggregation downlink says
nothing about balance; idle links count, so piling onto one of several parallel links
shows. The issue's literal ratio (max over mean of *used* links, across tiers) and a
load-blind baseline, measured in the same run, are printed beside it, and what balancing
alone could reach (``even_split``): where a few groups leave each switch (fat-tree:34's
edge uplinks carry 1.6 groups each on average with 1000 groups, and an edge switch with
three of the sources must put three on one uplink) the class ratio measures where the
sources are, not the search. ``rss_mb`` is the process's peak once the groups are built
(before the load-blind build), ``rss_per_group_kb`` what the build added per group.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import re
import resource
import statistics
import sys
import time
from collections import defaultdict
from typing import Any, Callable

import networkx as nx

from bench.machine import machine
from controller.core import MulticastCore, tune_gc
from controller.topoview import TopologyView
from topologies import Topology, TopologyError, parse


def _tier(name: str) -> str:
    return re.sub(r"[\d_]+", "", name) or "s"


def load_ratios(core: MulticastCore, topo: Topology) -> tuple[float, float]:
    """(max over tier classes of max/mean, global max/mean over used links).

    A class is every directed link between the same two tiers (e.g. all aggregation->edge
    links): links that are alternatives to each other. Its mean counts idle links too, so
    piling groups onto the first of several parallel links shows up as imbalance."""
    classes: dict[tuple[str, str], list[int]] = defaultdict(list)
    for link in topo.links:
        for u, v in ((link.a, link.b), (link.b, link.a)):
            classes[(_tier(topo.switches[u]), _tier(topo.switches[v]))].append(core.load[(u, v)])
    used = [n for n in core.load.values() if n > 0]
    if not used:
        return 0.0, 0.0
    per_class = max(max(v) / statistics.mean(v) for v in classes.values() if any(v))
    return per_class, max(used) / statistics.mean(used)


def even_split(core: MulticastCore, topo: Topology) -> tuple[float, float]:
    """(max over tier classes of the even split's max over the class mean, max over links
    of load / its even split). A link's even split is the least load its busiest parallel
    link must carry given how many groups this run's trees send out of its upper end
    towards the lower end's tier (and into its lower end from the upper end's tier):
    ceil(those loads' sum / the parallel links) at either end, the larger. The first says
    how far the class ratio (``load_ratios``) could fall by balancing alone (where a
    handful of groups leave each switch, as on fat-tree:34's edge uplinks with 1000
    groups, it cannot reach 1); the second how far the search is from balancing each
    switch's groups over its links (1.0: no link above an even split)."""
    ends: dict[tuple[int, str, str], list[int]] = defaultdict(list)  # (switch, side, tier) -> loads
    links = []
    for link in topo.links:
        for u, v in ((link.a, link.b), (link.b, link.a)):
            tu, tv, n = _tier(topo.switches[u]), _tier(topo.switches[v]), core.load[(u, v)]
            ends[(u, "out", tv)].append(n)
            ends[(v, "in", tu)].append(n)
            links.append(((tu, tv), n, (u, "out", tv), (v, "in", tu)))
    split = {key: math.ceil(sum(loads) / len(loads)) for key, loads in ends.items()}
    floor: dict[tuple[str, str], int] = defaultdict(int)
    total: dict[tuple[str, str], list[int]] = defaultdict(list)
    excess = 0.0
    for cls, n, out, into in links:
        even = max(split[out], split[into])
        floor[cls] = max(floor[cls], even)
        total[cls].append(n)
        if even:
            excess = max(excess, n / even)
    per_class = [floor[c] / statistics.mean(v) for c, v in total.items() if any(v)]
    return max(per_class, default=0.0), excess


def rss_mb() -> tuple[float, float]:
    """(this process's resident memory now, its peak so far), in MB."""
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return now / 2**20, peak / 2**20


def workload(topo: Topology, groups: int, receivers: int, seed: int) -> list[tuple[str, str, list[str]]]:
    """(model, source, receivers) per group: sources spread over the hosts, receivers random."""
    rng = random.Random(seed)
    ips = [h.ip for h in topo.hosts]
    if receivers >= len(ips):
        raise SystemExit(f"error: --receivers {receivers} needs more than {len(ips)} hosts")
    work = []
    for i in range(groups):
        src = ips[(i * 37) % len(ips)]
        work.append((f"model-{i}", src, rng.sample([x for x in ips if x != src], receivers)))
    return work


def reference_s(graph: nx.Graph, sources: list[str], clock=time.perf_counter) -> float:
    """The yardstick: one plain networkx shortest-path tree per source."""
    start = clock()
    for src in sources:
        nx.single_source_shortest_path(graph, src)
    return clock() - start


REFERENCE_EVERY = 25  # groups built between two slices of the reference (``build``)


def build(topo: Topology, groups: int, receivers: int, seed: int, algorithm: str,
          balance: bool, protection: bool = True, serialise: bool = False,
          graph: nx.Graph | None = None) -> tuple[MulticastCore, float, float, int, float, float, float]:
    """Create every group: (core, wall-clock s, CPU s, messages, CPU s the shell then
    spends serialising them as Ryu's ``Datapath.send_msg`` does, not in the other times;
    the reference's wall-clock and CPU s). With ``graph`` the reference runs in slices
    between the groups (the trees of the next ``REFERENCE_EVERY`` groups' sources), so
    both meet the same machine: this VM's CPU speed drifts by a third within seconds, and
    a reference timed before and after the build still gave ratios 2.97-5.10 x for the
    same code in one session."""
    core = MulticastCore(TopologyView.from_topology(topo), algorithm=algorithm, balance=balance,
                         protection=protection)
    for dpid in topo.switches:
        core.installed[dpid] = {}
    work = workload(topo, groups, receivers, seed)
    messages, send_cpu, xid = 0, 0.0, 0
    wall = cpu_s = ref_wall = ref_cpu = 0.0
    wall_clock, cpu_clock = time.perf_counter, time.process_time
    for i, (model, src, rcv) in enumerate(work):
        if graph is not None and i % REFERENCE_EVERY == 0:
            sources = [s for _, s, _ in work[i:i + REFERENCE_EVERY]]
            ref_wall += reference_s(graph, sources)
            ref_cpu += reference_s(graph, sources, cpu_clock)
        t0, c0 = wall_clock(), cpu_clock()
        _, plan = core.create_group(model, src, rcv)
        wall += wall_clock() - t0
        cpu_s += cpu_clock() - c0
        messages += len(plan)
        if serialise:
            c0 = cpu_clock()
            for _, msg in plan:
                xid += 1
                msg.set_xid(xid)
                msg.serialize()
            send_cpu += cpu_clock() - c0
    return core, wall, cpu_s, messages, send_cpu, ref_wall, ref_cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    tune_gc()  # as the controller does
    topo = parse(args.topology)
    graph = topo.graph()
    # the reference in slices between the groups (``build``): on a shared machine the CPU
    # available changes from second to second, and the ratio must not
    rss_before, _ = rss_mb()  # (no collection first: it would change the build's timing)
    core, total_s, cpu_s, messages, send_cpu_s, ref_s, ref_cpu_s = build(
        topo, args.groups, args.receivers, args.seed, args.algorithm, True, not args.no_protection, True, graph)
    gc.collect()
    rss_after, rss_peak = rss_mb()  # (before the load-blind build below adds its own)
    ratio, ratio_global = load_ratios(core, topo)
    floor_ratio, over_even = even_split(core, topo)
    per_switch = [len(entries) for entries in core.installed.values()]
    kinds: dict[str, list[int]] = defaultdict(list)
    for dpid in core.installed:
        for kind, n in core.entries_at(dpid).items():
            kinds[kind].append(n)
        kinds["all"].append(sum(core.entries_at(dpid).values()))
    blind = build(topo, args.groups, args.receivers, args.seed, args.algorithm, False, False)[0]
    blind_ratio, _ = load_ratios(blind, topo)

    # Fail links that carry trees, one at a time: core/aggregation links first. A bridge
    # (linear:N has only those) cuts receivers off whatever the controller does: it is
    # not failed, and counted, so a reroute that loses receivers stays an error.
    rng = random.Random(args.seed + 1)
    names = topo.switches
    bridges = {frozenset(e) for e in nx.bridges(nx.Graph([(k.a, k.b) for k in core.view.links]))}
    survivable = sorted(k for k in core.view.links if frozenset((k.a, k.b)) not in bridges)
    upper = [k for k in survivable if {_tier(names[k.a]), _tier(names[k.b])} == {"c", "a"}] or survivable
    if args.failures and not upper:
        print(f"bench: every link of {topo.name} is a bridge (its failure cuts receivers off): "
              "no failure is timed", file=sys.stderr)
    rng.shuffle(upper)
    times, affected, msgs, ratios, cpu_ratios, with_gc = [], [], [], [], [], 0
    for k in upper[: args.failures]:
        before = {g.gid: g.tree for g in core.groups.values()}
        collections = _gc_collections()
        t0, c0 = time.perf_counter(), time.process_time()
        plan = core.link_remove(k.a, k.a_port, k.b, k.b_port)
        times.append((time.perf_counter() - t0) * 1000)
        cpu_ms = (time.process_time() - c0) * 1000
        with_gc += _gc_collections() != collections
        moved = [g.source for g in core.groups.values() if g.tree is not before[g.gid]]
        affected.append(len(moved))
        msgs.append(len(plan))
        if moved:
            graph.remove_edge(k.a, k.b)
            ratios.append(times[-1] / (reference_s(graph, moved) * 1000))
            cpu_ratios.append(cpu_ms / (reference_s(graph, moved, time.process_time) * 1000))
            graph.add_edge(k.a, k.b, ports={k.a: k.a_port, k.b: k.b_port})
        unreach = sum(len(g.tree.unreachable) for g in core.groups.values() if g.tree)
        if unreach:
            raise SystemExit(f"error: {unreach} receivers unreachable after one link failure")
        core.link_add(k.a, k.a_port, k.b, k.b_port)
    return {
        "topology": topo.name, "switches": len(topo.switches), "hosts": len(topo.hosts),
        "groups": args.groups, "receivers": args.receivers, "algorithm": args.algorithm,
        "machine": machine(),
        "trees_total_s": round(total_s, 3), "messages_total": messages,
        "reference_trees_s": round(ref_s, 4),
        "trees_vs_reference": round(total_s / ref_s, 2),
        # the same in CPU time of this process: steadier when other work shares the cores
        "trees_vs_reference_cpu": round(cpu_s / ref_cpu_s, 2),
        # what the Ryu shell then spends turning those messages into bytes to send
        "send_serialise_cpu_s": round(send_cpu_s, 6),  # (a small run sends in well under 1 ms)
        "send_serialise_vs_reference_cpu": round(send_cpu_s / ref_cpu_s, 2),
        "link_failures": len(times),
        "bridges_not_failed": len(bridges),
        "link_failure_ms_p50": _pct(times, 0.5, 2),
        "link_failure_ms_p99": _pct(times, 0.99, 2),
        "reroute_vs_reference_p50": _pct(ratios, 0.5, 2),
        "reroute_vs_reference_p99": _pct(ratios, 0.99, 2),
        "reroute_vs_reference_max": round(max(ratios), 2) if ratios else None,
        "reroute_vs_reference_cpu_p50": _pct(cpu_ratios, 0.5, 2),
        "reroute_vs_reference_cpu_p99": _pct(cpu_ratios, 0.99, 2),
        "reroute_vs_reference_cpu_max": round(max(cpu_ratios), 2) if cpu_ratios else None,
        "reroutes_with_gc_pause": with_gc,
        # table use: each entry is one OFPGT_ALL group plus one (S,G) flow on that switch
        "switch_entries_max": max(per_switch), "switch_entries_mean": round(statistics.mean(per_switch), 1),
        "protection": not args.no_protection,
        # every kind of entry of ours per switch (modelcast_switch_entries' kinds; "all": their sum)
        "entries_per_switch": {k: {"max": max(v), "mean": round(statistics.mean(v), 1)}
                               for k, v in sorted(kinds.items())},
        "affected_groups": round(statistics.mean(affected), 1) if affected else 0,
        "messages_per_failure": round(statistics.mean(msgs), 1) if msgs else 0,
        "max_link_load_ratio": round(ratio, 3),
        "max_link_load_ratio_global": round(ratio_global, 3),
        "max_link_load_ratio_load_blind": round(blind_ratio, 3),
        "max_link_load_ratio_even_split": round(floor_ratio, 3),
        "max_link_load_over_even_split": round(over_even, 3),
        # the controller's memory: the process's peak once every group is built, and what
        # the build added (trees, entries, protection, the per-source caches) per group
        "rss_mb": round(rss_peak, 1),
        "rss_per_group_kb": round((rss_after - rss_before) * 1024 / args.groups, 1),
    }


def _gc_collections() -> int:
    """Garbage collections so far: a young-generation pass inside a reroute costs more
    than the reroute, so the output says how many reroutes had one."""
    return sum(s["collections"] for s in gc.get_stats())


def _pct(values: list[float], q: float, digits: int) -> float | None:
    """The q-quantile by nearest rank (the ceil(q * n)-th smallest), or None for no
    values. (Until 2026-12-03 it took the (floor(q * n) + 1)-th: of 100 failures the
    "p99" was the worst one, which ``*_max`` now reports.)"""
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v), max(1, math.ceil(q * len(v) - 1e-9))) - 1], digits)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.controller", description=__doc__.split("\n")[0])
    ap.add_argument("--topology", default="fat-tree:16", help="family:args, e.g. fat-tree:16")
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--receivers", type=int, default=64)
    ap.add_argument("--algorithm", choices=["spt", "steiner"], default="spt")
    ap.add_argument("--failures", type=int, default=100, help="link failures to time")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-protection", action="store_true",
                    help="trees without fast-failover groups and detours (the controller's --no-protection)")
    return command(ap, run, argv)


def command(ap: argparse.ArgumentParser, bench: Callable[[argparse.Namespace], dict[str, Any]],
            argv: list[str] | None) -> int:
    """A controller bench's command line: ``bench`` run with ``ap``'s arguments, its result
    printed as one JSON object (``--json``) or a line per figure; 2 for an unknown topology."""
    args = ap.parse_args(argv)
    try:
        result = bench(args)
    except TopologyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:32} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
