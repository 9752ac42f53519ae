"""The controller's pure core: groups, trees, and what each switch must be told.

Inputs are method calls (topology events, group requests); outputs are ``Plan``s of
OpenFlow messages. Nothing here touches Ryu's event loop or a socket, so the same code
runs in the Ryu app, the simulated fabric tests and the benchmark.

The core keeps ``installed``: what it believes each switch holds for each group. Every
change computes the desired per-switch state and diffs it against that belief, so group
edits, topology changes and a switch returning with empty tables are one mechanism.
"""

from __future__ import annotations

import gc
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Iterator

from controller import ofmsgs
from controller.addressing import check_model, check_ssm, ssm_address
from controller.errors import Conflict, CoreError, ReceiverIsSource, UnknownGroup
from controller.protect import (IN_PORT_BIT, TO_OWN_GROUP, Detours, ff_buckets, ff_id, ff_port,
                                is_ff, rejoin_actions, tag)
from controller.topoview import TopologyView, check_unicast, known_hosts
from controller.trees import ALGORITHMS, LinkLoad, PathCache, SwitchEntry, Tree, compute_tree, regraft
from controller.trees import _outs
from controller.trees import crossing as _crossing

log = logging.getLogger("modelcast.core")
DEFAULT_PORT = 5500
MAX_GID = 0x7FFEFFFF  # its turn group id (ofmsgs.turn_id) stays below the fast-failover ids (protect.FF_BASE)
UNKNOWN_PORT = -1  # in a believed entry: "whatever is there is wrong", never sent
_ABSENT = object()
_IN_PORT_OUT = ("output", ofmsgs.ofp.OFPP_IN_PORT)  # a rejoin output back where the packet came in
_NOTHING: dict = {}  # (never written)
_NO_ARRIVAL = -1  # a piece's arrival port where no group has a rejoin flow of its own (``nicira``)
_SHARED_PRIO = {"transit": ofmsgs.PRIO_DETOUR, "rejoin": ofmsgs.PRIO_REJOIN}  # a shared detour flow's
_SHARED_KIND = {prio: kind for kind, prio in _SHARED_PRIO.items()}  # (read back off a switch)
# one tuple object for every equal out-port or FF list of an entry (``_shape``): a tree
# holds ~100 of each, mostly the same few, so every tree used to hold its own copies
_SHAPES: dict[tuple, tuple] = {}
_MAX_SHAPES = 1 << 16


def _shape(t: tuple) -> tuple:
    """The one ``t`` of all equal tuples (``_SHAPES``; emptied when full: it only saves
    memory)."""
    if len(_SHAPES) >= _MAX_SHAPES:
        _SHAPES.clear()
    return _SHAPES.setdefault(t, t)


def _shared_msg(dpid: int, key: tuple, want: Any, have: Any) -> Any:
    """The message taking shared entry ``key`` of ``dpid`` from ``have`` to ``want``
    (either ``_ABSENT``): ("ff", id) an FF group, ("transit" | "rejoin", in_port, tag)
    a detour flow."""
    if want is _ABSENT:
        return ofmsgs.group_delete(dpid, key[1]) if key[0] == "ff" else \
            ofmsgs.detour_flow_delete(dpid, ofmsgs.COOKIE_DETOUR, key[1], key[2], priority=_SHARED_PRIO[key[0]])
    if key[0] == "ff":
        return ofmsgs.ff_group(dpid, key[1], want, ofmsgs.ofp.OFPGC_ADD if have is _ABSENT else ofmsgs.ofp.OFPGC_MODIFY)
    return ofmsgs.detour_flow(dpid, ofmsgs.COOKIE_DETOUR, key[1], key[2], want, priority=_SHARED_PRIO[key[0]])



def _counted(e: SwitchEntry) -> tuple[int, ...]:
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


def tune_gc() -> None:
    """The core holds large long-lived state (an entry per switch per group). With
    CPython's default thresholds the older generations, i.e. all of it, are rescanned
    every few thousand allocations, and a reroute that builds a few hundred messages then
    stalls for 100-250 ms (measured on fat-tree:16 with 1000 groups). Older generations
    are therefore collected rarely (gen1 after 10,000 young passes, i.e. every ~10^7
    allocations; gen2 after 1000 of those). The young generation stays small: a pass
    visits everything its objects point to, and on that state (fat-tree:16, 1000 groups,
    2026-12-02) a young pass during the reroutes took ~20 ms at a 10,000-object
    threshold (in 4 of 100 reroutes: the p99) but ~1-2 ms at 1,000, with the same total
    collection time in the build (~0.08 s, longest pause 2-3 ms -> 0.2-0.5 ms). A
    100,000-object threshold had put a ~45 ms pause into 1-2 of 100 reroutes. Called
    once by the controller and by the benchmark."""
    gc.set_threshold(1000, 10_000, 1000)


@dataclass
class SwitchState:
    """What a switch reports holding of ours: group id -> entry (None when its buckets
    are not what we install), the (group id, in_port) of each (S,G) flow, each group's
    rejoin flows (arrival port, tag, actions), and the shared protection entries
    (``("ff", id)`` -> buckets, ``("transit", in_port, tag)`` -> actions)."""

    groups: dict[int, SwitchEntry | None] = field(default_factory=dict)
    flows: set[tuple[int, int]] = field(default_factory=set)
    rejoins: dict[int, list[tuple]] = field(default_factory=dict)
    shared: dict[tuple, Any] = field(default_factory=dict)
    # turn groups (ofmsgs.turn_id) left by a move cut short: deleted first, with the
    # flows pointing at them (those flows are not in ``flows``: the diff rewrites them)
    turns: set[int] = field(default_factory=set)

    def ingress(self) -> dict[int, set[int]]:
        """Group id -> the in_ports of its (S,G) flows (one pass: tables hold thousands)."""
        out: dict[int, set[int]] = {}
        for gid, port in self.flows:
            out.setdefault(gid, set()).add(port)
        return out

    @classmethod
    def from_tables(cls, flows: Iterable[tuple[int, int, dict[str, Any], tuple]],
                    groups: dict[int, tuple[int, list[tuple[int, tuple]]]],
                    known: Iterable[int] = ()) -> "SwitchState":
        """Read our state out of a switch's tables: ``flows`` as (cookie, priority, match,
        actions), ``groups`` as group id -> (type, per-bucket (watch_port, actions)), in
        ``ofmsgs.actions``' normalised form. A group is ours when one of our (S,G) flows
        points at it, the core knows its id, or it is in the fast-failover id range; others
        are left alone."""
        state = cls()
        turned: set[int] = set()  # groups with an (S,G) flow pointing at their turn group
        for ck, prio, match, acts in flows:
            in_port = match.get("in_port")
            if ck & ofmsgs.COOKIE_MASK != ofmsgs.COOKIE_TAG or in_port is None:
                continue
            gid = ck & ~ofmsgs.COOKIE_MASK
            if prio == ofmsgs.PRIO_SG and 0 < gid <= MAX_GID:
                if any(a[0] == "group" and ofmsgs.is_turn(a[1]) for a in acts):
                    turned.add(gid)
                else:
                    state.flows.add((gid, in_port))
            elif prio in _SHARED_KIND and "eth_dst" in match:
                if ck == ofmsgs.COOKIE_DETOUR:
                    state.shared[(_SHARED_KIND[prio], in_port, match["eth_dst"])] = acts
                elif prio == ofmsgs.PRIO_DETOUR and 0 < gid <= MAX_GID:
                    state.rejoins.setdefault(gid, []).append((in_port, match["eth_dst"], acts))
        ours = {gid for gid, _ in state.flows} | set(known) | set(state.rejoins)
        ingress = state.ingress()
        for gid, (gtype, bucket_list) in groups.items():
            if ofmsgs.is_turn(gid):  # (another application's group with that bit: left alone)
                if gid & ~ofmsgs.TURN_BIT in ours or gid & ~ofmsgs.TURN_BIT in turned:
                    state.turns.add(gid)
                continue
            if is_ff(gid):
                state.shared[("ff", gid)] = tuple(bucket_list) if gtype == ofmsgs.ofp.OFPGT_FF else None
                continue
            if gid not in ours:
                continue
            ins = ingress.get(gid, set())
            ports, ffs = [], []
            for _watch, acts in bucket_list:
                kind, value = acts[0][:2] if len(acts) == 1 else ("?", None)
                if kind == "group" and is_ff(value):
                    ffs.append(value)
                    value = ff_port(value)
                elif kind != "output":
                    value = None
                ports.append(value)
            if gtype != ofmsgs.ofp.OFPGT_ALL or None in ports or (
                    ofmsgs.ofp.OFPP_IN_PORT in ports and len(ins) != 1):
                state.groups[gid] = None
            else:
                out = {next(iter(ins)) if p == ofmsgs.ofp.OFPP_IN_PORT else p for p in ports}
                rj = state.rejoins.get(gid, [])
                state.groups[gid] = SwitchEntry(min(ins) if ins else UNKNOWN_PORT, tuple(sorted(out)),
                                                tuple(sorted(ffs, key=ff_port)), rj[0] if len(rj) == 1 else ())
        return state


@dataclass
class Group:
    gid: int
    model: str
    source: str
    address: str
    port: int
    algorithm: str
    # replaced, never changed in place: a tree that reaches them all keeps the same set
    # as ``Tree.reached`` (~4 KB less per group)
    receivers: frozenset[str] = field(default_factory=frozenset)
    tree: Tree | None = None
    # bumped at every change of ``receivers``: a tree computed at the same count
    # (``Tree.members``) is for exactly these receivers
    members: int = field(default=0, repr=False, compare=False)

    def receiver_state(self, ip: str) -> str:
        """'routed' when the tree reaches the receiver, else 'unreachable'."""
        return "routed" if self.tree is not None and ip in self.tree.reached else "unreachable"

    def to_dict(self) -> dict[str, Any]:
        """The persistent definition (trees are recomputed, never stored)."""
        return {"id": self.gid, "model": self.model, "source": self.source,
                "address": self.address, "port": self.port, "algorithm": self.algorithm,
                "receivers": sorted(self.receivers),
                # the tree's shape (child, parent), so a restart keeps the installed tree
                "tree": sorted([c, p] for c, p in self.tree.parent.items() if p is not None)
                if self.tree is not None else []}


@dataclass
class Plan:
    """Messages in phases: every phase must be acknowledged (barrier) by the switches
    before the next starts. Phase 0 builds the new paths, phase 1 switches traffic onto
    them in place, phase 2 removes what no tree uses any more (make-before-break)."""

    phases: list[list[tuple[int, Any]]] = field(default_factory=lambda: [[], [], []])
    groups: set[int] = field(default_factory=set)  # groups whose switch state this changes

    def messages(self) -> list[tuple[int, Any]]:
        return [m for phase in self.phases for m in phase]

    def switches(self) -> set[int]:
        return {dpid for dpid, _ in self.messages()}

    def extend(self, other: "Plan") -> "Plan":
        for mine, theirs in zip(self.phases, other.phases):
            mine.extend(theirs)
        self.groups |= other.groups
        return self

    def __len__(self) -> int:
        return sum(len(p) for p in self.phases)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return iter(self.messages())


class MulticastCore:
    def __init__(self, view: TopologyView | None = None, algorithm: str = "spt",
                 udp_port: int = DEFAULT_PORT, balance: bool = True, protection: bool = True,
                 nicira: bool = True) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown tree algorithm {algorithm!r}; use one of {ALGORITHMS}")
        self.view = view or TopologyView()
        self.algorithm = algorithm
        self.udp_port = udp_port
        self.balance = balance  # False: load-blind trees (the benchmark's baseline)
        # fast-failover protection of tree links (controller.protect); False: failures
        # are handled by the controller's reroute alone
        self.protection = protection
        # True: a detour ends in one flow per link, with Open vSwitch's Nicira actions
        # (protect.rejoin_actions); False: in one flow per group and link, plain OpenFlow
        # 1.3, for switches without them (a third more messages per new tree)
        self.nicira = nicira
        self.no_ff: set[int] = set()  # switches without fast-failover groups: their links unprotected
        # False: a first tree goes through _protect, _swap and the general diff (tests)
        self.one_pass = True
        self.detours = Detours(self.view)
        self._pieces: dict[int, dict[int, tuple]] = {}  # dpid -> port -> _piece, this topology's
        self._uplinks: dict[int, dict[int, tuple]] = {}  # child -> parent -> _uplink, the same
        self._pieces_of: tuple[int, int] | None = None
        self._near_of: Any = None  # (the stale set whose switches ``_near`` holds)
        self._near: set[int] = set()
        # detours dropped since the pieces were last brought up to date, and the topology
        # version the detours were caught up at (``_restale``): the pieces forget only those
        self._stale_keys: set[tuple[int, int]] = set()
        self._detours_at: tuple[int, int] | None = None
        # dpid -> shared protection entries the switch holds (FF groups, transit flows)
        self.shared: dict[int, dict[tuple, Any]] = {}
        self.ff_refs: defaultdict[int, dict[int, int]] = defaultdict(dict)  # dpid -> FF id -> users
        self.guards: dict[tuple[int, int], Any] = {}  # protected (dpid, port) in use -> its Detour
        self.through: defaultdict[int, set[tuple[int, int]]] = defaultdict(set)  # dpid -> guards crossing it
        self.shared_want: defaultdict[int, dict[tuple, Any]] = defaultdict(dict)  # ... they must hold
        self._dirty: defaultdict[int, set[tuple]] = defaultdict(set)  # dpid -> keys that may differ
        self.groups: dict[int, Group] = {}
        # gid -> its tree's parent map (groups with a tree): what a failure scans for the
        # groups crossing a link (``_crossing``), without visiting each group and tree
        self._parents: dict[int, dict[int, int | None]] = {}
        # dpid -> gid -> entry, for switches with a live control channel: messages go only
        # to these. A restored controller knows the topology before switches reconnect;
        # until one does, nothing is sent to it and nothing of it is torn down.
        self.installed: dict[int, dict[int, SwitchEntry]] = {}
        self.load = LinkLoad()  # directed link -> groups crossing it
        self.cache = PathCache(self.view)
        # indexes, so that a request costs the same with 10 or 10,000 groups
        # gid -> dpids in installed (a dict used as an ordered set: half a set's memory)
        self.placed: defaultdict[int, dict[int, None]] = defaultdict(dict)
        self._by_key: dict[tuple[str, str], int] = {}  # (model, source) -> gid
        self._by_model: defaultdict[str, set[int]] = defaultdict(set)
        self._by_addr: defaultdict[str, set[int]] = defaultdict(set)
        # dpid -> how many times the belief about it changed: a table read (audit) that
        # started before a change cannot be compared with the belief after it
        self.changes: defaultdict[int, int] = defaultdict(int)
        self._next_gid = 1
        self._saved_trees: dict[int, dict[int, int | None]] = {}  # restored, not yet rebuilt

    # -- groups ------------------------------------------------------------------------
    def group(self, gid: int) -> Group:
        try:
            return self.groups[int(gid)]
        except (KeyError, ValueError, TypeError):
            raise UnknownGroup(f"no group with id {gid!r}") from None

    def find(self, model: str, source: str) -> Group | None:
        gid = self._by_key.get((model, source))
        return None if gid is None else self.groups[gid]

    def _add(self, g: Group) -> None:
        self.groups[g.gid] = g
        self._by_key[(g.model, g.source)] = g.gid
        self._by_model[g.model].add(g.gid)
        self._by_addr[g.address].add(g.gid)

    def _remove(self, g: Group) -> None:
        del self.groups[g.gid]
        self._parents.pop(g.gid, None)
        del self._by_key[(g.model, g.source)]
        for index, key in ((self._by_model, g.model), (self._by_addr, g.address)):
            index[key].discard(g.gid)
            if not index[key]:
                del index[key]

    def create_group(self, model: str, source: str, receivers: Iterable[str] = (),
                     algorithm: str | None = None, address: str | None = None,
                     port: int | None = None, gid: int | None = None) -> tuple[Group, Plan]:
        """Create the (source, model) group, or return the existing one unchanged.
        Receivers may be added now or later. Hosts the controller has not seen yet are
        accepted: the group waits for them (``controller.hosts`` looks for them) and
        routes them as soon as they are found."""
        model = check_model(model)
        source = check_unicast(source, "source")
        algorithm = algorithm or self.algorithm
        if algorithm not in ALGORITHMS:
            raise CoreError(f"unknown tree algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
        known = known_hosts(receivers, self.view.hosts)
        rset = frozenset(known) if known is not None else frozenset([check_unicast(r, "receiver") for r in receivers])
        if source in rset:
            raise ReceiverIsSource(f"receiver {source} is the group's source")
        existing = self.find(model, source)
        if existing is not None:
            return existing, Plan()
        if address is None:
            address = self._address_for(model)
        else:
            address = check_ssm(address)
            clash = self._by_address(address)
            if clash is not None and clash.model != model:
                raise Conflict(f"address {address} is used by model {clash.model!r}")
        if gid is None:
            gid = self._next_gid
        elif gid in self.groups:
            raise Conflict(f"group id {gid} is in use")
        if not 1 <= gid <= MAX_GID:
            raise CoreError(f"group id {gid} outside 1..{MAX_GID}")
        self._next_gid = max(self._next_gid, gid + 1)
        g = Group(gid, model, source, address, port or self.udp_port, algorithm, rset)
        self._add(g)
        return g, self._sync([gid])

    def delete_group(self, gid: int) -> Plan:
        g = self.group(gid)
        self._set_tree(g, None)
        plan = self._diff([g.gid])
        self._remove(g)
        if not self.placed.get(gid, True):  # (an empty leftover per deleted group, otherwise)
            del self.placed[gid]
        return plan

    def join(self, gid: int, ip: str) -> Plan:
        g = self.group(gid)
        ip = check_unicast(ip, "receiver")
        if ip == g.source:
            raise ReceiverIsSource(f"receiver {ip} is the group's source")
        if ip in g.receivers:
            return Plan()
        g.receivers = g.receivers | {ip}
        g.members += 1
        return self._sync([g.gid])

    def leave(self, gid: int, ip: str) -> Plan:
        g = self.group(gid)
        ip = check_unicast(ip, "receiver")
        if ip not in g.receivers:
            return Plan()
        g.receivers = g.receivers - {ip}
        g.members += 1
        return self._sync([g.gid])

    # -- topology events ---------------------------------------------------------------
    def switch_enter(self, dpid: int, present: "SwitchState | None" = None) -> Plan:
        """A switch (re)connected. Without ``present`` it is assumed empty and gets its
        whole share of every tree. With ``present`` (what the switch reported holding of
        ours, after a controller restart or a control-channel flap) only the differences
        are fixed, so delivery through a healthy switch never stops."""
        self._forget_installed(dpid)
        self.installed[dpid] = {}
        self.changes[dpid] += 1
        stale = Plan()
        if present is not None:
            ingress = present.ingress()
            for gid, entry in present.groups.items():
                g = self.groups.get(gid)
                if g is None:  # a group we no longer have: deleting it deletes its flows
                    stale.phases[2].append((dpid, ofmsgs.group_delete(dpid, gid)))
                    continue
                ins = sorted(ingress.get(gid, ()))
                rejoin = entry.rejoin if entry is not None else ()
                if rejoin:  # (kept as the trees keep it; actions not the group's stay as read: wrong)
                    kept = ofmsgs.rejoin_kept(rejoin[2], g.address, gid)
                    if kept is not None:
                        rejoin = (rejoin[0], rejoin[1], kept)
                # An unreadable entry or several flows: believe "wrong", so the diff rewrites it.
                self.installed[dpid][gid] = SwitchEntry(
                    ins[0] if len(ins) == 1 else UNKNOWN_PORT,
                    entry.out_ports if entry is not None else (UNKNOWN_PORT,),
                    entry.ff if entry is not None else (), rejoin)
                self.placed[gid][dpid] = None
            self.shared[dpid] = dict(present.shared)
        plan = Plan()
        if present is not None:  # before anything might add one of the same id again
            plan.phases[0].extend((dpid, ofmsgs.group_delete(dpid, t)) for t in sorted(present.turns))
        plan.extend(self._after_up() if self.view.add_switch(dpid) else Plan())
        plan.extend(self.sync_switch(dpid))
        if present is not None:  # flows on ingress ports the tree no longer uses
            for gid, in_port in sorted(present.flows):
                have = self.installed[dpid].get(gid)
                g = self.groups.get(gid)
                if g is not None and gid in present.groups and (have is None or have.in_port != in_port):
                    stale.phases[2].append((dpid, ofmsgs.flow_delete(dpid, gid, in_port, g.source, g.address)))
            for gid, found in sorted(present.rejoins.items()):  # rejoin flows not intended
                have = self.installed[dpid].get(gid)
                g = self.groups.get(gid)
                for arrival, link_tag, _acts in found:
                    if g is None:  # (a group we no longer have: every flow of its cookie)
                        stale.phases[2].append((dpid, ofmsgs.cookie_delete(dpid, gid)))
                        break
                    if have is None or have.rejoin[:2] != (arrival, link_tag):
                        stale.phases[2].append((dpid, ofmsgs.detour_flow_delete(
                            dpid, ofmsgs.cookie(gid), arrival, link_tag, g.source, g.address)))
        return plan.extend(stale)

    def switch_leave(self, dpid: int) -> Plan:
        """The switch is gone (or its control channel is, past the app's grace period)."""
        self._forget_installed(dpid)
        if not self.view.remove_switch(dpid):
            return Plan()
        # (the groups whose tree crosses it, found by a scan: a switch leaving is rare, and
        # an index of them cost a set insertion per switch of every new tree)
        return self._after_down({gid for gid, parent in self._parents.items() if dpid in parent})

    def link_add(self, a: int, a_port: int, b: int, b_port: int) -> Plan:
        return self._after_up() if self.view.add_link(a, a_port, b, b_port) else Plan()

    def link_remove(self, a: int, a_port: int, b: int, b_port: int) -> Plan:
        if not self.view.remove_link(a, a_port, b, b_port):
            return Plan()
        # every tree crossing the link crosses something no longer live; the trees that
        # cross a link whose detour the failure changed are found in the same scan
        reguard = self._restale() if self.protection else set()
        lost = ((a, b), (b, a))
        crossing = self._crossing(lost + tuple(self._stale_links(reguard)))
        return self._sync(sorted(gid for gid, links in crossing.items() if lost[0] in links or lost[1] in links),
                          (reguard, crossing))

    def port_down(self, dpid: int, port: int) -> Plan:
        return self.ports_down(dpid, [port])

    def ports_down(self, dpid: int, ports: Iterable[int]) -> Plan:
        """Ports of one switch went down together (a reconnecting switch reports them all
        at once): one reroute for all of them. One per port would be wrong in a single
        plan: plans run phase by phase together, so a tree moved by the first port and
        moved back by the next would have phase 2 delete the flows it is back on."""
        lost: list[tuple[int, int]] = []  # (both directions of each link: one scan for all)
        hosts: set[str] = set()
        went = False
        for port in ports:
            if not self.view.port_down(dpid, port):
                continue
            went = True
            link = self.view.port_link.get((dpid, port))
            if link is not None:
                lost += ((link.a, link.b), (link.b, link.a))
            else:
                hosts.update(self.view.hosts_at(dpid, port))
        affected = set(self._crossing(lost))
        if hosts:
            affected |= {g.gid for g in self.groups.values() if g.source in hosts or hosts & g.receivers}
        return self._after_down(affected) if went else Plan()

    def port_up(self, dpid: int, port: int) -> Plan:
        return self._after_up() if self.view.port_up(dpid, port) else Plan()

    def host_add(self, ip: str, mac: str, dpid: int, port: int) -> Plan:
        if not self.view.add_host(ip, mac, dpid, port):
            return Plan()
        return self._sync([g.gid for g in self.groups.values()
                           if ip == g.source or ip in g.receivers])

    def host_remove(self, ip: str) -> Plan:
        if not self.view.remove_host(ip):
            return Plan()
        # the host's groups keep it: the receiver is unreachable until it is seen again
        return self._sync([g.gid for g in self.groups.values()
                           if ip == g.source or ip in g.receivers])

    def set_nicira(self, on: bool) -> Plan:
        """Switch how detours end (``nicira``): one flow per link with Open vSwitch's
        Nicira actions, or one per group and link in plain OpenFlow 1.3. Used when a
        switch turns out not to have those actions (its description, or an error naming
        them). The per-group rejoins are added before the shared ones go, so a failure
        meanwhile is still bypassed."""
        if on == self.nicira:
            return Plan()
        return self._protect_anew(lambda: setattr(self, "nicira", on))

    def set_fast_failover(self, dpid: int, on: bool) -> Plan:
        """Whether switch ``dpid`` has fast-failover groups (OFPGT_FF is optional in
        OpenFlow 1.3: its group features say, or it refuses one). Without them the links
        leaving it are not protected (a failure there waits for the controller's
        reroute); detours may still cross it and end at it (plain flows)."""
        if on != (dpid in self.no_ff):
            return Plan()
        return self._protect_anew(lambda: (self.no_ff.discard if on else self.no_ff.add)(dpid))

    def _protect_anew(self, change: Callable[[], None]) -> Plan:
        """Every tree re-protected in place after ``change`` to what the detours' pieces
        depend on (``_piece_of``), with the shared entries and FF users in step; the plan
        moves the switches over (new entries before the old go)."""
        keys = list(self.guards)
        for key in keys:  # (the detours' shared entries as they were: dropped)
            self._guard(key, False)
        change()
        self._pieces_of = None  # (every piece made anew)
        self._pieces_now()
        for key in keys:  # (those still in use come back: ``_recount``)
            if key[0] not in self.no_ff:
                self._guard(key, True)
        gids = []
        if self.protection:
            for g in self.groups.values():
                if g.tree is None:
                    continue
                was = dict(g.tree.entries)
                self._protect(g, g.tree)
                self._recount(was, g.tree.entries)
                gids.append(g.gid)
        return self._diff(gids)

    def sync_switch(self, dpid: int) -> Plan:
        """Whatever the switch lacks of the trees, by the core's belief (idempotent)."""
        self._dirty[dpid] |= self.shared_want.get(dpid, {}).keys() | self.shared.get(dpid, {}).keys()
        return self._diff(list(self.groups), only={dpid})

    # -- internals ---------------------------------------------------------------------
    def _forget_installed(self, dpid: int) -> None:
        """Drop the belief about one switch (it left, or it reports afresh)."""
        for gid in self.installed.pop(dpid, {}):
            self.placed[gid].pop(dpid, None)
        self.shared.pop(dpid, None)

    def _address_for(self, model: str) -> str:
        same = self._by_model.get(model)
        if same:  # same model from another source shares G: (S,G) differs
            return self.groups[next(iter(same))].address
        return ssm_address(model, self._by_addr.__contains__)

    def _by_address(self, address: str) -> Group | None:
        gids = self._by_addr.get(address)
        return self.groups[min(gids)] if gids else None

    def _after_down(self, candidates: Iterable[int]) -> Plan:
        """Reroute those of ``candidates`` whose tree crosses something no longer live."""
        nbr = self.view.nbr_ports  # the live graph
        affected = []
        for gid in sorted(candidates):
            t = self.groups[gid].tree
            if t is None:
                continue
            if any(c not in nbr or (p is not None and c not in nbr.get(p, ()))
                   for c, p in t.parent.items()) or self._edge_lost(self.groups[gid]):
                affected.append(gid)
        return self._sync(affected)

    def _edge_lost(self, g: Group) -> bool:
        locs = [self.view.hosts.get(ip) for ip in [g.source, *(g.tree.reached if g.tree else ())]]
        return any(loc is None or not self.view.host_attached(loc) for loc in locs)

    def _after_up(self) -> Plan:
        """Something came back: retry groups that have unreachable receivers."""
        self.cache.refresh()
        return self._sync([g.gid for g in self.groups.values()
                           if g.receivers and (g.tree is None or g.tree.unreachable)])

    def _set_tree(self, g: Group, tree: Tree | None) -> None:
        """Swap a group's tree, keeping link load and the usage indexes in step."""
        if g.tree is not None:
            self.load.add_tree(g.tree, -1)
        self._swap(g, tree)

    def _swap(self, g: Group, tree: Tree | None, changed: set[int] | None = None) -> None:
        """Install ``tree`` as the group's, its old tree's load already taken off: the FF
        groups' users change only where the trees differ (a reroute keeps most of a tree).
        ``changed``: the only switches where the two trees may differ, and ``load``
        counts the new tree already (``trees.regraft``)."""
        was = g.tree.entries if g.tree is not None else {}
        now = tree.entries if tree is not None else {}
        if changed is not None:  # the same comparisons, on those switches alone
            was, now = ({n: d[n] for n in changed if n in d} for d in (was, now))
        elif tree is not None:
            self.load.add_tree(tree, 1)
        if self.protection:  # only the entries that differ (a reroute keeps most)
            if was:
                self._recount(was, now)
            else:
                self._count(now, 1)
        self._tree(g, tree)

    def _tree(self, g: Group, tree: Tree | None) -> None:
        g.tree = tree
        if tree is None:
            self._parents.pop(g.gid, None)
        else:
            self._parents[g.gid] = tree.parent

    def _sync(self, gids: Iterable[int], stale: tuple[set[tuple[int, int]], dict[int, list[tuple[int, int]]]]
              | None = None) -> Plan:
        """Bring ``gids``' trees up to date and diff them. ``stale``: what the caller
        already asked of ``_restale`` (the protected ports whose detour changed) and of
        ``_crossing`` for those ports' links (``_stale_links``), so that a failure scans
        the trees once."""
        gids = list(gids)
        reguard, crossing = stale if stale is not None else (self._restale() if self.protection else set(), None)
        within: dict[int, set[int]] = {}  # regrafted group -> the switches where it changed
        for gid in gids:
            g = self.groups[gid]
            if not g.receivers:
                self._set_tree(g, None)
                continue
            if g.tree is not None and g.algorithm == "spt" and self.balance:
                changed = self._regraft(g, reguard)
                if changed is not None:
                    within[gid] = changed
                    continue
            keep = g.tree.parent if g.tree is not None else self._saved_trees.pop(gid, None)
            if g.tree is not None:  # its own old tree must not bias it away from itself
                self.load.add_tree(g.tree, -1)
            load = self.load if self.balance else LinkLoad()
            # a group's first tree: its entries, protection and counts in one pass
            fill = partial(self._fill, g) if g.tree is None and self.one_pass else None
            try:
                tree = compute_tree(self.view, g.source, g.receivers, g.algorithm, load,
                                    self.cache, keep=keep, fill=fill)
            except CoreError:  # e.g. the source or a receiver is no longer known
                known = {r for r in g.receivers if r in self.view.hosts}
                tree = None
                if g.source in self.view.hosts and known:
                    tree = compute_tree(self.view, g.source, known, g.algorithm, load,
                                        self.cache, keep=keep, fill=fill)
                    tree.unreachable = frozenset(g.receivers - tree.reached)
            if tree is not None:
                tree.members = g.members
            if fill is not None:  # (``_fill`` did what ``_protect`` and ``_swap`` do)
                if tree is not None:
                    self.load.add_tree(tree, 1)
                self._tree(g, tree)
                continue
            if tree is not None and self.protection:
                self._protect(g, tree, old=g.tree, stale=reguard)
            self._swap(g, tree)
        if not reguard:
            return self._diff(gids, within=within)
        # trees unchanged, but a detour of their links changed: only the link's two ends
        again: dict[int, set[int]] = defaultdict(set)
        done = set(gids)
        down = self._stale_links(reguard)
        if crossing is None:
            crossing = self._crossing(down)
        down_set = set(down)
        for gid, links in crossing.items():
            if gid not in done:
                for p, c in links:
                    if (p, c) in down_set:
                        again[gid] |= {p, c}
        nodes: set[int] = set()
        kept = set(self._reprotect(again))
        for gid, at in list(again.items()):
            if gid in kept:
                nodes |= at
            else:
                del again[gid]
        # the shared entries with the first diff: their adds go before everything else
        return self._diff(gids, within=within).extend(self._diff(sorted(again), only=nodes, shared=False,
                                                                 within=again))


    def _reprotect(self, again: dict[int, set[int]]) -> list[int]:
        """Each group of ``again`` (group -> the two ends of its links whose detour
        changed) protected anew at those switches, the FF users of its entries that
        changed recounted; returns the groups with a changed entry (about half of them
        have none: a replaced detour keeps its ends where it can)."""
        kept = []
        for gid, at in again.items():
            g = self.groups[gid]
            entries = g.tree.entries
            old = {n: entries[n] for n in at}
            self._protect(g, g.tree, at)
            # (``_protect`` leaves an entry whose protection is the same as it was)
            moved = [n for n in at if entries[n] is not old[n]]
            if moved:
                self._recount({n: old[n] for n in moved}, {n: entries[n] for n in moved})
                kept.append(gid)
        return kept


    def _stale_links(self, reguard: set[tuple[int, int]]) -> list[tuple[int, int]]:
        """The links (parent, child) leaving the protected ports ``reguard``."""
        port_link = self.view.port_link
        return [(p, port_link[(p, port)].far_end(p, port)) for p, port in reguard if (p, port) in port_link]

    def _crossing(self, links: Iterable[tuple[int, int]]) -> dict[int, list[tuple[int, int]]]:
        """Group id -> those of ``links`` (parent, child) its tree crosses, by a scan of the
        trees (``trees.crossing``: one dict read per tree and loaded link's child) rather
        than an index: a failure or a changed detour is rare next to new trees, and the
        index of each link's groups cost every new tree a set insertion per switch,
        ~300,000 of the benchmark build's 3.2 million last-level cache misses."""
        below: dict[int, list[int]] = {}
        load = self.load
        for p, c in links:
            if load[(p, c)]:  # (no tree crosses an unloaded link)
                below.setdefault(c, []).append(p)
        return _crossing(self._parents, below) if below else {}

    def _regraft(self, g: Group, stale: set[tuple[int, int]]) -> set[int] | None:
        """Give the group the tree a new search keeping its tree would give, by changing
        only the part that lost its shortest path (``trees.regraft``; a failure changes ~7
        of a tree's ~100 switches, and the entries, protection and counts of the rest
        stay as they are). Returns the switches where the tree may have changed; None
        when that does not apply: the caller searches."""
        tree = g.tree
        got = self._regraft_tree(self.view, tree, None if tree.members == g.members else g.receivers, self.load,
                                 self.cache)
        if got is None:
            return None
        tree, changed = got
        if self.protection:
            nodes = {n for n in changed if n in tree.entries}
            entries, parent, port_link = tree.entries, tree.parent, self.view.port_link
            for d, q in stale:  # kept switches whose own or parent link's detour changed
                e = entries.get(d)
                if e is not None and q in e[1]:
                    nodes.add(d)
                    link = port_link.get((d, q))
                    if link is not None and parent.get(link.far_end(d, q)) == d:
                        nodes.add(link.far_end(d, q))
            self._protect(g, tree, nodes, old=g.tree, stale=stale)
            changed |= nodes
        self._swap(g, tree, changed)
        return changed


    def _fill(self, g: Group, tree: Tree, source_port: int, nbr: dict[int, dict[int, int]]) -> None:
        """A group's first tree (``compute_tree``'s ``fill``): each switch's entry made
        once, protected as ``_protect`` makes it, and its FF groups' users counted as
        ``_swap`` counts them, in one pass over the switches instead of four. Those
        passes cost more than the tree's ~300 messages (bench, fat-tree:16: ~1.7 x the
        reference against ~0.6 x; one pass ~1.6 x). What a switch's parent link gives
        every tree crossing it (``_uplink``) is looked up by two ints, not hashed as a
        pair per entry. ``nbr``: the view's neighbour ports, for each switch's output
        ports (``trees._outs``)."""
        outs = _outs(tree.parent, nbr, tree.ends)
        if not tree.entries:  # (sized once, in the same order: every switch of outs gets one)
            tree.entries = dict.fromkeys(outs)
        entries, parent = tree.entries, tree.parent
        entry = tuple.__new__  # SwitchEntry(...) without its Python-level __new__
        protect = self.protection
        self._pieces_now()
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
            counted = _counted(e)  # (as ``_count`` counts it)
            if counted:  # (``_count``)
                refs = ff_refs[n]
                for f in counted:
                    c = refs.get(f, 0) + 1
                    refs[f] = c
                    if c == 1:  # (``_count``)
                        if f ^ IN_PORT_BIT not in refs:
                            self._guard((n, ff_port(f)), True)
                        else:
                            self._want_ff(n, f)

    _tree_adds = staticmethod(ofmsgs.tree_adds)  # (the same choice: a class attribute, so a test can pick)
    _regraft_tree = staticmethod(regraft)

    # -- protection (controller.protect) ---------------------------------------------

    def _protect(self, g: Group, tree: Tree, nodes: Iterable[int] | None = None,
                    old: Tree | None = None, stale: set[tuple[int, int]] = frozenset()) -> None:
        """Rewrite ``tree.entries`` (only those of ``nodes``, if given) with fast-failover
        groups on every tree link leaving a switch that has a detour, and a rejoin flow
        where the switch's own parent link has one. Each entry needs only its own ports,
        its parent and their detours: where ``old`` (the group's previous tree) has the
        same and no detour of them is ``stale``, its protected entry is kept."""
        entries, parent = tree.entries, tree.parent
        self._pieces_now()
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

    def _pieces_now(self) -> dict[int, dict[int, tuple]]:
        """The per-port protection pieces (``_piece``) of the current topology; the
        parent links' pieces (``_uplink``) with them. After edge changes whose detours
        were caught up (``_restale``), only the pieces they touch are forgotten: those of
        the changed links' switches and of the links whose detour was dropped (a failure
        used to recompute ~470 pieces, ~5% of a reroute); otherwise all of them."""
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
        ``_restale`` (or ``_pieces_now``) for this topology."""
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
                if self.nicira:  # (the detour's one flow at its end serves every tree: ``_guard``)
                    return (d.first, ff_id(port, False), ff_id(port, True), _NO_ARRIVAL, link_tag, ())
                return (d.first, ff_id(port, False), ff_id(port, True), d.arrival, link_tag,
                        (d.arrival, link_tag, TO_OWN_GROUP))
        return ()

    def _uplink(self, n: int, par: int) -> tuple:
        """What the live link from ``par`` down to ``n`` gives every tree entry at ``n``
        below it, once per topology: (``n``'s port towards ``par``, the piece (``_piece``)
        of ``par``'s port towards ``n``, () without protection). The caller has run
        ``_pieces_now`` for this topology."""
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


    def _recount(self, was: dict[int, SwitchEntry], now: dict[int, SwitchEntry]) -> None:
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
                a, b = _counted(e), _counted(o)
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
            self._count(gone, -1)
        if came:
            self._count(came, 1)


    def _count(self, entries: dict[int, SwitchEntry], step: int) -> None:
        """Keep the users of each FF group and protected link in step with the trees."""
        appear = 1 if step > 0 else 0
        for dpid, e in entries.items():
            ffs = _counted(e)  # (a rejoin listing outputs may go through FF groups)
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
                        self._guard((dpid, ff_port(f)), step > 0)
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
        self._dirty[dpid].add(key)

    def _want_ff(self, dpid: int, ffid: int) -> None:
        """The FF group ``ffid`` of ``dpid`` wanted with its buckets while its link is
        guarded and a tree uses it, else dropped."""
        key = (dpid, ff_port(ffid))
        d = self.guards.get(key)
        self._want(dpid, ("ff", ffid), ff_buckets(key[1], d, bool(ffid & IN_PORT_BIT), tag(*key))
                   if d is not None and ffid in self.ff_refs.get(dpid, ()) else None)

    def _guard(self, key: tuple[int, int], on: bool) -> None:
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


    def _restale(self) -> set[tuple[int, int]]:
        """Detours the topology broke (or made possible): the links in use get their new
        one. Returns those links whose piece (``_piece_of``: all that an entry at either
        end takes from the detour) changed: the entries at their ends need re-protecting.
        A replaced detour keeps its first and last hop where it can (``protect.Detours``),
        and then no entry changes: on leaf-spine:8,32,16 that spared about half of the
        ~200 groups a failure used to re-protect besides those it moves."""
        stale = self.detours.stale()
        self._stale_keys |= stale  # (their pieces are forgotten by ``_pieces_now``)
        self._detours_at = (self.view.edge_count, self.view.removals)
        for key in stale:
            if key in self.guards:
                self._guard(key, True)
        pieces = self._pieces  # (still those the entries were made with: none forgotten yet)
        return {key for key in stale
                if pieces.get(key[0], _NOTHING).get(key[1], _ABSENT) != self._piece_of(*key)}

    def entries_at(self, dpid: int) -> dict[str, int]:
        """What the core believes ``dpid`` holds of ours, by kind: ALL groups and (S,G)
        flows (one each per tree crossing it), FF groups, detour flows (transit + rejoin)."""
        mine = self.installed.get(dpid, {})
        shared = self.shared.get(dpid, {})
        ff = sum(1 for k in shared if k[0] == "ff")
        return {"groups": len(mine), "sg_flows": len(mine), "ff_groups": ff,
                "detour_flows": len(shared) - ff + sum(1 for e in mine.values() if e.rejoin)}

    def shared_intended(self, dpid: int) -> dict[tuple, Any]:
        """The shared protection entries ``dpid`` must hold now: ("ff", id) -> buckets,
        ("transit", in_port, tag) -> actions."""
        return dict(self.shared_want.get(dpid, {}))

    def _diff_shared(self, dirty: dict[int, set[tuple]], plan: Plan) -> None:
        """Shared protection entries added or changed first (phase 0: before anything
        points at them), removed last (phase 2: after nothing does)."""
        adds, removes = [], []
        for dpid, keys in sorted(dirty.items()):
            want = self.shared_want.get(dpid, {})
            have = self.shared.setdefault(dpid, {})
            changed = False
            for key in sorted(keys):
                w, h = want.get(key, _ABSENT), have.get(key, _ABSENT)
                if w == h:
                    continue
                changed = True
                if w is _ABSENT:
                    del have[key]
                    removes.append((dpid, _shared_msg(dpid, key, w, h)))
                    continue
                have[key] = w
                adds.append((dpid, _shared_msg(dpid, key, w, h)))
            if changed:
                self.changes[dpid] += 1
        plan.phases[0][:0] = adds
        plan.phases[2].extend(removes)


    def _diff(self, gids: Iterable[int], only: set[int] | None = None, shared: bool = True,
              within: dict[int, set[int]] | None = None) -> Plan:
        """Messages taking the switches from ``installed`` to the groups' trees.
        ``within``: group -> the only switches where its tree changed since the last
        diff (elsewhere every live switch's belief is the tree's: each public method
        leaves it so), compared alone."""
        plan = Plan()
        build, switch, remove = plan.phases
        cut: list[tuple[int, Any]] = []  # phase 1, after ``switch``
        installed, switches = self.installed, self.view.switches
        # the live switches (known and connected), as a set only where one is needed: a
        # new set of every switch per call was a quarter of the benchmark's cache misses
        live: set[int] | None = None
        for gid in gids:
            g = self.groups[gid]
            want = g.tree.entries if g.tree is not None else {}
            placed = self.placed[gid]
            if placed:  # (``within``: a reroute's changed switches; else every one it or the tree has)
                if live is None:
                    live = switches & installed.keys()
                at = within.get(gid) if within else None
                dpids = (at if at is not None else want.keys() | placed.keys()) & live
                changed, have = self._changed(gid, dpids if only is None else dpids & only, placed, want,
                                              g.tree.parent if g.tree is not None else None)
                if changed:  # (leaves first already)
                    plan.groups.add(gid)
                    self._diff_switches(g, changed, have, want, placed, build, switch, cut, remove)
                continue
            # a new tree (or one whose switches all came back empty): all of it
            have = _NOTHING
            order = g.tree.leaves_first if g.tree is not None else None
            if order is not None and only is None and self.one_pass:  # (the search's order)
                if self._place(g, order, want, build):
                    plan.groups.add(gid)
                continue
            changed = [d for d in want if d in installed and d in switches and (only is None or d in only)]
            if not changed:
                continue
            plan.groups.add(gid)
            if g.tree is not None and len(changed) > 1:  # leaves first
                depth = g.tree.depths() if len(changed) > 16 else {
                    d: g.tree.depth(d) for d in changed if d in want}
                changed.sort(key=lambda d: -depth.get(d, 0))
            self._diff_switches(g, changed, have, want, placed, build, switch, cut, remove)
        remove[:0] = cut  # first in phase 2: after phase 1's feeds are confirmed
        if shared and self._dirty:
            ready = {d: self._dirty.pop(d) for d in list(self._dirty)
                     if d in installed and d in switches and (only is None or d in only)}
            for d in [d for d in self._dirty if d not in self.view.switches]:
                del self._dirty[d]  # (a switch that returns is synced whole)
            self._diff_shared(ready, plan)
        return plan

    def _place(self, g: Group, order: list[int], want: dict[int, SwitchEntry], build: list) -> bool:
        """A new tree's messages (``_tree_adds``, into ``build``) for its live switches in
        ``order`` (leaves first), which from then on are believed to hold ``want``'s
        entries; False when none is live."""
        installed, switches, gid = self.installed, self.view.switches, g.gid
        todo = [d for d in order if d in installed and d in switches]
        if not todo:
            return False
        self._tree_adds(gid, g.source, g.address, todo, want, build)
        changes = self.changes
        for d in todo:
            changes[d] += 1
            installed[d][gid] = want[d]
        # (it held none of them; sized once when every switch is live)
        self.placed[gid] = dict.fromkeys(want if len(todo) == len(want) else todo)
        return True


    def _changed(self, gid: int, dpids: set[int], placed: dict[int, None], want: dict[int, SwitchEntry],
                    parent: dict[int, int | None] | None) -> tuple[list[int], dict[int, SwitchEntry]]:
        """Which of switches ``dpids`` believe (``installed``) otherwise than ``want`` for
        group ``gid``, deepest in the tree (``parent``) first, ties in dpid order; and what
        they believe, for those of ``placed``."""
        installed = self.installed
        have = {dpid: installed[dpid][gid] for dpid in dpids & placed.keys()}
        changed = [d for d in sorted(dpids) if have.get(d) != want.get(d)]
        if parent is not None and len(changed) > 1:
            depth = {}
            for d in changed:
                if d in want:
                    n, k = d, 0
                    while parent.get(n) is not None:
                        n, k = parent[n], k + 1
                    depth[d] = k
            changed.sort(key=lambda d: -depth.get(d, 0))
        return changed, have


    def _diff_switches(self, g: Group, changed: list[int], have: dict[int, SwitchEntry],
                          want: dict[int, SwitchEntry], placed: dict[int, None], build: list, switch: list,
                          cut: list, remove: list) -> None:
        """The messages taking each of ``changed`` (in order) from its believed entry
        (``have``) to the tree's (``want``), into the plan's phases (``cut``: phase 2's
        first), and the beliefs updated."""
        installed, changes, gid = self.installed, self.changes, g.gid
        for dpid in changed:
            changes[dpid] += 1
            old, new = have.get(dpid), want.get(dpid)
            self._diff_one(g, dpid, old, new, build, switch, cut, remove)
            if new is None:
                installed[dpid].pop(gid, None)
                placed.pop(dpid, None)
            else:
                installed[dpid][gid] = new
                placed[dpid] = None


    def _diff_one(self, g: Group, dpid: int, old: SwitchEntry | None, new: SwitchEntry | None, build: list,
                  switch: list, cut: list, remove: list) -> None:
        """The messages taking switch ``dpid`` from ``old`` to ``new`` (None: nothing)."""
        gid, source, address = g.gid, g.source, g.address
        if old is None:  # (every switch of a new tree)
            in_port = new[0]
            build.append((dpid, ofmsgs.group_add(dpid, gid, in_port, new[1], new[2])))
            build.append((dpid, ofmsgs.flow_add(dpid, gid, in_port, source, address)))
            if new[3]:
                arrival, link_tag, acts = new[3]
                build.append((dpid, ofmsgs.detour_flow(dpid, ofmsgs.cookie(gid), arrival, link_tag, acts, source,
                                                       address)))
            return
        if new is None:  # deleting the group deletes the flows that point to it
            if old.rejoin:  # (a rejoin listing its outputs itself may not)
                remove.append((dpid, self._rejoin(dpid, g, old.rejoin, delete=True)))
            remove.append((dpid, ofmsgs.group_delete(dpid, gid)))
            return
        turn = False
        if new.out_ports != old.out_ports or new.ff != old.ff or (
                new.in_port != old.in_port and new.in_port in new.out_ports + old.out_ports):
            # a switch that stops copying to a port does so a phase after every
            # new feed is on (only a barrier orders two switches' messages):
            # one that also starts copying somewhere copies to both meanwhile
            # (make-before-break on the switch too; issue 12)
            msg = ofmsgs.group_modify(dpid, gid, new.in_port, new.out_ports, new.ff)
            if set(new.out_ports) >= set(old.out_ports):
                switch.append((dpid, msg))
            else:
                both = tuple(sorted(set(old.out_ports) | set(new.out_ports)))
                if len(both) == len(old.out_ports):
                    cut.append((dpid, msg))
                elif new.in_port == old.in_port or (
                        old.in_port not in both and new.in_port not in both):
                    ffs = new.ff + tuple(f for f in old.ff if ff_port(f) not in new.out_ports)
                    switch.append((dpid, ofmsgs.group_modify(
                        dpid, gid, new.in_port, both, tuple(sorted(ffs, key=ff_port)))))
                    cut.append((dpid, msg))
                else:  # the ingress turns onto a port it copied to (or back): no
                    # one group serves both directions, so the new one gets a
                    # group of its own until the old feeds are cut
                    turn = True
        if turn:  # copies from the new parent go the new way from phase 0 on,
            # those from the old one the old way until phase 2 cuts them; then the
            # group takes the new buckets and the flow points back at it
            tid = ofmsgs.turn_id(gid)
            build.append((dpid, ofmsgs.group_add(dpid, tid, new.in_port, new.out_ports, new.ff)))
            build.append((dpid, ofmsgs.flow_to(dpid, gid, new.in_port, source, address, tid)))
        elif new.in_port != old.in_port:
            build.append((dpid, ofmsgs.flow_add(dpid, gid, new.in_port, source, address)))
        if new.in_port != old.in_port and old.in_port != UNKNOWN_PORT:
            remove.append((dpid, ofmsgs.flow_delete(dpid, gid, old.in_port, source, address)))
        if new.rejoin != old.rejoin:
            moved = not old.rejoin or old.rejoin[:2] != new.rejoin[:2]
            if new.rejoin:  # a new match before the old one goes; same match in place
                (build if moved else switch).append((dpid, self._rejoin(dpid, g, new.rejoin)))
            if old.rejoin and moved:
                remove.append((dpid, self._rejoin(dpid, g, old.rejoin, delete=True)))
        if turn:  # (nothing points at the group now: its old flow is gone)
            remove.append((dpid, msg))
            remove.append((dpid, ofmsgs.flow_add(dpid, gid, new.in_port, source, address)))
            remove.append((dpid, ofmsgs.group_delete(dpid, tid)))


    @staticmethod
    def _rejoin(dpid: int, g: Group, rejoin: tuple, delete: bool = False) -> Any:
        arrival, link_tag, acts = rejoin
        if delete:
            return ofmsgs.detour_flow_delete(dpid, ofmsgs.cookie(g.gid), arrival, link_tag,
                                             g.source, g.address)
        return ofmsgs.detour_flow(dpid, ofmsgs.cookie(g.gid), arrival, link_tag, acts,
                                  g.source, g.address)

    # -- persistence ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Groups and the last known topology: a restarted controller routes at once and
        reconciles switches as they reconnect instead of tearing trees down meanwhile."""
        v = self.view
        return {"version": 1, "groups": [g.to_dict() for g in self.groups.values()],
                "topology": {"switches": sorted(v.switches),
                             "links": [[k.a, k.a_port, k.b, k.b_port] for k in sorted(v.links)],
                             "hosts": [[h.ip, h.mac, h.dpid, h.port] for h in v.hosts.values()]}}

    def restore(self, data: dict[str, Any]) -> list[str]:
        """Recreate the saved topology and groups and compute their trees; nothing is sent
        until switches reconnect. Returns one problem line per entry not restored."""
        problems = []
        topo = data.get("topology", {})
        try:
            for dpid in topo.get("switches", []):
                self.view.add_switch(int(dpid))
            for a, ap, b, bp in topo.get("links", []):
                self.view.add_link(int(a), int(ap), int(b), int(bp))
            for ip, mac, dpid, port in topo.get("hosts", []):
                self.view.add_host(ip, mac, int(dpid), int(port))
        except (TypeError, ValueError) as exc:
            problems.append(f"topology: {exc}")
        for d in data.get("groups", []):
            try:
                model, source = check_model(d["model"]), check_unicast(d["source"], "source")
                gid = int(d["id"])
                if gid in self.groups:
                    raise Conflict(f"group id {gid} is in use")
                g = Group(gid, model, source, check_ssm(d["address"]), int(d["port"]),
                          d.get("algorithm", self.algorithm),
                          frozenset([check_unicast(r, "receiver") for r in d.get("receivers", [])]))
                self._add(g)
                self._next_gid = max(self._next_gid, gid + 1)
                tree = d.get("tree") or []
                if tree:
                    children = {int(c) for c, _ in tree}
                    parent: dict[int, int | None] = {int(c): int(p) for c, p in tree}
                    parent.update({int(p): None for _, p in tree if int(p) not in children})
                    self._saved_trees[gid] = parent
            except (KeyError, TypeError, ValueError) as exc:
                problems.append(f"group {d!r}: {exc}")
        self.refresh()
        return problems

    def refresh(self) -> Plan:
        """Recompute every group whose tree is missing or incomplete."""
        return self._sync([g.gid for g in self.groups.values()
                           if g.receivers and (g.tree is None or g.tree.unreachable
                                               or self._edge_lost(g))])
