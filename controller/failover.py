"""Fast-failover state of the trees: what protecting each tree entry takes, and the shared
entries that protection makes every switch hold.

Owns: the per-port protection pieces of the current topology (``_piece``: a detour's
first port, FF group ids, the link's tag, where it rejoins) and the parent links' pieces
(``_uplink``); each tree entry's FF groups and rejoin (``protect``, and ``fill`` for a
new tree's entries); the FF groups' users per switch (``ff_refs``, ``count``,
``recount``); the protected links in use with their detours (``guards``) and the shared
entries they want on each switch (``shared_want``: FF groups, transit and rejoin flows),
with the keys that changed since the plan last looked (``dirty``).

Does not touch: the groups and their trees' shapes (``controller.core``), what switches
are believed to hold or any message (``controller.plan``), how a detour is found
(``controller.protect``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from controller import ofmsgs
from controller.protect import IN_PORT_BIT, TO_OWN_GROUP, Detours, ff_buckets, ff_id, ff_port, is_ff, \
    rejoin_actions, tag
from controller.topoview import TopologyView
from controller.trees import SwitchEntry, Tree, _outs

_ABSENT = object()
_NOTHING: dict = {}  # (never written)
_IN_PORT_OUT = ("output", ofmsgs.ofp.OFPP_IN_PORT)  # a rejoin output back where the packet came in
_NO_ARRIVAL = -1  # a piece's arrival port where no group has a rejoin flow of its own (``nicira``)
# one tuple object for every equal out-port or FF list of an entry (``_shape``): a tree
# holds ~100 of each, mostly the same few
_SHAPES: dict[tuple, tuple] = {}
_MAX_SHAPES = 1 << 16


def _shape(t: tuple) -> tuple:
    """The one ``t`` of all equal tuples (``_SHAPES``; emptied when full: it only saves
    memory)."""
    if len(_SHAPES) >= _MAX_SHAPES:
        _SHAPES.clear()
    return _SHAPES.setdefault(t, t)


def counted(e: SwitchEntry) -> tuple[int, ...]:
    """The FF groups entry ``e`` uses: its buckets', and those its rejoin lists."""
    ff, rejoin = e[2], e[3]
    if rejoin and rejoin[2] is not TO_OWN_GROUP:
        return ff + tuple(a[1] for a in rejoin[2] if a[0] == "group" and is_ff(a[1]))
    return ff


def _without(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """``a`` less ``b`` as multisets, in ``a``'s order (each of ``b`` takes away the first
    equal one of ``a`` not yet taken)."""
    rest = list(b)
    out = []
    for f in a:
        if f in rest:
            rest.remove(f)
        else:
            out.append(f)
    return tuple(out)


class Failover:
    """The trees' fast-failover protection (see the module's docstring). ``protection``
    False: entries carry none and nothing is counted; ``nicira``: a detour ends in one
    flow per link with Open vSwitch's Nicira actions, else in one flow per group and
    link (plain OpenFlow 1.3)."""

    def __init__(self, view: TopologyView, protection: bool = True, nicira: bool = True) -> None:
        self.view = view
        self.protection = protection
        self.nicira = nicira
        self.no_ff: set[int] = set()  # switches without fast-failover groups: their links unprotected
        self.detours = Detours(view)
        self._pieces: dict[int, dict[int, tuple]] = {}  # dpid -> port -> _piece, this topology's
        self._uplinks: dict[int, dict[int, tuple]] = {}  # child -> parent -> _uplink, the same
        self._pieces_of: tuple[int, int] | None = None
        # detours dropped since the pieces were last brought up to date, and the topology
        # version the detours were caught up at (``restale``): the pieces forget only those
        self._stale_keys: set[tuple[int, int]] = set()
        self._detours_at: tuple[int, int] | None = None
        self.ff_refs: defaultdict[int, dict[int, int]] = defaultdict(dict)  # dpid -> FF id -> users
        self.guards: dict[tuple[int, int], Any] = {}  # protected (dpid, port) in use -> its Detour
        self.shared_want: defaultdict[int, dict[tuple, Any]] = defaultdict(dict)  # dpid -> entries it must hold
        self.dirty: defaultdict[int, set[tuple]] = defaultdict(set)  # dpid -> keys that may differ

    def anew(self) -> list[tuple[int, int]]:
        """Every guard's shared entries dropped, before what the pieces depend on changes
        (``nicira``, ``no_ff``); returns the guarded links, for ``reguard``."""
        keys = list(self.guards)
        for key in keys:
            self.guard(key, False)
        return keys

    def reguard(self, keys: Iterable[tuple[int, int]]) -> None:
        """The pieces made anew and the guards of ``keys`` still possible back (those
        still in use: ``recount`` keeps them)."""
        self._pieces_of = None
        self.pieces_now()
        for key in keys:
            if key[0] not in self.no_ff:
                self.guard(key, True)


    def fill(self, tree: Tree, source_port: int, nbr: dict[int, dict[int, int]]) -> None:
        """A group's first tree (``compute_tree``'s ``fill``): each switch's entry made
        once, protected as ``protect`` makes it, and its FF groups' users counted as
        ``count`` counts them, in one pass over the switches instead of four. ``nbr``:
        the view's neighbour ports, for each switch's output ports (``trees._outs``)."""
        outs = _outs(tree.parent, nbr, tree.ends)
        if not tree.entries:  # (sized once, in the same order: every switch of outs gets one)
            tree.entries = dict.fromkeys(outs)
        entries, parent = tree.entries, tree.parent
        entry = tuple.__new__  # SwitchEntry(...) without its Python-level __new__
        protect = self.protection
        self.pieces_now()
        uplinks, uplink = self._uplinks, self._uplink
        if protect:
            protection, ff_refs = self._protection, self.ff_refs
        up: tuple = ()
        for n, ports in outs.items():
            par = parent[n]
            ports.sort()
            out_ports = _shape(tuple(ports))
            if par is None:
                in_port, up = source_port, ()
            else:
                u = uplinks.get(n, _NOTHING).get(par)
                if u is None:
                    u = uplink(n, par)
                in_port, up = u
            if not protect:
                entries[n] = entry(SwitchEntry, (in_port, out_ports, (), ()))
                continue
            ff, rejoin = protection(n, in_port, out_ports, up)
            ff = _shape(ff)
            e = entries[n] = entry(SwitchEntry, (in_port, out_ports, ff, rejoin))
            used = counted(e)  # (as ``count`` counts it)
            if used:
                refs = ff_refs[n]
                for f in used:
                    c = refs.get(f, 0) + 1
                    refs[f] = c
                    if c == 1:  # (``count``)
                        if f ^ IN_PORT_BIT not in refs:
                            self.guard((n, ff_port(f)), True)
                        else:
                            self._want_ff(n, f)

    def protect(self, tree: Tree, nodes: Iterable[int] | None = None,
                    old: Tree | None = None, stale: set[tuple[int, int]] = frozenset()) -> None:
        """Rewrite ``tree.entries`` (only those of ``nodes``, if given) with fast-failover
        groups on every tree link leaving a switch that has a detour, and a rejoin flow
        where the switch's own parent link has one. Each entry needs only its own ports,
        its parent and their detours: where ``old`` (the group's previous tree) has the
        same and no detour of them is ``stale``, its protected entry is kept."""
        entries, parent = tree.entries, tree.parent
        self.pieces_now()
        uplinks, uplink, protection = self._uplinks, self._uplink, self._protection
        was, was_parent = (old.entries, old.parent) if old is not None else ({}, {})
        at = {d for d, _ in stale}  # (a stale detour's link starts at one of these)
        entry = tuple.__new__  # SwitchEntry(...) without its Python-level __new__
        for n in entries if nodes is None else nodes:
            e = entries[n]
            in_port, out_ports = e[0], e[1]
            par = parent[n]
            o = was.get(n)
            if o is not None and o[0] == in_port and o[1] == out_ports and was_parent.get(n, _ABSENT) == par \
                    and not ((n in at or par in at) and self._touches(n, par, out_ports, stale)):
                entries[n] = o
                continue
            up: tuple = ()
            if par is not None:
                u = uplinks.get(n, _NOTHING).get(par)
                up = (u if u is not None else uplink(n, par))[1]
            ff, rejoin = protection(n, in_port, out_ports, up)
            if ff != e[2] or rejoin != e[3]:
                entries[n] = entry(SwitchEntry, (in_port, out_ports, ff, rejoin))

    def _protection(self, n: int, in_port: int, out_ports: tuple[int, ...], up: tuple) -> tuple[tuple, tuple]:
        """(FF group ids, rejoin) of switch ``n``'s entry: an FF group on each output with
        a detour (the in-port variant where the detour leaves by the ingress port), and a
        rejoin flow where its parent link has a detour (``up``: the piece of the
        parent's port towards ``n``, () for none) -- into the group's ALL group (the
        piece's own rejoin, ``TO_OWN_GROUP``: shared by every tree crossing the link),
        or, where the detour arrives over one of ``n``'s own outputs, to each output (the
        arrival port as IN_PORT, protected ones through their FF group)."""
        at = self._pieces.get(n)
        if at is None:
            at = self._pieces[n] = {}
        try:
            ff = tuple([pc[2] if pc[0] == in_port else pc[1] for pc in map(at.__getitem__, out_ports) if pc])
        except KeyError:  # (a port not asked about yet in this topology)
            for q in out_ports:
                if q not in at:
                    self._piece(n, q)
            ff = tuple([pc[2] if pc[0] == in_port else pc[1] for pc in map(at.__getitem__, out_ports) if pc])
        if not up:
            return ff, ()
        arr = up[3]
        if arr not in out_ports:
            return ff, up[5]
        outs = tuple(_IN_PORT_OUT if q == arr
                     else ("group", at[q][2] if at[q][0] == arr else at[q][1]) if at[q]
                     else ("output", q) for q in out_ports)
        return ff, (arr, up[4], outs)

    def pieces_now(self) -> dict[int, dict[int, tuple]]:
        """The per-port protection pieces (``_piece``) of the current topology; the
        parent links' pieces (``_uplink``) with them. After edge changes whose detours
        were caught up (``restale``), only the pieces they touch are forgotten: those of
        the changed links' switches and of the links whose detour was dropped; otherwise
        all of them."""
        view = self.view
        version = (view.edge_count, view.removals)
        was = self._pieces_of
        if was != version:
            changes = view.edge_changes(was[0]) if (
                was is not None and was[1] == version[1] and self._detours_at == version) else None
            if changes is None:
                self._pieces.clear()
                self._uplinks.clear()
            else:
                self._forget(changes, self._stale_keys)
            self._stale_keys = set()
            self._pieces_of = version
        return self._pieces

    def _forget(self, changes: list[tuple[int, int, bool]], stale: set[tuple[int, int]]) -> None:
        """Drop the pieces and uplinks that ``changes`` (edges) and ``stale`` (links whose
        detour was dropped) may have changed; the rest still hold."""
        pieces, uplinks, nbr = self._pieces, self._uplinks, self.view.nbr_ports
        for a, b in {s for a, b, _ in changes for s in ((a, b), (b, a))}:
            pieces.pop(a, None)
            uplinks.pop(a, None)
            for x in (*nbr.get(a, ()), b):  # (whose parent link's piece is a port of a's)
                below = uplinks.get(x)
                if below is not None:
                    below.pop(a, None)
        for d, p in stale:
            at = pieces.get(d)
            if at is not None:
                at.pop(p, None)
            link = self.view.port_link.get((d, p))
            if link is not None:
                below = uplinks.get(link.far_end(d, p))
                if below is not None:
                    below.pop(d, None)
            else:  # (gone: whoever had d as parent)
                for below in uplinks.values():
                    below.pop(d, None)

    def _piece(self, dpid: int, port: int) -> tuple:
        """What protecting port ``dpid:port`` puts into the entries of every tree using
        it (``_piece_of``), computed once per topology. The caller has run
        ``restale`` (or ``pieces_now``) for this topology."""
        pc = self._piece_of(dpid, port)
        at = self._pieces.get(dpid)
        if at is None:
            at = self._pieces[dpid] = {}
        at[port] = pc
        return pc

    def _piece_of(self, dpid: int, port: int) -> tuple:
        """() when ``dpid:port`` is no link, has no detour or ``dpid`` has no FF groups
        (``no_ff``), else (the detour's first port, the FF group id, the id when the
        detour leaves by the ingress port, the arrival port at the far end, the link's
        tag, the rejoin of a tree below the link into its group's ALL group)."""
        if (dpid, port) in self.view.port_link and dpid not in self.no_ff:
            d = self.detours.get(dpid, port)
            if d is not None:
                link_tag = tag(dpid, port)
                if self.nicira:  # (the detour's one flow at its end serves every tree: ``guard``)
                    return (d.first, ff_id(port, False), ff_id(port, True), _NO_ARRIVAL, link_tag, ())
                return (d.first, ff_id(port, False), ff_id(port, True), d.arrival, link_tag,
                        (d.arrival, link_tag, TO_OWN_GROUP))
        return ()

    def _uplink(self, n: int, par: int) -> tuple:
        """What the live link from ``par`` down to ``n`` gives every tree entry at ``n``
        below it, once per topology: (``n``'s port towards ``par``, the piece (``_piece``)
        of ``par``'s port towards ``n``, () without protection). The caller has run
        ``pieces_now`` for this topology."""
        down = self.view.nbr_ports[par][n]
        at = self._pieces.get(par)
        pc = at.get(down) if at is not None else None
        if pc is None:
            pc = self._piece(par, down) if self.protection else ()
        u = (self.view.nbr_ports[n][par], pc)
        got = self._uplinks.get(n)
        if got is None:
            got = self._uplinks[n] = {}
        got[par] = u
        return u

    def _touches(self, n: int, par: int | None, outs: tuple[int, ...], stale: set[tuple[int, int]]) -> bool:
        return (par is not None and (par, self.view.nbr_ports[par].get(n)) in stale) or \
            any((n, q) in stale for q in outs)

    def recount(self, was: dict[int, SwitchEntry], now: dict[int, SwitchEntry]) -> None:
        """The FF groups' users counted from entries ``was`` to ``now`` (switch -> entry;
        either may lack a switch), every user taken off before any is added, as counting
        all of ``was`` down and all of ``now`` up would; but at a switch in both only the
        FF groups one entry uses and the other does not are counted (a spine's entry on
        leaf-spine:8,32,16 uses ~30 of them, and a reroute changes one or two)."""
        gone: dict[int, SwitchEntry] = {}
        came: dict[int, SwitchEntry] = {}
        for n, e in was.items():
            o = now.get(n)
            if o is None:
                gone[n] = e
            elif o != e:
                a, b = counted(e), counted(o)
                if a != b:  # (an entry of those FF groups alone: all that counting reads)
                    less, more = _without(a, b), _without(b, a)
                    if less:
                        gone[n] = SwitchEntry(e[0], (), less, ())
                    if more:
                        came[n] = SwitchEntry(o[0], (), more, ())
        for n, e in now.items():
            if n not in was:
                came[n] = e
        if gone:
            self.count(gone, -1)
        if came:
            self.count(came, 1)

    def count(self, entries: dict[int, SwitchEntry], step: int) -> None:
        """Keep the users of each FF group and protected link in step with the trees."""
        appear = 1 if step > 0 else 0
        for dpid, e in entries.items():
            ffs = counted(e)  # (a rejoin listing outputs may go through FF groups)
            if not ffs:
                continue
            refs = self.ff_refs[dpid]
            for f in ffs:
                n = refs.get(f, 0) + step
                if n:
                    refs[f] = n
                else:
                    del refs[f]
                if n == appear:
                    # the protected link's users: both FF groups of its port (the sibling
                    # id differs in IN_PORT_BIT only); its guard wants both again
                    if f ^ IN_PORT_BIT not in refs:
                        self.guard((dpid, ff_port(f)), step > 0)
                    else:
                        self._want_ff(dpid, f)

    def _want(self, dpid: int, key: tuple, spec: Any) -> None:
        """Set (None: drop) one shared entry ``dpid`` must hold, noting the change."""
        want = self.shared_want[dpid]
        if spec is None:
            if want.pop(key, _ABSENT) is _ABSENT:
                return
        elif want.get(key, _ABSENT) == spec:
            return
        else:
            want[key] = spec
        self.dirty[dpid].add(key)

    def _want_ff(self, dpid: int, ffid: int) -> None:
        """The FF group ``ffid`` of ``dpid`` wanted with its buckets while its link is
        guarded and a tree uses it, else dropped."""
        key = (dpid, ff_port(ffid))
        d = self.guards.get(key)
        self._want(dpid, ("ff", ffid), ff_buckets(key[1], d, bool(ffid & IN_PORT_BIT), tag(*key))
                   if d is not None and ffid in self.ff_refs.get(dpid, ()) else None)

    def guard(self, key: tuple[int, int], on: bool) -> None:
        """A protected link came into use (its detour's transit entries are wanted), went
        out of use, or (``on`` again) its detour changed."""
        link_tag = tag(*key)
        d = self.guards.pop(key, None)
        if d is not None:
            for x, i, _ in d.transit:
                self._want(x, ("transit", i, link_tag), None)
            if self.nicira:
                self._want(d.rejoin, ("rejoin", d.arrival, link_tag), None)
        if on:
            d = self.guards[key] = self.detours.get(*key)
            if d is not None:
                for x, i, o in d.transit:
                    self._want(x, ("transit", i, link_tag), (("output", o),))
                if self.nicira:
                    far_port = self.view.port_link[key].port_of(d.rejoin)
                    self._want(d.rejoin, ("rejoin", d.arrival, link_tag), rejoin_actions(far_port, ofmsgs.TABLE))
        for via in (False, True):
            self._want_ff(key[0], ff_id(key[1], via))

    def restale(self) -> set[tuple[int, int]]:
        """Detours the topology broke (or made possible): the links in use get their new
        one. Returns those links whose piece (``_piece_of``: all that an entry at either
        end takes from the detour) changed: the entries at their ends need re-protecting.
        A replaced detour keeps its first and last hop where it can (``protect.Detours``),
        and then no entry changes."""
        stale = self.detours.stale()
        self._stale_keys |= stale  # (their pieces are forgotten by ``pieces_now``)
        self._detours_at = (self.view.edge_count, self.view.removals)
        for key in stale:
            if key in self.guards:
                self.guard(key, True)
        pieces = self._pieces  # (still those the entries were made with: none forgotten yet)
        return {key for key in stale
                if pieces.get(key[0], _NOTHING).get(key[1], _ABSENT) != self._piece_of(*key)}

    def shared_intended(self, dpid: int) -> dict[tuple, Any]:
        """The shared protection entries ``dpid`` must hold now: ("ff", id) -> buckets,
        ("transit", in_port, tag) -> actions."""
        return dict(self.shared_want.get(dpid, {}))
