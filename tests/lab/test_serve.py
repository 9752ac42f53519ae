"""An autoscaling fleet on OVS (issue 16): the real controller, OVS (userspace datapath),
one ``modelcast serve`` of a model directory and 7 receivers each starting ``modelcast
fetch MODEL_ID`` at a random moment spread over twice one transfer's time (measured
alone in the same run). Every receiver must exit 0 with the model (hashed here), the
server must exit 0 on SIGTERM with its offer withdrawn, and the server's link must carry
far less than the 7 copies unicast would; the summary prints the rounds, every
receiver's start -> verified time and the link bytes next to N x size."""

from __future__ import annotations

import pytest

import topologies as T
from lab.autoscale import Autoscale
from lab.controller import stamp_printer
from lab.fabric import Fabric
from lab.models import make_model_dir
from tests.support.lab import need_lab

pytestmark = pytest.mark.lab


def test_a_fleet_arriving_over_time_is_served_in_few_rounds(tmp_path) -> None:
    need_lab()
    model = make_model_dir(tmp_path / "model", seed=16, files=8, big=3, big_size=8_000_000)
    fleet = [f"h{i}" for i in range(2, 9)]
    with Fabric(T.leaf_spine(2, 4, 2), tmp_path / "lab", say=stamp_printer()) as fabric:
        with Autoscale(fabric, model, "h1", fleet, rate=150, workdir=tmp_path / "run") as run:
            report = run.run()
    print("\n" + report.format())
    assert report.ok, report.format()
    assert report.server_exit == 0 and report.offers_after_stop == []
    assert sum(len(r["verified"]) for r in report.rounds) == len(fleet)
    assert 1 < len(report.rounds) < len(fleet), "arrivals over 2 transfers: batched, not one round each"
    # Target <= 0.5 x N x size (measured 0.29-0.43 with the hold over 11 arrival draws, docs/benchmarks.md).
    assert report.sender_ratio <= 0.5, report.format()
    # Target: every receiver within 2 x one transfer (docs/benchmarks.md: 1.43-1.78 x over 11 draws with one
    # other work stream on the machine; 0.87-3.92 x when three shared it). The reference is a
    # round to one receiver; on 2 busy cores a round to six takes longer (their CPU), so the
    # bound is 3 x: it still fails a receiver that waits a round more than it should.
    assert report.worst_time_ratio() <= 3.0, report.format()
    # A host admitted late is served and counted by the round that admitted it.
    for r in report.rounds:
        assert set(r["late"]) <= set(r["verified"]), (r, report.format())
    # Every receiver's time is accounted for from the server's own JSON: seen asking, its
    # round, that round's stream, verified -- in that order -- and the CPU over its window.
    for a in report.arrivals:
        assert None not in (a.seen, a.round_start, a.stream_start, a.verified_at), (a, report.format())
        assert a.round_start <= a.stream_start <= a.verified_at <= a.seconds + 0.5, (a, report.format())
        assert a.seen <= a.verified_at and 0 < a.cpu["machine"] <= report.cores + 0.2, (a, report.format())
        assert 0 < a.cpu_at_seen <= a.cpu_s + 0.05, (a, report.format())
    for host, done, would in report.mid_round_check():
        assert done <= would + 0.5 * report.reference_s, (host, report.format())
