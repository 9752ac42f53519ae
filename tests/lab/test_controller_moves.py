"""Trees that move cleanly on a real Open vSwitch fabric (userspace datapath, netns hosts):
a 5,000 datagrams/s sequence-numbered stream from h1 to several receivers while the
controller moves its tree again and again by planned drains (a spine, a spine-leaf link,
ring links whose move turns the tree around) and their undrains. Each receiver's capture
must hold every datagram exactly once: 0 lost, 0 duplicates, across every move, on two
topologies. Printed: the moves, datagrams and duplicates per receiver, each move's
latency (the request until its old entries are removed: ``clear`` in ``GET /v1/drains``)
p50/p99, and the stream's one-way latency through the fabric (send to capture, one host
clock), which the plan's 50 ms drain must exceed by far (``controller.plan.DRAIN_S``)."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Callable

import pytest

import topologies as T
from controller.plan import DRAIN_S
from lab.probes import Capture, send
from tests.support.controller_lab import controller_lab, group_from_h1, wait_for

pytestmark = pytest.mark.lab

INTERVAL = 0.0002  # 5,000 datagrams/s
MOVES = int(os.environ.get("MODELCAST_MOVES", "50"))  # per topology


def _drained(ctl, switches: list[int]) -> dict | None:
    return next((d for d in ctl.api("GET", "/v1/drains").json() if d["switches"] == sorted(switches)), None)


def _move(ctl, gid: int, path: str, switches: list[int]) -> float:
    """Drain ``path``, wait until nothing crosses it and its plan is installed; the
    seconds that took. The tree must have moved off it."""
    before = ctl.api("GET", f"/v1/groups/{gid}").json()["tree"]["links"]
    t0 = time.monotonic()
    r = ctl.api("PUT", path)
    assert r.status_code == 200, r.text
    assert wait_for(lambda: (_drained(ctl, switches) or {}).get("clear"), 10, step=0.005), ctl.api(
        "GET", "/v1/drains").json()
    took = time.monotonic() - t0
    after = ctl.api("GET", f"/v1/groups/{gid}").json()
    assert after["state"] == "installed" and after["tree"]["links"] != before, (before, after)
    assert not any(set(k) <= set(switches) or (len(switches) == 1 and switches[0] in k)
                   for k in after["tree"]["links"]), after["tree"]
    return took


def _undrain(ctl, path: str, switches: list[int]) -> None:
    r = ctl.api("DELETE", path)
    assert r.status_code == 200 and not r.json()["drained"], r.text
    assert wait_for(lambda: _drained(ctl, switches) is None, 5)


def run_moves(topo: T.Topology, receivers: tuple[str, ...], moves: Callable[[dict], tuple[str, list[int]]],
              work: Path) -> dict:
    """The stream from h1 to ``receivers`` while ``moves(group)`` (the drain path and its
    switches for the tree as it is) is drained, waited for and given back MOVES times."""
    with controller_lab(topo, work) as (lab, ctl):
        g = group_from_h1(lab, ctl, topo, "moves", receivers)
        probes = {h: Capture(lab, h, g["address"], work) for h in receivers}
        sent_log = Path(work) / "sent.txt"
        sender = send(lab, "h1", g["address"], g["port"], INTERVAL, 10_000_000, log=sent_log)
        took = []
        try:
            assert wait_for(lambda: all(len(p.seqs()) > 1000 for p in probes.values()), 15)
            start = time.time()
            for _ in range(MOVES):
                path, switches = moves(ctl.api("GET", f"/v1/groups/{g['id']}").json())
                took.append(_move(ctl, g["id"], path, switches))
                _undrain(ctl, path, switches)
            time.sleep(0.5)
            end = time.time()
        finally:
            sender.kill()
            sender.wait()
        time.sleep(0.5)
        sent = {int(a): float(b) for a, b in (line.split() for line in sent_log.read_text().splitlines()
                                              if len(line.split()) == 2)}
        window = sorted(s for s, t in sent.items() if start - 0.2 <= t <= end)
        out = {"moves": len(took), "move_s": took, "receivers": {}, "one_way_ms": []}
        for h, p in probes.items():
            recs = p.records()
            p.stop()
            got = [s for s, _ in recs if window[0] <= s <= window[-1]]
            first = {}
            for s, t in recs:
                first.setdefault(s, t)
            out["one_way_ms"] += [1000 * (first[s] - sent[s]) for s in window if s in first]
            out["receivers"][h] = {"sent": len(window), "received": len(set(got)),
                                   "lost": len(set(window) - set(got)), "duplicates": len(got) - len(set(got))}
        return out


def report(name: str, m: dict) -> None:
    took = sorted(1000 * t for t in m["move_s"])
    lat = sorted(m["one_way_ms"])
    print(f"\n{name}: {m['moves']} moves under a {1 / INTERVAL:.0f} datagram/s stream")
    for h, r in m["receivers"].items():
        print(f"  {h}: {r['sent']} sent, {r['received']} received, {r['lost']} lost, {r['duplicates']} duplicates")
    print(f"  move latency (request -> old entries removed): p50 {statistics.median(took):.0f} ms, "
          f"p99 {took[min(len(took) - 1, int(0.99 * len(took)))]:.0f} ms, max {took[-1]:.0f} ms")
    print(f"  one-way latency through the fabric (send -> capture): p50 {statistics.median(lat):.2f} ms, "
          f"p99.9 {lat[int(0.999 * (len(lat) - 1))]:.2f} ms, max {lat[-1]:.2f} ms (the drain: {1000 * DRAIN_S:.0f} ms)")


def check(m: dict) -> None:
    assert m["moves"] == MOVES
    for h, r in m["receivers"].items():
        assert r["lost"] == 0 and r["duplicates"] == 0, (h, r)


def test_leaf_spine_moves_lose_and_double_nothing(tmp_path, capsys):
    """leaf-spine 2 spines, 3 leaves: h1 (leaf 3) to h2 (its own leaf), h3 and h5; each
    move drains the spine the tree uses, or (every other move) the link from it to h5's
    leaf, so the tree moves to the other spine; given back, nothing moves back."""
    topo = T.leaf_spine(2, 3, 2)
    n = [0]

    def next_move(g: dict) -> tuple[str, list[int]]:
        n[0] += 1
        spine = next(p for p, c in g["tree"]["links"] if p in (1, 2))
        if n[0] % 2:
            return f"/v1/drains/switch/{spine}", [spine]
        return f"/v1/drains/link/{spine}/5", [spine, 5]

    m = run_moves(topo, ("h2", "h3", "h5"), next_move, tmp_path)
    with capsys.disabled():  # (printed in CI's log too)
        report("leaf-spine:2,3,2", m)
    check(m)


def test_ring_moves_that_turn_the_tree_around_lose_and_double_nothing(tmp_path, capsys):
    """ring:6, h1 (s1) to h2, h3 and h4 (s2, s3, s4): draining s1's link the tree uses
    sends it the other way round (a move that turns s2..s4's segment around); given back,
    it stays; the next move drains the other link of s1."""
    topo = T.ring(6, 1)

    def next_move(g: dict) -> tuple[str, list[int]]:
        first = next(c for p, c in g["tree"]["links"] if p == 1)
        return f"/v1/drains/link/1/{first}", sorted((1, first))

    m = run_moves(topo, ("h2", "h3", "h4"), next_move, tmp_path)
    with capsys.disabled():
        report("ring:6", m)
    check(m)
