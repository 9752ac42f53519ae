"""What the controller benchmark says about balance and memory at scale: the tier ratio
next to what balancing alone could reach (``even_split``), the controller's RSS, and
sweep cases with their own group counts (the k = 34 rows of ``make bench-controller-sweep``)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import topologies as T
from bench.controller import even_split, load_ratios
from controller.trees import LinkLoad


def _loads(counts: dict[tuple[int, int], int]) -> SimpleNamespace:
    """A stand-in for the core: the benchmark's balance figures read only its ``load``."""
    return SimpleNamespace(load=LinkLoad(counts))


def test_even_split_tells_placement_from_piling_onto_one_link() -> None:
    """leaf-spine:2,2,1 with three groups leaving leaf1 (dpid 3) for the spines and none
    leaving leaf2: all three on one uplink is 1.5 x the even split (ceil(3/2) = 2); two
    and one is balanced (1.0), although the tier ratio stays 2.67 (the mean counts leaf2's
    idle uplinks) -- which is then the floor: placement, not the search."""
    topo = T.parse("leaf-spine:2,2,1")
    piled = _loads({(3, 1): 3})
    floor, over = even_split(piled, topo)
    assert over == 1.5
    split = _loads({(3, 1): 2, (3, 2): 1})
    floor, over = even_split(split, topo)
    ratio, _ = load_ratios(split, topo)
    assert over == 1.0
    assert round(ratio, 2) == round(floor, 2) == 2.67


def test_a_run_reports_the_controllers_memory() -> None:
    from argparse import Namespace

    from bench.controller import run

    out = run(Namespace(topology="fat-tree:4", groups=30, receivers=4, algorithm="spt",
                        failures=1, seed=1, no_protection=False))
    assert out["rss_mb"] > 10 and out["rss_per_group_kb"] >= 0
    assert out["max_link_load_ratio_even_split"] <= out["max_link_load_ratio"]
    assert out["max_link_load_over_even_split"] >= 1.0


def test_a_sweep_case_can_set_its_own_group_count(tmp_path) -> None:
    """``--case TOPOLOGY@RECEIVERS xGROUPS``: the case's groups override ``--groups``, and
    each row has the time per group and per message and the memory per group, so rows of
    different sizes can be compared; a malformed case is refused."""
    cmd = [sys.executable, "-m", "bench.controller_sweep", "--runs", "1", "--groups", "20", "--failures", "1",
           "--case", "fat-tree:4@4x40", "--case", "fat-tree:4@4", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["groups"] for r in rows] == [40, 20]
    for r in rows:
        assert r["build_us_per_group"] > 0 and r["build_us_per_message"] > 0
        assert r["rss_mb"] > 10 and r["rss_per_group_kb"] >= 0
    # the plot of time and memory per group, drawn from these rows (as 256-receiver ones)
    rows_file, png = tmp_path / "rows.jsonl", tmp_path / "sweep.png"
    rows_file.write_text("".join(json.dumps({**r, "receivers": 256}) + "\n" for r in rows))
    drawn = subprocess.run([sys.executable, "-m", "bench.controller_sweep", "--plot", str(png), "--rows",
                            str(rows_file)], capture_output=True, text=True, timeout=120, check=False)
    assert drawn.returncode == 0, drawn.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run([sys.executable, "-m", "bench.controller_sweep", "--case", "fat-tree:4@4xmany"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "TOPOLOGY@RECEIVERS[xGROUPS]" in bad.stderr
