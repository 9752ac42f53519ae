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

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from operator import itemgetter
from typing import Callable, Iterable, Iterator, NamedTuple

import networkx as nx
import numpy as np
from networkx.algorithms.approximation import steiner_tree

from controller.errors import EmptyReceivers, ReceiverIsSource, Unreachable
from controller.topoview import TopologyView, check_unicast, known_hosts

ALGORITHMS = ("spt", "steiner")
DirectedLink = tuple[int, int]
Preds = tuple[int, ...]  # a switch's predecessors on shortest paths from a root, sorted


class SwitchEntry(NamedTuple):
    """What one switch does for one group: accept on ``in_port``, copy to ``out_ports``
    (sorted, so equal entries compare equal). With protection (``controller.protect``)
    ``ff`` names the fast-failover groups the ALL group's buckets for protected ports go
    through (in port order; the port is in each id), and ``rejoin`` is the flow taking
    detoured copies back into the group here: (arrival port, link tag, actions)."""

    in_port: int
    out_ports: tuple[int, ...]
    ff: tuple[int, ...] = ()
    rejoin: tuple = ()


@dataclass
class Tree:
    source: str
    root: int | None  # the source's switch
    parent: dict[int, int | None] = field(default_factory=dict)  # switch -> parent switch
    entries: dict[int, SwitchEntry] = field(default_factory=dict)
    reached: frozenset[str] = frozenset()
    unreachable: frozenset[str] = frozenset()
    # (a PathCache's link numbering, the numbers of this tree's links) when the search
    # had them: the load vector adds and removes the tree without looking its links up
    numbered: tuple[dict, list[int]] | None = field(default=None, repr=False, compare=False)
    # the reached receivers' (switch, port) and the view's ``attach`` when computed:
    # ``regraft`` repairs the tree in place of a new search while both still hold
    ends: frozenset[tuple[int, int]] = field(default=frozenset(), repr=False, compare=False)
    attach: int = field(default=-1, repr=False, compare=False)
    # the switches deepest first (equal depths in ``parent``'s order), when the search
    # knew their depths: a new tree is installed leaves first without sorting it again
    leaves_first: list[int] | None = field(default=None, repr=False, compare=False)
    # the group's ``members`` count (``core.Group``) when its receivers were these: equal
    # counts tell ``regraft`` the receivers are the tree's without comparing the sets
    # (two cold hash tables per tree: ~50 cache misses per regraft on leaf-spine:8,32,16)
    members: int = field(default=-1, repr=False, compare=False)

    def links(self) -> set[DirectedLink]:
        """Directed inter-switch links (parent, child) the group's packets cross."""
        return {(p, c) for c, p in self.parent.items() if p is not None}

    def depth(self, dpid: int) -> int:
        d = 0
        while self.parent.get(dpid) is not None:
            dpid = self.parent[dpid]  # type: ignore[assignment]
            d += 1
        return d

    def depths(self) -> dict[int, int]:
        """Every switch's hop count from the root, in one pass (installs go leaves first)."""
        depth: dict[int, int] = {}
        parent = self.parent
        for n in parent:
            path = []
            while n not in depth:
                p = parent[n]
                if p is None:
                    depth[n] = 0
                    break
                path.append(n)
                n = p
            d = depth[n]
            for m in reversed(path):
                d += 1
                depth[m] = d
        return depth


class LinkLoad:
    """Groups crossing each directed link (parent, child), stored child -> parent -> count:
    the tree search reads a node's incoming loads in its inner loop, ~10^3 times per tree,
    and a nested dict read is cheaper than hashing a tuple key. Reads like a Counter keyed
    by (parent, child)."""

    def __init__(self, counts: dict[DirectedLink, int] | None = None) -> None:
        self.into: dict[int, dict[int, int]] = {}
        # links (child -> parent, with a tree's link numbers when it has them) added
        # (step 1) or taken off (-1) since ``vector`` last ran
        self.pending: list[tuple[dict[int, int | None], tuple | None, int]] = []
        self._vec: np.ndarray | None = None
        self._ids: dict[DirectedLink, int] | None = None  # the link numbering _vec is in
        for (p, c), n in (counts or {}).items():
            self.bump(p, c, n)

    def bump(self, p: int, c: int, delta: int) -> None:
        into = self.into.get(c)
        if into is None:
            into = self.into[c] = {}
        into[p] = into.get(p, 0) + delta
        self._vec = None  # (not a tree's links: recount from ``into``)

    def add_tree(self, tree: "Tree", step: int) -> None:
        """Add (1) or take off (-1) a tree's links: ~10^5 links per 1000 groups, so the
        nested-dict update is one plain loop (``add_links``) and the vector catches up
        from ``pending``."""
        self.add_links(tree.parent, step, tree.numbered)

    def add_links(self, links: dict[int, int | None], step: int, numbered: tuple | None = None) -> None:
        """Add (1) or take off (-1) links given as child -> parent (None: no link), each
        once: a tree's, or the part of one that a ``regraft`` changed."""
        _bump(self.into, links, step)
        self.noted(links, step, numbered)

    def noted(self, links: dict[int, int | None], step: int, numbered: tuple | None = None) -> None:
        """Links already added to ``into`` (as a ``regraft`` counts them): the vector
        catches up from ``pending``."""
        if self._vec is not None and links:
            if len(self.pending) >= _MAX_PENDING:  # (no new tree for a long while)
                self._vec = None  # counted afresh from ``into`` when next asked
                self.pending.clear()
            else:
                self.pending.append((links, numbered, step))

    def vector(self, cache: "PathCache") -> np.ndarray:
        """The loads as an array indexed by ``cache``'s link numbers (0: no link, load 0),
        for the vectorised search. Every loaded link has a number (one is given to a link
        the first time a tree crosses it), so links numbered later start at 0."""
        ids = cache.link_ids
        vec = self._vec
        if vec is None or self._ids is not ids:
            vec = np.zeros(len(ids) + 1, dtype=np.int64)
            loaded = [(cache.link_id(p, c), n) for c, ps in self.into.items() for p, n in ps.items()]
            vec = _grown(vec, len(ids))
            for i, n in loaded:
                vec[i] = n
            self.pending.clear()  # (counted in ``into`` already)
        elif self.pending:
            get, link_id = ids.get, cache.link_id
            for links, num, step in self.pending:
                if num is not None and num[0] is ids:
                    idx = num[1]
                else:
                    idx = [get((p, c)) or link_id(p, c) for c, p in links.items() if p is not None]
                vec = _grown(vec, len(ids))
                vec[idx] += step  # (each link once)
            self.pending.clear()
        vec = self._vec = _grown(vec, len(ids))
        self._ids = ids
        return vec

    def __getitem__(self, link: DirectedLink) -> int:
        return self.into.get(link[1], _NO_LOAD).get(link[0], 0)

    def items(self) -> Iterator[tuple[DirectedLink, int]]:
        return (((p, c), n) for c, ps in self.into.items() for p, n in ps.items())

    def values(self) -> Iterator[int]:
        return (n for ps in self.into.values() for n in ps.values())


def _bump(into: dict[int, dict[int, int]], links: dict[int, int | None], step: int) -> None:
    """``into[child][parent] += step`` for each link of ``links`` (child -> parent or None)."""
    for c, p in links.items():
        if p is not None:
            loads = into.get(c)
            if loads is None:
                loads = into[c] = {}
            loads[p] = loads.get(p, 0) + step


_NO_LOAD: dict[int, int] = {}
_NARROW = 1 << 16  # up to this many switches and links, the layers' numbers are 16-bit
_ROWS = np.arange(1 << 12)  # row numbers, shared by the layers (views of it)
_MAX_PENDING = 1 << 14  # link changes waiting for the vector: reroutes alone would grow it forever


def _grown(vec: np.ndarray, top: int) -> np.ndarray:
    """``vec`` with room for index ``top`` (new room zero)."""
    if len(vec) > top:
        return vec
    return np.concatenate([vec, np.zeros(top + 1024 - len(vec), dtype=vec.dtype)])


class PathCache:
    """Hop-count BFS layers from each source switch, reused across groups: most groups
    share few source switches. A link change patches the cached layers instead of
    clearing them (a failure must not pay one BFS per source switch of every affected
    group): removing a link that leaves its far end another shortest-path predecessor, or
    adding one between adjacent layers, only edits a predecessor list; the last change
    since the previous catch-up is also repaired when distances move (``_regrow``,
    ``_shrink``: the view's graph is the one after it); an earlier one that moves
    distances drops that source's entry. A switch leaving drops everything. New trees'
    search reads the DAGs as arrays (``layers``)."""

    def __init__(self, view: TopologyView) -> None:
        self.view = view
        self._removals = -1
        self._edges = 0
        self._dags: dict[int, tuple[dict[int, int], dict[int, Preds]]] = {}
        self._shared: dict[Preds, Preds] = {}  # the DAGs' equal predecessor tuples, one object each
        self._layers: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}
        # numbers for the vectorised search, never reused: switches from 1 (0 stands for
        # "no predecessor"), directed links from 1 (0: "no link", load 0)
        self.node_ids: dict[int, int] = {}
        self.dpids: list[int] = [0]  # node number -> dpid
        self.link_ids: dict[DirectedLink, int] = {}
        self._grid: tuple[np.ndarray, np.ndarray] | None = None
        self._dpid_array = np.zeros(1, dtype=np.uint64)  # node number -> dpid, with ``_grid``

    def node_id(self, dpid: int) -> int:
        i = self.node_ids.get(dpid)
        if i is None:
            i = self.node_ids[dpid] = len(self.dpids)
            self.dpids.append(dpid)
        return i

    def link_id(self, p: int, c: int) -> int:
        i = self.link_ids.get((p, c))
        if i is None:
            i = self.link_ids[(p, c)] = len(self.link_ids) + 1
        return i

    def _neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """The live graph as two node-number x widest-degree arrays: each switch's
        neighbours in dpid order and the links from them to it (0-padded); rebuilt after
        a topology change, when the first new tree asks."""
        if self._grid is None:
            nbr, nid, link_id = self.view.nbr_ports, self.node_ids, self.link_id
            for n in sorted(nbr.keys() | self.view.switches):
                if n not in nid:
                    self.node_id(n)
            width = max([len(ps) for ps in nbr.values()], default=0) or 1
            around = np.zeros((len(self.dpids), width), dtype=np.intp)
            links = np.zeros((len(self.dpids), width), dtype=np.intp)
            for n, ps in nbr.items():
                i, row = nid[n], sorted(ps)
                around[i, :len(row)] = [nid[p] for p in row]
                links[i, :len(row)] = [link_id(p, n) for p in row]
            self._grid = (around, links)
            self._dpid_array = np.array(self.dpids, dtype=np.uint64)
        return self._grid

    def layers(self, root: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """The root's DAG as arrays, one tuple per hop count >= 1: (node numbers, their
        predecessors' node numbers and the links from them, taken from the neighbour
        arrays, 0-padded to the layer's most, row numbers). Predecessors stay in dpid
        order, so the first least cost of a row is the lowest dpid, as in ``_spt``."""
        dist, _preds = self.dag(root)  # (catches up first: stale layers are gone)
        hit = self._layers.get(root)
        if hit is None:
            nid = self.node_ids
            if any(n not in nid for n in dist):  # (a switch that came without links)
                self._grid = None
            around, links = self._neighbours()
            nodes = np.fromiter([nid[n] for n in dist], dtype=np.intp, count=len(dist))
            hops = np.fromiter(dist.values(), dtype=np.intp, count=len(dist))  # (BFS order)
            at = np.full(len(self.dpids), -2, dtype=np.intp)
            at[nodes] = hops
            nb = around[nodes]
            pred = at[nb] == (hops - 1)[:, None]
            first = np.argsort(~pred, axis=1, kind="stable")  # predecessors first, in order
            p_ids = np.take_along_axis(np.where(pred, nb, 0), first, 1)
            l_ids = np.take_along_axis(np.where(pred, links[nodes], 0), first, 1)
            count = pred.sum(1)
            cuts = np.searchsorted(hops, np.arange(1, int(hops[-1]) + 2))
            hit = []
            # numbers in as few bytes as today's count needs (numbers are never reused,
            # so they stay below it): these arrays are a cache per source switch
            num = np.uint16 if max(len(self.dpids), len(self.link_ids) + 1) <= _NARROW else np.int32
            for lo, hi in zip(cuts.tolist(), cuts[1:].tolist()):
                width = int(count[lo:hi].max())
                # copies as narrow as the layer needs: a slice would keep the whole
                # node x widest-degree arrays alive, per root (~0.75 MB on fat-tree:34)
                hit.append((nodes[lo:hi].copy(), p_ids[lo:hi, :width].astype(num),
                            l_ids[lo:hi, :width].astype(num), _ROWS[:hi - lo] if hi - lo <= len(_ROWS)
                            else np.arange(hi - lo)))
            self._layers[root] = hit
        return hit

    def _catch_up(self) -> None:
        view = self.view
        self._layers.clear()  # (rebuilt from the patched DAGs when next asked)
        self._grid = None
        changes = view.edge_changes(self._edges)
        if view.removals != self._removals or changes is None:
            self._dags.clear()
            self._shared.clear()
        else:
            for i, (a, b, added) in enumerate(changes):
                # (the view's graph is the DAG's only after the last change)
                adj = view.nbr_ports if i == len(changes) - 1 else None
                for root, (dist, preds) in list(self._dags.items()):
                    if not _patch(dist, preds, a, b, added, adj):
                        del self._dags[root]
        self._removals, self._edges = view.removals, view.edge_count

    def refresh(self) -> None:
        """Patch the cached DAGs to the view now: a change is patched (not dropped) when
        it is the last one since the previous catch-up, so the core calls this on every
        link that comes up (the following failure would otherwise find two changes)."""
        if self._removals != self.view.removals or self._edges != self.view.edge_count:
            self._catch_up()

    def dag(self, root: int) -> tuple[dict[int, int], dict[int, Preds]]:
        """(distance, predecessors on some shortest path) for every switch reachable from root."""
        self.refresh()
        hit = self._dags.get(root)
        if hit is None:
            hit = self._dags[root] = self._bfs(root)
        return hit

    def _bfs(self, root: int) -> tuple[dict[int, int], dict[int, Preds]]:
        """(distance, predecessors on some shortest path, a sorted tuple) of every switch
        reachable from ``root``, breadth-first (a layer in node-number order), a layer at
        a time on the neighbour arrays: node by node in Python it was a sixth of building
        1,000 trees on fat-tree:34 (3.1 ms a source switch; 1.3 ms so). Equal predecessor
        tuples are one object (``_shared``): most switches have the same ones from most
        roots, and a list per switch per root was half of the controller's memory."""
        around, _ = self._neighbours()
        r = self.node_ids.get(root)
        if r is None or r >= len(around):  # (a switch newer than the arrays)
            self._grid = None
            around, _ = self._neighbours()
            r = self.node_ids.get(root)
            if r is None:
                return {root: 0}, {root: ()}
        at = np.full(len(around), -1, dtype=np.intp)
        at[0] = -2  # (the padding: never reached, never one hop nearer)
        at[r] = 0
        frontier, found = np.array([r], dtype=np.intp), []
        hop = 0
        while True:
            nb = around[frontier].ravel()
            nb = nb[at[nb] == -1]
            if not len(nb):
                break
            hop += 1
            at[nb] = hop
            frontier = np.flatnonzero(at == hop)  # (each once, in number order)
            found.append(frontier)
        if not found:
            return {root: 0}, {root: ()}
        dpids = self._dpid_array
        nodes = np.concatenate(found)
        hops = at[nodes]
        near = around[nodes]
        is_pred = at[near] == (hops - 1)[:, None]
        flat = dpids[near[is_pred]].tolist()  # (row by row, each in dpid order)
        names = dpids[nodes].tolist()
        dist = dict(zip([root] + names, [0] + hops.tolist()))
        preds: dict[int, Preds] = {root: ()}
        get, i = self._shared.setdefault, 0
        for n, c in zip(names, is_pred.sum(1).tolist()):
            t = tuple(flat[i:i + c])
            i += c
            preds[n] = get(t, t)
        return dist, preds


def _with(preds: Preds, p: int) -> Preds:
    """``preds`` with ``p`` added in order (a new tuple: the old one may be shared)."""
    i = bisect_left(preds, p)
    return preds[:i] + (p,) + preds[i:]


def _patch(dist: dict[int, int], preds: dict[int, Preds], a: int, b: int, added: bool,
           adj: dict[int, dict[int, int]] | None = None) -> bool:
    """Apply one edge change to a BFS DAG in place; False when distances may change (and
    the DAG is to be recomputed). With ``adj``, the graph after the change, a removal
    that takes a node's only predecessor is repaired too (``_regrow``)."""
    da, db = dist.get(a), dist.get(b)
    if da is None and db is None:
        return True  # both outside the root's component, and they stay so together
    if da is None or db is None:
        if not added:
            return True  # an edge from outside the component cannot be in it
        if adj is None:
            return False  # another component joins
        _shrink(dist, preds, adj, b if da is not None else a, (da if da is not None else db) + 1)
        return True
    if da == db:
        return True  # same layer: on no shortest path
    near, far = (a, b) if da < db else (b, a)
    if abs(da - db) > 1:
        if adj is None:
            return False  # a shortcut: distances shrink
        _shrink(dist, preds, adj, far, dist[near] + 1)
        return True
    if added:
        preds[far] = _with(preds[far], near)
        return True
    preds[far] = tuple(p for p in preds[far] if p != near)
    if preds[far]:
        return True
    if adj is None:
        return False  # its only predecessor went: distances grow
    _regrow(dist, preds, adj, far)
    return True


def _regrow(dist: dict[int, int], preds: dict[int, Preds], adj: dict[int, dict[int, int]],
            far: int) -> None:
    """``far`` lost its only shortest-path predecessor: the nodes all of whose shortest
    paths ran through it get new distances from their neighbours that keep theirs
    (breadth-first in distance order), instead of one new search from the root (a
    failure next to a source's switch would otherwise cost a whole search per source)."""
    gone, frontier = {far}, [far]
    while frontier:  # a node is gone when all its predecessors are (layer by layer)
        nxt = []
        for u in frontier:
            du = dist[u] + 1
            for v in adj.get(u, ()):
                if v not in gone and dist.get(v) == du and all(p in gone for p in preds[v]):
                    gone.add(v)
                    nxt.append(v)
        frontier = nxt
    for x in gone:
        del dist[x]
        del preds[x]
    last = next(reversed(dist.values()))  # (the root is never gone)
    queue = []
    for x in gone:
        ds = [dist[y] for y in adj.get(x, ()) if y in dist]
        if ds:
            queue.append((min(ds) + 1, x))
    heapify(queue)
    ordered = not queue or queue[0][0] >= last  # (they come back in distance order, after the rest)
    while queue:
        d, x = heappop(queue)
        if x in dist:
            continue
        dist[x] = d
        for y in adj[x]:
            if y in gone and y not in dist:
                heappush(queue, (d + 1, y))
    _repred(dist, preds, adj, gone, ordered)


def _shrink(dist: dict[int, int], preds: dict[int, Preds], adj: dict[int, dict[int, int]],
            far: int, d: int) -> None:
    """A new edge brings ``far`` to distance ``d``, closer than before (or into the
    component): breadth-first from it over the nodes that come closer too (a link coming
    back next to a source's switch would otherwise cost a whole search per source)."""
    dist[far] = d
    closer, frontier = {far}, [far]
    while frontier:
        nxt = []
        for x in frontier:
            dx = dist[x] + 1
            for y in adj.get(x, ()):
                dy = dist.get(y)
                if dy is None or dy > dx:
                    dist[y] = dx
                    closer.add(y)
                    nxt.append(y)
        frontier = nxt
    _repred(dist, preds, adj, closer)


def _repred(dist: dict[int, int], preds: dict[int, Preds], adj: dict[int, dict[int, int]],
            moved: set[int], ordered: bool = False) -> None:
    """Predecessors again for the nodes whose distance changed and their neighbours, and
    the distances back in BFS order (the layers rely on it) unless ``ordered`` says they
    are (a failure re-sorted all ~1,445 of every affected source's on fat-tree:34)."""
    for v in {y for x in moved for y in adj.get(x, ())} | moved:
        dv = dist.get(v)
        if dv is not None and dv > 0:
            preds[v] = tuple(sorted(y for y in adj[v] if dist.get(y) == dv - 1))
    if ordered:
        return
    order = sorted(dist.items(), key=itemgetter(1))
    dist.clear()
    dist.update(order)


def compute_tree(view: TopologyView, source: str, receivers: Iterable[str],
                 algorithm: str = "spt", load: LinkLoad | Counter[DirectedLink] | None = None,
                 cache: PathCache | None = None, strict: bool = False,
                 keep: dict[int, int | None] | None = None,
                 fill: Callable[[Tree, int, dict[int, dict[int, int]]], None] | None = None) -> Tree:
    """Tree from ``source`` to ``receivers``. Unreachable receivers are listed in
    ``Tree.unreachable`` (or raise ``Unreachable`` when ``strict``); unknown hosts,
    the source among its receivers and an empty receiver set raise.

    ``keep`` is the group's current tree (switch -> parent): with ``spt`` every part of it
    that is still a live shortest path is kept, so a failure or a join changes only the
    branches it must, and running flows are not moved.

    ``fill`` makes the entries instead (called with the tree, its ``ends`` set, then the
    source's port and the view's neighbour ports: a switch's output ports are its
    children's and its ends', ``_outs``): the core builds a new tree's protected entries
    and its bookkeeping in that one pass, in ``parent``'s order."""
    source = check_unicast(source, "source")
    hosts = view.hosts
    # (known hosts' addresses are normalised already: the core's groups are sets of them)
    rset = known_hosts(receivers, hosts)
    known = rset is not None
    if rset is None:
        rset = {check_unicast(r, "receiver") for r in receivers}
    if not rset:
        raise EmptyReceivers("a multicast tree needs at least one receiver")
    if source in rset:
        raise ReceiverIsSource(f"receiver {source} is the group's source")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown tree algorithm {algorithm!r}; use one of {ALGORITHMS}")
    src = view.host(source)
    locs: dict | None = None  # (None: every receiver is a known host, hosts[r])
    if not (known or rset <= hosts.keys()):
        locs = {}
        for r in sorted(rset):
            loc = hosts.get(r)  # (checked above: ``view.host`` would check each again)
            locs[r] = loc if loc is not None else view.host(r)  # (raises UnknownHost)
    if not isinstance(load, LinkLoad):
        load = LinkLoad(load)  # a plain Counter from a caller
    tree = Tree(source=source, root=src.dpid if view.host_attached(src) else None, attach=view.attach)
    if tree.root is None:
        tree.unreachable = frozenset(rset)
    else:
        if algorithm == "spt":
            cache = cache or PathCache(view)
            dist, preds = cache.dag(tree.root)
            live, down = view.switches, view.ports_down  # (``view.host_attached``, inlined)
            targets: dict | None = None  # (None: every receiver is reached)
            if locs is None:  # every switch with a receiver checked once, not every receiver
                found = [hosts[r] for r in rset]
                tset = {loc.dpid for loc in found}
                if down or not (tset <= live and dist.keys() >= tset):
                    locs = dict(zip(rset, found))
            if locs is not None:
                targets = {r: loc for r, loc in locs.items() if loc.dpid in dist and loc.dpid in live
                           and (not down or (loc.dpid, loc.port) not in down)}
                found = list(targets.values())
                tset = {loc.dpid for loc in found}
            if keep and keep.get(tree.root, 0) is None:
                tree.parent = _spt(tree.root, tset, preds, dist, load, keep)
            else:
                cache = cache or PathCache(view)
                tree.parent, links, deepest = _spt_vector(tree.root, tset, cache, load)
                tree.numbered = (cache.link_ids, links)
                if fill is not None:  # (a first tree: the core installs it whole)
                    tree.leaves_first = deepest
        else:
            comp = nx.node_connected_component(view.graph, tree.root)
            targets = {r: loc for r, loc in (locs or {r: hosts[r] for r in rset}).items()
                       if view.host_attached(loc) and loc.dpid in comp}
            found = list(targets.values())
            tdpids = {loc.dpid for loc in found}
            # (the root's component only: Mehlhorn fails on a partitioned fabric)
            tree.parent = _steiner(view.graph.subgraph(comp), tree.root, tdpids, load)
            # Mehlhorn is a 2-approximation: on some graphs the shortest-path tree has
            # fewer links. "steiner" promises the fewest links we can find, so take it then.
            dist, preds = (cache or PathCache(view)).dag(tree.root)
            spt = _spt(tree.root, tdpids, preds, dist, load)
            if len(spt) < len(tree.parent):
                tree.parent = spt
        if targets is not None and len(targets) < len(rset):
            tree.reached, tree.unreachable = frozenset(targets), frozenset(rset.difference(targets))
        else:  # (all of them: an immutable set given is shared, as a group's receivers are)
            tree.reached, tree.unreachable = rset if type(rset) is frozenset else frozenset(rset), frozenset()
        _fill_entries(view, tree, src.port, found, fill)
        if algorithm == "spt" and fill is not None and tree.leaves_first is None:  # (as above, for a
            tree.leaves_first = _deepest_first(tree.parent, dist)  # kept tree: depths are the DAG's distances)
    if strict and tree.unreachable:
        raise Unreachable(f"no live path from {source} to {', '.join(sorted(tree.unreachable))}",
                          tree.unreachable)
    return tree


def _spt(root: int, targets: set[int], preds: dict[int, Preds], dist: dict[int, int],
         load: LinkLoad, keep: dict[int, int | None] | None = None
         ) -> dict[int, int | None]:
    """Each target walks back along shortest-path predecessors choosing, at every hop,
    the predecessor whose path to the root carries the least total group load.
    One best predecessor per node makes the union of paths a tree by construction.
    Nodes of ``keep`` whose kept path is still shortest cost nothing: new branches
    graft onto the existing tree."""
    cost: dict[int, int] = {root: 0}
    choice: dict[int, int | None] = {root: None}
    if keep:
        for n in sorted((n for n in keep if n in dist), key=dist.__getitem__):
            p = keep[n]
            if p is not None and p in cost and p in preds[n]:
                cost[n], choice[n] = 0, p
    _settle([t for t in targets if t not in cost], cost, choice, preds, dist, load)
    parent: dict[int, int | None] = {root: None}
    for t in sorted(targets):
        n = t
        while n not in parent:
            p = choice[n]
            parent[n] = p
            n = p  # type: ignore[assignment]
    return parent


def _settle(todo: list[int], cost: dict[int, int], choice: dict[int, int | None],
            preds: dict[int, Preds], dist: dict[int, int], load: LinkLoad) -> None:
    """Least-loaded path choices for the switches of ``todo`` (targets not in ``cost``)
    and their ancestors not in ``cost`` (a kept tree stops the walk up) that could be
    chosen, nearest to the root first: ``cost`` and ``choice`` get them. An unkept
    predecessor is looked into only when its link's load alone (a path costs at least
    that) beats the best kept predecessor's, or ties it with a lower dpid."""
    seen = set(todo)
    seen.update(cost)
    into = load.into
    for n in todo:  # grows while iterated
        ps = preds[n]
        into_n = into.get(n, _NO_LOAD)
        best = min(((into_n.get(p, 0), p) for p in ps if p in cost), default=None)  # (load, dpid) kept
        for p in ps:
            if p not in seen and (best is None or (into_n.get(p, 0), p) < best):
                seen.add(p)
                todo.append(p)
    todo.sort(key=dist.__getitem__)
    for n in todo:
        ps = preds[n]
        into_n = into.get(n, _NO_LOAD)
        if len(ps) == 1:
            p = ps[0]
            cost[n], choice[n] = cost[p] + into_n.get(p, 0), p
            continue
        bc, bp = -1, None  # preds are sorted: the first of equal costs is the lowest dpid
        for p in ps:
            c = cost.get(p)
            if c is not None:  # (else a predecessor that cannot be chosen: above)
                c += into_n.get(p, 0)
                if bp is None or c < bc:
                    bc, bp = c, p
        cost[n], choice[n] = bc, bp


def regraft(view: TopologyView, old: Tree, receivers: set[str] | frozenset[str] | None, load: LinkLoad,
               cache: PathCache) -> tuple[Tree, set[int]] | None:
    """The tree ``compute_tree(view, old.source, receivers, "spt", load, cache,
    keep=old.parent)`` gives, with ``old``'s links counted in ``load`` (not taken off
    first), built by changing only the part of ``old`` that lost its shortest path (a
    failure changes ~7 of a tree's ~100 switches on fat-tree:16). Returns it with the
    switches whose entry may differ from ``old``'s (those gone included); ``load`` then
    counts the new tree instead of the old one. Its other entries are ``old``'s,
    protection included; the changed ones are unprotected. None, with ``load``
    untouched, when it does not apply: ``old`` is not a complete spt tree to exactly
    ``receivers`` (None: the caller knows they are its, ``Tree.members``), a host's
    attachment may have changed since (``view.attach``), or a receiver is cut off.

    Why the same tree: the search keeps exactly the switches whose kept path to the root
    is still a shortest path, i.e. those with no link on it that is no longer a
    shortest-path link (``broken`` below: the switches below such a link), settles the
    remaining targets' ancestors by the same ``_settle`` (which reads the loads of links
    into unkept switches only: those are taken off here first, as the search's caller
    takes off the whole old tree) and is the union of the targets' paths. Here the kept
    switches start the tree, the unkept targets walk up from their choices, and kept
    switches left with no target below are peeled off from the cut upwards: the same
    union (every leaf of ``old`` is a target)."""
    root = old.root
    if root is None or old.unreachable or old.attach != view.attach or not old.ends or (
            receivers is not None and old.reached != receivers):
        return None
    dist, preds = cache.dag(root)
    was = old.parent
    # the switches whose kept path to the root is no longer a shortest path: those below
    # a link that is not (or no longer live) and the switches below them
    get, none = preds.get, ()
    broken = [n for n, p in was.items() if p is not None and p not in get(n, none)]
    if not broken:
        return Tree(old.source, root, dict(was), dict(old.entries), old.reached, old.unreachable,
                    ends=old.ends, attach=old.attach, members=old.members), set()
    kids = _children(was)
    cut = set(broken)
    for n in broken:  # grows while iterated
        for c in kids.get(n, none):
            if c not in cut:
                cut.add(c)
                broken.append(c)
    targets = {d for d, _ in old.ends}
    lost = [t for t in targets if t in cut]
    if any(t not in dist for t in lost):
        return None  # cut off: unreachable now
    load.add_links({n: was[n] for n in broken}, -1)
    parent = dict(was)
    for n in broken:
        del parent[n]
    cost = dict.fromkeys(parent, 0)
    choice: dict[int, int | None] = {}
    _settle(list(lost), cost, choice, preds, dist, load)
    walked: dict[int, int | None] = {}
    for t in sorted(lost):
        n = t
        while n not in parent:
            p = choice[n]
            parent[n] = walked[n] = p
            n = p  # type: ignore[assignment]
    pruned: dict[int, int | None] = {}
    cuts = {was[n] for n in broken if was[n] not in cut} - targets  # kept, lost a child
    cuts.discard(root)
    if cuts:
        below = Counter(parent.values())  # children in the new tree
        for m in cuts:
            while m in parent and not below[m] and m != root and m not in targets:
                p = parent.pop(m)
                pruned[m] = p
                below[p] -= 1
                m = p
    load.add_links(walked, 1)
    load.add_links(pruned, -1)
    # what may differ: switches gone or moved, and those that lost or gained a child
    gone = [n for n in broken if n not in walked] + list(pruned)
    changed = set(walked).union(gone, walked.values(), (was[n] for n in broken), pruned.values())
    entries = dict(old.entries)
    for n in gone:
        del entries[n]
    adopted = _children(walked)  # new parent -> its walked children
    nbr = view.nbr_ports
    redo = {}  # switch -> its new output ports: its children, kept and new, and receivers
    for n in changed:
        if n in parent:
            to = nbr[n]
            redo[n] = [to[c] for c in kids.get(n, none) if c in parent and c not in walked] + \
                [to[c] for c in adopted.get(n, none)]
    for d, port in old.ends:
        if d in redo:
            redo[d].append(port)
    entry = tuple.__new__
    for n, ports in redo.items():
        par = parent[n]
        ports.sort()
        entries[n] = entry(SwitchEntry, (old.entries[root][0] if par is None else nbr[n][par], tuple(ports), (), ()))
    return Tree(old.source, root, parent, entries, old.reached, old.unreachable,
                ends=old.ends, attach=old.attach, members=old.members), changed


def _children(links: dict[int, int | None]) -> dict[int | None, list[int]]:
    """Parent -> children of a child -> parent map."""
    kids: dict[int | None, list[int]] = {}
    for c, p in links.items():
        if p in kids:
            kids[p].append(c)
        else:
            kids[p] = [c]
    return kids


_FAR = 1 << 60  # the cost of "no predecessor" (padding): never the least


def _spt_vector(root: int, targets: set[int], cache: PathCache, link_load: LinkLoad
                   ) -> tuple[dict[int, int | None], np.ndarray, list[int]]:
    """``_spt`` without a kept tree, a layer of the DAG at a time as array operations:
    every switch's least-loaded path cost and choice, then the tree's switches marked
    from the deepest layer up (a switch is in it when it is a target or the choice of
    one in it). The same choices as ``_spt`` (ties to the lowest dpid), ~5x cheaper:
    the per-node loop in Python was the search's cost. Returns the tree (switch ->
    parent, the root first, then a layer at a time), its links' numbers and its
    switches deepest first (ties in ``parent``'s order: ``_deepest_first``)."""
    layers = cache.layers(root)
    load = link_load.vector(cache)  # (after the layers: they may number new links)
    size, ids, dpids = len(cache.dpids), cache.node_ids, cache.dpids
    cost = np.full(size, _FAR, dtype=np.int64)
    choice = np.zeros(size, dtype=np.intp)
    uplink = np.zeros(size, dtype=np.intp)
    cost[ids[root]] = 0
    for nodes, preds, links, rows in layers:
        c = cost[preds]
        c += load[links]
        best = c.argmin(1)
        cost[nodes] = c[rows, best]
        choice[nodes] = preds[rows, best]
        uplink[nodes] = links[rows, best]
    mark = np.zeros(size, dtype=bool)
    mark[[ids[t] for t in targets]] = True
    below, above, used = [], [], []  # per layer, deepest first: the tree's switches, parents, links
    for nodes, _, _, _ in reversed(layers):
        sel = nodes[mark[nodes]]
        if len(sel):
            up = choice[sel]
            mark[up] = True
            below.append(list(map(dpids.__getitem__, sel.tolist())))
            above.append(map(dpids.__getitem__, up.tolist()))
            used.append(uplink[sel])
    parent: dict[int, int | None] = {root: None}
    for kids, ups in zip(reversed(below), reversed(above)):
        parent.update(zip(kids, ups))
    deepest = [n for kids in below for n in kids]
    deepest.append(root)
    return parent, np.concatenate(used) if used else np.zeros(0, dtype=np.intp), deepest


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


def _deepest_first(parent: dict[int, int | None], dist: dict[int, int]) -> list[int]:
    """``parent``'s switches by decreasing ``dist``, ties in ``parent``'s order (what a
    stable sort gives), bucketed: depths are a few hops."""
    by: list[list[int]] = []
    for n in parent:
        d = dist[n]
        while len(by) <= d:
            by.append([])
        by[d].append(n)
    return [n for level in reversed(by) for n in level]


def _outs(parent: dict[int, int | None], nbr: dict[int, dict[int, int]],
             ends: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    """Each switch of the tree (in ``parent``'s order) -> its output ports, unsorted: the
    port towards each child, then the receivers' (switch, port) ``ends``."""
    outs: dict[int, list[int]] = {n: [] for n in parent}
    for child, par in parent.items():
        if par is not None:
            outs[par].append(nbr[par][child])  # (one port per child)
    for dpid, port in ends:
        outs[dpid].append(port)
    return outs


def crossing(parents: dict[int, dict[int, int | None]], below: dict[int, list[int]]
                 ) -> dict[int, list[DirectedLink]]:
    """Group id -> the links (parent, child) of ``below`` (child -> its parents) that the
    group's tree crosses (``parents``: group id -> its tree's child -> parent), in
    ``parents``' order and each group's in ``below``'s. What the core asks on a failure
    instead of keeping an index of each link's groups."""
    found: dict[int, list[DirectedLink]] = {}
    for gid, parent in parents.items():
        get = parent.get
        for c, ps in below.items():
            p = get(c)
            if p is not None and p in ps:
                if gid in found:
                    found[gid].append((p, c))
                else:
                    found[gid] = [(p, c)]
    return found


def _fill_entries(view: TopologyView, tree: Tree, source_port: int, receivers: Iterable,
                  fill: Callable[[Tree, int, dict[int, dict[int, int]]], None] | None = None) -> None:
    nbr, parent = view.nbr_ports, tree.parent
    tree.ends = frozenset([loc.at for loc in receivers])  # (hosts may share a port)
    if fill is not None:
        fill(tree, source_port, nbr)
        return
    outs = _outs(parent, nbr, tree.ends)
    entry, entries = tuple.__new__, tree.entries  # SwitchEntry(...) without its Python __new__
    for n, ports in outs.items():
        par = parent[n]
        ports.sort()
        entries[n] = entry(SwitchEntry, (source_port if par is None else nbr[n][par], tuple(ports), (), ()))
