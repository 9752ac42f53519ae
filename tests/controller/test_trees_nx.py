"""The tree search checked directly against networkx, not against another search of ours.

What ``compute_tree(..., "spt")`` promises (controller/trees.py, ``_spt``): every
receiver is reached along a shortest path from the source's switch, and each switch on
the way takes, among its shortest-path predecessors, the one whose path to the root
carries the least total group load (the loads summed link by link), the lowest dpid of
equal ones. networkx states the same tree on its own: BFS distances give the
shortest-path DAG, Dijkstra over that DAG weighted by the loads gives each switch's
least load, and the choices follow. Both of the controller's searches are held to it:
the array search (a new group's tree) and the per-switch one (a kept tree), on random
topologies with random loads and links down.
"""

from __future__ import annotations

import random
from collections import Counter

import networkx as nx
from hypothesis import example, given, settings
from hypothesis import strategies as st

import topologies as T
from controller.topoview import TopologyView
from controller.trees import compute_tree
from tests.support.profiles import examples

FAMILIES = ["fat-tree:4", "leaf-spine:3,4,2", "ring:7", "linear:5", "fat-tree:6"]


def nx_tree(graph: nx.Graph, root: int, targets: set[int], load: Counter) -> dict[int, int | None]:
    """The least-loaded shortest-path tree from ``root`` to the reachable ``targets``,
    from networkx alone (child -> parent, the root -> None)."""
    dist = nx.single_source_shortest_path_length(graph, root)
    dag = nx.DiGraph()
    dag.add_nodes_from(dist)
    for a, b in graph.edges:
        for p, c in ((a, b), (b, a)):
            if p in dist and c in dist and dist[c] == dist[p] + 1:
                dag.add_edge(p, c, load=load[(p, c)])
    cost = nx.single_source_dijkstra_path_length(dag, root, weight="load")
    parent: dict[int, int | None] = {root: None}
    for t in sorted(targets & dist.keys()):
        n = t
        while n not in parent:
            best = min(cost[p] + dag.edges[p, n]["load"] for p in dag.predecessors(n))
            parent[n] = min(p for p in dag.predecessors(n) if cost[p] + dag.edges[p, n]["load"] == best)
            n = parent[n]
    return parent


@settings(max_examples=examples(150), deadline=None)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**32 - 1), receivers=st.integers(1, 12),
       down=st.integers(0, 4), heavy=st.sampled_from([0, 1, 3, 50]), kept=st.booleans())
@example(family="fat-tree:4", seed=0, receivers=12, down=0, heavy=0, kept=False)  # no load: ties everywhere
@example(family="ring:7", seed=1, receivers=6, down=1, heavy=3, kept=True)  # a ring cut: one way round
def test_the_tree_is_networkxs_least_loaded_shortest_path_tree(family, seed, receivers, down, heavy, kept) -> None:
    rng = random.Random(seed)
    topo = T.parse(family)
    view = TopologyView.from_topology(topo)
    for link in rng.sample(topo.links, min(down, len(topo.links))):
        view.remove_link(link.a, link.a_port, link.b, link.b_port)
    hosts = [h.ip for h in topo.hosts]
    source, *chosen = rng.sample(hosts, min(len(hosts), receivers + 1))
    load: Counter = Counter()
    if heavy:
        for link in topo.links:
            for p, c in ((link.a, link.b), (link.b, link.a)):
                if rng.random() < 0.6:
                    load[(p, c)] = rng.randint(0, heavy)
    root = view.host(source).dpid
    # kept: a "current tree" of just the root makes compute_tree take the per-switch search
    tree = compute_tree(view, source, chosen, "spt", load, keep={root: None} if kept else None)
    targets = {view.host(r).dpid for r in chosen}
    want = nx_tree(view.graph, root, targets, load)
    assert tree.root == root and tree.parent == want
    reachable = nx.node_connected_component(view.graph, root)
    assert tree.unreachable == {r for r in chosen if view.host(r).dpid not in reachable}
