"""CI smoke of the NACK-implosion bench (``python -m bench.scale``) at sizes that run in
a second: the host agent's repair at 8 and 64 receivers, 2% independent loss, FEC on,
checked against issue 48's targets where they are cheap to check -- the tail after the
stream, NACKs per distinct loss -- and its repair share against what parity needs at
least (the full run's 1,024 receivers are in ``make bench``)."""

from __future__ import annotations

import pytest

from bench.scale import (
    NACKS_PER_DISTINCT_TARGET, TAIL_TARGET_S, Row, meets_targets, relate_to_base, run_one,
)

SIZE = 256 * 1024
LOSS = 0.02


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    out = [run_one(n, LOSS, SIZE, fec_k=32, seed=7) for n in (8, 64)]
    relate_to_base(out)
    return out


def test_every_receiver_verifies(rows: list[Row]) -> None:
    assert all(r.all_verified and r.completed == r.receivers for r in rows)


def test_the_tail_after_the_stream_stays_short_at_64_receivers(rows: list[Row]) -> None:
    row = rows[1]
    assert row.tail_s <= TAIL_TARGET_S, row
    assert meets_targets(row)["tail"]


def test_nacks_per_distinct_loss_stay_below_target(rows: list[Row]) -> None:
    for row in rows:
        assert row.nacks_per_distinct <= NACKS_PER_DISTINCT_TARGET, row


def test_repairs_cost_close_to_what_parity_needs_at_least(rows: list[Row]) -> None:
    """Repair bytes at 64 receivers within a quarter of the expected largest per-block
    loss (one round of parity, none of it lost): parity sized for the group, not one
    NACK round at a time, and not per receiver."""
    row = rows[1]
    assert row.ideal_parity_pct > 0
    assert row.repair_share_pct <= 1.25 * row.ideal_parity_pct, row
    assert row.repair_vs_base is not None and row.base_receivers == 8
