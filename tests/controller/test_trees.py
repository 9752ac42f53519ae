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
from controller import trees
from controller.trees import LinkLoad, PathCache, Tree, _deepest_first, _spt, _spt_vector


def _flip_link(view: TopologyView, link, kind: float, remove_below: float, add_below: float) -> bool:
    """One random link change of a generative test: the link goes down when ``kind`` is
    below ``remove_below``, comes (back) up below ``add_below``; False: neither."""
    if kind < remove_below:
        view.remove_link(link.a, link.a_port, link.b, link.b_port)
    elif kind < add_below:
        view.add_link(link.a, link.a_port, link.b, link.b_port)
    else:
        return False
    return True


def fresh(view: TopologyView, root: int) -> tuple[dict[int, int], dict[int, tuple[int, ...]]]:
    dist = nx.single_source_shortest_path_length(view.graph, root)
    preds = {n: tuple(sorted(p for p in view.graph.adj[n] if dist.get(p) == d - 1))
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
        if _flip_link(view, link, kind, 0.45, 0.9):
            pass
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


def test_roots_share_equal_predecessor_lists() -> None:
    """Memory: on fat-tree:8 a core's predecessors (the aggregation switches of its
    column) are the same from every edge switch outside their pods, so the DAGs of all
    roots hold one object per distinct predecessor set, not one per switch per root
    (half of the controller's memory on fat-tree:34 was these lists)."""
    topo = T.parse("fat-tree:8")
    cache = PathCache(TopologyView.from_topology(topo))
    edges = [d for d, name in topo.switches.items() if name.startswith("e")]
    dags = [cache.dag(root)[1] for root in edges]
    entries = [p for preds in dags for p in preds.values()]
    distinct = {id(p) for p in entries}
    assert len(distinct) == len(set(entries))  # equal tuples are one object
    assert len(distinct) * 10 < len(entries)  # 77 objects for 32 roots x 80 switches
    assert dags[0] == fresh(cache.view, edges[0])[1]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), steps=st.integers(1, 25),
       family=st.sampled_from(["fat-tree:4", "leaf-spine:3,4,1", "ring:7", "linear:5"]))
def test_vectorised_search_picks_the_per_node_searchs_tree_as_loads_and_links_change(seed, steps, family):
    """The array search (new trees) and the per-node one (trees kept across a change) must
    choose the same least-loaded paths, with loads added tree by tree between searches,
    the cached arrays renumbered or rebuilt after link changes, and the load vector
    counted afresh when too many changes wait for it (a small cap here), with the cached
    layers' numbers in 16 or 32 bits."""
    rng = random.Random(seed)
    topo = T.parse(family)
    view = TopologyView.from_topology(topo)
    cache = PathCache(view)
    load = LinkLoad()
    roots = sorted(topo.switches)
    cap, trees._MAX_PENDING = trees._MAX_PENDING, rng.choice([1, 3, trees._MAX_PENDING])
    narrow, trees._NARROW = trees._NARROW, rng.choice([0, trees._NARROW])  # (0: 32-bit layers)
    try:
        _search_as_loads_and_links_change(rng, topo, view, cache, load, roots, steps)
    finally:
        trees._MAX_PENDING, trees._NARROW = cap, narrow


def _search_as_loads_and_links_change(rng, topo, view, cache, load, roots, steps) -> None:
    for _ in range(steps):
        root = rng.choice(roots)
        if root in view.switches:
            dist, preds = cache.dag(root)
            targets = set(rng.sample(sorted(dist), min(len(dist), rng.randint(1, 6))))
            got, links, deepest = _spt_vector(root, targets, cache, load)
            assert got == _spt(root, targets, preds, dist, load)
            assert deepest == _deepest_first(got, dist)
            assert sorted(links) == sorted(cache.link_ids[(p, c)] for c, p in got.items() if p is not None)
            tree = Tree(source="10.0.0.1", root=root, parent=got,
                        numbered=(cache.link_ids, links) if rng.random() < 0.5 else None)
            load.add_tree(tree, 1)
            if rng.random() < 0.2:
                load.add_tree(tree, -1)
            elif rng.random() < 0.3:  # a part of it, as a regraft changes one
                load.add_links(dict(rng.sample(sorted(got.items()), len(got) // 2)), rng.choice([1, -1]))
        link = rng.choice(topo.links)
        kind = rng.random()
        if not _flip_link(view, link, kind, 0.3, 0.6) and kind < 0.65:
            load.bump(link.a, link.b, rng.randint(1, 3))  # a load not from a tree
        if rng.random() < 0.3:  # (else changes pile up for the vector)
            vec = load.vector(cache)  # the array the search reads is the loads, link by link
            assert {k: int(vec[cache.link_id(*k)]) for k, n in load.items()} == dict(load.items())
    assert all(n >= 0 for n in load.values())
