"""Multicast distribution trees over the live switch graph.

Two algorithms:
- ``spt``: source-rooted shortest-path tree (fewest hops to every receiver, as PIM-SSM
  would build). Among equal-hop paths it picks the one with the least group load, so many
  groups on one fabric spread over parallel links instead of piling onto the first one.
- ``steiner``: networkx's Mehlhorn 2-approximation of the minimum Steiner tree (fewest
  links in total; paths may be longer than shortest), with the same load tie-break; the
  shortest-path tree instead where that one has fewer links (the approximation can miss).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

import networkx as nx
from networkx.algorithms.approximation import steiner_tree

from controller.errors import EmptyReceivers, ReceiverIsSource, Unreachable
from controller.topoview import TopologyView, check_unicast

ALGORITHMS = ("spt", "steiner")
DirectedLink = tuple[int, int]


class SwitchEntry(NamedTuple):
    """What one switch does for one group: accept on ``in_port``, copy to ``out_ports``
    (sorted, so equal entries compare equal)."""

    in_port: int
    out_ports: tuple[int, ...]


@dataclass
class Tree:
    source: str
    root: int | None  # the source's switch
    parent: dict[int, int | None] = field(default_factory=dict)  # switch -> parent switch
    entries: dict[int, SwitchEntry] = field(default_factory=dict)
    reached: frozenset[str] = frozenset()
    unreachable: frozenset[str] = frozenset()

    def links(self) -> set[DirectedLink]:
        """Directed inter-switch links (parent, child) the group's packets cross."""
        return {(p, c) for c, p in self.parent.items() if p is not None}

    def depth(self, dpid: int) -> int:
        d = 0
        while self.parent.get(dpid) is not None:
            dpid = self.parent[dpid]  # type: ignore[assignment]
            d += 1
        return d


class PathCache:
    """Hop-count BFS layers from each source switch, reused across groups until the
    topology changes (``TopologyView.version``): most groups share few source switches."""

    def __init__(self, view: TopologyView) -> None:
        self.view = view
        self._version = -1
        self._dags: dict[int, tuple[dict[int, int], dict[int, list[int]]]] = {}

    def dag(self, root: int) -> tuple[dict[int, int], dict[int, list[int]]]:
        """(distance, predecessors on some shortest path) for every switch reachable from root."""
        if self._version != self.view.version:
            self._dags.clear()
            self._version = self.view.version
        hit = self._dags.get(root)
        if hit is None:
            adj = self.view.graph.adj
            dist = {root: 0}
            preds: dict[int, list[int]] = {root: []}
            frontier = [root]
            while frontier:
                nxt = []
                for u in frontier:
                    du = dist[u] + 1
                    for v in adj[u]:
                        dv = dist.get(v)
                        if dv is None:
                            dist[v] = du
                            preds[v] = [u]
                            nxt.append(v)
                        elif dv == du:
                            preds[v].append(u)
                frontier = nxt
            for p in preds.values():
                p.sort()  # deterministic tie-breaks
            hit = self._dags[root] = (dist, preds)
        return hit


def compute_tree(view: TopologyView, source: str, receivers: Iterable[str],
                 algorithm: str = "spt", load: Counter[DirectedLink] | None = None,
                 cache: PathCache | None = None, strict: bool = False,
                 keep: dict[int, int | None] | None = None) -> Tree:
    """Tree from ``source`` to ``receivers``. Unreachable receivers are listed in
    ``Tree.unreachable`` (or raise ``Unreachable`` when ``strict``); unknown hosts,
    the source among its receivers and an empty receiver set raise.

    ``keep`` is the group's current tree (switch -> parent): with ``spt`` every part of it
    that is still a live shortest path is kept, so a failure or a join changes only the
    branches it must, and running flows are not moved."""
    source = check_unicast(source, "source")
    rset = {check_unicast(r, "receiver") for r in receivers}
    if not rset:
        raise EmptyReceivers("a multicast tree needs at least one receiver")
    if source in rset:
        raise ReceiverIsSource(f"receiver {source} is the group's source")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown tree algorithm {algorithm!r}; use one of {ALGORITHMS}")
    src = view.host(source)
    locs = {r: view.host(r) for r in sorted(rset)}
    load = load if load is not None else Counter()
    tree = Tree(source=source, root=src.dpid if view.host_attached(src) else None)
    if tree.root is None:
        tree.unreachable = frozenset(rset)
    else:
        if algorithm == "spt":
            dist, preds = (cache or PathCache(view)).dag(tree.root)
            targets = {r: loc for r, loc in locs.items()
                       if view.host_attached(loc) and loc.dpid in dist}
            tree.parent = _spt(tree.root, {loc.dpid for loc in targets.values()}, preds, load,
                               keep if keep and keep.get(tree.root, 0) is None else None,
                               dist)
        else:
            comp = nx.node_connected_component(view.graph, tree.root)
            targets = {r: loc for r, loc in locs.items()
                       if view.host_attached(loc) and loc.dpid in comp}
            tdpids = {loc.dpid for loc in targets.values()}
            tree.parent = _steiner(view.graph, tree.root, tdpids, load)
            # Mehlhorn is a 2-approximation: on some graphs the shortest-path tree has
            # fewer links. "steiner" promises the fewest links we can find, so take it then.
            dist, preds = (cache or PathCache(view)).dag(tree.root)
            spt = _spt(tree.root, tdpids, preds, load, None, dist)
            if len(spt) < len(tree.parent):
                tree.parent = spt
        tree.reached = frozenset(targets)
        tree.unreachable = frozenset(rset - set(targets))
        _fill_entries(view, tree, src.port, targets.values())
    if strict and tree.unreachable:
        raise Unreachable(f"no live path from {source} to {', '.join(sorted(tree.unreachable))}",
                          tree.unreachable)
    return tree


def _spt(root: int, targets: set[int], preds: dict[int, list[int]],
         load: Counter[DirectedLink], keep: dict[int, int | None] | None = None,
         dist: dict[int, int] | None = None) -> dict[int, int | None]:
    """Each target walks back along shortest-path predecessors choosing, at every hop,
    the predecessor whose path to the root carries the least total group load.
    One best predecessor per node makes the union of paths a tree by construction.
    Nodes of ``keep`` whose kept path is still shortest cost nothing: new branches
    graft onto the existing tree."""
    best: dict[int, tuple[int, int | None]] = {root: (0, None)}  # node -> (cost, chosen pred)
    if keep and dist:
        for n in sorted((n for n in keep if n in dist), key=dist.__getitem__):
            p = keep[n]
            if p is not None and p in best and p in preds[n]:
                best[n] = (0, p)

    def resolve(node: int) -> None:  # iterative: predecessors are resolved first
        stack = [node]
        while stack:
            n = stack[-1]
            if n in best:
                stack.pop()
                continue
            ps = preds[n]
            waiting = [p for p in ps if p not in best]
            if waiting:
                stack.extend(waiting)
                continue
            stack.pop()
            bc, bp = -1, None
            for p in ps:  # preds are sorted: the first of equal costs is the lowest dpid
                c = best[p][0] + load[(p, n)]
                if bp is None or c < bc:
                    bc, bp = c, p
            best[n] = (bc, bp)

    parent: dict[int, int | None] = {root: None}
    for t in sorted(targets):
        resolve(t)
        n = t
        while n not in parent:
            p = best[n][1]
            parent[n] = p
            n = p  # type: ignore[assignment]
    return parent


def _steiner(graph: nx.Graph, root: int, targets: set[int],
             load: Counter[DirectedLink]) -> dict[int, int | None]:
    terminals = {root} | targets
    if len(terminals) == 1:
        return {root: None}
    biggest = max(load.values(), default=0) + 1
    scale = biggest * max(graph.number_of_nodes(), 1)

    def weight(u: int, v: int, _d: dict) -> float:
        return 1.0 + (load[(u, v)] + load[(v, u)]) / scale

    weighted = nx.Graph()
    weighted.add_weighted_edges_from((u, v, weight(u, v, d)) for u, v, d in graph.edges(data=True))
    st = steiner_tree(weighted, sorted(terminals), weight="weight", method="mehlhorn")
    if root not in st:  # single-terminal components come back empty
        st.add_node(root)
    parent: dict[int, int | None] = {root: None}
    for u, v in nx.bfs_edges(st, root):
        parent[v] = u
    # Mehlhorn can leave non-terminal leaves: prune them so no link carries useless copies.
    children = Counter(p for p in parent.values() if p is not None)
    leaves = [n for n in parent if children[n] == 0 and n not in terminals]
    while leaves:
        n = leaves.pop()
        p = parent.pop(n)
        if p is not None:
            children[p] -= 1
            if children[p] == 0 and p not in terminals:
                leaves.append(p)
    return parent


def _fill_entries(view: TopologyView, tree: Tree, source_port: int, receivers: Iterable) -> None:
    adj = view.graph.adj
    outs: dict[int, set[int]] = {n: set() for n in tree.parent}
    for child, par in tree.parent.items():
        if par is not None:
            outs[par].add(adj[par][child]["ports"][par])
    for loc in receivers:
        outs[loc.dpid].add(loc.port)
    for n, ports in outs.items():
        par = tree.parent[n]
        in_port = source_port if par is None else adj[n][par]["ports"][n]
        tree.entries[n] = SwitchEntry(in_port, tuple(sorted(ports)))
