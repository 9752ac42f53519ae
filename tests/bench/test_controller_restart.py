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
