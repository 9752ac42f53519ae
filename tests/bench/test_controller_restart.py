"""The restart benchmark measures what it says: a restarted controller reconciles a
healthy fabric without a message to any tree, and puts back exactly what a switch lost
while it was down."""

from __future__ import annotations

from bench.controller_restart import installed, restart
from controller import ofmsgs


def test_a_healthy_fabric_needs_no_tree_message_after_a_restart() -> None:
    core, fabric, sent = installed("fat-tree:4", 20, 4, 1)
    out = restart(core, fabric)
    assert sent > 0 and out["groups_restored"] == 20
    assert out["plan_messages"] == 0 and out["fabric_unchanged"]
    assert out["requests"] == 2 * len(fabric.switches) and out["reply_parts"] >= out["requests"]
    assert out["restore_cpu_s"] > 0 and out["reconcile_cpu_s"] > 0


def test_what_a_switch_lost_meanwhile_is_put_back() -> None:
    core, fabric, _ = installed("fat-tree:4", 20, 4, 1)
    intact = fabric.snapshot()
    g = next(iter(core.groups.values()))
    root = g.tree.root
    assert not fabric.apply_all([(root, ofmsgs.group_delete(root, g.gid))])
    assert fabric.snapshot() != intact
    out = restart(core, fabric, intact)
    assert out["plan_messages"] > 0 and out["fabric_unchanged"]


def test_start_up_discovers_the_whole_fabric_and_says_what_ryus_probing_adds() -> None:
    """fat-tree:4: 20 switches, 32 links seen from both ends (64 signed frames), 16 hosts;
    then its 80 ports are probed again one by one: at --lldp-rate's 1000 frames/s a round
    is Ryu's period per port (0.9 s); at Ryu's own 0.05 s apart it was 4 s."""
    from bench.controller_restart import discover

    out = discover("fat-tree:4")
    assert out["lldp_frames"] == 64 and out["switch_ports"] == 80
    assert out["lldp_round_s"] == 0.9 and out["ryu_stock_lldp_round_s"] == 4.0
    assert out["link_messages"] > 0 and out["host_messages"] >= 16
    assert out["discovery_cpu_s"] >= out["links_cpu_s"] > 0
