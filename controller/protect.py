"""Fast-failover protection of tree links, decided without a live switch (pure).

For every inter-switch link a tree uses, parent ``p`` -> child ``c`` on ``p``'s port
``port``, ``p`` holds one OFPGT_FF group shared by every group crossing the link: bucket 1
outputs on ``port``, bucket 2 sends the copy onto a *detour* (a loop-free path around the
link) with its destination MAC rewritten to the link's *tag*. Tagged copies match only
the detour's *transit* flows on the way and a *rejoin* flow at ``c`` (one per link with
Open vSwitch's Nicira actions, ``rejoin_actions``; one per group and link without them),
which gives the copy its group's MAC back and hands it to the trees' (S,G) flows there:
every receiver still gets one copy, with no controller round trip. A bridge has no
detour; its receivers wait for the reroute. Detours are shortest paths found once and
kept while they work. The design in full: docs/architecture.md, "Protection".
"""

from __future__ import annotations

from functools import lru_cache
from itertools import chain
from typing import NamedTuple

import numpy as np
from ryu.ofproto import ofproto_v1_3 as ofp

from controller.topoview import TopologyView

_ABSENT = object()

FF_BASE = 0xFFFF0000  # FF group ids: FF_BASE | (via ingress << 15) | port
IN_PORT_BIT = 1 << 15
MAX_PORT = IN_PORT_BIT - 1  # link ports above this are not protected
MAX_TAG_DPID = 0xFFFFFF  # switches with larger dpids are not protected


class Detour(NamedTuple):
    """A loop-free path around the link ``dpid:port``: ``first`` is the port it leaves
    ``dpid`` on, ``transit`` the (switch, in_port, out_port) hops in between, ``rejoin``
    the switch it ends at (the link's far end) and ``arrival`` the port it comes in on."""

    first: int
    transit: tuple[tuple[int, int, int], ...]
    rejoin: int
    arrival: int


# A rejoin flow's actions are kept without what is the group's own (its multicast MAC,
# restored first, and its ALL group's id): the same for every group, so the entries of
# all trees crossing a link share them. ``OWN_GROUP`` stands for the group's ALL group;
# ``ofmsgs.rejoin_actions`` makes them whole for one group.
OWN_GROUP = -1
TO_OWN_GROUP = (("group", OWN_GROUP),)  # the usual rejoin: on into the group's ALL group


def protectable(dpid: int, port: int) -> bool:
    return 0 < dpid <= MAX_TAG_DPID and 0 < port <= MAX_PORT


@lru_cache(maxsize=1 << 16)
def tag(dpid: int, port: int) -> str:
    """The detour MAC of link ``dpid:port``: locally administered, unicast (02:...)."""
    return (0x02 << 40 | dpid << 16 | port).to_bytes(6, "big").hex(":")


def ff_id(port: int, via_in_port: bool) -> int:
    """The FF group protecting ``port``; ``via_in_port`` when its detour leaves through the
    port the packet came in on (so the backup bucket outputs ``OFPP_IN_PORT``)."""
    return FF_BASE | (IN_PORT_BIT if via_in_port else 0) | port


def is_ff(gid: int) -> bool:
    return FF_BASE <= gid < FF_BASE + 2 * IN_PORT_BIT


def ff_port(ffid: int) -> int:
    return ffid & MAX_PORT


GROUP_MAC_BASE = "01:00:5e:00:00:00"  # an IPv4 group's MAC: this and its low 23 bits (RFC 1112)


def rejoin_actions(port: int, table: int) -> tuple:
    """The actions of a detour's last flow, at the link's far end: the copy gets its
    group's MAC back (from its destination address), its ingress becomes the link's own
    port ``port`` there, and it is looked up in ``table`` again. So the one (S,G) flow
    every tree crossing the link has on that port takes it on, and its ALL group sends it
    out of every tree port but that one -- also out of the one the detour came in by
    (OVS's resubmit alone replaces the ingress for the lookup, not for the outputs). One
    flow per link serves every group (it was one per group and link: a third of a new
    tree's messages)."""
    return (("set_field", "eth_dst", GROUP_MAC_BASE), ("move", "ipv4_dst", 0, "eth_dst", 0, 23),
            ("set_field", "in_port", port), ("resubmit", port, table))


def ff_buckets(port: int, d: Detour, via_in_port: bool, link_tag: str) -> tuple:
    """The FF group's buckets as (watch_port, actions): the link, else the detour."""
    return ((port, (("output", port),)),
            (d.first, (("set_field", "eth_dst", link_tag),
                       ("output", ofp.OFPP_IN_PORT if via_in_port else d.first))))


class Detours:
    """Detours per directed link (dpid, port), cached against the view's changes: each
    cached detour is indexed by the edges it crosses, so a failure finds the detours it
    broke without looking at the others."""

    def __init__(self, view: TopologyView) -> None:
        self.view = view
        self._paths: dict[tuple[int, int], Detour | None] = {}
        self.known = self._paths  # read-only to callers: ``get`` without the call, when cached
        self._by_edge: dict[tuple[int, int], set[tuple[int, int]]] = {}  # (lo, hi) edge -> its users
        self._none: set[tuple[int, int]] = set()  # links without a detour (bridges)
        self._around: dict[tuple[int, int], list[int] | None] = {}  # (lo, hi) -> path lo..hi
        self._pair: dict[tuple[int, int], tuple[int, int]] = {}  # (dpid, port) -> its (lo, hi)
        # (dpid, port) -> the dropped detour's node after dpid and node before the far end
        self._hint: dict[tuple[int, int], tuple[int, int]] = {}
        self._edges = view.edge_count
        self._removals = view.removals

    def stale(self) -> set[tuple[int, int]]:
        """Catch up with the view; returns the links whose detour was dropped (a removed
        edge or switch was on it, or it had none and an edge came up)."""
        view = self.view
        if view.edge_count == self._edges and view.removals == self._removals:
            return set()
        changes = view.edge_changes(self._edges)
        if changes is None or view.removals != self._removals:
            dropped = set(self._paths)
        else:
            dropped = set()
            for a, b, added in changes:
                if added:
                    dropped |= self._none
                else:
                    dropped |= self._by_edge.get((a, b) if a < b else (b, a), set())
        for key in dropped:
            d = self._paths.pop(key)
            self._around.pop(self._pair.pop(key, None), None)
            if d is None:
                self._none.discard(key)
                continue
            self._hint[key] = (d.transit[0][0] if d.transit else d.rejoin,
                               d.transit[-1][0] if d.transit else key[0])
            for e in _edges_of(key[0], d):
                users = self._by_edge[e]
                users.discard(key)
                if not users:
                    del self._by_edge[e]
        self._edges, self._removals = view.edge_count, view.removals
        return dropped

    def get(self, dpid: int, port: int) -> Detour | None:
        """The detour around link ``dpid:port`` (None: no other path, or not taggable).
        The caller runs ``stale()`` after each topology change first."""
        d = self._paths.get((dpid, port), _ABSENT)
        return self._miss(dpid, port) if d is _ABSENT else d


    def _miss(self, dpid: int, port: int) -> Detour | None:
        """A detour not cached: found, cached, and indexed by the edges it crosses."""
        key = (dpid, port)
        link = self.view.port_link.get(key)
        d = None
        far = link.far_end(dpid, port) if link is not None else None
        # (the far end's port too: the detour's last flow names it in a 16-bit resubmit)
        if far is not None and protectable(dpid, port) and link.port_of(far) <= MAX_PORT:
            # one search per link, from its lower dpid: the other direction's detour is
            # the same path backwards
            nbr = self.view.nbr_ports
            hint = self._hint.pop(key, None) if self._hint else None
            if hint is not None:  # a replacement: as close to the old one as it can be
                path = _path_around(nbr, dpid, far, hint)
            else:
                pair = self._pair[key] = (dpid, far) if dpid < far else (far, dpid)
                path = self._around.get(pair, _ABSENT)
                if path is _ABSENT:
                    path = self._around[pair] = _path_around(nbr, *pair)
            if path is not None:
                d = _detour(nbr, path if path[0] == dpid else path[::-1])
        self._paths[key] = d
        if d is None:
            self._none.add(key)
        else:
            by_edge = self._by_edge
            for e in _edges_of(dpid, d):
                users = by_edge.get(e)
                if users is None:
                    by_edge[e] = {key}
                else:
                    users.add(key)
        return d


def _edges_of(start: int, d: Detour) -> list[tuple[int, int]]:
    """The edges detour ``d`` (from ``start``) crosses, each as (lower dpid, higher)."""
    out, a = [], start
    for b, _, _ in d.transit:
        out.append((a, b) if a < b else (b, a))
        a = b
    b = d.rejoin
    out.append((a, b) if a < b else (b, a))
    return out


def _path_around(nbr: dict[int, dict[int, int]], src: int, dst: int,
                    hint: tuple[int, int] | None = None) -> list[int] | None:
    """A shortest path from ``src`` to ``dst`` without the edge between them: breadth-first
    from both ends (a whole level at a time, the smaller frontier first, meetings found by
    set intersection before the level is expanded), the meeting with the shortest total,
    then a hash of the link and the meeting: the same graph always gives
    the same detour, equally short ones are spread over the fabric, and a failure costs
    two shallow searches, not one deep one. ``hint`` (the replaced detour's node after
    ``src`` and node before ``dst``) is kept where an equally short detour allows: a new
    node before ``dst`` changes every group's rejoin flow there, a new first node the
    FF group ids of the groups entering ``src`` by either."""
    if src not in nbr or dst not in nbr:
        return None
    sides = ({src: None}, {dst: None})  # node -> its parent on that side
    hop: tuple[dict, dict] = ({src: None}, {dst: None})  # node -> its side's first hop to it
    salt = (src * 0x9E3779B1 ^ dst * 0x85EBCA77) & _M32
    depth = ({src: 0}, {dst: 0})
    fronts = [[src], [dst]]
    while fronts[0] and fronts[1]:
        side = 0 if len(fronts[0]) <= len(fronts[1]) else 1
        mine, other, far = sides[side], sides[1 - side], depth[1 - side]
        front = fronts[side]
        level = depth[side][front[0]] + 1
        hits, n = [], 0  # (u, its neighbours on the other side), how many in all
        meets = set(other).intersection  # (a set's intersection with a dict: the cheapest here)
        for u in front:
            common = meets(nbr[u])
            if common:
                hits.append((u, common))
                n += len(common)
        meet = _meeting(hits, n, (src, dst, salt), level, far, mine, hop, hint, side) if n else None
        if meet is not None:
            mine[meet[0]] = meet[1]
            head = [meet[0]]
            while sides[0][head[-1]] is not None:
                head.append(sides[0][head[-1]])
            path = head[::-1]
            while sides[1][path[-1]] is not None:
                path.append(sides[1][path[-1]])
            return path
        nxt: list[int] = []
        at, hops = depth[side], hop[side]
        for u in front:
            for v in sorted(nbr[u]):
                if v not in mine and not ((u == src and v == dst) or (u == dst and v == src)):
                    mine[v] = u
                    if hint is not None:  # (only a hint reads them)
                        hops[v] = v if mine[u] is None else hops[u]
                    at[v] = level
                    nxt.append(v)
        fronts[side] = nxt
    return None


_M32 = 0xFFFFFFFF
_MANY = 64  # meeting candidates from which the hashes are taken as arrays (measured)


def _meeting(hits: list[tuple[int, set[int]]], n: int, link: tuple[int, int, int], level: int,
             far: dict[int, int], mine: dict[int, int | None], hop: tuple[dict, dict],
             hint: tuple[int, int] | None, side: int) -> tuple[int, int] | None:
    """The meeting (v on the far side, u on this one) of ``_path_around``'s ``n``
    candidates (each u of ``hits`` with each of its v) it takes: the shortest total, then (with ``hint``) the
    fewest changed ends, then the hash, then the lowest v and u; None when every candidate
    is the link itself or a node both sides hold. Among equally short detours a hash of
    the link and the meeting, not the lowest dpids: those put every detour of a fabric
    tier through the same few links (254 of 800 on fat-tree:16), and a failure of one of
    them re-protected every tree entry that relied on them. With many candidates (a
    fat-tree:34 link has up to 528) the hashes are array operations: the same low 32 bits
    as Python's integers, so the same choice."""
    src, dst, salt = link
    if n < _MANY or hint is not None:
        best: tuple[int, int] | None = None
        low = 0
        for u, common in hits:
            for v in common:
                if v in mine or (u == src and v == dst) or (u == dst and v == src):
                    continue
                miss = 0
                if hint is not None:
                    a, b = (u, v) if side == 0 else (v, u)  # a on src's side, b on dst's
                    miss = 2 * ((hop[1][b] or a) != hint[1]) + ((hop[0][a] or b) != hint[0])
                key = ((level + far[v]) * 4 + miss) << 24 | \
                    ((v * 0xC2B2AE3D ^ u * 0x27D4EB2F ^ salt) * 0x2C1B3C6D & _M32) >> 8
                if best is None or key < low or (key == low and (v, u) < best):
                    low, best = key, (v, u)
        return best
    u64 = np.uint64
    vs = list(chain.from_iterable(common for _, common in hits))
    U = np.repeat(np.array([u for u, _ in hits], dtype=u64), [len(common) for _, common in hits])
    V = np.array(vs, dtype=u64)
    ok = ~(((U == src) & (V == dst)) | ((U == dst) & (V == src)))
    both = mine.keys() & far.keys()
    if both:
        ok &= ~np.isin(V, np.array(list(both), dtype=u64))
    if not ok.all():
        U, V = U[ok], V[ok]
        if not len(U):
            return None
        vs = V.tolist()
    hops = np.fromiter(map(far.__getitem__, vs), dtype=u64, count=len(vs))  # (level: the same for all)
    h = ((V * u64(0xC2B2AE3D) ^ U * u64(0x27D4EB2F) ^ u64(salt)) * u64(0x2C1B3C6D) & u64(_M32)) >> u64(8)
    key = hops << u64(26) | h
    at = np.flatnonzero(key == key.min())
    i = int(at[0]) if len(at) == 1 else int(at[np.lexsort((U[at], V[at]))[0]])
    return int(V[i]), int(U[i])


def _detour(nbr: dict[int, dict[int, int]], path: list[int]) -> Detour:
    """The detour along ``path`` (its first node to its last, the link's two ends)."""
    hops = []
    for i in range(1, len(path) - 1):
        x = path[i]
        at = nbr[x]
        hops.append((x, at[path[i - 1]], at[path[i + 1]]))
    return _new_detour(Detour, (nbr[path[0]][path[1]], tuple(hops), path[-1], nbr[path[-1]][path[-2]]))


_new_detour = tuple.__new__  # (Detour's own __new__ is a Python frame per detour)
