"""Tree-computation internals whose speed tricks must not change results: the per-source
shortest-path layers are patched on link changes instead of recomputed, and must equal a
fresh breadth-first search after any sequence of link and switch changes."""

from __future__ import annotations

import random

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

import topologies as T
from controller.topoview import TopologyView
from controller.trees import PathCache


def fresh(view: TopologyView, root: int) -> tuple[dict[int, int], dict[int, list[int]]]:
    dist = nx.single_source_shortest_path_length(view.graph, root)
    preds = {n: sorted(p for p in view.graph.adj[n] if dist.get(p) == d - 1)
             for n, d in dist.items()}
    return dist, preds


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), steps=st.integers(1, 40),
       family=st.sampled_from(["fat-tree:4", "leaf-spine:3,4,1", "ring:6"]))
def test_patched_layers_equal_a_fresh_search_after_link_and_switch_changes(seed, steps, family):
    rng = random.Random(seed)
    topo = T.parse(family)
    view = TopologyView.from_topology(topo)
    cache = PathCache(view)
    roots = sorted(topo.switches)
    for _ in range(steps):
        for root in rng.sample(roots, 3):  # warm some entries, so patches have work
            if root in view.switches:
                cache.dag(root)
        link = rng.choice(topo.links)
        kind = rng.random()
        if kind < 0.45:
            view.remove_link(link.a, link.a_port, link.b, link.b_port)
        elif kind < 0.9:
            view.add_link(link.a, link.a_port, link.b, link.b_port)
        elif kind < 0.95:
            view.port_down(link.a, link.a_port)
        elif view.switches - {link.a}:
            view.remove_switch(link.a) if link.a in view.switches else view.add_switch(link.a)
        for root in roots:
            if root in view.switches:
                dist, preds = cache.dag(root)
                want_dist, want_preds = fresh(view, root)
                assert dist == want_dist and preds == want_preds
                assert list(dist.values()) == sorted(dist.values())  # BFS order kept
