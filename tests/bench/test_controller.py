"""The controller benchmark keeps working and reports its times next to the same-run
reference (plain networkx shortest-path trees) and the machine it ran on."""

from __future__ import annotations

import argparse

from bench.controller import run


def test_small_run_reports_ratios_against_the_reference_and_the_machine() -> None:
    out = run(argparse.Namespace(topology="fat-tree:4", groups=20, receivers=4,
                                 algorithm="spt", failures=3, seed=1, no_protection=False))
    assert out["messages_total"] > 0 and out["link_failures"] == 3
    assert out["reference_trees_s"] > 0
    assert out["trees_vs_reference"] > 0 and out["trees_vs_reference_cpu"] > 0
    assert out["send_serialise_cpu_s"] > 0 and out["send_serialise_vs_reference_cpu"] > 0
    assert 0 < out["reroute_vs_reference_cpu_p50"] <= out["reroute_vs_reference_cpu_p99"] \
        <= out["reroute_vs_reference_cpu_max"]
    assert out["reroute_vs_reference_p50"] > 0 and out["reroute_vs_reference_p99"] >= out["reroute_vs_reference_p50"]
    assert 0 <= out["reroutes_with_gc_pause"] <= 3
    assert out["machine"]["cores"] >= 1 and out["machine"]["cpu"]
    # Protection is on by default: every switch's fast-failover groups and detour flows are counted.
    entries = out["entries_per_switch"]
    assert out["protection"] and entries["ff_groups"]["max"] > 0 and entries["detour_flows"]["max"] > 0
    assert entries["all"]["max"] >= entries["groups"]["max"] + entries["ff_groups"]["max"] // 2


def test_quantiles_are_by_nearest_rank() -> None:
    """p99 of 100 values is the 99th smallest (not the worst: that is ``*_max``), p50 the
    50th; one value is every quantile of itself."""
    from bench.controller import _pct

    values = [float(i) for i in range(1, 101)]
    assert _pct(values, 0.99, 2) == 99.0 and _pct(values, 0.5, 2) == 50.0 and _pct(values, 1.0, 2) == 100.0
    assert _pct([3.0], 0.99, 2) == 3.0 and _pct([], 0.5, 2) is None
    assert _pct(values[:10], 0.99, 2) == 10.0  # (of 10 failures, p99 is the worst)


def test_bridges_are_not_failed_and_a_line_times_no_failure(tmp_path, capsys) -> None:
    """A bridge's failure cuts receivers off whatever the controller does: the bench fails
    only the other links (a reroute that then loses a receiver is still an error) and counts
    the bridges; on a line, where every link is one, it says so and times no failure."""
    import json

    spec = tmp_path / "ring-and-tail.json"
    spec.write_text(json.dumps({
        "switches": ["s1", "s2", "s3", "s4", "s5"],
        "links": [["s1", "s2"], ["s2", "s3"], ["s3", "s4"], ["s4", "s1"], ["s4", "s5"]],
        "hosts": [{"switch": f"s{i}"} for i in (1, 2, 3, 5, 5)]}))
    args = dict(groups=20, receivers=3, algorithm="spt", failures=10, seed=1, no_protection=False)
    out = run(argparse.Namespace(topology=f"file:{spec}", **args))
    assert out["link_failures"] == 4 and out["bridges_not_failed"] == 1  # the ring's links alone
    assert out["reroute_vs_reference_cpu_p99"] > 0
    line = run(argparse.Namespace(topology="linear:4", **args))
    assert line["link_failures"] == 0 and line["bridges_not_failed"] == 3
    assert line["reroute_vs_reference_p99"] is None and line["trees_vs_reference"] > 0
    assert "every link of linear:4" in capsys.readouterr().err


def test_the_sweep_reports_each_case_with_what_explains_its_ratio() -> None:
    """``bench.controller_sweep`` runs each case in fresh processes and reports the ratios'
    range next to the reference's time per tree and the messages per group; a case that
    fails names itself and exits non-zero."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "bench.controller_sweep", "--runs", "2", "--groups", "20", "--failures", "2",
           "--case", "fat-tree:4@4", "--case", "linear:4@2", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["topology"], r["receivers"], r["runs"]) for r in rows] == [("fat-tree:4,2", 4, 2), ("linear:4,1", 2, 2)]
    fat, line = rows
    low, median, high = fat["trees_vs_reference"]
    assert 0 < low <= median <= high and fat["reroute_vs_reference_cpu_p99"][0] > 0 and fat["failures"] == 2
    assert fat["reference_us_per_tree"] > 0 and fat["build_us_per_group"] > 0 and fat["messages_per_group"] > 1
    assert line["failures"] == 0 and line["bridges_not_failed"] == 3 and line["reroute_vs_reference_cpu_p99"] is None
    assert fat["machine"]["cpu"]
    bad = subprocess.run([sys.executable, "-m", "bench.controller_sweep", "--runs", "1", "--case", "bogus:3@2"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "bogus:3" in bad.stderr and "unknown topology family" in bad.stderr
