"""The pipelined-chain baseline: sender -> r1 -> r2 -> ... -> rN over plain TCP, every
receiver writing each block to disk and forwarding it to the next as it arrives
(``bench/chain_node.py`` in each namespace). Time is about size / bandwidth whatever N,
but every receiver's uplink carries the whole file once more.

The order follows the topology: the receivers on one switch are adjacent, so the chain
crosses the core once per switch it visits, not once per hop.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from bench.baselines import RunResult, read_stats, tx_bytes, wait_all, wrapped
from lab.models import file_digest
from lab.sh import LabError, NetnsHosts, stop_processes
from topologies.spec import Topology

NODE = Path(__file__).with_name("chain_node.py")
PORT = 9100


def chain_order(topo: Topology, receivers: list[str]) -> list[str]:
    """``receivers`` grouped by the switch they hang off (switches in dpid order, hosts
    in port order): the chain then leaves each leaf only once."""
    return sorted(receivers, key=lambda r: (topo.host(r).dpid, topo.host(r).port))


def chain(lab: NetnsHosts, topo: Optional[Topology], sender: Any, receivers: list[Any], path: Path,
          work: Path, timeout: float = 900) -> RunResult:
    """One pipelined-chain distribution of ``path``; every copy's BLAKE3 checked. Without
    a topology (one switch, as the kernel-bridge lab) the chain takes ``receivers`` in
    their order."""
    work.mkdir(parents=True, exist_ok=True)
    want = file_digest(path)
    order = chain_order(topo, receivers) if topo is not None else list(receivers)
    nodes: list[tuple[Any, Path, subprocess.Popen]] = []
    nxt: list[str] = []
    head: subprocess.Popen | None = None
    try:
        for r in reversed(order):  # the tail first: each node connects to its successor
            out = work / f"chain-{r}.bin"
            p = wrapped(lab, r, work / f"chain-{r}.json", sys.executable, str(NODE), "recv",
                        str(PORT), str(out), *nxt, stdout=subprocess.PIPE, text=True)
            nodes.append((r, out, p))
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise LabError(f"chain node on {r} did not start (exit {p.wait(10)})")
            nxt = [f"{lab.ip(r)}:{PORT}"]
        before = tx_bytes(lab, sender)
        t0 = time.monotonic()
        head_stats = work / "chain-head.json"
        head = wrapped(lab, sender, head_stats, sys.executable, str(NODE), "send", str(path),
                       *nxt, stdout=subprocess.DEVNULL)
        finished = wait_all([p for _, _, p in nodes], t0 + timeout)
        seconds = time.monotonic() - t0
        wait_all([head], time.monotonic() + 10)
        sent = tx_bytes(lab, sender) - before
    finally:  # SIGTERM first: the CPU wrapper passes it on to the node
        stop_processes([p for _, _, p in nodes] + ([head] if head else []), grace=10)
    oks = {}
    for r, out, p in nodes:
        got = p.stdout.read().strip() if p.stdout else ""
        oks[r] = got == want and file_digest(out) == want
        out.unlink(missing_ok=True)
    return RunResult("chain", len(receivers), seconds, finished and all(oks.values()), sent,
                     path.stat().st_size, None, read_stats(head_stats)["cpu_s"],
                     sum(read_stats(work / f"chain-{r}.json")["cpu_s"] or 0 for r in order),
                     {"verified": oks, "order": order})
