"""The distribution benchmark keeps working: a tiny run (4 MB, N=1,2, one run) of all
three methods on the OVS lab writes its table, plot and raw numbers, every copy verified."""

import json
import subprocess
import sys

import pytest

from tests.support.lab import need_lab

pytestmark = pytest.mark.lab


def test_benchmark_smoke(tmp_path):
    need_lab()
    proc = subprocess.run([sys.executable, "-m", "bench.distribution", "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert {r["method"] for r in data["runs"]} == {"tcp", "uftp", "modelcast"}
    assert all(r["ok"] for r in data["runs"]) and len(data["runs"]) == 6
    tcp2 = next(r for r in data["runs"] if r["method"] == "tcp" and r["receivers"] == 2)
    mc2 = next(r for r in data["runs"] if r["method"] == "modelcast" and r["receivers"] == 2)
    assert tcp2["sender_link_bytes"] > 1.9 * tcp2["file_bytes"]  # two unicast copies
    assert mc2["sender_link_bytes"] < 1.2 * mc2["file_bytes"]  # one multicast copy
    assert "| modelcast |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.png").stat().st_size > 10_000


def test_agent_benchmark_smoke(tmp_path):
    """The agent-speed, lanes and asymmetry benchmark runs end to end on the kernel-bridge
    lab: every method's copies verified, times and CPU per GB reported for each side."""
    need_lab(ovs=False)
    proc = subprocess.run([sys.executable, "-m", "bench.agent", "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "agent.json").read_text())
    runs = data["runs"]
    assert all(r["ok"] for r in runs), [r for r in runs if not r["ok"]]
    speed = {(r["method"], r["receivers"]) for r in runs if r["scenario"] == "speed"}
    assert speed == {(m, n) for m in ("modelcast", "tcp", "uftp") for n in (1, 2)}
    for r in runs:
        assert r["seconds"] > 0 and r["line_rate_s"] > 0 and r["vs_line_rate"] > 1 - 1e-9
        assert r["cpu_sender_per_gb"] is not None and r["cpu_receiver_per_gb"] is not None
    lossy = [r for r in runs if r["scenario"] == "asymmetry-one-lossy"]
    assert {r["method"] for r in lossy} == {"modelcast", "uftp"}
    assert all(r["detail"]["dropped_at_lossy_receiver"] > 0 for r in lossy)
    assert "| speed | modelcast | 2 |" in (tmp_path / "agent.md").read_text()
    laned = {r["method"] for r in runs if r["scenario"] == "lanes"}
    assert laned == {"modelcast --lanes 1", "modelcast --lanes 2"}
    assert "T(2 lanes) / T(1 lane)" in (tmp_path / "agent.md").read_text()


def test_directory_benchmark_smoke():
    """The directory-vs-file benchmark runs end to end on the kernel-bridge lab: both
    kinds verified on every receiver, the same bytes, the ratio reported."""
    need_lab(ovs=False)
    proc = subprocess.run([sys.executable, "-m", "bench.dirs", "--smoke"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["ok"] and {r["kind"] for r in data["runs"]} == {"file", "directory"}
    assert len({r["bytes"] for r in data["runs"]}) == 1 and data["directory_vs_file"] > 0
    assert next(r for r in data["runs"] if r["kind"] == "directory")["files"] == 40
