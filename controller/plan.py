"""What each switch is believed to hold of ours, and the messages that take it to what
the trees want.

Owns: the belief per switch (``installed``: group id -> entry; ``placed``: each group's
switches; ``shared``: the shared protection entries held; ``changes``: a counter per
switch that a table read compares with), and the diff of wanted against held entries
into a ``Plan``: messages in three phases, each acknowledged (barrier) before the next,
so that new paths are built before traffic moves onto them and old ones go last.

Does not touch: the trees (``controller.core``) or what protection wants
(``controller.failover``; the plan reads ``shared_want`` and consumes its ``dirty``
marks), nor any socket: messages are built without a live datapath (``ofmsgs``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from controller import ofmsgs
from controller.failover import Failover
from controller.protect import ff_port, is_ff
from controller.topoview import TopologyView
from controller.trees import SwitchEntry

Group = Any  # (``controller.core.Group``: read for its id, addresses and tree; not imported, core imports this)

MAX_GID = 0x7FFEFFFF  # its turn group id (ofmsgs.turn_id) stays below the fast-failover ids (protect.FF_BASE)
UNKNOWN_PORT = -1  # in a believed entry: "whatever is there is wrong", never sent
SETTLE_S = 0.05  # (Planner.settle_s) Open vSwitch's revalidation after a barrier: a few ms
# (Planner.drain_s) how long the old version's copies may still be in the fabric after
# the flip: measured on the OVS lab (tests/lab/test_controller_moves.py prints it), a few
# ms at the median, but a userspace switch starved of CPU held copies up to ~0.3 s
DRAIN_S = 0.2
_ABSENT = object()
_NOTHING: dict = {}  # (never written)
_SHARED_PRIO = {"transit": ofmsgs.PRIO_DETOUR, "rejoin": ofmsgs.PRIO_REJOIN}  # a shared detour flow's
_SHARED_KIND = {prio: kind for kind, prio in _SHARED_PRIO.items()}  # (read back off a switch)


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
    # (group id, in_port) -> the version stamp of a flow that pushes one (the tree's
    # first switch): a stamp other than the group's own is rewritten
    stamps: dict[tuple[int, int], tuple] = field(default_factory=dict)

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
                    if acts[:1] == (("push_vlan", ofmsgs.ETH_VLAN),):  # (the tree's first switch)
                        state.stamps[(gid, in_port)] = acts[1:2]
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
                if len(acts) == 2 and acts[0] == ofmsgs.POP[0]:  # (towards a host: the version tag off)
                    acts = acts[1:]
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


BUILD, FLIP, SETTLE, REDIRECT, REMOVE = range(5)  # a plan's phases (``Plan``)


@dataclass
class Plan:
    """Messages in phases: every phase must be acknowledged (barrier) by the switches
    before the next starts, and ``waits`` (phase -> seconds) holds one back after that.
    BUILD adds what nothing uses yet; FLIP switches traffic: in place (a tree that grows
    or shrinks) or, for a tree that moves, by stamping the new version at its first
    switch; SETTLE, REDIRECT and REMOVE then fold a move's new entries into the group's
    own ids and delete what no tree uses any more (make-before-break)."""

    phases: list[list[tuple[int, Any]]] = field(default_factory=lambda: [[], [], [], [], []])
    groups: set[int] = field(default_factory=set)  # groups whose switch state this changes
    waits: dict[int, float] = field(default_factory=dict)
    moved: set[int] = field(default_factory=set)  # groups that move (a versioned update)

    def messages(self) -> list[tuple[int, Any]]:
        return [m for phase in self.phases for m in phase]

    def switches(self) -> set[int]:
        return {dpid for dpid, _ in self.messages()}

    def extend(self, other: "Plan") -> "Plan":
        for mine, theirs in zip(self.phases, other.phases):
            mine.extend(theirs)
        self.groups |= other.groups
        self.moved |= other.moved
        for phase, wait in other.waits.items():
            self.waits[phase] = max(wait, self.waits.get(phase, 0.0))
        return self

    def __len__(self) -> int:
        return sum(len(p) for p in self.phases)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return iter(self.messages())


class Planner:
    """The switches' believed state and the diff into plans (see the module's
    docstring). ``groups``: the core's groups, read for their trees; ``one_pass``
    False: a new tree goes through the general diff (tests)."""

    _tree_adds = staticmethod(ofmsgs.tree_adds)  # (a class attribute, so a test can pick)

    def __init__(self, view: TopologyView, groups: dict[int, Group], failover: Failover) -> None:
        self.view = view
        self.groups = groups
        self.failover = failover
        self.one_pass = True
        # seconds: after a move's new entries are confirmed, before its flip (Open vSwitch
        # moves its datapath's cached flows onto new entries a few ms after the barrier),
        # and after the flip, before the old version's entries change (its last copies
        # leave the fabric); and before an in-place change's removals
        self.settle_s = SETTLE_S
        self.drain_s = DRAIN_S
        # dpid -> gid -> entry, for switches with a live control channel: messages go only
        # to these. A restored controller knows the topology before switches reconnect;
        # until one does, nothing is sent to it and nothing of it is torn down.
        self.installed: dict[int, dict[int, SwitchEntry]] = {}
        # gid -> dpids in installed (a dict used as an ordered set: half a set's memory)
        self.placed: defaultdict[int, dict[int, None]] = defaultdict(dict)
        # dpid -> shared protection entries the switch holds (FF groups, transit flows)
        self.shared: dict[int, dict[tuple, Any]] = {}
        # dpid -> how many times the belief about it changed: a table read (audit) that
        # started before a change cannot be compared with the belief after it
        self.changes: defaultdict[int, int] = defaultdict(int)

    def adopt(self, dpid: int, present: "SwitchState | None") -> list[tuple[int, Any]]:
        """Believe what a (re)connected switch reports holding (``present``; None: it
        holds nothing). Returns the deletes of groups the core no longer has."""
        self.forget(dpid)
        self.installed[dpid] = {}
        self.changes[dpid] += 1
        stale: list[tuple[int, Any]] = []
        if present is None:
            return stale
        ingress = present.ingress()
        for gid, entry in present.groups.items():
            g = self.groups.get(gid)
            if g is None:  # a group we no longer have: deleting it deletes its flows
                stale.append((dpid, ofmsgs.group_delete(dpid, gid)))
                continue
            ins = sorted(ingress.get(gid, ()))
            rejoin = entry.rejoin if entry is not None else ()
            if rejoin:  # (kept as the trees keep it; actions not the group's stay as read: wrong)
                kept = ofmsgs.rejoin_kept(rejoin[2], g.address, gid, rejoin[0])
                if kept is not None:
                    rejoin = (rejoin[0], rejoin[1], kept)
            root = g.tree is not None and g.tree.root == dpid
            stamp = ofmsgs.stamp(g.color)[1:] if root else ()
            # An unreadable entry, several flows or a version stamp not the group's (the
            # first switch's alone, with its version): believe "wrong", so the diff rewrites it.
            self.installed[dpid][gid] = SwitchEntry(
                ins[0] if len(ins) == 1 and present.stamps.get((gid, ins[0]), ()) == stamp else UNKNOWN_PORT,
                entry.out_ports if entry is not None else (UNKNOWN_PORT,),
                entry.ff if entry is not None else (), rejoin)
            self.placed[gid][dpid] = None
        self.shared[dpid] = dict(present.shared)
        return stale

    def leftovers(self, dpid: int, present: "SwitchState") -> list[tuple[int, Any]]:
        """Deletes of what ``present`` (a reconnected switch's report) holds that the
        trees no longer use there: flows on other ingress ports, rejoin flows not
        intended, every flow of a group the core no longer has."""
        out: list[tuple[int, Any]] = []
        mine = self.installed[dpid]
        for gid, in_port in sorted(present.flows):
            have = mine.get(gid)
            g = self.groups.get(gid)
            if g is not None and gid in present.groups and (have is None or have.in_port != in_port):
                out.append((dpid, ofmsgs.flow_delete(dpid, gid, in_port, g.source, g.address)))
        for gid, found in sorted(present.rejoins.items()):
            have = mine.get(gid)
            g = self.groups.get(gid)
            for arrival, link_tag, _acts in found:
                if g is None:  # (a group we no longer have: every flow of its cookie)
                    out.append((dpid, ofmsgs.cookie_delete(dpid, gid)))
                    break
                if have is None or have.rejoin[:2] != (arrival, link_tag):
                    out.append((dpid, ofmsgs.detour_flow_delete(
                        dpid, ofmsgs.cookie(gid), arrival, link_tag, g.source, g.address)))
        return out

    def shared_dirty(self, dpid: int) -> None:
        """Compare every shared entry of ``dpid`` at the next diff (a switch synced whole)."""
        want = self.failover.shared_want
        self.failover.dirty[dpid] |= want.get(dpid, {}).keys() | self.shared.get(dpid, {}).keys()

    def forget(self, dpid: int) -> None:
        """Drop the belief about one switch (it left, or it reports afresh)."""
        for gid in self.installed.pop(dpid, {}):
            self.placed[gid].pop(dpid, None)
        self.shared.pop(dpid, None)

    def entries_at(self, dpid: int) -> dict[str, int]:
        """What the core believes ``dpid`` holds of ours, by kind: ALL groups and (S,G)
        flows (one each per tree crossing it), FF groups, detour flows (transit + rejoin)."""
        mine = self.installed.get(dpid, {})
        shared = self.shared.get(dpid, {})
        ff = sum(1 for k in shared if k[0] == "ff")
        return {"groups": len(mine), "sg_flows": len(mine), "ff_groups": ff,
                "detour_flows": len(shared) - ff + sum(1 for e in mine.values() if e.rejoin)}

    def _diff_shared(self, dirty: dict[int, set[tuple]], plan: Plan) -> None:
        """Shared protection entries added or changed first (phase 0: before anything
        points at them), removed last (phase 2: after nothing does)."""
        adds, removes = [], []
        for dpid, keys in sorted(dirty.items()):
            want = self.failover.shared_want.get(dpid, {})
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
        plan.phases[BUILD][:0] = adds
        plan.phases[REMOVE].extend(removes)

    def diff(self, gids: Iterable[int], only: set[int] | None = None, shared: bool = True,
              within: dict[int, set[int]] | None = None) -> Plan:
        """Messages taking the switches from ``installed`` to the groups' trees.
        ``within``: group -> the only switches where its tree changed since the last
        diff (elsewhere every live switch's belief is the tree's: each public method
        leaves it so), compared alone. ``only``: those switches alone, in place (a
        switch synced whole); otherwise a tree whose paths move is moved by version."""
        plan = Plan()
        installed, switches = self.installed, self.view.switches
        # the live switches (known and connected), as a set only where one is needed: a
        # new set of every switch per call was a quarter of the benchmark's cache misses
        live: set[int] | None = None
        for gid in gids:
            g = self.groups[gid]
            want = g.tree.entries if g.tree is not None else {}
            placed = self.placed[gid]
            if only is not None and not any(d in want or d in placed for d in only):
                continue  # (nothing of it there: a switch synced whole looks at its groups alone)
            if placed:  # (``within``: a reroute's changed switches; else every one it or the tree has)
                if live is None:
                    live = switches & installed.keys()
                if only is not None:
                    dpids = {d for d in only if (d in want or d in placed) and d in live}
                else:
                    at = within.get(gid) if within else None
                    dpids = (at if at is not None else want.keys() | placed.keys()) & live
                changed, have = self._changed(gid, dpids, placed, want,
                                              g.tree.parent if g.tree is not None else None)
                if changed:  # (leaves first already)
                    plan.groups.add(gid)
                    if only is None and _moves(changed, have, want):
                        self._move(g, changed, have, want, placed, plan)
                    else:
                        self._diff_switches(g, changed, have, want, placed, plan)
                continue
            # a new tree (or one whose switches all came back empty): all of it
            have = _NOTHING
            order = g.tree.leaves_first if g.tree is not None else None
            if order is not None and only is None and self.one_pass:  # (the search's order)
                if self._place(g, order, want, plan.phases[BUILD]):
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
            self._diff_switches(g, changed, have, want, placed, plan)
        if shared and self.failover.dirty:
            ready = {d: self.failover.dirty.pop(d) for d in list(self.failover.dirty)
                     if d in installed and d in switches and (only is None or d in only)}
            for d in [d for d in self.failover.dirty if d not in self.view.switches]:
                del self.failover.dirty[d]  # (a switch that returns is synced whole)
            self._diff_shared(ready, plan)
        if plan.moved:  # the new entries in the switches' datapaths before the flip, the
            # old version's copies out of the fabric before its entries change
            plan.waits[FLIP] = self.settle_s
            plan.waits[SETTLE] = self.drain_s
        elif plan.phases[FLIP] and plan.phases[REMOVE]:
            plan.waits[REMOVE] = self.settle_s
        return plan

    def _place(self, g: Group, order: list[int], want: dict[int, SwitchEntry], build: list) -> bool:
        """A new tree's messages (``_tree_adds``, into ``build``) for its live switches in
        ``order`` (leaves first), which from then on are believed to hold ``want``'s
        entries; False when none is live."""
        installed, switches, gid = self.installed, self.view.switches, g.gid
        todo = [d for d in order if d in installed and d in switches]
        if not todo:
            return False
        self._tree_adds(gid, g.source, g.address, todo, want, build, ofmsgs.edge_ports(g.tree.ends),
                        g.tree.root, g.color)
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

    def _believe(self, gid: int, dpid: int, new: SwitchEntry | None, placed: dict[int, None]) -> None:
        self.changes[dpid] += 1
        if new is None:
            self.installed[dpid].pop(gid, None)
            placed.pop(dpid, None)
        else:
            self.installed[dpid][gid] = new
            placed[dpid] = None

    def _diff_switches(self, g: Group, changed: list[int], have: dict[int, SwitchEntry],
                       want: dict[int, SwitchEntry], placed: dict[int, None], plan: Plan) -> None:
        """In place: each of ``changed`` (in order) from its believed entry (``have``) to
        the tree's (``want``). Exactly once as long as no switch of both trees takes the
        group in on another port (``_moves``): a receiver of both is then reached the same
        way before and after, and only branches nobody else uses grow or go."""
        build, flip, _, _, remove = plan.phases
        gid, source, address = g.gid, g.source, g.address
        edge = ofmsgs.edge_ports(g.tree.ends) if g.tree is not None else {}
        for dpid in changed:
            old, new = have.get(dpid), want.get(dpid)
            self._believe(gid, dpid, new, placed)
            at = edge.get(dpid, ())
            if old is None or new is None:
                self._alone(g, dpid, old, new, at, g.color, build, remove)
                continue
            if new[:3] != old[:3]:
                flip.append((dpid, ofmsgs.group_modify(dpid, gid, new.in_port, new.out_ports, new.ff, at)))
            if new.in_port != old.in_port:
                build.append((dpid, self._flow(g, dpid, new.in_port)))
                if old.in_port != UNKNOWN_PORT:
                    remove.append((dpid, ofmsgs.flow_delete(dpid, gid, old.in_port, source, address)))
            self._rejoins(g, dpid, old, new, build, flip, remove)

    def _move(self, g: Group, changed: list[int], have: dict[int, SwitchEntry], want: dict[int, SwitchEntry],
              placed: dict[int, None], plan: Plan) -> None:
        """A tree whose paths move, by version: each changed switch gets its new entry in
        a second group (``ofmsgs.turn_id``) that only the new version's copies reach (a
        version flow, or the flow of its new in_port); the first switch then stamps the
        new version; once the old version's copies are out of the fabric the group's own
        id takes the new entry and the second goes. Every copy travels wholly on the old
        tree or wholly on the new one, and a switch holds at most two entries per group."""
        build, flip, settle, redirect, remove = plan.phases
        gid, source, address, tree = g.gid, g.source, g.address, g.tree
        color, root, tid = 1 - g.color, tree.root, ofmsgs.turn_id(gid)
        edge = ofmsgs.edge_ports(tree.ends)
        for dpid in changed:
            old, new = have.get(dpid), want.get(dpid)
            self._believe(gid, dpid, new, placed)
            at = edge.get(dpid, ())
            if old is None or new is None:  # a switch of one tree alone: no copy of the other reaches it
                self._alone(g, dpid, old, new, at, color, build, remove)
                continue
            if new[:3] == old[:3]:  # (its detour's end alone changed)
                self._rejoins(g, dpid, old, new, build, settle, remove)
                continue
            if new[1:3] == old[1:3] and dpid != root and UNKNOWN_PORT != old.in_port not in old.out_ports \
                    and new.in_port not in new.out_ports and new.in_port != old.in_port:
                # where the moved path comes back in: each version arrives on its own
                # port and both go out alike (no copy goes back where it came from)
                build.append((dpid, ofmsgs.flow_add(dpid, gid, new.in_port, source, address)))
                redirect.append((dpid, ofmsgs.flow_delete(dpid, gid, old.in_port, source, address)))
                self._rejoins(g, dpid, old, new, build, settle, remove)
                continue
            build.append((dpid, ofmsgs.group_add(dpid, tid, new.in_port, new.out_ports, new.ff, at)))
            settle.append((dpid, ofmsgs.group_modify(dpid, gid, new.in_port, new.out_ports, new.ff, at)))
            if dpid == root:
                into = ofmsgs.ingress_add(dpid, gid, new.in_port, source, address, color, tid)
                (flip if new.in_port == old.in_port else build).append((dpid, into))
                redirect.append((dpid, ofmsgs.ingress_add(dpid, gid, new.in_port, source, address, color)))
            elif new.in_port == old.in_port:
                build.append((dpid, ofmsgs.version_flow(dpid, gid, new.in_port, source, address, color, tid)))
                redirect.append((dpid, ofmsgs.version_flow_delete(dpid, gid, new.in_port, source, address, color)))
            else:
                build.append((dpid, ofmsgs.flow_to(dpid, gid, new.in_port, source, address, tid)))
                redirect.append((dpid, ofmsgs.flow_add(dpid, gid, new.in_port, source, address)))
            if new.in_port != old.in_port and old.in_port != UNKNOWN_PORT:
                redirect.append((dpid, ofmsgs.flow_delete(dpid, gid, old.in_port, source, address)))
            self._rejoins(g, dpid, old, new, build, settle, remove)
            remove.append((dpid, ofmsgs.group_delete(dpid, tid)))
        if root in want and root not in changed and root in self.installed and root in self.view.switches:
            flip.append((root, ofmsgs.ingress_add(root, gid, want[root].in_port, source, address, color)))
        g.color = color
        plan.moved.add(gid)

    def _alone(self, g: Group, dpid: int, old: SwitchEntry | None, new: SwitchEntry | None, at: tuple[int, ...],
               color: int, build: list, remove: list) -> None:
        """A switch that has the group in one of the trees only: its entry added first
        (at the first switch stamping ``color``) or deleted last (deleting the group
        deletes the flows that point to it)."""
        gid = g.gid
        if new is None:
            if old is not None:
                if old.rejoin:  # (a rejoin listing its outputs itself may not)
                    remove.append((dpid, self._rejoin(dpid, g, old.rejoin, delete=True)))
                remove.append((dpid, ofmsgs.group_delete(dpid, gid)))
            return
        build.append((dpid, ofmsgs.group_add(dpid, gid, new.in_port, new.out_ports, new.ff, at)))
        if g.tree is not None and dpid == g.tree.root:
            build.append((dpid, ofmsgs.ingress_add(dpid, gid, new.in_port, g.source, g.address, color)))
        else:
            build.append((dpid, ofmsgs.flow_add(dpid, gid, new.in_port, g.source, g.address)))
        if new.rejoin:
            build.append((dpid, self._rejoin(dpid, g, new.rejoin)))

    def _flow(self, g: Group, dpid: int, in_port: int) -> Any:
        """The group's (S,G) flow on ``in_port`` of ``dpid``: at the tree's first switch
        the one that stamps the version."""
        if g.tree is not None and dpid == g.tree.root:
            return ofmsgs.ingress_add(dpid, g.gid, in_port, g.source, g.address, g.color)
        return ofmsgs.flow_add(dpid, g.gid, in_port, g.source, g.address)

    def _rejoins(self, g: Group, dpid: int, old: SwitchEntry, new: SwitchEntry, build: list, modify: list,
                 remove: list) -> None:
        """A changed rejoin flow: a new match before the old one goes; the same in place."""
        if new.rejoin == old.rejoin:
            return
        moved = not old.rejoin or old.rejoin[:2] != new.rejoin[:2]
        if new.rejoin:
            (build if moved else modify).append((dpid, self._rejoin(dpid, g, new.rejoin)))
        if old.rejoin and moved:
            remove.append((dpid, self._rejoin(dpid, g, old.rejoin, delete=True)))

    @staticmethod
    def _rejoin(dpid: int, g: Group, rejoin: tuple, delete: bool = False) -> Any:
        arrival, link_tag, acts = rejoin
        if delete:
            return ofmsgs.detour_flow_delete(dpid, ofmsgs.cookie(g.gid), arrival, link_tag,
                                             g.source, g.address)
        edge = ofmsgs.edge_ports(g.tree.ends).get(dpid, ()) if g.tree is not None else ()
        return ofmsgs.detour_flow(dpid, ofmsgs.cookie(g.gid), arrival, link_tag, acts,
                                  g.source, g.address, edge=edge)


def _moves(changed: list[int], have: dict[int, SwitchEntry], want: dict[int, SwitchEntry]) -> bool:
    """Does the change move a path: a switch of both trees takes the group in on another
    port? (Only then can a receiver of both be reached two ways during the change.)"""
    for d in changed:
        old, new = have.get(d), want.get(d)
        if old is not None and new is not None and old.in_port != new.in_port and old.in_port != UNKNOWN_PORT:
            return True
    return False
