"""Detours are chosen the same whichever way the meeting's hashes are taken: one by one
in Python or as arrays (many candidates, e.g. on fat-tree:34). A different choice would
change FF groups and rejoin flows on a controller upgrade, for no reason."""

from __future__ import annotations

import random

import pytest

import topologies as T
from controller import protect
from controller.topoview import TopologyView


@pytest.mark.parametrize("family", ["fat-tree:8", "leaf-spine:8,32,16", "ring:7", "fat-tree:4"])
def test_the_array_meeting_picks_the_per_candidate_loops_detour(family: str, monkeypatch) -> None:
    topo = T.parse(family)
    view = TopologyView.from_topology(topo)
    nbr = view.nbr_ports
    rng = random.Random(7)
    nodes = sorted(nbr)
    asks = [(k.a, k.b) for k in topo.links] + [(k.b, k.a) for k in topo.links]
    asks += [tuple(rng.sample(nodes, 2)) for _ in range(200)]  # (any two switches, too)

    def around(many: int) -> list:
        monkeypatch.setattr(protect, "_MANY", many)
        return [protect._path_around(nbr, a, b) for a, b in asks]

    loop, arrays = around(1 << 30), around(1)
    assert arrays == loop
    found = [p for p in loop if p is not None]
    assert found and all(p[0] != p[-1] and len(set(p)) == len(p) for p in found)
    # a detour never crosses the link it goes around
    assert all((p[0], p[1]) != (a, b) for p, (a, b) in zip(loop, asks) if p is not None)
