"""Everything the controller does that is neither Ryu nor tree computation: the group
lifecycle as REST users see it, which plans are still in flight, persistence, metrics
and authentication.

The Ryu app is a shim over this class: topology events go to ``core`` and the plans that
come back go through ``apply``; the REST layer (``controller.rest``) calls the group
methods. Nothing here touches a socket or the event loop, so tests drive it with an
``Installer`` backed by the simulated fabric.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import socket
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, Counter as PCounter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from controller import settings
from controller.addressing import check_model, check_ssm
from controller.auth import (ADMIN, Credentials, Principal, check_admin, check_create, check_self,
                             check_source, may_see_key)
from controller.core import MAX_GID, Group, MulticastCore, Plan
from controller.errors import Conflict, CoreError, InvalidAddress, UnknownOffer
from controller.linkgate import LinkGate
from controller.store import FileStore, Store, write_atomic
from controller.topoview import check_unicast
from controller.trees import ALGORITHMS

log = logging.getLogger("modelcast.service")

STATE_VERSION = 1
RECEIVER_STATES = ("installed", "pending", "unreachable")  # see receiver_state
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
MAX_DPID = (1 << 64) - 1
MAX_PORT = 0xFFFFFF00  # OFPP_MAX
SAVE_INTERVAL_S = 1.0  # changes learned from the network are written at most this often


class StateFileError(Exception):
    """The state file exists but cannot be used at all (not JSON, wrong shape or version).
    The controller must not start over it: saving would overwrite the groups and keys."""


class Installer(Protocol):
    def install(self, plan: Plan, done: Callable[[list[str]], None]) -> None:
        """Send ``plan`` phase by phase, each phase confirmed by a barrier; call
        ``done(errors)`` once the plan's last barrier has replied, with the OpenFlow error
        strings the switches answered to this plan's messages."""
        ...


class Metrics:
    """Every metric of the controller, declared in one place on an injected registry
    (faucet_metrics' pattern) so tests read values from their own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.groups = Gauge("modelcast_groups", "Multicast groups defined",
                            registry=registry)
        self.receivers = Gauge("modelcast_receivers", "Group receivers by delivery state",
                               ["state"], registry=registry)
        self.installs = PCounter("modelcast_installs", "Plans sent to the switches",
                                 registry=registry)
        self.reroutes = PCounter("modelcast_reroutes",
                                 "Plans moving trees off failed links or switches",
                                 registry=registry)
        self.openflow_errors = PCounter("modelcast_openflow_errors",
                                        "OpenFlow errors switches answered to our plans",
                                        registry=registry)
        self.rest_requests = PCounter("modelcast_rest_requests", "REST requests served",
                                      ["method", "status"], registry=registry)
        self.audits = PCounter("modelcast_audits",
                               "Switch table audits by result: clean, repaired (the switch had "
                               "drifted from the intended state), void (overtaken by a change)",
                               ["result"], registry=registry)
        self.held_requests = Gauge("modelcast_rest_held_requests",
                                   "GETs held until their group changes (Prefer: wait), now", registry=registry)
        self.holds_refused = Gauge("modelcast_rest_holds_refused",
                                   "GETs answered at once since start because the most that are held at once were held",
                                   registry=registry)
        # (set by the app from its REST server, controller.webserver)
        self.rest_connections = Gauge("modelcast_rest_connections", "REST connections being served, now",
                                      registry=registry)
        self.rest_connections_refused = Gauge(
            "modelcast_rest_connections_refused",
            "REST connections answered 503 since start: their client held the most one client may",
            registry=registry)
        self.lldp_refused = Gauge(  # (set by the app from controller.lldpauth)
            "modelcast_lldp_refused",
            "Discovery (LLDP) frames refused since start: our format without a valid, fresh "
            "signature (a host forging links?)", registry=registry)
        self.links_refused = PCounter(
            "modelcast_links_refused",
            "Discovered links not believed, by why: not pinned (not a link of --fabric), host "
            "ports (hosts attached at both ends: hosts relaying discovery frames?)",
            ["why"], registry=registry)
        self.punt_quarantines = Gauge(  # (set by the app from controller.punt)
            "modelcast_punt_quarantines",
            "Host ports quarantined since start: more than --punt-port-rate frames to the "
            "controller in one second (a host flooding new addresses or discovery frames?)",
            registry=registry)
        self.install_seconds = Histogram(
            "modelcast_install_seconds", "Time from sending a plan to its last barrier reply",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry)


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


class Service:
    """Group lifecycle, install state, persistence, metrics and auth over a core.

    Group calls take ``who``, the caller (``controller.auth``): the REST layer passes the
    authenticated principal (None: anonymous); in-process callers -- the app's IGMP
    handling, tests -- are the controller itself and default to ``ADMIN``."""

    def __init__(self, core: MulticastCore, installer: Installer, state_path: Path | None = None,
                 token: str | None = None, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 host_tokens: dict[str, str] | None = None,
                 writer: Callable[[Path, bytes], None] | None = None,
                 save_interval_s: float = SAVE_INTERVAL_S, store: Store | None = None) -> None:
        self.core = core
        self.installer = installer
        self.changes = Changes()  # (the app's uses hub.Event)
        self.state_path = Path(state_path) if state_path is not None else None
        self.writer = writer or self._write  # (path, payload): atomic and durable
        # where state() is kept: the state file by default, or e.g. etcd (controller.store)
        self.store: Store | None = store if store is not None else (
            FileStore(self.state_path, self.writer) if self.state_path is not None else None)
        self.save_interval_s = save_interval_s
        self._dirty = False  # changes not written yet (save_soon)
        self._next_save = float("-inf")
        self.credentials = Credentials(token, host_tokens)
        self.clock = clock
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
        # address -> (mac, dpid, port) of the hosts declared over REST: a frame claiming one's
        # address from elsewhere never wins (``HostDiscovery.reserved``; cleared in place,
        # never replaced: discovery holds this dict), until ``DELETE /v1/hosts/{ip}``
        self.declared: dict[str, tuple[str, int, int]] = {}
        self._inflight: Counter[int] = Counter()  # gid -> plans sent, not yet confirmed
        self._plans_inflight = 0
        self._errors: dict[int, list[str]] = {}  # gid -> errors of its last confirmed plan
        self._started = clock()
        # () -> {"role", "leader", "generation"} when several instances run (the app's)
        self.cluster: Callable[[], dict[str, Any]] | None = None
        # which discovered links are believed (the app sets the one of --fabric before load)
        self.gate = LinkGate()
        self.metrics.groups.set_function(lambda: len(self.core.groups))
        self.metrics.registry.register(_SwitchEntries(self))
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
            else:
                log.debug("install %s for groups %s confirmed in %.1f ms",
                          reason, _ids(gids), elapsed * 1000)
            if done is not None:
                done(errors)
            self.changes.notify()

        self.installer.install(plan, _done)

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
        A new group gets a new session key: every transfer that re-creates its group
        (after a delete) runs under a fresh key."""
        model = check_model(body.get("model"))
        source = check_unicast(body.get("source"), "source")
        algorithm = body.get("algorithm")
        if algorithm is not None and algorithm not in ALGORITHMS:
            raise CoreError(f"unknown tree algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
        receivers = body.get("receivers") or []
        if not isinstance(receivers, list):
            raise CoreError("receivers must be a list of IPv4 addresses")
        if len(set(receivers)) != len(receivers):  # here, not uniqueItems: that is O(n^2)
            raise CoreError("receivers must not name an address twice")
        check_create(who, source, receivers)
        existing = self.core.find(model, source)
        if existing is not None and algorithm is not None and algorithm != existing.algorithm:
            raise Conflict(f"group {existing.gid} for model {model!r} from {source} already "
                           f"exists with algorithm {existing.algorithm!r}")
        address = body.get("address")
        if existing is not None and address is not None and address != existing.address:
            raise Conflict(f"group {existing.gid} for model {model!r} from {source} already "
                           f"exists at {existing.address}")
        g, plan = self.core.create_group(model, source, receivers, algorithm=algorithm,
                                         address=address)
        if existing is not None:
            return self.group_json(g, who), False
        self.keys[g.gid] = secrets.token_hex(32)
        log.info("group %d created by %s: model %r from %s to %d receivers at %s:%d (%s)", g.gid,
                 who or "anonymous", g.model, g.source, len(g.receivers), g.address, g.port,
                 g.algorithm)
        self.apply(plan, "create")
        self.save()
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
        self.save()
        return self.group_json(g, who)

    def delete_group(self, gid: int, done: Callable[[], None] | None = None,
                     who: Principal | None = ADMIN) -> None:
        """Remove the group and its switch state; ``done`` runs once the switches have
        confirmed the removal (at once when nothing was installed)."""
        check_source(who, self.core.group(gid).source, "delete its group")
        plan = self.core.delete_group(gid)
        gid = int(gid)
        self.keys.pop(gid, None)
        self.transfers.pop(gid, None)
        self._errors.pop(gid, None)
        log.info("group %d deleted", gid)
        self.apply(plan, "delete", (lambda errors: done()) if done is not None else None)
        self.save()

    def join(self, gid: int, ip: str, who: Principal | None = ADMIN) -> dict[str, Any]:
        """Add ``ip``; the answer carries the key when ``who`` may see it (a host joining
        itself with its own token does), so a receiver needs no second call for it."""
        g = self.core.group(gid)
        check_self(who, ip)
        plan = self.core.join(g.gid, ip)
        self.apply(plan, "join")
        self.save()
        return self.group_json(g, who)

    def leave(self, gid: int, ip: str, who: Principal | None = ADMIN) -> dict[str, Any]:
        g = self.core.group(gid)
        check_self(who, ip)
        plan = self.core.leave(g.gid, ip)
        self.apply(plan, "leave")
        self.save()
        return self.group_json(g, who)

    # -- offers ------------------------------------------------------------------------
    def create_offer(self, body: dict[str, Any], who: Principal | None = ADMIN
                     ) -> tuple[dict[str, Any], bool]:
        """Register that ``source`` serves ``model`` (the admin or the source itself), or
        update its offer of it (created False): a restarted server re-registers."""
        model = check_model(body.get("model"))
        source = check_unicast(body.get("source"), "source")
        check_source(who, source, "offer models from it")
        fields = {"model": model, "source": source, "name": str(body.get("name", "")),
                  "size": int(body.get("size", 0)), "files": int(body.get("files", 0))}
        for oid, offer in self.offers.items():
            if (offer["model"], offer["source"]) == (model, source):
                offer.update(fields)
                self.save()
                return self.offer_json(oid), False
        oid = max(self.offers, default=0) + 1
        self.offers[oid] = fields
        log.info("offer %d: %s serves %r (%s)", oid, source, model, fields["name"] or "unnamed")
        self.save()
        return self.offer_json(oid), True

    def list_offers(self, model: str | None = None, source: str | None = None) -> list[dict[str, Any]]:
        if source is not None:
            source = check_unicast(source, "source")
        return [self.offer_json(oid) for oid, o in sorted(self.offers.items())
                if (model is None or o["model"] == model) and (source is None or o["source"] == source)]

    def get_offer(self, oid: int) -> dict[str, Any]:
        if oid not in self.offers:
            raise UnknownOffer(f"no offer {oid}")
        return self.offer_json(oid)

    def delete_offer(self, oid: int, who: Principal | None = ADMIN) -> None:
        """Withdraw an offer (the admin or its source); its group is the server's to delete."""
        offer = self.get_offer(oid)
        check_source(who, offer["source"], "withdraw its offer")
        del self.offers[oid]
        log.info("offer %d withdrawn: %s no longer serves %r", oid, offer["source"], offer["model"])
        self.save()

    def offer_json(self, oid: int) -> dict[str, Any]:
        """The offer as REST shows it, with the id of its group (None until created)."""
        o = self.offers[oid]
        g = self.core.find(o["model"], o["source"])
        return {"id": oid, **o, "group": g.gid if g is not None else None}

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
        if not isinstance(mac, str) or not _MAC.match(mac.lower()):
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
        self.save()

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
        if self.cluster is not None:  # several instances: role, leader, generation
            out.update(self.cluster())
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
               "tree": tree, "errors": list(self._errors.get(g.gid, []))}
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

    # -- persistence -------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a restarted controller needs: ``core.to_dict()`` (groups and the last
        known switches, links and hosts, so it routes as soon as switches reconnect) with
        each group's session key (and announced transfer) added."""
        data = self.core.to_dict()
        for d in data.get("groups", []):
            d["key"] = self.keys.get(d["id"], "")
            if d["id"] in self.transfers:
                d["transfer"] = dict(self.transfers[d["id"]])
        if self.offers:
            data["offers"] = [{"id": oid, **o} for oid, o in sorted(self.offers.items())]
        if self.declared:  # (as topology.hosts: [ip, mac, dpid, port])
            data["declared_hosts"] = [[ip, *place] for ip, place in sorted(self.declared.items(),
                                                                          key=lambda kv: _ip_key(kv[0]))]
        return data

    def save(self) -> bool:
        """Write the state file now (a REST change: its caller is answered after the
        file holds it). Atomic: a crash leaves the old file or the new one, never a torn
        one (temp file in the same directory, fsync, rename, fsync dir). The encoding runs
        here; the write and fsyncs through ``writer`` (the app's runs them in a native
        thread, off the hub). Returns False, after logging the reason, when the disk
        refuses: the change the switches already received stands and the next save
        retries."""
        self._dirty = False
        if self.store is None:
            return True
        # compact: json's C encoder (an indented dump runs in Python, ~4x slower)
        payload = json.dumps(self.state(), sort_keys=True, separators=(",", ":")).encode()
        try:
            self.store.save(payload)
        except OSError as exc:
            log.error("cannot save state to %s: %s", self.store.name, exc)
            self._dirty = True  # flush_state retries
            return False
        return True

    def save_soon(self) -> None:
        """Note a change the network taught us (a host learned or forgotten, a link): it
        is written by the next ``flush_state`` that is due, so a burst of packet-ins costs
        one encoding, not one per new address. Losing the last second of it in a crash
        only means re-learning: switches and hosts report it again."""
        self._dirty = True

    def flush_state(self, now: float) -> bool:
        """Write pending changes if any, at most every ``save_interval_s`` (the app's
        timer calls this every 0.25 s)."""
        if not self._dirty or now < self._next_save:
            return True
        self._next_save = now + self.save_interval_s
        return self.save()

    @staticmethod
    def _write(path: Path, payload: bytes) -> None:
        """The file replaced atomically and durably (also what the app's writer runs in
        a native thread)."""
        write_atomic(path, payload)

    def load(self) -> list[str]:
        """Restore groups (with their keys) and the last known topology from the state
        file. Call once at start, before switches connect: nothing is sent until they do.
        Returns one line per item that could not be restored; a missing file is a fresh
        start. Raises StateFileError, one clear sentence, for a file that cannot be used
        at all (the caller should stop rather than overwrite it)."""
        if self.store is None:
            return []
        path = self.store.name
        try:
            raw = self.store.load()
            if raw is None:
                return []
            data = json.loads(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise StateFileError(f"cannot read state file {path}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise StateFileError(f"state file {path} is not valid JSON ({exc}); "
                                 "fix it or move it aside to start empty") from None
        if not isinstance(data, dict) or not isinstance(data.get("groups", []), list) \
                or not isinstance(data.get("topology", {}), dict):
            raise StateFileError(f"state file {path} does not hold a modelcast state object")
        if data.get("version") != STATE_VERSION:
            raise StateFileError(f"state file {path} has version {data.get('version')!r}; "
                                 f"this controller reads version {STATE_VERSION}")
        try:
            check_state(data)
        except ValueError as exc:  # one entry is wrong: starting without it would save over it
            raise StateFileError(f"state file {path}: {exc}; fix it or move it aside to "
                                 "start empty") from None
        return self._restore(data, path)

    def reload(self, data: dict[str, Any]) -> list[str]:
        """Replace everything with ``data`` (a ``state()`` another instance saved): a
        follower mirrors its leader, a new leader starts from its predecessor's last
        state. The core is rebuilt with the same settings; nothing is sent."""
        if data.get("version") != STATE_VERSION:
            raise StateFileError(f"state version {data.get('version')!r}; this controller "
                                 f"reads version {STATE_VERSION}")
        check_state(data)
        old = self.core
        self.core = MulticastCore(algorithm=old.algorithm, udp_port=old.udp_port,
                                  balance=old.balance, protection=old.protection, nicira=old.nicira)
        self.core.no_ff.update(old.no_ff)  # (what the switches said of themselves still holds)
        self.keys.clear()
        self.transfers.clear()
        self.offers.clear()
        self.declared.clear()  # (in place: discovery holds it)
        self._errors.clear()
        return self._restore(data, self.store.name if self.store is not None else "state")

    def mirror(self, data: dict[str, Any]) -> list[str]:
        """A follower's view: its leader's last saved state, with every known switch
        believed to hold its share of the trees (the leader installs them; a follower
        never writes), so reads on any instance answer what the leader would."""
        problems = self.reload(data)
        for dpid in sorted(self.core.view.switches):
            self.core.switch_enter(dpid)  # the plan is the leader's to send: dropped
        return problems

    def _restore(self, data: dict[str, Any], path: str) -> list[str]:
        problems: list[str] = []
        groups = data.get("groups", [])
        before = set(self.core.groups)
        # keys stay out of restore(): its problem lines quote the group and get logged
        try:
            problems += self.core.restore(dict(data, groups=[
                {k: v for k, v in d.items() if k not in ("key", "transfer")} for d in groups]))
        except Exception as exc:  # check_state missed something: still one line, no traceback
            log.debug("restoring %s failed", path, exc_info=True)
            raise StateFileError(f"state file {path} cannot be restored ({type(exc).__name__}: "
                                 f"{exc}); fix it or move it aside to start empty") from None
        for d in groups:
            try:
                gid = int(d["id"])
            except (KeyError, TypeError, ValueError):
                continue
            if gid not in self.core.groups or gid in before:
                continue
            key = d.get("key")
            if isinstance(key, str) and re.fullmatch(r"[0-9a-f]{64}", key):
                self.keys[gid] = key
            else:
                self.keys[gid] = secrets.token_hex(32)
                problems.append(f"group {gid}: no valid session key saved; issued a new one")
                continue  # an announced transfer belonged to the lost key
            transfer = d.get("transfer")
            if transfer:
                self.transfers[gid] = dict(transfer)
        for ip, mac, dpid, port in data.get("declared_hosts", []):  # (checked by check_state)
            self.declared[check_unicast(ip)] = (mac.lower(), dpid, port)
        for o in data.get("offers", []):  # (checked by check_state)
            self.offers[o["id"]] = {"model": o["model"].strip(), "source": o["source"], "name": o.get("name", ""),
                                    "size": o.get("size", 0), "files": o.get("files", 0)}
        view = self.core.view
        for k in sorted(view.links):
            if not self.gate.allowed(k):  # saved before --fabric was given (or changed)
                self.core.link_remove(k.a, k.a_port, k.b, k.b_port)  # (nothing is connected yet)
                problems.append(f"link {k.a:#x}:{k.a_port} <-> {k.b:#x}:{k.b_port} is not a link of "
                                "the pinned fabric (--fabric): not restored")
        for p in problems:
            log.warning("state file %s: %s", path, p)
        log.info("restored %d groups, %d switches, %d links, %d hosts from %s",
                 len(set(self.core.groups) - before), len(view.switches), len(view.links),
                 len(view.hosts), path)
        return problems


def _valid_transfer(t: Any) -> bool:
    """An announced transfer as saved: {} or {"session": 16 hex[, "file_digest": 64 hex]}."""
    if t == {}:
        return True
    if not isinstance(t, dict) or not set(t) <= {"session", "file_digest"}:
        return False
    session, digest = t.get("session"), t.get("file_digest", "0" * 64)
    return (isinstance(session, str) and re.fullmatch(r"[0-9a-f]{16}", session) is not None
            and isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest) is not None)


def check_state(data: dict[str, Any]) -> None:
    """Raise ValueError naming the first entry of a state file's content that the core
    could not take as it is (wrong types, out-of-range ids and ports, a receiver equal to
    its source, a duplicate id). One linear pass, before anything is restored."""
    def integer(v: Any, lo: int, hi: int, where: str) -> None:
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ValueError(f"{where} is {v!r:.60}, not an integer in {lo}..{hi}")

    def items(v: Any, n: int, where: str) -> list[Any]:
        if not isinstance(v, list) or len(v) != n:
            raise ValueError(f"{where} is {v!r:.60}, not a list of {n}")
        return v

    def listed(v: Any, where: str) -> list[Any]:
        if not isinstance(v, list):
            raise ValueError(f"{where} is {type(v).__name__}, not a list")
        return v

    topo = data.get("topology", {})
    for i, dpid in enumerate(listed(topo.get("switches", []), "topology.switches")):
        integer(dpid, 1, MAX_DPID, f"topology.switches[{i}]")
    for i, link in enumerate(listed(topo.get("links", []), "topology.links")):
        a, ap, b, bp = items(link, 4, f"topology.links[{i}]")
        for v, hi, what in ((a, MAX_DPID, "dpid"), (ap, MAX_PORT, "port"), (b, MAX_DPID, "dpid"),
                            (bp, MAX_PORT, "port")):
            integer(v, 1, hi, f"topology.links[{i}] {what}")
    hosts = [(f"topology.hosts[{i}]", h) for i, h in enumerate(listed(topo.get("hosts", []), "topology.hosts"))]
    hosts += [(f"declared_hosts[{i}]", h) for i, h in enumerate(listed(data.get("declared_hosts", []),
                                                                       "declared_hosts"))]
    for where, host in hosts:
        ip, mac, dpid, port = items(host, 4, where)
        if not isinstance(ip, str):
            raise ValueError(f"{where} address is {ip!r:.60}, not a string")
        check_unicast(ip, f"{where} host")
        if not isinstance(mac, str) or not _MAC.match(mac.lower()):
            raise ValueError(f"{where} MAC {mac!r:.60} is not a MAC address")
        integer(dpid, 1, MAX_DPID, f"{where} dpid")
        integer(port, 1, MAX_PORT, f"{where} port")
    seen: set[int] = set()
    for i, d in enumerate(listed(data.get("groups", []), "groups")):
        where = f"groups[{i}]"
        if not isinstance(d, dict):
            raise ValueError(f"{where} is {type(d).__name__}, not an object")
        integer(d.get("id"), 1, MAX_GID, f"{where} id")
        if d["id"] in seen:
            raise ValueError(f"{where} id {d['id']} is used twice")
        seen.add(d["id"])
        where = f"group {d['id']}"
        for name in ("model", "source", "address"):
            if not isinstance(d.get(name), str):
                raise ValueError(f"{where} {name} is {d.get(name)!r:.60}, not a string")
        try:
            check_model(d["model"])
            check_ssm(d["address"])
        except CoreError as exc:
            raise ValueError(f"{where}: {exc}") from None
        source = check_unicast(d["source"], f"{where} source")
        integer(d.get("port"), 1, 65535, f"{where} port")
        if d.get("algorithm", ALGORITHMS[0]) not in ALGORITHMS:
            raise ValueError(f"{where} algorithm {d['algorithm']!r:.60} is not one of {', '.join(ALGORITHMS)}")
        receivers = listed(d.get("receivers", []), f"{where} receivers")
        for r in receivers:
            if not isinstance(r, str):
                raise ValueError(f"{where} receiver {r!r:.60} is not a string")
            if check_unicast(r, f"{where} receiver") == source:
                raise ValueError(f"{where} receiver {r} is the group's source")
        if len(set(receivers)) != len(receivers):
            raise ValueError(f"{where} names a receiver twice")
        for j, edge in enumerate(listed(d.get("tree", []), f"{where} tree")):
            for v in items(edge, 2, f"{where} tree[{j}]"):
                integer(v, 1, MAX_DPID, f"{where} tree[{j}] dpid")
        if not isinstance(d.get("key", ""), str):
            raise ValueError(f"{where} key is not a string")
        if not _valid_transfer(d.get("transfer", {})):
            raise ValueError(f"{where} transfer is not {{session: 16 hex digits[, file_digest: 64 hex digits]}}")
    offered: set[int] = set()
    for i, o in enumerate(listed(data.get("offers", []), "offers")):
        where = f"offers[{i}]"
        if not isinstance(o, dict):
            raise ValueError(f"{where} is {type(o).__name__}, not an object")
        integer(o.get("id"), 1, MAX_GID, f"{where} id")
        if o["id"] in offered:
            raise ValueError(f"{where} id {o['id']} is used twice")
        offered.add(o["id"])
        if not isinstance(o.get("model"), str) or not isinstance(o.get("source"), str) \
                or not isinstance(o.get("name", ""), str):
            raise ValueError(f"{where} model, source and name must be strings")
        try:
            check_model(o["model"])
        except CoreError as exc:
            raise ValueError(f"{where}: {exc}") from None
        check_unicast(o["source"], f"{where} source")
        for name in ("size", "files"):
            integer(o.get(name, 0), 0, 1 << 62, f"{where} {name}")


class _SwitchEntries:
    """``modelcast_switch_entries{dpid, kind}``: the multicast entries each connected switch
    holds for us (``groups`` and the ``sg_flows`` pointing at them: one each per tree;
    protection's ``ff_groups`` and ``detour_flows``), so table use can be watched per switch. Collected on scrape from the core's belief, which the
    audits keep equal to the switches."""

    def __init__(self, service: Service) -> None:
        self.service = service  # its core is replaced when a follower reloads the state

    def collect(self) -> Any:
        fam = GaugeMetricFamily("modelcast_switch_entries",
                                "Multicast entries of ours per connected switch",
                                labels=["dpid", "kind"])
        core = self.service.core
        for dpid in sorted(core.installed):
            for kind, n in core.entries_at(dpid).items():
                fam.add_metric([str(dpid), kind], n)
        yield fam


def _ids(gids: list[int], limit: int = 10) -> str:
    """Group ids for a log line: a big reroute touches thousands."""
    head = ", ".join(map(str, gids[:limit]))
    return f"[{head}]" if len(gids) <= limit else f"[{head}, ... {len(gids)} in all]"


def _ip_key(ip: str) -> bytes:
    """Numeric order of canonical IPv4 strings (every address the core holds is one)."""
    return socket.inet_aton(ip)
