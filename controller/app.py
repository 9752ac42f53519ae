"""The Ryu app: a thin shim that turns OpenFlow and topology events into calls on the
pure core (through ``Service``) and sends back what they return. The decisions live in
pure modules: ``controller.reconnect`` (a switch's connect sequence), ``controller.igmp``
(membership reports), ``controller.unicast`` (forwarding punted frames) and
``controller.hosts`` (learning, probing for and forgetting hosts).

Start it with ``modelcast-controller`` (``controller.main``), which loads the eventlet
shim first and enables Ryu's LLDP link discovery.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Callable

import controller.compat  # noqa: F401  (before ryu.app.wsgi)
from eventlet import tpool
from ryu.app.wsgi import WSGIApplication
from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.lib import hub
from ryu.lib.packet import arp, ethernet, ipv4, packet
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser
from ryu.topology import event as topo_event

from controller import igmp as igmp_decisions
from controller import lldpauth, ofmsgs, settings, unicast, webserver
from controller.election import LEADER, MASTER, Election, Status, role_for
from controller.core import MulticastCore, Plan, tune_gc
from controller.errors import CoreError
from controller.hosts import PROBE_MAC, Actions, HostDiscovery
from controller.igmp import IgmpPolicy
from controller.linkgate import LinkGate
from controller.punt import QUARANTINE_S, PuntGuard
from controller.reconnect import AuditClock, Reconnect, normalise_actions, port_status, removal_is_drift
from controller.rest import RestApi
from controller.rest import ApiError, forward_to
from controller.service import Changes, Service, StateFileError
from controller.store import EtcdStore, parse_store_url

app_manager.require_app("ryu.topology.switches", api_style=True)
log = logging.getLogger("modelcast.app")
# --trace FILE (settings.trace_file): one line per OpenFlow message of a plan, barrier
# reply, PortStatus and audit, with the wall-clock time (to lay against a receiver's
# capture of a stream). Off by default; a debugging aid for the order of a move (issue 12).
_TRACE: Any = None


webserver.install()  # our limits on REST connections, before Ryu's manager starts the server
lldpauth.install()  # links only from discovery frames we signed, before any switch connects


def trace(what: str, *args: Any) -> None:
    if _TRACE is not None:
        _TRACE.write(f"{time.time():.4f} {what % args if args else what}\n")


def describe(msg: Any) -> str:
    """One line for a plan's message (tracing only: decodes it)."""
    try:
        if isinstance(msg, parser.OFPGroupMod):
            cmd = {ofp.OFPGC_ADD: "add", ofp.OFPGC_MODIFY: "mod", ofp.OFPGC_DELETE: "del"}.get(msg.command)
            kind = {ofp.OFPGT_ALL: "all", ofp.OFPGT_FF: "ff"}.get(msg.type, msg.type)
            bks = ["w%s:%s" % (b.watch_port if b.watch_port != ofp.OFPP_ANY else "-",
                               ",".join(map(str, normalise_actions(b.actions)))) for b in msg.buckets or ()]
            return f"group-{cmd} {kind} {msg.group_id:#x} [{' | '.join(bks)}]"
        if isinstance(msg, parser.OFPFlowMod):
            cmd = {ofp.OFPFC_ADD: "add", ofp.OFPFC_DELETE: "del", ofp.OFPFC_DELETE_STRICT: "del-strict",
                   ofp.OFPFC_MODIFY: "mod"}.get(msg.command, msg.command)
            acts = [a for i in (msg.instructions or ()) for a in getattr(i, "actions", ())]
            return (f"flow-{cmd} t{msg.table_id} p{msg.priority} ck={msg.cookie:#x} "
                    f"{dict(msg.match.items())} -> {normalise_actions(acts)}")
    except Exception as exc:  # tracing must never break a plan
        return f"{type(msg).__name__} ({exc})"
    return type(msg).__name__


# after a phase that switched traffic onto new feeds, this long before the old ones are
# cut (see ModelcastApp._install_loop): the new feed is not delayed, only the clean-up
SETTLE_S = 0.05

_CAMPAIGNING: list["ModelcastApp"] = []  # instances in an election (--store)


def request_stop() -> bool:
    """SIGTERM (``controller.main``): an instance in an election resigns first, so the
    others take over at once instead of after the lease TTL. False: none is running
    one (the caller exits as before)."""
    for app in _CAMPAIGNING:
        app.stopping = True
    return bool(_CAMPAIGNING)


def open_store(conf: settings.Settings) -> EtcdStore:
    """The etcd store of ``--store`` (tests put an in-memory one here)."""
    assert conf.store_url is not None
    return EtcdStore(parse_store_url(conf.store_url, conf.store_prefix))


class ModelcastApp(app_manager.RyuApp):
    OFP_VERSIONS = [ofp.OFP_VERSION]
    _CONTEXTS = {"wsgi": WSGIApplication}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        conf = settings.current
        tune_gc()
        global _TRACE
        if conf.trace_file is not None and _TRACE is None:
            _TRACE = open(conf.trace_file, "a", buffering=1)
            log.info("tracing plans, barriers and port changes to %s", conf.trace_file)
        self.dps: dict[int, Any] = {}
        self._waiters: dict[tuple[int, int], Any] = {}  # (dpid, barrier xid) -> hub.Event
        self._xid_errors: dict[tuple[int, int], list[str]] = {}  # (dpid, xid) -> plan's errors
        self._queue: Any = hub.Queue()
        core = MulticastCore(algorithm=conf.algorithm, udp_port=conf.udp_port,
                             protection=conf.protection, nicira=conf.nicira)
        self._save_lock = hub.Semaphore()
        # several instances (--store etcd://): one leads and writes, the others follow
        self.store: EtcdStore | None = None
        self.election: Election | None = None
        if conf.store_url:
            self.store = open_store(conf)
            self.election = Election(self.store, f"{socket.gethostname()}-{os.getpid()}-"
                                     f"{secrets.token_hex(3)}", conf.advertise_url or "",
                                     ttl=conf.lease_ttl_s)
        self.leading = self.election is None  # may write to switches (and the store)
        self._role: tuple[str, int] | None = None  # the role request switches last got
        self._mirrored = -1  # the store revision a follower's view reflects
        self._next_mirror = float("-inf")
        # a new leader's switches whose tables are still being read (mutations wait)
        self._taking_over: set[int] = set()
        self._takeover_deadline = float("-inf")
        self._slave_refusals = 0
        self.switch_roles: dict[int, tuple[str, int]] = {}  # dpid -> what its role reply said
        self.service = Service(core, installer=self, state_path=conf.state_file, token=conf.token,
                               host_tokens=conf.host_tokens, writer=self._write_state,
                               store=self.store)
        self.service.gate = LinkGate(conf.fabric)  # (before load: restored links are checked too)
        self.service.changes = Changes(hub.Event, conf.held_max)  # (green: a held GET waits on the hub)
        metrics = self.service.metrics
        metrics.rest_connections.set_function(lambda: sum(webserver.POOL.open.values()) if webserver.POOL else 0)
        metrics.rest_connections_refused.set_function(lambda: webserver.POOL.refused if webserver.POOL else 0)
        metrics.lldp_refused.set_function(lambda: lldpauth.SIGNER.forged if lldpauth.SIGNER else 0)
        self.punt_guard = PuntGuard(conf.punt_port_rate if conf.punt_rate > 0 else 0)
        self._spoof_warned: dict[str, float] = {}  # pinned host -> when a claim on it was last logged
        metrics.punt_quarantines.set_function(lambda: self.punt_guard.quarantined)
        self._rebind()
        if self.election is not None:
            self.service.cluster = self._cluster
        self.igmp_policy = IgmpPolicy.from_settings(conf.igmp_allow, conf.host_tokens)
        if self.election is None:
            try:
                problems = self.service.load()  # before any switch connects
            except StateFileError as exc:
                # Starting empty would overwrite the file (and the groups' keys) on next save.
                log.critical("%s", exc)
                raise SystemExit(2) from None
            for problem in problems:
                log.error("state file %s: %s", conf.state_file, problem)
            self.discovery.pin()  # (over a place the saved state had)
        kwargs["wsgi"].register(RestApi, {"service": self.service,
                                          "barrier_timeout": 3 * conf.barrier_timeout_s + 2,
                                          "forward": self._forward if self.election else None})
        hub.spawn(self._install_loop)
        hub.spawn(self._timer_loop)
        self.stopping = False
        if self.election is not None:
            _CAMPAIGNING.append(self)
            hub.spawn(self._election_loop)
        if self.service.credentials.open:
            log.warning("no REST token configured (--token or MODELCAST_TOKEN): local callers "
                        "may change groups, and no caller is given a session key")
        log.info("modelcast controller: %d groups restored, algorithm %s, links %s, fast-failover "
                 "protection %s, state file %s", len(core.groups), conf.algorithm,
                 f"only the {len(conf.fabric.links)} of --fabric {conf.fabric.name}" if conf.fabric else
                 "from signed discovery frames, none between two host ports",
                 ("on (detours end in one flow per link: Nicira actions)" if conf.nicira else
                  "on (detours end in one flow per group: plain OpenFlow 1.3)") if conf.protection else "off",
                 conf.state_file or "(none: groups are not persisted)")

    @property
    def core(self) -> MulticastCore:
        return self.service.core

    def _rebind(self) -> None:
        """The per-core helpers, after the service's core was (re)built."""
        conf = settings.current
        unmetered = self.reconnect.unmetered if hasattr(self, "reconnect") else set()
        self.reconnect = Reconnect(self.core, host_idle_s=conf.host_timeout_s, punt_rate=conf.punt_rate,
                                   punt_port_rate=conf.punt_port_rate)
        self.reconnect.unmetered = unmetered  # (what the switches said of themselves still holds)
        self.discovery = HostDiscovery(self.core, idle_s=conf.host_timeout_s, pinned=self.service.gate.hosts,
                                       reserved=self.service.declared)
        self.discovery.pin()  # (its plan: what the switches get when they connect or are read)
        self.audits = AuditClock(conf.audit_interval_s)

    # -- several instances: election, OpenFlow roles, follower view -----------------------
    def _election_loop(self) -> None:
        assert self.election is not None
        while True:
            if self.stopping:
                log.warning("stopping: resigning from the election (leader: %s)", self.leading)
                self.leading = False
                self.election.resign()
                os._exit(0)  # switches keep forwarding; the others take over now
            try:
                self._election_step(self.election.step(time.monotonic()))
            except Exception:  # never let one bad step stop the election
                log.exception("election step failed")
            hub.sleep(0.1)

    def _election_step(self, status: Status) -> None:
        if status.role == LEADER and not self.leading:
            self._promote(status)
        elif status.role != LEADER and self.leading:
            self._demote(status)
        role = role_for(status) if (status.role != LEADER or self.leading) else None
        if role is not None and role != self._role:
            self._role = role
            self._send([(dpid, ofmsgs.role_request(dpid, role[0] == MASTER, role[1]))
                        for dpid in self.dps])
        if not self.leading:
            self._follow()

    def _promote(self, status: Status) -> None:
        """Won the election: start from the predecessor's last state in the store, ask
        every switch for MASTER, then read each switch's tables and fix only what differs
        (the restart path: a healthy switch gets no flow-mod at all)."""
        assert self.store is not None
        try:
            raw = self.store.load()
            problems = self.service.reload(json.loads(raw)) if raw else []
        except (OSError, ValueError, StateFileError) as exc:
            log.error("elected, but the state in %s cannot be read (%s): not taking over yet",
                      self.store.name, exc)
            return
        for p in problems:
            log.error("store %s: %s", self.store.name, p)
        self._rebind()
        self.store.fence = status.generation
        self.leading = True
        log.warning("elected leader (generation %d): %d groups, %d switches connected; "
                    "reading their tables", status.generation, len(self.core.groups), len(self.dps))
        self._role = (MASTER, status.generation)
        self._taking_over = set(self.dps)
        self._takeover_deadline = time.monotonic() + settings.current.barrier_timeout_s
        for dpid, dp in list(self.dps.items()):
            dp.send_msg(ofmsgs.role_request(dpid, True, status.generation))
            self._send([(dpid, m) for m in self.reconnect.features(dpid)])
            self._send([(dpid, m) for m in ofmsgs.capability_requests(dpid) + self.reconnect.start(dpid)])

    def _demote(self, status: Status) -> None:
        """Lost the lead (or cannot renew it): stop writing at once; switches keep
        forwarding exactly as they do."""
        assert self.store is not None
        self.store.fence = None
        self.leading = False
        self._mirrored = -1
        log.warning("no longer the leader (%s): following", status.role)

    def _follow(self) -> None:
        """A follower mirrors the leader's state whenever the store's revision moves, at
        most every 0.5 s and taking at most a tenth of the time (a mirror rebuilds every
        tree: with thousands of groups that costs a follower seconds)."""
        assert self.store is not None
        now = time.monotonic()
        if now < self._next_mirror:
            return
        try:
            rev = self.store.revision()
            if rev == self._mirrored:
                return
            raw = self.store.load()
        except OSError as exc:
            log.debug("store: %s", exc)
            return
        if raw:
            try:
                problems = self.service.mirror(json.loads(raw))
            except (ValueError, StateFileError) as exc:
                log.error("store %s: cannot mirror the leader's state: %s", self.store.name, exc)
                return
            for p in problems:
                log.warning("store %s: %s", self.store.name, p)
            self._rebind()
            self.service.changes.notify()  # (held GETs look at the leader's state)
            self._next_mirror = now + max(0.5, 10 * (time.monotonic() - now))
        self._mirrored = rev

    def _cluster(self) -> dict[str, Any]:
        assert self.election is not None
        st = self.election.status
        role = "leader" if self.leading else ("follower" if st.leader is not None else "unknown")
        return {"role": role, "leader": st.leader.url if st.leader is not None else None,
                "generation": st.generation}

    def _forward(self, req: Any) -> Any:
        """A mutation on a follower goes to the leader (its answer passed back as is);
        None when this instance leads and serves it itself."""
        if self.leading:
            if self._taking_over and time.monotonic() < self._takeover_deadline:
                # a change now would be planned against switches not read yet
                raise ApiError(503, f"taking over as leader: reading {len(self._taking_over)} "
                               "switches; retry shortly", None, {"Retry-After": "1"})
            return None
        assert self.election is not None
        leader = self.election.status.leader
        return forward_to(req, leader.url if leader is not None else None,
                          timeout=3 * settings.current.barrier_timeout_s + 5)

    @set_ev_cls(ofp_event.EventOFPRoleReply, MAIN_DISPATCHER)
    def _role_reply(self, ev: Any) -> None:
        msg = ev.msg
        names = {ofp.OFPCR_ROLE_MASTER: "master", ofp.OFPCR_ROLE_SLAVE: "slave",
                 ofp.OFPCR_ROLE_EQUAL: "equal"}
        self.switch_roles[msg.datapath.id] = (names.get(msg.role, str(msg.role)), msg.generation_id)
        log.info("switch %#x: our role is %s (generation %d)", msg.datapath.id,
                 names.get(msg.role, msg.role), msg.generation_id)

    def _write_state(self, path: Path, payload: bytes) -> None:
        """Write and fsync in a native thread: the hub keeps serving OpenFlow and REST
        meanwhile. Writes run one at a time in the order they were encoded (the lock is
        taken before this green thread first yields), so an older state never replaces
        a newer one."""
        with self._save_lock:
            tpool.execute(Service._write, path, payload)

    # -- Installer (used by Service) ---------------------------------------------------
    def install(self, plan: Plan, done: Callable[[list[str]], None]) -> None:
        """Queue a plan; one green thread sends plans in order, phase by phase, each
        phase confirmed by a barrier on every switch it touched."""
        self._queue.put((plan, done))

    def _install_loop(self) -> None:
        while True:
            plan, done = self._queue.get()
            errors: list[str] = []
            try:
                for i, phase in enumerate(plan.phases):
                    if i == len(plan.phases) - 1 and phase and plan.phases[i - 1]:
                        # old feeds are cut and old entries removed only once the new
                        # ones carry traffic: a barrier confirms a switch's tables, but
                        # Open vSwitch moves its datapath's cached flows onto them a few
                        # ms later (its revalidators), so cutting at once still lost a
                        # datagram now and then (issue 12)
                        hub.sleep(SETTLE_S)
                    touched = []
                    for dpid, msg in phase:
                        dp = self.dps.get(dpid)
                        if dp is None:
                            errors.append(f"switch {dpid:#x} disconnected before install")
                            continue
                        if _TRACE is not None:
                            trace("send phase %d s%d %s", i, dpid, describe(msg))
                        dp.send_msg(msg)
                        self._xid_errors[(dpid, msg.xid)] = errors
                        if dpid not in touched:
                            touched.append(dpid)
                    self._barrier(touched, errors)
            except Exception as exc:  # never let one plan kill the install loop
                log.exception("install failed")
                errors.append(f"install failed: {exc}")
            finally:
                self._xid_errors = {k: v for k, v in self._xid_errors.items() if v is not errors}
            done(errors)

    def _barrier(self, dpids: list[int], errors: list[str]) -> None:
        waits = []
        for dpid in dpids:
            dp = self.dps.get(dpid)
            if dp is None:
                continue
            msg = parser.OFPBarrierRequest(dp)
            ev = hub.Event()
            dp.set_xid(msg)
            self._waiters[(dpid, msg.xid)] = ev
            dp.send_msg(msg)
            waits.append((dpid, msg.xid, ev))
        deadline = time.monotonic() + settings.current.barrier_timeout_s
        for dpid, xid, ev in waits:
            if not ev.wait(timeout=max(0.0, deadline - time.monotonic())):
                errors.append(f"switch {dpid:#x} did not confirm (barrier timeout)")
            elif _TRACE is not None:
                trace("barrier s%d confirmed", dpid)
            self._waiters.pop((dpid, xid), None)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier_reply(self, ev: Any) -> None:
        waiter = self._waiters.get((ev.msg.datapath.id, ev.msg.xid))
        if waiter is not None:
            waiter.set()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev: Any) -> None:
        msg = ev.msg
        dpid = msg.datapath.id
        text = f"switch {dpid:#x}: OpenFlow error type {msg.type} code {msg.code} (xid {msg.xid})"
        if msg.type == ofp.OFPET_BAD_REQUEST and msg.code == ofp.OFPBRC_IS_SLAVE and (
                not self.leading or (dpid, msg.xid) not in self._xid_errors):
            # a follower's LLDP packet-outs (ryu.topology), also one answered just after it
            # was elected: refused by design, not an error worth a line each (a plan's
            # message refused so falls through: this instance was deposed)
            self._slave_refusals += 1
            if self._slave_refusals in (1, 10, 100) or self._slave_refusals % 1000 == 0:
                log.info("switches refused %d messages of ours as from a SLAVE (expected on a "
                         "follower)", self._slave_refusals)
            return
        data = bytes(msg.data or b"")  # (the refused request's first bytes)
        if ofmsgs.benign_error(msg.type, msg.code, ofmsgs.meter_of_error(data)):
            return  # the punt meter was there already (a switch that kept its tables)
        if msg.type == ofp.OFPET_ROLE_REQUEST_FAILED:
            log.warning("switch %#x refused our role request (code %d%s)", dpid, msg.code,
                        ": stale, a newer leader was elected" if msg.code == ofp.OFPRRFC_STALE else "")
            return
        errors = self._xid_errors.get((dpid, msg.xid))
        if errors is not None:
            errors.append(text)
        # a switch lacking something optional: the first refusal switches it over (with a
        # warning saying so); the others already sent are expected, and logged quietly
        lacks = ("nicira" if ofmsgs.refuses_nicira(msg.type, msg.code) else
                 "fast-failover" if ofmsgs.refused_fast_failover(msg.type, msg.code, data) else
                 "meters" if ofmsgs.refuses_meters(msg.type, msg.code, data) else None)
        known = {"nicira": not self.core.nicira, "fast-failover": dpid in self.core.no_ff,
                 "meters": dpid in self.reconnect.unmetered, None: False}[lacks]
        (log.debug if known else log.error)("%s", text)
        if lacks == "nicira":
            self._without_nicira(dpid, "refused an experimenter action (Open vSwitch's Nicira actions)")
            self.audits.soon(dpid)  # (what else of that plan it refused: read, and put right)
        elif lacks == "fast-failover":
            self._fast_failover(dpid, False, "refused a fast-failover group (bad type)")
            self.audits.soon(dpid)  # (the ALL groups chained to it were refused with it)
        elif lacks == "meters":
            self._meters(dpid, False, "refused our punt meters or a flow using them")

    def _meters(self, dpid: int, on: bool, why: str) -> None:
        """Whether a switch has meters changed how its frames reach the controller: without
        them they are not rate-limited (as ``--punt-rate 0`` for it), and a port flooding
        the controller cannot be held to a meter of its own. Its base flows go again."""
        rc = self.reconnect
        if not self.leading or rc.punt_rate <= 0 or on != (dpid in rc.unmetered):
            return
        (rc.unmetered.discard if on else rc.unmetered.add)(dpid)
        (log.info if on else log.warning)(
            "switch %#x %s: its frames to the controller %s", dpid, why,
            "pass its punt meters again" if on else "are not rate-limited (as with --punt-rate 0 for it)")
        self._send([(dpid, m) for m in rc.features(dpid)])
        self.audits.soon(dpid)  # (and whatever else the refusal left out)

    @set_ev_cls(ofp_event.EventOFPMeterFeaturesStatsReply, MAIN_DISPATCHER)
    def _meter_features_reply(self, ev: Any) -> None:
        """Asked for with the description (``_desc_reply``): a switch without meters."""
        if ev.msg.body:
            on = ofmsgs.has_meters(ev.msg.body[0].max_meter)
            self._meters(ev.msg.datapath.id, on, f"has {ev.msg.body[0].max_meter} meters (its meter features)")

    def _fast_failover(self, dpid: int, on: bool, why: str) -> None:
        """Whether a switch has fast-failover groups changed what it can protect: the links
        leaving one without them wait for the controller's reroute."""
        if not self.leading or on != (dpid in self.core.no_ff) or not self.core.protection:
            return
        t0 = time.perf_counter()
        plan = self.core.set_fast_failover(dpid, on)
        (log.info if on else log.warning)(
            "switch %#x %s: the links leaving it are %s: %d messages for %d groups in %.1f ms", dpid, why,
            "protected again" if on else "not protected (a failure there waits for the controller's reroute)",
            len(plan), len(plan.groups), (time.perf_counter() - t0) * 1000)
        self._apply(plan, "fast-failover")

    @set_ev_cls(ofp_event.EventOFPGroupFeaturesStatsReply, MAIN_DISPATCHER)
    def _group_features_reply(self, ev: Any) -> None:
        """Asked for with the description (``_desc_reply``): a switch without OFPGT_FF."""
        on = ofmsgs.has_fast_failover(ev.msg.body.types)
        if on is not None:
            self._fast_failover(ev.msg.datapath.id, on, "has fast-failover groups" if on else
                                "has no fast-failover groups (its group features)")

    def _without_nicira(self, dpid: int, why: str) -> None:
        """A switch lacks Open vSwitch's Nicira actions: from now on every detour ends in
        one flow per group and link, plain OpenFlow 1.3 (``--no-nicira``), on every switch."""
        if not self.core.nicira or not self.leading:
            return
        t0 = time.perf_counter()
        plan = self.core.set_nicira(False)
        log.warning("switch %#x %s: detours now end in one flow per group and link, plain OpenFlow 1.3, "
                    "as with --no-nicira (start with it to skip this step): %d messages for %d groups "
                    "in %.1f ms", dpid, why, len(plan), len(plan.groups), (time.perf_counter() - t0) * 1000)
        self._apply(plan, "plain-openflow")

    @set_ev_cls(ofp_event.EventOFPDescStatsReply, MAIN_DISPATCHER)
    def _desc_reply(self, ev: Any) -> None:
        """Asked for when a switch connects (and on a takeover), before its tables are read:
        a switch that is not Open vSwitch makes detours plain OpenFlow before it gets any."""
        d = ev.msg.body
        if not ofmsgs.speaks_nicira(d.mfr_desc, d.hw_desc):
            self._without_nicira(ev.msg.datapath.id, "is not Open vSwitch (%s)" % ", ".join(
                repr(ofmsgs.desc_text(f)) for f in (d.mfr_desc, d.hw_desc, d.sw_desc)))

    def _apply(self, plan: Plan, reason: str) -> None:
        if len(plan):
            trace("plan %s: %d messages (queue %d)", reason, len(plan), self._queue.qsize())
            self.service.apply(plan, reason)

    # -- switches ------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _features(self, ev: Any) -> None:
        dp = ev.msg.datapath
        if not self.leading:
            return
        self.punt_guard.forget(dp.id)  # (a switch that connects anew holds no quarantine)
        for msg in self.reconnect.features(dp.id):
            dp.send_msg(msg)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state(self, ev: Any) -> None:
        dp = ev.datapath
        if dp.id is None:
            return
        if ev.state == MAIN_DISPATCHER:
            log.info("switch %#x connected from %s", dp.id, dp.address)
            self.dps[dp.id] = dp
            if self._role is not None:
                dp.send_msg(ofmsgs.role_request(dp.id, self._role[0] == MASTER, self._role[1]))
            if not self.leading:
                return
            # Read what it already holds of ours before touching it: after a controller
            # restart a healthy switch keeps forwarding and gets no message at all. Its
            # description, group and meter features first: the answers come in order
            # (``_desc_reply``, ``_group_features_reply``, ``_meter_features_reply``).
            for msg in ofmsgs.capability_requests(dp.id) + self.reconnect.start(dp.id):
                dp.send_msg(msg)
        elif self.dps.get(dp.id) is dp:
            del self.dps[dp.id]
            self.reconnect.forget(dp.id)
            self.punt_guard.forget(dp.id)
            self._taking_over.discard(dp.id)
            if not self.leading:
                return
            t0 = time.perf_counter()
            plan = self.core.switch_leave(dp.id)
            log.warning("switch %#x disconnected: %d groups rerouted in %.1f ms",
                        dp.id, len(plan.groups), (time.perf_counter() - t0) * 1000)
            self._apply(plan, "reroute")
            self._flush_unicast()

    @set_ev_cls([ofp_event.EventOFPFlowStatsReply, ofp_event.EventOFPGroupDescStatsReply],
                MAIN_DISPATCHER)
    def _stats_reply(self, ev: Any) -> None:
        dp = ev.msg.datapath
        if not self.leading:
            return
        done = self.reconnect.on_reply(dp.id, ev.msg, getattr(dp, "ports", {}).values())
        if done is None:
            return
        trace("read s%d done: audit=%s void=%s, %d messages", dp.id, done.audit, done.void, len(done.plan))
        if not done.audit:
            log.info("switch %#x reconciled: held %d of our groups, %d messages to fix",
                     dp.id, len(done.present.groups), len(done.plan))
            self._apply(done.plan, "switch")
            if dp.id in self._taking_over:
                self._taking_over.discard(dp.id)
                if not self._taking_over:
                    log.warning("took over: every connected switch read and reconciled")
            return
        self.audits.finished(dp.id, time.monotonic())
        result = "void" if done.void else "repaired" if len(done.plan) else "clean"
        self.service.metrics.audits.labels(result=result).inc()
        if result == "repaired":
            log.warning("switch %#x drifted from the intended state (entries deleted or changed "
                        "by hand?): %d messages restore it", dp.id, len(done.plan))
            self._apply(done.plan, "repair")

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev: Any) -> None:
        """React to a port going down at once: LLDP would notice only after ~10 s."""
        msg = ev.msg
        dpid, port = msg.datapath.id, msg.desc.port_no
        down = port_status(msg.reason, msg.desc)
        trace("port-status s%d:%d down=%s", dpid, port, down)
        if down is None or not self.leading:  # a follower's view comes from the leader
            return
        t0 = time.perf_counter()
        plan = self.core.port_down(dpid, port) if down else self.core.port_up(dpid, port)
        if len(plan) or down:
            log.info("port %#x:%d %s: %d groups rerouted, %d messages, computed in %.1f ms",
                     dpid, port, "down" if down else "up", len(plan.groups), len(plan),
                     (time.perf_counter() - t0) * 1000)
        self._apply(plan, "reroute")
        if down:  # hosts behind it are gone
            self._discovered(self.discovery.port_down(dpid, port))
        self._flush_unicast()

    # -- links (LLDP via ryu.topology) ---------------------------------------------------
    @set_ev_cls(topo_event.EventLinkAdd)
    def _link_add(self, ev: Any) -> None:
        s, d = ev.link.src, ev.link.dst
        if not self.leading:
            return
        trace("link-add s%d:%d s%d:%d", s.dpid, s.port_no, d.dpid, d.port_no)
        refused = self.service.gate.check(self.core.view, s.dpid, s.port_no, d.dpid, d.port_no)
        if refused is not None:  # (Ryu reports a link once while its frames keep arriving)
            self.service.metrics.links_refused.labels(why=refused.kind).inc()
            log.warning("link %#x:%d <-> %#x:%d not believed: %s", s.dpid, s.port_no, d.dpid,
                        d.port_no, refused.why)
            return
        suspects = [ip for p in ((s.dpid, s.port_no), (d.dpid, d.port_no))
                    for ip in self.service.gate.hosts_at(self.core.view, *p)]
        before = self.core.view.version
        plan = self.core.link_add(s.dpid, s.port_no, d.dpid, d.port_no)
        if self.core.view.version != before:
            log.info("link %#x:%d <-> %#x:%d discovered", s.dpid, s.port_no, d.dpid, d.port_no)
            if suspects:
                log.warning("link %#x:%d <-> %#x:%d discovered where host %s was attached: the host "
                            "is forgotten (if that port is not cabled to a switch, a host is relaying "
                            "discovery frames: pin the fabric with --fabric)", s.dpid, s.port_no,
                            d.dpid, d.port_no, ", ".join(suspects))
            self._send(self.discovery.link_up(s.dpid, s.port_no, d.dpid, d.port_no))
            self._apply(plan, "reroute")
            self._flush_unicast()
            self.service.save_soon()

    @set_ev_cls(topo_event.EventLinkDelete)
    def _link_delete(self, ev: Any) -> None:
        s, d = ev.link.src, ev.link.dst
        if not self.leading:
            return
        trace("link-delete s%d:%d s%d:%d", s.dpid, s.port_no, d.dpid, d.port_no)
        before = self.core.view.version
        t0 = time.perf_counter()
        plan = self.core.link_remove(s.dpid, s.port_no, d.dpid, d.port_no)
        if self.core.view.version != before:
            log.info("link %#x:%d <-> %#x:%d lost: %d groups rerouted in %.1f ms",
                     s.dpid, s.port_no, d.dpid, d.port_no, len(plan.groups),
                     (time.perf_counter() - t0) * 1000)
            self._apply(plan, "reroute")
            self._send(self.discovery.link_down(s.dpid, s.port_no, d.dpid, d.port_no))
            self._flush_unicast()
            self.service.save_soon()

    # -- packets: host learning, IGMP snooping, unicast forwarding -------------------------
    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev: Any) -> None:
        msg = ev.msg
        dp = msg.datapath
        if not self.leading:  # (an EQUAL instance before the roles are set)
            return
        in_port = msg.match.get("in_port")
        if self.punt_guard.note(dp.id, in_port, time.monotonic()):
            self._quarantine(dp.id, in_port)
        try:
            pkt = packet.Packet(msg.data)
        except Exception:  # malformed frames are the sender's problem, not ours
            return
        eth = pkt.get_protocol(ethernet.ethernet)
        if eth is None or eth.ethertype == 0x88CC:
            return
        edge = self.core.view.edge_port(dp.id, in_port)
        ip4 = pkt.get_protocol(ipv4.ipv4)
        a = pkt.get_protocol(arp.arp)
        src_ip = ip4.src if ip4 else (a.src_ip if a else None)
        if edge and src_ip and src_ip != "0.0.0.0":
            acts = self.discovery.seen(src_ip, eth.src, dp.id, in_port,
                                       msg.table_id == ofmsgs.TABLE_DST)
            self._discovered(acts)
            if acts.refused:  # it claims a known host's address: neither forwarded nor heard
                return
        if eth.dst == PROBE_MAC:
            return  # an answer to our probe: it taught us the host, it goes nowhere
        if ip4 is not None and ip4.proto == 2:
            if edge:
                self._igmp(pkt, ip4.src, (dp.id, in_port, eth.src))
            return
        if ip4 is not None and unicast.is_multicast(ip4.dst):
            return  # never flood multicast: only controller-built trees carry it
        self._send(unicast.forward(self.core.view, dp.id, in_port, eth.dst, msg.data,
                                   {d: getattr(sw, "ports", {}) for d, sw in self.dps.items()}))

    def _quarantine(self, dpid: int, port: int) -> None:
        """A port sent us more than ``--punt-port-rate`` frames in a second: if it is a
        host port, its frames to us pass a meter of their own for a while
        (``controller.punt``), so it cannot take its switch's budget from the others."""
        if not self.core.view.edge_port(dpid, port):
            return  # (an inter-switch link carries many hosts' frames: never quarantined)
        limit = self.punt_guard.limit
        if not self.reconnect.metered(dpid):
            log.warning("switch %#x port %d sent the controller more than %d frames in 1 s (a host "
                        "flooding new addresses or discovery frames?), but the switch has no meters "
                        "to hold it to", dpid, port, limit)
            return
        log.warning("switch %#x port %d sent the controller more than %d frames in 1 s (a host "
                    "flooding new addresses or discovery frames?): its frames to the controller "
                    "pass a meter of their own (%d/s) for %d s", dpid, port, limit, limit, QUARANTINE_S)
        self._send([(dpid, m) for m in ofmsgs.quarantine_flows(dpid, port, limit, QUARANTINE_S)])

    # -- hosts: learned, probed for, forgotten (controller.hosts decides) ------------------
    @set_ev_cls(ofp_event.EventOFPFlowRemoved, MAIN_DISPATCHER)
    def _flow_removed(self, ev: Any) -> None:
        """A host's source entry idled out: it was silent for the host timeout. Or one
        of our other entries was deleted while no plan of ours was in flight: someone
        else did it, so that switch is audited at once."""
        msg = ev.msg
        if msg.cookie & ofmsgs.COOKIE_MASK != ofmsgs.COOKIE_TAG or not self.leading:
            return
        if msg.reason == ofp.OFPRR_IDLE_TIMEOUT:
            if msg.cookie == ofmsgs.COOKIE_SOURCE and "eth_src" in msg.match \
                    and "in_port" in msg.match:
                self.discovery.idle(msg.datapath.id, msg.match["in_port"],
                                    msg.match["eth_src"], time.monotonic())
                self._discovery_tick()
        elif msg.cookie != ofmsgs.COOKIE_SOURCE and not self.service.busy \
                and removal_is_drift(self.service.core, msg.datapath.id, msg.cookie):  # (we
            # delete source-table entries outside plans; the periodic audit checks link ports)
            log.warning("switch %#x: an entry of ours was deleted (cookie %#x, priority %d): "
                        "auditing it", msg.datapath.id, msg.cookie, msg.priority)
            self.audits.soon(msg.datapath.id)

    def _timer_loop(self) -> None:
        """Host discovery's probes and timeouts, and the switches' periodic audits."""
        while True:
            hub.sleep(0.25)
            if not self.leading:
                continue
            try:
                self._discovery_tick()
                self.punt_guard.expire(time.monotonic())
                self._start_audits(time.monotonic())
                self.service.flush_state(time.monotonic())
            except Exception:  # never let one bad step stop the timers
                log.exception("timer step failed")

    def _start_audits(self, now: float) -> None:
        """Re-read the tables of the switches that are due (answers: ``_stats_reply``)."""
        for dpid in self.audits.due(now, self.dps, self.service.busy, self.reconnect.reading()):
            trace("audit start s%d", dpid)
            self._send([(dpid, m) for m in self.reconnect.start(dpid, audit=True)])

    def _discovery_tick(self) -> None:
        self._discovered(self.discovery.tick(
            time.monotonic(), {d: getattr(dp, "ports", {}) for d, dp in self.dps.items()}))

    def _discovered(self, acts: Actions) -> None:
        self._send(acts.msgs)
        view = self.core.view
        for ip in acts.learned:
            h = view.hosts[ip]
            log.info("host %s (%s) at switch %#x port %d", ip, h.mac, h.dpid, h.port)
        for ip in acts.forgotten:
            log.info("host %s forgotten (port down, or silent and not answering probes)", ip)
        now = time.monotonic()
        for ip in acts.spoofed:
            if now - self._spoof_warned.get(ip, float("-inf")) >= 60:
                self._spoof_warned[ip] = now
                pinned = ip in self.discovery.pinned
                place = self.discovery.pinned.get(ip) or self.discovery.reserved.get(ip)
                if place is None:  # (its declaration was removed meanwhile)
                    continue
                mac, dpid, port = place
                log.warning("a frame claims host %s's address from elsewhere: dropped (%s at switch %#x "
                            "port %d, %s; said at most once a minute)", ip,
                            "--fabric pins it" if pinned else "declared over REST", dpid, port, mac)
        for ip in acts.contested:
            h = view.hosts[ip]
            log.warning("a frame claims host %s's address from elsewhere: not moved; probing it at "
                        "switch %#x port %d (forgotten if silent, then learned where it is)",
                        ip, h.dpid, h.port)
        self._apply(acts.plan, "host")
        if acts.learned or acts.forgotten:
            self.service.save_soon()  # written by the timer: a burst of new hosts is one write

    def _igmp(self, pkt: packet.Packet, reporter: str, place: tuple[int, int, str]) -> None:
        """Membership reports act exactly like REST joins/leaves of the (S,G) groups, for
        hosts the operator allows (``--igmp-allow``) reporting from where they were
        learned."""
        refusal = self.igmp_policy.refuses(reporter, self.core.view.hosts.get(reporter), place)
        if refusal:
            log.info("IGMP report from %s ignored: %s", reporter, refusal)
            return
        said = igmp_decisions.statements(pkt.protocols)
        for d in igmp_decisions.decide(reporter, said, self.core.groups):
            st, g, verb = d.statement, d.group, "join" if d.join else "leave"
            if g is None:
                log.info("IGMP %s from %s for (%s, %s): no such group", verb, reporter,
                         st.source or "*", st.address)
                continue
            try:
                self.service.join(g.gid, reporter) if d.join else self.service.leave(g.gid, reporter)
                log.info("IGMP %s: %s %s group %d (%s, %s)", verb, reporter,
                         "joined" if d.join else "left", g.gid, g.source, g.address)
            except CoreError as exc:
                log.warning("IGMP from %s for group %d ignored: %s", reporter, g.gid, exc)

    def _send(self, msgs: list[tuple[int, Any]]) -> None:
        for dpid, msg in msgs:
            dp = self.dps.get(dpid)
            if dp is not None:
                dp.send_msg(msg)

    def _flush_unicast(self) -> None:
        self._send([(dpid, ofmsgs.unicast_flush(dpid)) for dpid in self.dps])
