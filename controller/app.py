"""The Ryu app: a thin shim. Events in (OpenFlow messages, ``ryu.topology``'s links,
timers), calls into pure modules with ``now``, messages out. It owns what Ryu hands it
(the datapaths, the WSGI context, green threads) and must not decide anything itself;
the decisions live in:

* ``controller.service`` and the core: groups, trees and the plans that change them;
* ``controller.ha``: several instances (election's outcome, following, forwarding);
* ``controller.reconnect``: a switch's connect sequence and audits;
* ``controller.topochange``: ports, links and switches coming and going;
* ``controller.capabilities``: meters, fast-failover groups, Nicira actions;
* ``controller.hosts`` (and ``hostnotices``), ``controller.igmp``, ``controller.unicast``:
  punted frames (hosts learned and forgotten, membership reports, unicast forwarding);
* ``controller.installer``: plans sent phase by phase behind barriers.

Start it with ``modelcast-controller`` (``controller.main``), which loads the eventlet
shim first and enables Ryu's LLDP link discovery.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import controller.compat  # noqa: F401  (before ryu.app.wsgi)
from ryu.app.wsgi import WSGIApplication
from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.lib import hub
from ryu.lib.packet import arp, ethernet, ipv4, packet
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.topology import event as topo_event

from controller import (capabilities, lldpauth, membership, ofmsgs, settings, topochange, tracing, unicast,
                        webserver)
from controller.core import MulticastCore, Plan, tune_gc
from controller.counters import Counters
from controller.election import Election
from controller.ha import Ha, instance_id
from controller.hostnotices import HostNotices
from controller.hosts import PROBE_MAC, Actions, HostDiscovery
from controller.igmp import IgmpPolicy
from controller.installer import PlanInstaller
from controller.linkgate import LinkGate
from controller.punt import PuntGuard
from controller.reconnect import AuditClock, Reconnect, port_status, removal_is_drift
from controller.rest import RestApi
from controller.service import Changes, Service
from controller.store import EtcdStore, parse_store_url
from controller.tracing import trace
from controller.webui import WebUi

app_manager.require_app("ryu.topology.switches", api_style=True)
log = logging.getLogger("modelcast.app")

webserver.install()  # our limits on REST connections, before Ryu's manager starts the server
lldpauth.install(settings.current.lldp_rate)  # links only from discovery frames we signed, before any switch connects


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
        tracing.start(conf.trace_file)
        self.dps: dict[int, Any] = {}
        self.installer = PlanInstaller(self.dps, conf.barrier_timeout_s)
        core = MulticastCore(algorithm=conf.algorithm, udp_port=conf.udp_port,
                             protection=conf.protection, nicira=conf.nicira, flap_damping=conf.flap_damping)
        # several instances (--store etcd://): one leads and writes, the others follow
        store = open_store(conf) if conf.store_url else None
        self.switch_roles: dict[int, tuple[str, int]] = {}  # dpid -> what its role reply said
        self.service = Service(core, installer=self.installer, state_path=conf.state_file, token=conf.token,
                               host_tokens=conf.host_tokens, writer=self.installer.write_state, store=store)
        self.service.gate = LinkGate(conf.fabric)  # (before load: restored links are checked too)
        self.service.changes = Changes(hub.Event, conf.held_max)  # (green: a held GET waits on the hub)
        self.service.events.use(hub.Event)  # (so does a client following the event stream)
        metrics = self.service.metrics
        metrics.rest_connections.set_function(lambda: sum(webserver.POOL.open.values()) if webserver.POOL else 0)
        metrics.rest_connections_refused.set_function(lambda: webserver.POOL.refused if webserver.POOL else 0)
        metrics.lldp_refused.set_function(lambda: lldpauth.SIGNER.forged if lldpauth.SIGNER else 0)
        self.punt_guard = PuntGuard(conf.punt_port_rate if conf.punt_rate > 0 else 0)
        self.host_notices = HostNotices()
        self.counters = Counters(self._send_one, hub.Event)  # live counters for traces
        metrics.punt_quarantines.set_function(lambda: self.punt_guard.quarantined)
        self._rebind()
        election = (Election(store, instance_id(), conf.advertise_url or "", ttl=conf.lease_ttl_s)
                    if store else None)
        self.ha = Ha(self.service, store, election, self._rebind, takeover_s=conf.barrier_timeout_s,
                     forward_timeout_s=3 * conf.barrier_timeout_s + 5)
        self.igmp_policy = IgmpPolicy.from_settings(conf.igmp_allow, conf.host_tokens)
        if election is None:  # (one of several gets its state from the store)
            self.ha.restore()
            self.discovery.pin()  # (over a place the saved state had)
        kwargs["wsgi"].register(RestApi, {"service": self.service,
                                          "barrier_timeout": 3 * conf.barrier_timeout_s + 2,
                                          "forward": (lambda req: self.ha.forward(req, time.monotonic()))
                                          if election else None,
                                          "leader": self.ha.leader_url if election else None,
                                          "counters": self.counters})
        kwargs["wsgi"].register(WebUi, {"service": self.service})  # the live web view at /ui/
        hub.spawn(self.installer.run)
        hub.spawn(self._timer_loop)
        if election is not None:
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

    @property
    def leading(self) -> bool:
        """May write to switches (and the store): always, unless another instance leads."""
        return self.ha.leading

    @property
    def election(self) -> Election | None:
        return self.ha.election

    # -- several instances: controller.ha acts on the election's outcome -----------------
    def _election_loop(self) -> None:
        assert self.election is not None
        while True:
            if self.ha.stopping:
                self.ha.stop()
                os._exit(0)  # switches keep forwarding; the others take over now
            try:
                now = time.monotonic()
                step = self.ha.step(self.election.step(now), now, self.dps)
                self._send(step.msgs)
                for dpid in step.takeover:  # a new leader reads every switch anew
                    self._send([(dpid, m) for m in self.reconnect.features(dpid)
                                + capabilities.capability_requests(dpid) + self.reconnect.start(dpid)])
            except Exception:  # never let one bad step stop the election
                log.exception("election step failed")
            hub.sleep(0.1)

    @set_ev_cls(ofp_event.EventOFPRoleReply, MAIN_DISPATCHER)
    def _role_reply(self, ev: Any) -> None:
        msg = ev.msg
        names = {ofp.OFPCR_ROLE_MASTER: "master", ofp.OFPCR_ROLE_SLAVE: "slave",
                 ofp.OFPCR_ROLE_EQUAL: "equal"}
        self.switch_roles[msg.datapath.id] = (names.get(msg.role, str(msg.role)), msg.generation_id)
        log.info("switch %#x: our role is %s (generation %d)", msg.datapath.id,
                 names.get(msg.role, msg.role), msg.generation_id)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier_reply(self, ev: Any) -> None:
        self.installer.confirmed(ev.msg.datapath.id, ev.msg.xid)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev: Any) -> None:
        msg = ev.msg
        dpid = msg.datapath.id
        text = f"switch {dpid:#x}: OpenFlow error type {msg.type} code {msg.code} (xid {msg.xid})"
        if msg.type == ofp.OFPET_BAD_REQUEST and msg.code == ofp.OFPBRC_IS_SLAVE and (
                not self.leading or self.installer.errors_of(dpid, msg.xid) is None):
            # a follower's LLDP packet-outs (ryu.topology), also one answered just after it
            # was elected: refused by design, not an error worth a line each (a plan's
            # message refused so falls through: this instance was deposed)
            self.ha.refused_as_slave()
            return
        data = bytes(msg.data or b"")  # (the refused request's first bytes)
        if ofmsgs.benign_error(msg.type, msg.code, ofmsgs.meter_of_error(data)):
            return  # the punt meter was there already (a switch that kept its tables)
        if msg.type == ofp.OFPET_ROLE_REQUEST_FAILED:
            log.warning("switch %#x refused our role request (code %d%s)", dpid, msg.code,
                        ": stale, a newer leader was elected" if msg.code == ofp.OFPRRFC_STALE else "")
            return
        errors = self.installer.errors_of(dpid, msg.xid)
        if errors is not None:
            errors.append(text)
        # a switch lacking something optional: the first refusal switches it over (with a
        # warning saying so); the others already sent are expected, and logged quietly
        lacks = capabilities.refused(msg.type, msg.code, data)
        (log.debug if capabilities.known(self.core, self.reconnect, dpid, lacks) else log.error)("%s", text)
        if lacks is not None:
            self._capability(dpid, (lacks, False, capabilities.REFUSED[lacks]))
            if lacks != capabilities.METERS:  # (what else of that plan it refused, such as
                self.audits.soon(dpid)  # the ALL groups chained to a FF group: read, put right)

    def _capability(self, dpid: int, said: capabilities.Said | None) -> None:
        """A switch has (or lacks) meters, fast-failover groups or Nicira actions."""
        change = capabilities.change(self.core, self.reconnect, dpid, said) if said and self.leading else None
        if change is not None:
            self._send(change.msgs)
            self._apply(change.plan, change.reason)
            if change.audit:
                self.audits.soon(dpid)

    # (asked for when a switch connects, and on a takeover, before its tables are read)
    @set_ev_cls(ofp_event.EventOFPDescStatsReply, MAIN_DISPATCHER)
    def _desc_reply(self, ev: Any) -> None:
        self._capability(ev.msg.datapath.id, capabilities.description(ev.msg.body))

    @set_ev_cls(ofp_event.EventOFPGroupFeaturesStatsReply, MAIN_DISPATCHER)
    def _group_features_reply(self, ev: Any) -> None:
        self._capability(ev.msg.datapath.id, capabilities.group_features(ev.msg.body.types))

    @set_ev_cls(ofp_event.EventOFPMeterFeaturesStatsReply, MAIN_DISPATCHER)
    def _meter_features_reply(self, ev: Any) -> None:
        self._capability(ev.msg.datapath.id, capabilities.meter_features(ev.msg.body))

    def _apply(self, plan: Plan, reason: str) -> None:
        if len(plan):
            trace("plan %s: %d messages (queue %d)", reason, len(plan), self.installer.queued())
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
            self.service.events.emit("switch_connected", dpid=dp.id, address=str(dp.address[0]))
            self.dps[dp.id] = dp
            self._send(self.ha.role_requests([dp.id]))
            if not self.leading:
                return
            # Read what it already holds of ours before touching it: after a controller
            # restart a healthy switch keeps forwarding and gets no message at all. Its
            # description, group and meter features first: the answers come in order
            # (``_desc_reply``, ``_group_features_reply``, ``_meter_features_reply``).
            for msg in capabilities.capability_requests(dp.id) + self.reconnect.start(dp.id):
                dp.send_msg(msg)
        elif self.dps.get(dp.id) is dp:
            del self.dps[dp.id]
            self.reconnect.forget(dp.id)
            self.punt_guard.forget(dp.id)
            self.ha.disconnected(dp.id)
            if not self.leading:
                return
            self._apply(topochange.switch_left(self.core, dp.id), "reroute")
            self._flush_unicast()

    @set_ev_cls([ofp_event.EventOFPFlowStatsReply, ofp_event.EventOFPGroupDescStatsReply,
                 ofp_event.EventOFPGroupStatsReply], MAIN_DISPATCHER)
    def _stats_reply(self, ev: Any) -> None:
        dp = ev.msg.datapath
        if self.counters.reply(dp.id, ev.msg) or not self.leading:  # (a trace's read; a follower's)
            return
        done = self.reconnect.on_reply(dp.id, ev.msg, getattr(dp, "ports", {}).values())
        if done is None:
            return
        trace("read s%d done: audit=%s void=%s, %d messages", dp.id, done.audit, done.void, len(done.plan))
        if not done.audit:
            log.info("switch %#x reconciled: held %d of our groups, %d messages to fix",
                     dp.id, len(done.present.groups), len(done.plan))
            self._apply(done.plan, "switch")
            self.ha.read(dp.id)
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
        self._apply(topochange.port(self.core, dpid, port, down), "reroute")
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
        self._links(topochange.link_up(self.service, self.discovery, s.dpid, s.port_no, d.dpid, d.port_no))

    @set_ev_cls(topo_event.EventLinkDelete)
    def _link_delete(self, ev: Any) -> None:
        s, d = ev.link.src, ev.link.dst
        if not self.leading:
            return
        trace("link-delete s%d:%d s%d:%d", s.dpid, s.port_no, d.dpid, d.port_no)
        self._links(topochange.link_down(self.core, self.discovery, s.dpid, s.port_no, d.dpid, d.port_no))

    def _links(self, change: topochange.Change | None) -> None:
        if change is not None:  # (None: refused, or known already)
            self._send(change.msgs)
            self._apply(change.plan, "reroute")
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
            self._send(capabilities.quarantine(self.core.view, self.reconnect, self.punt_guard.limit,
                                               dp.id, in_port))
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
                membership.report(self.igmp_policy, self.service, pkt.protocols, ip4.src,
                                  (dp.id, in_port, eth.src))
            return
        if ip4 is not None and unicast.is_multicast(ip4.dst):
            return  # never flood multicast: only controller-built trees carry it
        self._send(unicast.forward(self.core.view, dp.id, in_port, eth.dst, msg.data,
                                   {d: getattr(sw, "ports", {}) for d, sw in self.dps.items()}))

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
        """Host discovery's probes and timeouts, flapping links given back, and the
        switches' periodic audits."""
        while True:
            hub.sleep(0.25)
            if not self.leading:
                continue
            try:
                self._discovery_tick()
                self.punt_guard.expire(time.monotonic())
                self.service.apply(self.core.release_damped(time.monotonic()), "flap hold ended")
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
        self.host_notices.tell(acts, self.core.view, self.discovery, time.monotonic(), self.service.events)
        self._apply(acts.plan, "host")
        if acts.learned or acts.forgotten:
            self.service.save_soon()  # written by the timer: a burst of new hosts is one write

    def _send_one(self, dpid: int, msg: Any) -> bool:
        dp = self.dps.get(dpid)
        if dp is None:
            return False
        dp.send_msg(msg)
        return True

    def _send(self, msgs: list[tuple[int, Any]]) -> None:
        for dpid, msg in msgs:
            self._send_one(dpid, msg)

    def _flush_unicast(self) -> None:
        self._send([(dpid, ofmsgs.unicast_flush(dpid)) for dpid in self.dps])
