"""The fixed-cost bench's arithmetic: each part is the gap between the marks it names,
and the medians take the slowest receiver of each run (the lab runs are in
tests/lab/test_bench_smoke.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from bench.fixedcost import medians, parts
from tests.support.lab import need_lab


def _run(shift: float, rx_exit: float) -> dict:
    sender = SimpleNamespace(spawn=10.0 + shift, exit=11.5 + shift)
    sent = {"clock": {"ready": 10.05 + shift, "first_data": 10.08 + shift, "stream_end": 11.0 + shift,
                      "verified": 11.4 + shift, "result": 11.41 + shift}}
    receivers = [(SimpleNamespace(spawn=9.5 + shift, exit=rx_exit + shift),
                  {"clock": {"ready": 9.6 + shift, "first": 10.1 + shift, "verified": 11.2 + shift,
                             "acked": 11.3 + shift, "result": 11.31 + shift}}),
                 (SimpleNamespace(spawn=9.5 + shift, exit=11.45 + shift),
                  {"clock": {"ready": 9.7 + shift, "first": 10.1 + shift, "verified": 11.1 + shift,
                             "acked": 11.35 + shift, "result": 11.36 + shift}})]
    return {"ok": True, **parts(sender, sent, receivers, line_s=0.9)}  # type: ignore[arg-type]


def test_parts_are_the_gaps_between_the_marks() -> None:
    p = _run(0.0, 11.6)
    s = p["sender"]
    assert (s["setup"], s["start"], s["end"], s["exit"]) == (0.05, 0.08, 0.4, 0.1)
    assert s["stream_extra"] == round(11.0 - 10.08 - 0.9, 4)  # the first pass beyond its line time
    assert [r["start"] for r in p["receivers"]] == [0.1, 0.2]
    assert [r["end"] for r in p["receivers"]] == [0.2, 0.1]  # from the sender's last data
    assert [r["ack"] for r in p["receivers"]] == [0.1, 0.25]
    assert p["wall"] == 1.6 and p["overhead"] == 0.7  # the last process gone, less the line time


def test_medians_take_the_slowest_receiver_and_skip_failed_runs() -> None:
    runs = [_run(0.0, 11.6), _run(5.0, 11.8), _run(9.0, 12.0), {"ok": False, "error": "x"}]
    m = medians(runs)
    assert m["receiver.start"] == 0.2 and m["receiver.ack"] == 0.25
    assert m["receiver.exit"] == 0.6  # max over receivers (11.8 - 11.2), then the median of the runs
    assert m["sender.end"] == 0.4 and m["overhead"] == 0.9
    assert medians([{"ok": False, "error": "x"}]) == {}


@pytest.mark.lab
@pytest.mark.timeout(600)
def test_fixed_cost_bench_smoke() -> None:
    """On a kernel-bridge lab every copy is verified and every part is measured: a start
    after the process's spawn, an end after the last data, a wall time above the line's."""
    need_lab(ovs=False)
    proc = subprocess.run([sys.executable, "-m", "bench.fixedcost", "--smoke"], capture_output=True, text=True,
                          timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["ok"] and len(data["runs"]) == 2 and data["python_floor_s"] > 0
    for run in data["runs"]:
        assert run["sender"]["start"] >= run["sender"]["setup"] > 0 and run["sender"]["exit"] > 0
        assert len(run["receivers"]) == 2 and all(r["start"] > 0 and r["exit"] > 0 for r in run["receivers"])
        assert run["wall"] > run["line_s"]
    assert set(data["medians"]["this"]) >= {"sender.start", "sender.end", "receiver.end", "overhead"}
