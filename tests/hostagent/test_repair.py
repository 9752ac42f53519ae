"""The sender's repair planner on its own: which requests become unicast, multicast or
parity repairs, and when. Virtual time; no datagrams are built here."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from hostagent.common import Layout
from hostagent.repair import ParityRepair, PlainRepair, RepairPlanner, expected_shares, group_loss_rates

LAYOUT = Layout(file_size=64 * 1024, chunk_size=16 * 1024, payload_size=1024)  # 4 chunks of 16 seqs
WINDOW = 0.05


@dataclass
class Peer:
    loss: float = 0.0
    loss_over: int = 0  # datagrams the loss figure covers (0: no report)
    completed: bool = False
    failed: bool = False


def planner(fec_k: int = 0, fec_overhead: float = 0.0, threshold: int = 2,
            holdoff: Optional[float] = None) -> RepairPlanner:
    return RepairPlanner(LAYOUT, random.Random(1), multicast_threshold=threshold, repair_holdoff=holdoff,
                         shared_loss_memory=1.0, min_nack_window=0.002, fec_k=fec_k, fec_overhead=fec_overhead,
                         fec_anticipate=True)


def drain(p: RepairPlanner, peers: dict[int, Peer], now: float = 1.0) -> list:
    out = []
    while (repair := p.next_repair(now, peers)) is not None:
        out.append(repair)
    return out


def nack(p: RepairPlanner, rid: int, ranges: list[tuple[int, int]], now: float = 0.0) -> None:
    p.nack(rid, ranges, now, WINDOW)
    p.open_window(now + WINDOW)


def test_a_lone_asker_waits_for_the_window_then_gets_unicast() -> None:
    p = planner()
    peers = {1: Peer()}
    nack(p, 1, [(3, 5)])
    assert p.deadline == WINDOW and not p.queued
    p.close_window(WINDOW, peers, LAYOUT.total_seq, 1e9, WINDOW)
    assert p.deadline is None
    assert drain(p, peers) == [PlainRepair(3, 1), PlainRepair(4, 1)]


def test_a_second_asker_makes_the_loss_shared_at_once() -> None:
    p = planner()
    peers = {1: Peer(), 2: Peer()}
    nack(p, 1, [(3, 4)])
    nack(p, 2, [(3, 5)])
    # No window close needed: seq 3 is multicast now, seq 4 still waits (one asker).
    assert drain(p, peers) == [PlainRepair(3, None)]
    p.close_window(WINDOW, peers, LAYOUT.total_seq, 1e9, WINDOW)
    assert drain(p, peers) == [PlainRepair(4, 2)]


def test_with_a_higher_threshold_the_window_counts_askers() -> None:
    p = planner(threshold=3)
    peers = {rid: Peer() for rid in (1, 2, 3)}
    for rid in (1, 2, 3):
        nack(p, rid, [(7, 8)])
    nack(p, 1, [(9, 10)])
    nack(p, 2, [(9, 10)])
    assert not p.queued
    p.close_window(WINDOW, peers, LAYOUT.total_seq, 1e9, WINDOW)
    assert drain(p, peers) == [PlainRepair(7, None), PlainRepair(9, 1), PlainRepair(9, 2)]


def test_requests_for_a_fresh_multicast_repair_are_ignored_until_the_holdoff_ends() -> None:
    p = planner(holdoff=0.1)
    peers = {1: Peer(), 2: Peer()}
    nack(p, 1, [(5, 6)])
    nack(p, 2, [(5, 6)])
    assert drain(p, peers, now=0.0) == [PlainRepair(5, None)]
    nack(p, 1, [(5, 6)], now=0.05)  # the repair is still in flight
    p.close_window(0.1, peers, LAYOUT.total_seq, 1e9, WINDOW)
    assert drain(p, peers) == []
    nack(p, 1, [(5, 6)], now=0.2)  # it was lost after all
    p.close_window(0.25, peers, LAYOUT.total_seq, 1e9, WINDOW)
    assert drain(p, peers) == [PlainRepair(5, 1)]


def test_leftovers_of_receivers_that_finished_are_skipped() -> None:
    p = planner()
    peers = {1: Peer(), 2: Peer()}
    nack(p, 1, [(0, 3)])
    nack(p, 2, [(10, 12)])
    p.close_window(WINDOW, peers, LAYOUT.total_seq, 1e9, WINDOW)
    assert p.next_repair(1.0, peers) == PlainRepair(0, 1)
    peers[1].completed = True
    p.forget(1)
    assert drain(p, peers) == [PlainRepair(10, 2), PlainRepair(11, 2)]


def test_one_receivers_backlog_does_not_hold_back_the_others() -> None:
    """Group repairs first, then unicast repairs take turns a datagram at a time: a
    lagging receiver with a long list is served alongside, not ahead of, the others."""
    p = planner(threshold=3)
    peers = {rid: Peer() for rid in (1, 2, 3)}
    nack(p, 1, [(0, 6)])  # the laggard, asking first
    nack(p, 2, [(20, 22)])
    for rid in (1, 2, 3):
        nack(p, rid, [(40, 41)])  # shared by three: multicast
    p.close_window(WINDOW, peers, LAYOUT.total_seq, 1e9, WINDOW)
    assert drain(p, peers) == [
        PlainRepair(40, None),
        PlainRepair(0, 1), PlainRepair(20, 2), PlainRepair(1, 1), PlainRepair(21, 2),
        PlainRepair(2, 1), PlainRepair(3, 1), PlainRepair(4, 1), PlainRepair(5, 1),
    ]


def test_a_window_opens_for_requests_or_a_congestion_signal_only() -> None:
    p = planner()
    p.open_window(1.0)
    assert p.deadline is None
    p.open_window(1.0, congested=True)
    assert p.deadline == 1.0
    p.open_window(2.0, congested=True)
    assert p.deadline == 1.0  # already open: the first deadline stands


# --------------------------------------------------------------------------- FEC


def test_different_single_losses_in_one_block_get_one_parity_share() -> None:
    p = planner(fec_k=8)
    peers = {rid: Peer() for rid in (1, 2, 3)}
    for rid, seq in ((1, 1), (2, 3), (3, 5)):
        nack(p, rid, [(seq, seq + 1)])
    p.close_window(WINDOW, peers, LAYOUT.total_seq, 1e9, WINDOW)
    (share,) = drain(p, peers)
    assert isinstance(share, ParityRepair)
    assert (share.chunk, share.block, share.first, share.end) == (0, 0, 0, 8)
    assert 8 <= share.index < 256 and share.remaining == (share.index,)


def test_a_lone_asker_gets_parity_when_the_others_report_loss() -> None:
    """Same cost to the sender as plain repair, but the others will likely need it too."""
    for others_loss, expect_parity in ((0.0, False), (0.05, True)):
        p = planner(fec_k=8)
        peers = {1: Peer(loss=0.02), 2: Peer(loss=others_loss), 3: Peer(loss=others_loss)}
        nack(p, 1, [(1, 3)])
        p.close_window(WINDOW, peers, LAYOUT.total_seq, 1e9, WINDOW)
        out = drain(p, peers)
        if expect_parity:  # one share plus the second hole by unicast
            assert [type(r) for r in out] == [ParityRepair, PlainRepair] and out[1] == PlainRepair(1, 1)
        else:
            assert out == [PlainRepair(1, 1), PlainRepair(2, 1)]


def test_requests_in_the_block_being_streamed_wait_for_it_to_complete() -> None:
    p = planner(fec_k=8)
    peers = {1: Peer(), 2: Peer()}
    nack(p, 1, [(17, 18)])
    nack(p, 2, [(19, 20)])
    p.close_window(WINDOW, peers, next_seq=21, rate=8e6, nack_window=WINDOW)  # block 16..24 still open
    assert not p.queued and p.deadline is not None  # held over to a later window
    p.close_window(p.deadline, peers, next_seq=30, rate=8e6, nack_window=WINDOW)
    (share,) = drain(p, peers)
    assert isinstance(share, ParityRepair) and (share.first, share.end) == (16, 24)


def test_a_multi_share_job_hands_out_its_shares_in_order() -> None:
    p = planner(fec_k=8)
    peers = {rid: Peer() for rid in (1, 2, 3)}
    for rid, ranges in ((1, [(0, 1), (2, 3)]), (2, [(4, 5), (6, 7)]), (3, [(1, 2), (3, 4)])):
        nack(p, rid, ranges)
    p.close_window(WINDOW, peers, LAYOUT.total_seq, 1e9, WINDOW)
    first, second = drain(p, peers)
    assert first.remaining == (first.index, second.index) and second.remaining == (second.index,)


def test_proactive_parity_follows_each_complete_block() -> None:
    p = planner(fec_k=8, fec_overhead=0.125)  # one share per 8-datagram block
    shares = []
    for seq in range(LAYOUT.total_seq):
        p.stream_sent(seq)
        while (share := p.next_proactive()) is not None:
            shares.append((seq, share.first, share.index))
    assert shares == [(end - 1, end - 8, 8) for end in range(8, LAYOUT.total_seq + 1, 8)]
    without = planner(fec_k=8)
    without.stream_sent(7)
    assert not without.proactive_queued


# --------------------------------------------------------------------------- group-sized parity


def test_expected_shares_follow_the_largest_loss_the_group_will_see() -> None:
    """At 2% independent loss a 32-datagram block needs ~1 share for 8 receivers and
    ~4 for 1,024 (the largest loss in the block grows with the group, ~log N)."""
    assert expected_shares([0.02] * 8, 32, 200) == 1
    assert expected_shares([0.02] * 1024, 32, 200) == 4
    assert expected_shares([0.02] * 1024, 32, 2) == 2  # never past the share indices left


def test_no_group_parity_for_a_lone_lossy_receiver_or_without_reports() -> None:
    """One receiver at 50% among receivers without loss: its repairs are its own
    (unicast or on request), nothing is multicast to everyone unasked."""
    assert expected_shares([0.5] + [0.0] * 63, 32, 200) == 0
    assert expected_shares([], 32, 200) == 0
    assert group_loss_rates([Peer(), Peer()], 1 - 1 / 1024) == []


def test_group_loss_rates_undo_the_ewma_start_and_fill_in_the_silent() -> None:
    """A report over n datagrams of a 2% loss reads 2% * (1 - keep**n); the sender
    divides that back out (less one sigma of its few losses), and receivers that never
    reported count at the median."""
    keep = 1 - 1 / 1024
    n = 2000
    reported = 0.02 * (1 - keep**n)
    rates = group_loss_rates([Peer(loss=reported, loss_over=n)] * 3 + [Peer()] * 5, keep)
    assert len(rates) == 8
    assert all(0.015 < r <= 0.02 for r in rates)


def test_one_report_is_one_receivers_loss_not_the_groups() -> None:
    """One receiver reports 5% among three silent ones: the silent count as losing
    nothing (not at the reporter's rate), so no parity goes to everyone unasked; a
    second report makes the loss the group's again."""
    keep = 1 - 1 / 1024
    n = 4000
    lossy = Peer(loss=0.05 * (1 - keep**n), loss_over=n)
    one = group_loss_rates([lossy, Peer(), Peer(), Peer()], keep)
    assert one[1:] == [0.0, 0.0, 0.0] and 0.04 < one[0] <= 0.05
    assert expected_shares(one, 64, 200) == 0
    two = group_loss_rates([lossy, lossy, Peer(), Peer()], keep)
    assert all(0.04 < r <= 0.05 for r in two) and expected_shares(two, 64, 200) >= 1


def test_a_window_after_loss_reports_sizes_every_streamed_block_for_the_group() -> None:
    """One receiver's NACK closes a window: every complete block streamed so far gets the
    shares the group's reported loss says two receivers will need, not just the block
    asked about."""
    p = planner(fec_k=8)
    keep = 1 - 1 / 1024
    n = 64
    peers = {rid: Peer(loss=0.2 * (1 - keep**n), loss_over=n) for rid in range(64)}
    p.nack(0, [(1, 2)], 0.0, 0.01)
    p.close_window(0.01, peers, next_seq=32, rate=1e9, nack_window=0.01)
    blocks = set()
    while (r := p.next_repair(0.01, peers)) is not None:
        if isinstance(r, ParityRepair):
            blocks.add(r.first)
    assert blocks == {0, 8, 16, 24}
