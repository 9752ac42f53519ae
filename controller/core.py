"""The controller's pure core: groups and their trees, and the entry point for every event.

Inputs are method calls (topology events, group requests); outputs are ``Plan``s of
OpenFlow messages. Nothing here touches Ryu's event loop or a socket, so the same code
runs in the Ryu app, the simulated fabric tests and the benchmark.

Owns: the groups (registry and indexes, receivers, addresses), each group's tree and the
links' load, and the order of a change: search or regraft a tree, have it protected
(``controller.failover``), then diffed into messages (``controller.plan``). Every change
computes the desired per-switch state and diffs it against the belief of what switches
hold, so group edits, topology changes and a switch returning with empty tables are one
mechanism.

Does not touch: protection's pieces and counts (``failover``), the switches' believed
state and messages (``plan``), the topology itself (``topoview``: it is told, not asked).
"""

from __future__ import annotations

import gc
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from controller import ofmsgs
from controller.addressing import check_model, check_ssm, ssm_address
from controller.damping import Damping
from controller.errors import Conflict, CoreError, ReceiverIsSource, UnknownGroup
from controller.events import EventLog
from controller.failover import Failover
from controller.plan import BUILD, MAX_GID, REMOVE, UNKNOWN_PORT, Plan, Planner, SwitchState
from controller.topoview import TopologyView, check_unicast, known_hosts
from controller.trees import ALGORITHMS, LinkLoad, PathCache, SwitchEntry, Tree, compute_tree, regraft
from controller.trees import crossing as _crossing

__all__ = ["DEFAULT_PORT", "MAX_GID", "UNKNOWN_PORT", "Group", "MulticastCore", "Plan", "SwitchEntry",
           "SwitchState", "tune_gc"]

log = logging.getLogger("modelcast.core")
DEFAULT_PORT = 5500


def tune_gc() -> None:
    """The core holds large long-lived state (an entry per switch per group): with
    CPython's default thresholds all of it is rescanned every few thousand allocations
    and a reroute stalls for 100-250 ms. The older generations are collected rarely;
    the young one stays small, since a young pass visits everything its objects point
    to (a larger threshold puts 20-45 ms pauses into reroutes). Called once by the
    controller and by the benchmark."""
    gc.set_threshold(1000, 10_000, 1000)


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
    # the version its first switch stamps on every copy (0 or 1; ``ofmsgs.stamp``): each
    # move of its tree flips it (``controller.plan``)
    color: int = field(default=0, repr=False, compare=False)

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


class MulticastCore:
    """Groups, trees and events (see the module's docstring); ``failover`` and
    ``planner`` are its managers. ``balance`` False: load-blind trees (the benchmark's
    baseline); ``protection`` False: failures are handled by the controller's reroute
    alone; ``nicira`` (``Failover``'s)."""

    Failover = Failover  # (class attributes, so a test can pick another)
    _regraft_tree = staticmethod(regraft)

    def __init__(self, view: TopologyView | None = None, algorithm: str = "spt",
                 udp_port: int = DEFAULT_PORT, balance: bool = True, protection: bool = True,
                 nicira: bool = True, flap_damping: int = 3) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown tree algorithm {algorithm!r}; use one of {ALGORITHMS}")
        self.view = view or TopologyView()
        self.algorithm = algorithm
        self.udp_port = udp_port
        self.balance = balance
        self.groups: dict[int, Group] = {}
        self.failover = self.Failover(self.view, protection, nicira)
        self.planner = Planner(self.view, self.groups, self.failover)
        self.damping = Damping(flaps=flap_damping)  # flapping links held out of new trees (controller.damping)
        self.events = EventLog()  # what happened, for operators (controller.events; the service's too)
        # gid -> its tree's parent map (groups with a tree): what a failure scans for the
        # groups crossing a link (``_crossing``), without visiting each group and tree
        self._parents: dict[int, dict[int, int | None]] = {}
        self.load = LinkLoad()  # directed link -> groups crossing it
        self.cache = PathCache(self.view)
        # indexes, so that a request costs the same with 10 or 10,000 groups
        self._by_key: dict[tuple[str, str], int] = {}  # (model, source) -> gid
        self._by_model: defaultdict[str, set[int]] = defaultdict(set)
        self._by_addr: defaultdict[str, set[int]] = defaultdict(set)
        self._next_gid = 1
        self._saved_trees: dict[int, dict[int, int | None]] = {}  # restored, not yet rebuilt
        self.entries_at, self.shared_intended = self.planner.entries_at, self.failover.shared_intended

    # the managers' state under the names the app, the service and the tests read
    # (read-only: rebinding one here would part it from the manager that keeps it)
    protection = property(lambda self: self.failover.protection)
    nicira = property(lambda self: self.failover.nicira)
    detours = property(lambda self: self.failover.detours)
    no_ff = property(lambda self: self.failover.no_ff)
    ff_refs = property(lambda self: self.failover.ff_refs)
    guards = property(lambda self: self.failover.guards)
    shared_want = property(lambda self: self.failover.shared_want)
    installed = property(lambda self: self.planner.installed)
    placed = property(lambda self: self.planner.placed)
    shared = property(lambda self: self.planner.shared)
    changes = property(lambda self: self.planner.changes)

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
        plan = self.planner.diff([g.gid])
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

    def switch_enter(self, dpid: int, present: "SwitchState | None" = None) -> Plan:
        """A switch (re)connected. Without ``present`` it is assumed empty and gets its
        whole share of every tree. With ``present`` (what the switch reported holding of
        ours, after a controller restart or a control-channel flap) only the differences
        are fixed, so delivery through a healthy switch never stops."""
        stale = Plan()
        stale.phases[REMOVE].extend(self.planner.adopt(dpid, present))
        plan = Plan()
        if present is not None:  # before anything might add one of the same id again
            plan.phases[BUILD].extend((dpid, ofmsgs.group_delete(dpid, t)) for t in sorted(present.turns))
        plan.extend(self._after_up() if self.view.add_switch(dpid) else Plan())
        plan.extend(self.sync_switch(dpid))
        if present is not None:  # flows on ingress ports the tree no longer uses
            stale.phases[REMOVE].extend(self.planner.leftovers(dpid, present))
        return plan.extend(stale)

    def switch_leave(self, dpid: int) -> Plan:
        """The switch is gone (or its control channel is, past the app's grace period)."""
        self.planner.forget(dpid)
        if not self.view.remove_switch(dpid):
            return Plan()
        # (the groups whose tree crosses it, found by a scan: a switch leaving is rare, and
        # an index of them cost a set insertion per switch of every new tree)
        return self._after_down({gid for gid, parent in self._parents.items() if dpid in parent})

    def link_add(self, a: int, a_port: int, b: int, b_port: int) -> Plan:
        return self._after_up() if self.view.add_link(a, a_port, b, b_port) else Plan()

    def link_remove(self, a: int, a_port: int, b: int, b_port: int, now: float | None = None) -> Plan:
        live = self.view.graph.has_edge(a, b)
        if not self.view.remove_link(a, a_port, b, b_port):
            return Plan()
        if live:
            self._flapped(a, b, now)
        # every tree crossing the link crosses something no longer live; the trees that
        # cross a link whose detour the failure changed are found in the same scan
        reguard = self.failover.restale() if self.protection else set()
        lost = ((a, b), (b, a))
        crossing = self._crossing(lost + tuple(self._stale_links(reguard)))
        return self._sync(sorted(gid for gid, links in crossing.items() if lost[0] in links or lost[1] in links),
                          (reguard, crossing))

    def drain(self, a: int, b: int | None = None, on: bool = True) -> Plan:
        """Hold the link between switches ``a`` and ``b`` (``b`` None: switch ``a``) out
        of every tree and detour for maintenance (``on``), or give it back. The trees
        crossing it move off, each by version (no copy lost or doubled: it is still up);
        new trees avoid it. Given back, nothing moves onto it at once (no churn)."""
        edges = self.view.hold(a, b, on)
        if not on or not edges:
            return self._after_up() if edges else Plan()
        lost = tuple(e for x, y, _ in edges for e in ((x, y), (y, x)))
        reguard = self.failover.restale() if self.protection else set()
        crossing = self._crossing(lost + tuple(self._stale_links(reguard)))
        return self._sync(sorted(gid for gid, links in crossing.items() if any(k in lost for k in links)),
                          (reguard, crossing))

    def drained(self) -> list[dict[str, Any]]:
        """The drains, each with the trees that still cross it (by the trees; the
        switches follow once the plans are installed)."""
        out = []
        for pair in sorted(self.view.held, key=sorted):
            a, b = sorted(pair)
            out.append({"kind": "link", "switches": [a, b],
                        "trees": sum(1 for p in self._parents.values() if p.get(a) == b or p.get(b) == a)})
        for dpid in sorted(self.view.held_switches):
            out.append({"kind": "switch", "switches": [dpid],
                        "trees": sum(1 for p in self._parents.values() if dpid in p)})
        return out

    def _flapped(self, a: int, b: int, now: float | None) -> None:
        """A live link went down: held out of new trees for a while if it flaps."""
        now = time.monotonic() if now is None else now
        until = self.damping.down(frozenset((a, b)), now)
        if until is not None:
            self.view.damp(a, b, True)
            log.warning("link %d-%d went down %d times within %g s: held out of trees and detours "
                        "for %g s", a, b, self.damping.flaps, self.damping.window_s, until - now)
            self.events.emit("damped", switches=sorted((a, b)), hold_s=round(until - now, 1),
                             flaps=self.damping.flaps, window_s=self.damping.window_s)

    def release_damped(self, now: float) -> Plan:
        """Give back the flapping links whose hold ended by ``now`` (the app's timer)."""
        back = False
        for pair in self.damping.due(now):
            a, b = sorted(pair)
            log.info("link %d-%d: its hold for flapping ended", a, b)
            self.events.emit("undamped", switches=[a, b])
            back |= bool(self.view.damp(a, b, False))
        return self._after_up() if back else Plan()

    def port_down(self, dpid: int, port: int, now: float | None = None) -> Plan:
        return self.ports_down(dpid, [port], now)

    def ports_down(self, dpid: int, ports: Iterable[int], now: float | None = None) -> Plan:
        """Ports of one switch went down together (a reconnecting switch reports them all
        at once): one reroute for all of them. One per port would be wrong in a single
        plan: plans run phase by phase together, so a tree moved by the first port and
        moved back by the next would have phase 2 delete the flows it is back on."""
        lost: list[tuple[int, int]] = []  # (both directions of each link: one scan for all)
        hosts: set[str] = set()
        went = False
        for port in ports:
            link = self.view.port_link.get((dpid, port))
            live = link is not None and self.view.graph.has_edge(link.a, link.b)
            if not self.view.port_down(dpid, port):
                continue
            went = True
            if link is not None:
                lost += ((link.a, link.b), (link.b, link.a))
                if live:  # (once per link: its other end's PortStatus finds it down)
                    self._flapped(link.a, link.b, now)
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
        return self._protect_anew(lambda: setattr(self.failover, "nicira", on))

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
        keys = self.failover.anew()  # (the detours' shared entries as they were: dropped)
        change()
        self.failover.reguard(keys)  # (those still in use come back: ``recount``)
        gids = []
        if self.protection:
            for g in self.groups.values():
                if g.tree is None:
                    continue
                was = dict(g.tree.entries)
                self.failover.protect(g.tree)
                self.failover.recount(was, g.tree.entries)
                gids.append(g.gid)
        return self.planner.diff(gids)

    def sync_switch(self, dpid: int) -> Plan:
        """Whatever the switch lacks of the trees, by the core's belief (idempotent)."""
        self.planner.shared_dirty(dpid)
        placed = self.planner.placed  # (the groups with nothing there have nothing to sync: a
        # restart reconciling every switch looked at every group per switch, 1,445 x 1,000)
        return self.planner.diff([gid for gid, g in self.groups.items() if dpid in placed.get(gid, ()) or (
            g.tree is not None and dpid in g.tree.entries)], only={dpid})

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
                self.failover.recount(was, now)
            else:
                self.failover.count(now, 1)
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
        already asked of ``Failover.restale`` (the protected ports whose detour changed) and of
        ``_crossing`` for those ports' links (``_stale_links``), so that a failure scans
        the trees once."""
        gids = list(gids)
        reguard, crossing = stale if stale is not None else (self.failover.restale() if self.protection else set(), None)
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
            fill = self.failover.fill if g.tree is None and self.planner.one_pass else None
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
            if fill is not None:  # (``Failover.fill`` did what ``protect`` and ``_swap`` do)
                if tree is not None:
                    self.load.add_tree(tree, 1)
                self._tree(g, tree)
                continue
            if tree is not None and self.protection:
                self.failover.protect(tree, old=g.tree, stale=reguard)
            self._swap(g, tree)
        if not reguard:
            return self.planner.diff(gids, within=within)
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
        return self.planner.diff(gids, within=within).extend(self.planner.diff(sorted(again), only=nodes, shared=False,
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
            self.failover.protect(g.tree, at)
            # (``Failover.protect`` leaves an entry whose protection is the same as it was)
            moved = [n for n in at if entries[n] is not old[n]]
            if moved:
                self.failover.recount({n: old[n] for n in moved}, {n: entries[n] for n in moved})
                kept.append(gid)
        return kept

    def _stale_links(self, reguard: set[tuple[int, int]]) -> list[tuple[int, int]]:
        """The links (parent, child) leaving the protected ports ``reguard``."""
        port_link = self.view.port_link
        return [(p, port_link[(p, port)].far_end(p, port)) for p, port in reguard if (p, port) in port_link]

    def _crossing(self, links: Iterable[tuple[int, int]]) -> dict[int, list[tuple[int, int]]]:
        """Group id -> those of ``links`` (parent, child) its tree crosses, by a scan of the
        trees (``trees.crossing``) rather than an index: a failure is rare next to new
        trees, and an index would cost every new tree a set insertion per switch."""
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
            self.failover.protect(tree, nodes, old=g.tree, stale=stale)
            changed |= nodes
        self._swap(g, tree, changed)
        return changed

    def to_dict(self) -> dict[str, Any]:
        """Groups and the last known topology: a restarted controller routes at once and
        reconciles switches as they reconnect instead of tearing trees down meanwhile."""
        v = self.view
        return {"version": 1, "groups": [g.to_dict() for g in self.groups.values()],
                "topology": {"switches": sorted(v.switches),
                             "links": [[k.a, k.a_port, k.b, k.b_port] for k in sorted(v.links)],
                             "hosts": [[h.ip, h.mac, h.dpid, h.port] for h in v.hosts.values()],
                             "drains": self.drains()}}

    def drains(self) -> list[list[int]]:
        """The drains as saved: [a, b] a link, [a] a switch."""
        return sorted(sorted(p) for p in self.view.held) + [[d] for d in sorted(self.view.held_switches)]

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
            for drain in topo.get("drains", []):  # (before the trees: none is computed across one)
                self.view.hold(int(drain[0]), int(drain[1]) if len(drain) == 2 else None, True)
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
