"""Everything the controller does that is neither Ryu nor tree computation: the group
lifecycle as REST users see it (with the ACL's join rules, the quotas and idle groups'
expiry), which plans are still in flight, persistence (``controller.persist``), offers and
the ACL (``controller.offers``), metrics and authentication.

The Ryu app is a shim over this class: topology events go to ``core`` and the plans that
come back go through ``apply``; the REST layer (``controller.rest``) calls the group
methods. Nothing here touches a socket or the event loop, so tests drive it with an
``Installer`` backed by the simulated fabric.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import prometheus_client
from prometheus_client import CollectorRegistry

from controller import settings
from controller.auth import (ADMIN, Credentials, Forbidden, Principal, check_admin, check_create,
                             check_self, check_source, may_see_key)
from controller.cluster import Cluster
from controller.core import Group, MulticastCore, Plan
from controller.errors import Conflict, CoreError, InvalidAddress, UnknownReceiver, UnknownSwitch
from controller.events import MAX_LISTED
from controller.treetrace import Read, trace as trace_tree
from controller.linkgate import LinkGate
from controller.metrics import Metrics, SwitchEntries
from controller.offers import Offers
from controller.persist import Persisted, StateFileError, _ip_key
from controller.policy import Acl, Quotas
from controller.state import (DECLARED, GROUP, MAC, MAX_DPID, MAX_PORT, TOPOLOGY, check_group_fields,
                              check_state)
from controller.store import FileStore, Store
from controller.trees import ALGORITHMS
from controller.topoview import check_unicast

log = logging.getLogger("modelcast.service")

RECEIVER_STATES = ("installed", "pending", "unreachable")  # see receiver_state
SAVE_INTERVAL_S = 1.0  # changes learned from the network are written at most this often
EXPIRY_CHECK_S = 10.0  # idle groups are looked for this often
__all__ = ["Changes", "Installer", "Service", "StateFileError", "check_state"]


class Installer(Protocol):
    def install(self, plan: Plan, done: Callable[[list[str]], None]) -> None:
        """Send ``plan`` phase by phase, each phase confirmed by a barrier; call
        ``done(errors)`` once the plan's last barrier has replied, with the OpenFlow error
        strings the switches answered to this plan's messages."""
        ...


class Changes:
    """Wakes the readers waiting for a group to change (``GET /v1/groups/{id}`` with
    ``Prefer: wait=N``): whatever may change what a group shows notifies, and each
    waiter then compares its own group. A host agent waiting for a transfer thus asks
    once per change (or per wait) instead of polling: a poll costs the controller
    ~0.7 ms of CPU, and 100 agents polling at 10 Hz kept one core busy. ``event``
    makes the waitable: the app passes Ryu's ``hub.Event``."""

    def __init__(self, event: Callable[[], Any] = threading.Event, limit: int | None = None) -> None:
        self._new = event
        self._event = event()
        # requests held at once at most (``hold``): each keeps one of the REST server's
        # connections, and the others must stay free for every other call
        self.limit = settings.Settings().held_max if limit is None else limit
        self.held = 0
        self.refused = 0  # holds refused at the limit (answered at once instead)
        self._count = threading.Lock()  # (green under the app: eventlet patches threading)

    @contextmanager
    def hold(self) -> Iterator[bool]:
        """A slot for one held request while the block runs: False (nothing held) when
        ``limit`` are held already; the caller answers at once then, and the client
        (``ControllerClient.watch_group``) paces its next ask itself."""
        with self._count:
            held = self.held < self.limit
            if held:
                self.held += 1
            else:
                self.refused += 1
        try:
            yield held
        finally:
            if held:
                with self._count:
                    self.held -= 1

    def notify(self) -> None:
        event, self._event = self._event, self._new()
        event.set()

    def wait(self, timeout: float) -> bool:
        """Until the next ``notify`` or ``timeout`` s; whether notified."""
        return bool(self._event.wait(timeout))


class Service(Persisted, Offers):
    """Group lifecycle, install state, persistence (``controller.persist``), offers and
    the ACL (``controller.offers``), metrics and auth over a core.

    Group calls take ``who``, the caller (``controller.auth``): the REST layer passes the
    authenticated principal (None: anonymous); in-process callers -- the app's IGMP
    handling, tests -- are the controller itself and default to ``ADMIN``. Quotas, the
    idle time of groups and the cluster secret default to ``controller.settings.current``."""

    def __init__(self, core: MulticastCore, installer: Installer, state_path: Path | None = None,
                 token: str | None = None, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 host_tokens: dict[str, str] | None = None,
                 writer: Callable[[Path, bytes], None] | None = None,
                 save_interval_s: float = SAVE_INTERVAL_S, store: Store | None = None, *,
                 quotas: Quotas | None = None, group_idle_s: float | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        conf = settings.current
        self.core = core
        self.installer = installer
        self.changes = Changes()  # (the app's uses hub.Event)
        self.events = core.events  # the event history (controller.events), one with the core's
        # (gid, receiver) -> when it joined, until a plan puts it on the switches: the
        # "installed" event's time to install
        self._joined: dict[tuple[int, str], float] = {}
        self.state_path = Path(state_path) if state_path is not None else None
        self.writer = writer or self._write  # (path, payload): atomic, or an appended record
        # where the state's objects are kept: the state file by default, or e.g. etcd
        self.store: Store | None = store if store is not None else (
            FileStore(self.state_path, self.writer) if self.state_path is not None else None)
        self.save_interval_s = save_interval_s
        self.dirty: set[str] = set()  # objects changed and not written yet (controller.persist)
        self._dirty = False  # a write is due at the next flush_state (save_soon)
        self._next_save = float("-inf")
        self.credentials = Credentials(token, host_tokens)
        self.clock = clock
        self.wall = wall  # (saved times: when each group last changed)
        self.metrics = Metrics(registry if registry is not None else CollectorRegistry())
        # (read at each scrape from whichever Changes the service has then: the app swaps in its own)
        self.metrics.held_requests.set_function(lambda: self.changes.held)
        self.metrics.holds_refused.set_function(lambda: self.changes.refused)
        self.keys: dict[int, str] = {}  # gid -> hex session key for host agents
        # gid -> the transfer its source announced with the key ({"session", "file_digest"})
        self.transfers: dict[int, dict[str, str]] = {}
        # offer id -> {"model", "source", "name", "size", "files"}: what `modelcast serve`
        # publishes (docs/serving.md)
        self.offers: dict[int, dict[str, Any]] = {}
        self.offer_index: dict[tuple[str, str], int] = {}  # (model, source) -> offer id
        self.acl = Acl()  # who may offer and join which model (controller.policy)
        self.quotas = quotas if quotas is not None else Quotas.from_settings(conf)
        self.owners: dict[int, str] = {}  # gid -> the host whose token created it
        self.pinned: set[int] = set()  # groups that never expire
        self.active: dict[int, float] = {}  # gid -> wall time of its last change
        self.group_idle_s = conf.group_idle_s if group_idle_s is None else group_idle_s
        self._next_expiry = float("-inf")
        self.next_ids = {"group": 1, "offer": 1, "rule": 1}  # never reused (saved in meta)
        # address -> (mac, dpid, port) of the hosts declared over REST: a frame claiming one's
        # address from elsewhere never wins (``HostDiscovery.reserved``; cleared in place,
        # never replaced: discovery holds this dict), until ``DELETE /v1/hosts/{ip}``
        self.declared: dict[str, tuple[str, int, int]] = {}
        self._inflight: Counter[int] = Counter()  # gid -> plans sent, not yet confirmed
        self._plans_inflight = 0
        self._errors: dict[int, list[str]] = {}  # gid -> errors of its last confirmed plan
        self._started = clock()
        # the secret several instances share (controller.cluster; set by controller.ha):
        # session keys sealed in the store, forwarded requests checked
        self.cluster: Cluster | None = None
        # () -> {"role", "leader", "generation"} when several instances run (controller.ha)
        self.cluster_health: Callable[[], dict[str, Any]] | None = None
        # which discovered links are believed (the app sets the one of --fabric before load)
        self.gate = LinkGate()
        self.metrics.groups.set_function(lambda: len(self.core.groups))
        self.events.counted = lambda kind: self.metrics.events.labels(kind=kind).inc()
        self.metrics.registry.register(SwitchEntries(self))
        for state in RECEIVER_STATES:
            self.metrics.receivers.labels(state=state).set_function(
                lambda state=state: self._count_receivers(state))

    # -- plans -------------------------------------------------------------------------
    def apply(self, plan: Plan, reason: str, done: Callable[[list[str]], None] | None = None) -> None:
        """Send a plan and track it: the groups it touches are ``pending`` until the
        installer confirms it. Every plan of the core must pass here, topology-driven
        ones too, or receiver states would claim what the switches do not hold."""
        if not len(plan):
            if done is not None:
                done([])
            return
        gids = sorted(plan.groups)
        for gid in gids:
            self._inflight[gid] += 1
        self._plans_inflight += 1
        if gids:  # (their tree shapes may have moved: saved with the next flush)
            self.touch(*(f"{GROUP}{gid}" for gid in gids))
            self._dirty = True
        self.metrics.installs.inc()
        if reason == "reroute":
            self.metrics.reroutes.inc()
        start = self.clock()
        log.info("install %s: %d messages to %d switches for groups %s",
                 reason, len(plan), len(plan.switches()), _ids(gids))
        confirmed = False
        self.changes.notify()  # (its groups and receivers are pending now)

        def _done(errors: list[str]) -> None:
            nonlocal confirmed
            if confirmed:  # an installer must confirm once; ignore a repeat
                log.warning("install %s for groups %s confirmed twice", reason, _ids(gids))
                return
            confirmed = True
            self._plans_inflight -= 1
            errors = [str(e) for e in errors]
            elapsed = max(0.0, self.clock() - start)
            self.metrics.install_seconds.observe(elapsed)
            for gid in gids:
                self._inflight[gid] -= 1
                if self._inflight[gid] <= 0:
                    del self._inflight[gid]
                if gid not in self.core.groups:  # deleted meanwhile: nothing to report on
                    self._errors.pop(gid, None)
                elif errors:
                    self._errors[gid] = errors
                else:
                    self._errors.pop(gid, None)
            if errors:
                self.metrics.openflow_errors.inc(len(errors))
                log.warning("install %s for groups %s: %d OpenFlow errors: %s",
                            reason, _ids(gids), len(errors), "; ".join(errors[:20]))
                self.events.emit("install_failed", groups=gids, reason=reason, errors=errors[:5])
            else:
                log.debug("install %s for groups %s confirmed in %.1f ms",
                          reason, _ids(gids), elapsed * 1000)
                if gids:
                    self._installed_event(gids, reason, elapsed, len(plan))
            if done is not None:
                done(errors)
            self.changes.notify()

        self.installer.install(plan, _done)

    def _installed_event(self, gids: list[int], reason: str, elapsed: float, messages: int) -> None:
        """One "installed" event per confirmed plan, with each receiver it put on the
        switches since its join and how long that took (join to confirmation)."""
        joined: dict[str, dict[str, float]] = {}
        if self._joined:
            now = self.clock()
            for gid in gids:
                g = self.core.groups.get(gid)
                for ip in list(g.receivers) if g is not None else ():
                    at = self._joined.get((gid, ip))
                    if at is not None and self.receiver_state(g, ip) == "installed":
                        del self._joined[(gid, ip)]
                        joined.setdefault(str(gid), {})[ip] = round(now - at, 4)
        self.events.emit("installed", groups=gids, reason=reason, seconds=round(elapsed, 4),
                         messages=messages, **({"receivers": joined} if joined else {}))

    @property
    def busy(self) -> bool:
        """Plans sent and not yet confirmed: the switches do not hold the belief yet."""
        return self._plans_inflight > 0

    # -- groups ------------------------------------------------------------------------
    def create_group(self, body: dict[str, Any], who: Principal | None = ADMIN
                     ) -> tuple[dict[str, Any], bool]:
        """Create the (model, source) group or return the existing one (created False).
        The existing group is returned unchanged (receivers join with ``join``), but an
        explicitly requested different algorithm is a conflict, not silently ignored.
        A new group gets a new session key (every transfer that re-creates its group runs
        under a fresh key) and an id never used before. A host token is held to the ACL's
        join rules for the receivers it names and to its quotas."""
        model, source, receivers = check_group_fields(body.get("model"), body.get("source"),
                                                      body.get("receivers") or [])
        algorithm = body.get("algorithm")
        if algorithm is not None and algorithm not in ALGORITHMS:
            raise CoreError(f"unknown tree algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
        check_create(who, source, receivers)
        existing = self.core.find(model, source)
        if existing is not None and algorithm is not None and algorithm != existing.algorithm:
            raise Conflict(f"group {existing.gid} for model {model!r} from {source} already "
                           f"exists with algorithm {existing.algorithm!r}")
        address = body.get("address")
        if existing is not None and address is not None and address != existing.address:
            raise Conflict(f"group {existing.gid} for model {model!r} from {source} already "
                           f"exists at {existing.address}")
        # (a pin is the admin's or the source's: from anyone else it is not taken, and the
        # answer's "pinned" says so)
        pin = bool(body.get("pinned")) and (who is None or who.admin or who.ip == source)
        if existing is not None:
            if pin and existing.gid not in self.pinned:
                return self.pin(existing.gid, True, who), False
            return self.group_json(existing, who), False
        for r in receivers:
            self._check_join(who, model, r)
        if who is not None and not who.admin:
            self.quotas.check(who, "groups", len(self._owned(who.ip)))
            self.quotas.check(who, "receivers", self._receivers_of(who.ip), len(receivers))
        gid = self._next_id("group")
        while gid in self.core.groups:  # (a group the core was given directly, as tests do)
            gid = self._next_id("group")
        g, plan = self.core.create_group(model, source, receivers, algorithm=algorithm,
                                         address=address, gid=gid)
        self.keys[g.gid] = secrets.token_hex(32)
        if who is not None and not who.admin:
            self.owners[g.gid] = who.ip
        if pin:
            self.pinned.add(g.gid)
        log.info("group %d created by %s: model %r from %s to %d receivers at %s:%d (%s)", g.gid,
                 who or "anonymous", g.model, g.source, len(g.receivers), g.address, g.port,
                 g.algorithm)
        now = self.clock()
        for ip in g.receivers:
            self._joined[(g.gid, ip)] = now
        self.events.emit("group_created", group=g.gid, model=g.model, source=g.source,
                         receivers=sorted(g.receivers, key=_ip_key)[:MAX_LISTED],
                         receiver_count=len(g.receivers))
        self.apply(plan, "create")
        self._changed(g.gid)
        return self.group_json(g, who), True

    def get_group(self, gid: int, who: Principal | None = ADMIN) -> dict[str, Any]:
        return self.group_json(self.core.group(gid), who)

    def list_groups(self, model: str | None = None, source: str | None = None,
                    who: Principal | None = ADMIN) -> list[dict[str, Any]]:
        if source is not None:
            source = check_unicast(source, "source")
        return [self.group_json(g, who) for gid, g in sorted(self.core.groups.items())
                if (model is None or g.model == model) and (source is None or g.source == source)]

    def rekey(self, gid: int, who: Principal | None = ADMIN,
              transfer: dict[str, Any] | None = None) -> dict[str, Any]:
        """A fresh session key for the group's next transfer (the admin or its source).
        ``transfer`` ({"session", "file_digest"}, schema ``Rekey``) announces that
        transfer: receivers are shown the key with the session id and digest it is for,
        and accept nothing else (no replay of an earlier transfer). Without one the
        announcement is cleared and the old key retired (a sender does so when done).
        Receivers get the new key by joining again (idempotent) or reading the group."""
        g = self.core.group(gid)
        check_source(who, g.source, "rekey its group")
        self.keys[g.gid] = secrets.token_hex(32)
        announced = {k: str(v) for k, v in (transfer or {}).items() if k in ("session", "file_digest")}
        if announced.get("session"):
            self.transfers[g.gid] = announced
        else:
            self.transfers.pop(g.gid, None)
        log.info("group %d rekeyed by %s%s", g.gid, who or "anonymous",
                 f" for session {announced['session']}" if announced.get("session") else "")
        self._changed(g.gid)
        return self.group_json(g, who)

    def delete_group(self, gid: int, done: Callable[[], None] | None = None,
                     who: Principal | None = ADMIN) -> None:
        """Remove the group and its switch state; ``done`` runs once the switches have
        confirmed the removal (at once when nothing was installed)."""
        check_source(who, self.core.group(gid).source, "delete its group")
        plan = self.core.delete_group(gid)
        gid = int(gid)
        for table in (self.keys, self.transfers, self._errors, self.owners, self.active):
            table.pop(gid, None)
        self.pinned.discard(gid)
        self._forget_joins(gid)
        log.info("group %d deleted", gid)
        self.events.emit("group_deleted", group=gid)
        self.apply(plan, "delete", (lambda errors: done()) if done is not None else None)
        self.touch(f"{GROUP}{gid}")
        self.save()

    def join(self, gid: int, ip: str, who: Principal | None = ADMIN) -> dict[str, Any]:
        """Add ``ip``; the answer carries the key when ``who`` may see it (a host joining
        itself with its own token does), so a receiver needs no second call for it. A host
        token is held to the ACL's join rule for the group's model and to its quota."""
        g = self.core.group(gid)
        check_self(who, ip)
        ip = check_unicast(ip, "receiver")
        if ip not in g.receivers:
            self._check_join(who, g.model, ip)
            if who is not None and not who.admin:
                self.quotas.check(who, "receivers", self._receivers_of(who.ip))
        new = ip not in g.receivers
        plan = self.core.join(g.gid, ip)
        if new:
            self._joined[(g.gid, ip)] = self.clock()
            self.events.emit("join", group=g.gid, receiver=ip, by=str(who) if who is not None else "anonymous")
        self.apply(plan, "join")
        self._changed(g.gid)
        return self.group_json(g, who)

    def leave(self, gid: int, ip: str, who: Principal | None = ADMIN) -> dict[str, Any]:
        g = self.core.group(gid)
        check_self(who, ip)
        was = ip in g.receivers
        plan = self.core.leave(g.gid, ip)
        if was:
            self._joined.pop((g.gid, ip), None)
            self.events.emit("leave", group=g.gid, receiver=ip, by=str(who) if who is not None else "anonymous")
        self.apply(plan, "leave")
        self._changed(g.gid)
        return self.group_json(g, who)

    def pin(self, gid: int, pinned: bool, who: Principal | None = ADMIN) -> dict[str, Any]:
        """Keep the group however long it stays unchanged (or let it expire again): the
        admin or its source."""
        g = self.core.group(gid)
        check_source(who, g.source, "pin its group")
        (self.pinned.add if pinned else self.pinned.discard)(g.gid)
        log.info("group %d %s by %s", g.gid, "pinned" if pinned else "unpinned", who or "anonymous")
        self._changed(g.gid)
        return self.group_json(g, who)

    def expire_idle(self) -> list[int]:
        """Delete the groups unchanged for ``group_idle_s`` (none when 0) that are neither
        pinned nor offered (a server's offer keeps its group); the ids deleted."""
        if self.group_idle_s <= 0:
            return []
        cutoff = self.wall() - self.group_idle_s
        idle = [gid for gid, g in self.core.groups.items()
                if self.active.get(gid, cutoff + 1) < cutoff and gid not in self.pinned
                and not self.offered(g.model, g.source)]
        for gid in idle:
            log.warning("group %d expired: unchanged for more than %g s (--group-idle), not pinned "
                        "and not offered", gid, self.group_idle_s)
            self.delete_group(gid)
        return idle

    def _forget_joins(self, gid: int) -> None:
        for key in [k for k in self._joined if k[0] == gid]:
            del self._joined[key]

    def _changed(self, gid: int) -> None:
        """A REST change of a group: its idle clock restarts, and it is saved now."""
        self.active[gid] = self.wall()
        self.touch(f"{GROUP}{gid}")
        self.save()

    def _check_join(self, who: Principal | None, model: str, ip: str) -> None:
        if not self.acl.may_join(who, model, ip):
            raise Forbidden(f"{ip} may not join groups of model {model!r:.80}: the ACL's rule for it "
                            "does not name the host")

    def _owned(self, ip: str) -> list[int]:
        return [gid for gid, owner in self.owners.items() if owner == ip]

    def _receivers_of(self, ip: str) -> int:
        """Receiver entries a host's token holds: every receiver of the groups it created,
        and its own memberships of the others."""
        owned = set(self._owned(ip))
        return sum(len(g.receivers) if gid in owned else int(ip in g.receivers)
                   for gid, g in self.core.groups.items())

    # -- hosts and topology ------------------------------------------------------------
    def declare_host(self, ip: str, mac: str, dpid: int, port: int,
                     who: Principal | None = ADMIN) -> dict[str, Any]:
        """A host declared by an operator (it may not have sent a packet yet). Declaring
        an address already known elsewhere, or on an inter-switch link port, is a
        conflict: a declaration must not silently move a live receiver. The declaration
        stands until ``remove_host``: a frame claiming the address from another port or
        MAC is refused without probing the host (no silence makes the claim win), while
        the host itself is forgotten and found again as any other (port down, silence)."""
        check_admin(who, "declare hosts")
        ip = check_unicast(ip)
        if not isinstance(mac, str) or not MAC.match(mac.lower()):
            raise InvalidAddress(f"mac {mac!r} is not a MAC address like 00:00:00:00:00:01")
        mac = mac.lower()
        if not isinstance(dpid, int) or isinstance(dpid, bool) or not 0 < dpid <= MAX_DPID:
            raise CoreError(f"dpid {dpid!r} is not a datapath id (1..2^64-1)")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port <= MAX_PORT:
            raise CoreError(f"port {port!r} is not a switch port number (1..{MAX_PORT})")
        view = self.core.view
        known = view.hosts.get(ip)
        if known is not None and (known.mac, known.dpid, known.port) != (mac, dpid, port):
            raise Conflict(f"host {ip} is already known at {known.mac} on switch {known.dpid} "
                           f"port {known.port}")
        if not view.edge_port(dpid, port):
            raise Conflict(f"switch {dpid} port {port} is an inter-switch link, not a host port")
        log.info("host %s declared at %s on switch %d port %d", ip, mac, dpid, port)
        self.apply(self.core.host_add(ip, mac, dpid, port), "host")
        self.declared[ip] = (mac, dpid, port)
        self.touch(f"{DECLARED}{ip}", TOPOLOGY)
        self.save()
        return {"ip": ip, "mac": mac, "dpid": dpid, "port": port}

    def remove_host(self, ip: str, who: Principal | None = ADMIN) -> None:
        """Forget a host and its declaration (e.g. before declaring it somewhere else);
        its groups keep it as an unreachable receiver until it is seen again."""
        check_admin(who, "remove hosts")
        ip = check_unicast(ip)
        known = ip in self.core.view.hosts
        if not known and ip not in self.declared:
            self.core.view.host(ip)  # UnknownHost -> 404
        if ip in self.gate.hosts:
            raise Conflict(f"host {ip} is pinned by the fabric the controller was started with "
                           "(--fabric): change that file to move it")
        if self.declared.pop(ip, None) is not None:
            log.info("host %s: its declaration is removed", ip)
        if known:
            self.apply(self.core.host_remove(ip), "host")
        self.touch(f"{DECLARED}{ip}", TOPOLOGY)
        self.save()

    # -- drains: a link or a switch held out of every tree for maintenance ----------------
    def drain(self, a: int, b: int | None, on: bool, who: Principal | None = ADMIN) -> dict[str, Any]:
        """Hold the link between switches ``a`` and ``b`` (``b`` None: switch ``a``) out
        of every tree and detour while it is still up (``on``), or give it back. Each tree
        crossing it moves off by version: no copy lost or doubled. Saved: a restart and a
        new leader keep it."""
        check_admin(who, "drain switches and links")
        view = self.core.view
        for d in (a, b):
            if d is not None and d not in view.switches:
                raise UnknownSwitch(f"switch {d} is not in the controller's view")
        if b is not None and (a == b or not any({k.a, k.b} == {a, b} for k in view.links)):
            raise UnknownSwitch(f"no link between switches {a} and {b}")
        plan = self.core.drain(a, b, on)
        if len(plan):
            log.info("%s %s: %d trees move (%d messages)", "drain" if on else "undrain",
                     f"link {a}-{b}" if b is not None else f"switch {a}", len(plan.moved), len(plan))
        self.events.emit("drain", groups=plan.groups, switches=[a] if b is None else sorted((a, b)),
                         on=on, by=str(who) if who is not None else "anonymous")
        self.apply(plan, "drain" if on else "undrain")
        self.touch(TOPOLOGY)
        self.save()
        return self._drain_json([a] if b is None else sorted((a, b)), on)

    def drains(self) -> list[dict[str, Any]]:
        """Every drain, with the trees still crossing it and whether its moves are
        installed (``clear``: nothing crosses it and no plan is in flight)."""
        return [self._drain_json(d["switches"], True, d) for d in self.core.drained()]

    def _drain_json(self, switches: list[int], on: bool, found: dict[str, Any] | None = None) -> dict[str, Any]:
        if found is None:
            found = next((d for d in self.core.drained() if d["switches"] == switches),
                         {"trees": 0})
        trees = found["trees"] if on else 0
        return {"kind": "switch" if len(switches) == 1 else "link", "switches": switches, "drained": on,
                "trees": trees, "clear": trees == 0 and not self._plans_inflight}

    def topology(self) -> dict[str, Any]:
        view = self.core.view
        links = []
        for k in sorted(view.links):
            edge = view.graph.get_edge_data(k.a, k.b)
            links.append({"a": k.a, "a_port": k.a_port, "b": k.b, "b_port": k.b_port,
                          "up": bool(edge) and edge.get("key") == k})
        return {"switches": sorted(view.switches), "links": links,
                "hosts": [self._host_json(h) for _, h in sorted(view.hosts.items(),
                                                                  key=lambda kv: _ip_key(kv[0]))]}

    def health(self) -> dict[str, Any]:
        out = {"status": "ok", "switches": len(self.core.view.switches),
               "groups": len(self.core.groups),
               "uptime_s": round(max(0.0, self.clock() - self._started), 3),
               "protection": {"on": self.core.protection, "detour_ends": "per-link" if self.core.nicira else "per-group",
                              "unprotected_switches": sorted(self.core.no_ff)},
               "fabric": self.gate.health(self.core.view)}
        if self.core.damping.held:  # links held out of new trees for flapping
            out["flapping"] = self.core.damping.report(time.monotonic())
        if self.cluster_health is not None:  # several instances: role, leader, generation
            out.update(self.cluster_health())
        return out

    # -- metrics -----------------------------------------------------------------------
    def metrics_text(self) -> bytes:
        return prometheus_client.generate_latest(self.metrics.registry)

    def count_request(self, method: str, status: int) -> None:
        """``method`` must come from a fixed set (the REST layer maps others to "other"):
        every distinct label value is a time series kept forever."""
        self.metrics.rest_requests.labels(method=method, status=str(status)).inc()

    # -- auth --------------------------------------------------------------------------
    def authenticate(self, header: str | None, mutating: bool = False) -> Principal | None:
        """The caller behind an Authorization header (None: anonymous). A wrong token is
        a 401 on any call; a mutating call needs a token unless none is configured."""
        who = self.credentials.authenticate(header)
        return self.credentials.require(who) if mutating else who

    # -- views -------------------------------------------------------------------------
    def receiver_state(self, g: Group, ip: str) -> str:
        """installed: the tree reaches ``ip``, no plan of the group is in flight or
        failed, and every switch on the path holds its entry (a restored controller has
        trees before its switches reconnect: those receivers are still pending).
        pending also while the receiver or the source has not been found yet (the
        controller probes for it); unreachable: both known, but no live path."""
        hosts = self.core.view.hosts
        if ip not in hosts or g.source not in hosts:
            return "pending"
        if g.tree is None or ip not in g.tree.reached:
            return "unreachable"
        if self._inflight.get(g.gid) or g.gid in self._errors:
            return "pending"
        return "installed" if self._on_switches(g, ip) else "pending"

    def errors_of(self, gid: int) -> list[str]:
        """The OpenFlow errors of the group's last confirmed plan (none: it was installed)."""
        return list(self._errors.get(gid, ()))

    def plans_of(self, gid: int) -> int:
        """The group's plans sent and not yet confirmed by barriers."""
        return self._inflight.get(gid, 0)

    def trace(self, gid: int, receiver: str | None = None, read: Read | None = None) -> dict[str, Any]:
        """The group's tree hop by hop for each receiver (or ``receiver`` alone: 404 when
        it is not one), with live counters when ``read`` is given (``controller.treetrace``)."""
        g = self.core.group(gid)
        if receiver is not None:
            receiver = check_unicast(receiver, "receiver")
            if receiver not in g.receivers:
                raise UnknownReceiver(f"{receiver} is not a receiver of group {g.gid}")
        return trace_tree(self, g, [receiver] if receiver is not None else list(g.receivers),
                          read, time.monotonic)

    def _on_switches(self, g: Group, ip: str) -> bool:
        loc = self.core.view.hosts.get(ip)
        if loc is None or g.tree is None:
            return False
        dpid: int | None = loc.dpid
        installed = self.core.installed
        while dpid is not None:
            want = g.tree.entries.get(dpid)
            if want is None or installed.get(dpid, {}).get(g.gid) != want:
                return False
            dpid = g.tree.parent.get(dpid)
        return True

    def group_state(self, g: Group) -> str:
        if self._inflight.get(g.gid):
            return "pending"
        if g.gid in self._errors:
            return "error"
        if not g.receivers:
            return "idle"
        if any(self.receiver_state(g, ip) == "pending" for ip in g.receivers):
            return "pending"
        return "installed"

    def group_json(self, g: Group, who: Principal | None = ADMIN) -> dict[str, Any]:
        """The group as REST shows it; ``key`` only for a caller allowed to see it."""
        t = g.tree
        tree: dict[str, Any] = {"switches": [], "links": [], "out_ports": {}, "in_ports": {}}
        if t is not None:
            tree = {"switches": sorted(set(t.parent) | set(t.entries)),
                    "links": [[p, c] for p, c in sorted(t.links())],
                    "out_ports": {str(d): sorted(e.out_ports) for d, e in sorted(t.entries.items())},
                    "in_ports": {str(d): e.in_port for d, e in sorted(t.entries.items())}}
        out = {"id": g.gid, "model": g.model, "source": g.source, "address": g.address,
               "port": g.port, "algorithm": g.algorithm, "state": self.group_state(g),
               "receivers": {ip: self.receiver_state(g, ip)
                             for ip in sorted(g.receivers, key=_ip_key)},
               "tree": tree, "errors": list(self._errors.get(g.gid, [])), "pinned": g.gid in self.pinned}
        out.update(self.transfers.get(g.gid, {}))  # not secret: every datagram names its session
        key = self.keys.get(g.gid)
        if key and may_see_key(who, g.source, g.receivers):
            out["key"] = key
        return out

    def _count_receivers(self, state: str) -> int:
        return sum(1 for g in self.core.groups.values() for ip in g.receivers
                   if self.receiver_state(g, ip) == state)

    @staticmethod
    def _host_json(h: Any) -> dict[str, Any]:
        return {"ip": h.ip, "mac": h.mac, "dpid": h.dpid, "port": h.port}

    # -- persistence (the rest: controller.persist) ----------------------------------------
    def flush_state(self, now: float) -> bool:
        """The app's timer (every 0.25 s, while leading): idle groups expired now and then,
        pending changes written at most every ``save_interval_s``."""
        if now >= self._next_expiry:
            self._next_expiry = now + EXPIRY_CHECK_S
            self.expire_idle()
        if not self._dirty or now < self._next_save:
            return True
        self._next_save = now + self.save_interval_s
        return self.save()


def _ids(gids: list[int], limit: int = 10) -> str:
    """Group ids for a log line: a big reroute touches thousands."""
    head = ", ".join(map(str, gids[:limit]))
    return f"[{head}]" if len(gids) <= limit else f"[{head}, ... {len(gids)} in all]"
