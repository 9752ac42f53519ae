"""The Ryu app: a thin shim that turns OpenFlow and topology events into calls on the
pure core (through ``Service``) and sends back what they return.

Start it with ``modelcast-controller`` (``controller.main``), which loads the eventlet
shim first and enables Ryu's LLDP link discovery.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import controller.compat  # noqa: F401  (before ryu.app.wsgi)
import networkx as nx
from ryu.app.wsgi import WSGIApplication
from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.lib import hub
from ryu.lib.packet import arp, ethernet, igmp, ipv4, packet
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser
from ryu.topology import event as topo_event

from controller import ofmsgs, settings
from controller.core import MulticastCore, Plan, SwitchState, tune_gc
from controller.errors import CoreError
from controller.rest import RestApi
from controller.service import Service, StateFileError

app_manager.require_app("ryu.topology.switches", api_style=True)
log = logging.getLogger("modelcast.app")

IGMPV3_JOIN = {1, 3, 5}  # MODE_IS_INCLUDE, CHANGE_TO_INCLUDE, ALLOW_NEW_SOURCES
IGMPV3_BLOCK = 6  # BLOCK_OLD_SOURCES
IGMPV3_EXCLUDE = {2, 4}  # MODE_IS_EXCLUDE, CHANGE_TO_EXCLUDE: any-source join (empty list)


class ModelcastApp(app_manager.RyuApp):
    OFP_VERSIONS = [ofp.OFP_VERSION]
    _CONTEXTS = {"wsgi": WSGIApplication}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        conf = settings.current
        tune_gc()
        self.dps: dict[int, Any] = {}
        self._stats: dict[int, dict[str, Any]] = {}
        self._waiters: dict[tuple[int, int], Any] = {}  # (dpid, barrier xid) -> hub.Event
        self._xid_errors: dict[tuple[int, int], list[str]] = {}  # (dpid, xid) -> plan's errors
        self._queue: Any = hub.Queue()
        core = MulticastCore(algorithm=conf.algorithm, udp_port=conf.udp_port)
        self.service = Service(core, installer=self, state_path=conf.state_file, token=conf.token)
        try:
            problems = self.service.load()  # before any switch connects
        except StateFileError as exc:
            # Starting empty would overwrite the file (and the groups' keys) on next save.
            log.critical("%s", exc)
            raise SystemExit(2) from None
        for problem in problems:
            log.error("state file %s: %s", conf.state_file, problem)
        kwargs["wsgi"].register(RestApi, {"service": self.service,
                                          "barrier_timeout": 3 * conf.barrier_timeout_s + 2})
        hub.spawn(self._install_loop)
        if not conf.token:
            log.warning("no REST token configured (--token or MODELCAST_TOKEN): "
                        "anyone who reaches the REST port can change groups")
        log.info("modelcast controller: %d groups restored, algorithm %s, state file %s",
                 len(core.groups), conf.algorithm, conf.state_file or "(none: groups are not persisted)")

    @property
    def core(self) -> MulticastCore:
        return self.service.core

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
                for phase in plan.phases:
                    touched = []
                    for dpid, msg in phase:
                        dp = self.dps.get(dpid)
                        if dp is None:
                            errors.append(f"switch {dpid:#x} disconnected before install")
                            continue
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
        errors = self._xid_errors.get((dpid, msg.xid))
        if errors is not None:
            errors.append(text)
        log.error("%s", text)

    def _apply(self, plan: Plan, reason: str) -> None:
        if len(plan):
            self.service.apply(plan, reason)

    # -- switches ------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _features(self, ev: Any) -> None:
        dp = ev.msg.datapath
        for msg in ofmsgs.base_flows(dp.id):
            dp.send_msg(msg)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state(self, ev: Any) -> None:
        dp = ev.datapath
        if dp.id is None:
            return
        if ev.state == MAIN_DISPATCHER:
            log.info("switch %#x connected from %s", dp.id, dp.address)
            self.dps[dp.id] = dp
            # Read what it already holds of ours before touching it: after a controller
            # restart a healthy switch keeps forwarding and gets no message at all.
            self._stats[dp.id] = {"flows": [], "groups": {}, "pending": 2}
            dp.send_msg(parser.OFPFlowStatsRequest(
                dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, ofmsgs.COOKIE_TAG,
                ofmsgs.COOKIE_MASK, parser.OFPMatch()))
            dp.send_msg(parser.OFPGroupDescStatsRequest(dp, 0))
        elif self.dps.get(dp.id) is dp:
            del self.dps[dp.id]
            self._stats.pop(dp.id, None)
            t0 = time.perf_counter()
            plan = self.core.switch_leave(dp.id)
            log.warning("switch %#x disconnected: %d groups rerouted in %.1f ms",
                        dp.id, len(plan.groups), (time.perf_counter() - t0) * 1000)
            self._apply(plan, "reroute")
            self._flush_unicast()

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats(self, ev: Any) -> None:
        st = self._stats.get(ev.msg.datapath.id)
        if st is None:
            return
        for f in ev.msg.body:
            st["flows"].append((f.cookie, f.priority, f.match.get("in_port")))
        if not ev.msg.flags & ofp.OFPMPF_REPLY_MORE:
            self._stats_part_done(ev.msg.datapath)

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, MAIN_DISPATCHER)
    def _group_stats(self, ev: Any) -> None:
        st = self._stats.get(ev.msg.datapath.id)
        if st is None:
            return
        for g in ev.msg.body:
            st["groups"][g.group_id] = (g.type, [
                [a.port for a in b.actions if isinstance(a, parser.OFPActionOutput)]
                + [None for a in b.actions if not isinstance(a, parser.OFPActionOutput)]
                for b in g.buckets])
        if not ev.msg.flags & ofp.OFPMPF_REPLY_MORE:
            self._stats_part_done(ev.msg.datapath)

    def _stats_part_done(self, dp: Any) -> None:
        st = self._stats[dp.id]
        st["pending"] -= 1
        if st["pending"]:
            return
        del self._stats[dp.id]
        present = SwitchState.from_tables(st["flows"], st["groups"], self.core.groups)
        plan = Plan()
        for port in getattr(dp, "ports", {}).values():  # its ports' state, as it reports it
            if port.port_no < ofp.OFPP_MAX and self._port_is_down(port):
                plan.extend(self.core.port_down(dp.id, port.port_no))
        plan.extend(self.core.switch_enter(dp.id, present))
        log.info("switch %#x reconciled: held %d of our groups, %d messages to fix",
                 dp.id, len(present.groups), len(plan))
        self._apply(plan, "switch")

    @staticmethod
    def _port_is_down(port: Any) -> bool:
        return bool(port.state & ofp.OFPPS_LINK_DOWN or port.config & ofp.OFPPC_PORT_DOWN)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev: Any) -> None:
        """React to a port going down at once: LLDP would notice only after ~10 s."""
        msg = ev.msg
        dpid, port = msg.datapath.id, msg.desc.port_no
        if port >= ofp.OFPP_MAX:
            return
        down = msg.reason == ofp.OFPPR_DELETE or self._port_is_down(msg.desc)
        t0 = time.perf_counter()
        plan = self.core.port_down(dpid, port) if down else self.core.port_up(dpid, port)
        if len(plan) or down:
            log.info("port %#x:%d %s: %d groups rerouted, %d messages, computed in %.1f ms",
                     dpid, port, "down" if down else "up", len(plan.groups), len(plan),
                     (time.perf_counter() - t0) * 1000)
        self._apply(plan, "reroute")
        self._flush_unicast()

    # -- links (LLDP via ryu.topology) ---------------------------------------------------
    @set_ev_cls(topo_event.EventLinkAdd)
    def _link_add(self, ev: Any) -> None:
        s, d = ev.link.src, ev.link.dst
        before = self.core.view.version
        plan = self.core.link_add(s.dpid, s.port_no, d.dpid, d.port_no)
        if self.core.view.version != before:
            log.info("link %#x:%d <-> %#x:%d discovered", s.dpid, s.port_no, d.dpid, d.port_no)
            self._apply(plan, "reroute")
            self._flush_unicast()
            self.service.save()

    @set_ev_cls(topo_event.EventLinkDelete)
    def _link_delete(self, ev: Any) -> None:
        s, d = ev.link.src, ev.link.dst
        before = self.core.view.version
        t0 = time.perf_counter()
        plan = self.core.link_remove(s.dpid, s.port_no, d.dpid, d.port_no)
        if self.core.view.version != before:
            log.info("link %#x:%d <-> %#x:%d lost: %d groups rerouted in %.1f ms",
                     s.dpid, s.port_no, d.dpid, d.port_no, len(plan.groups),
                     (time.perf_counter() - t0) * 1000)
            self._apply(plan, "reroute")
            self._flush_unicast()
            self.service.save()

    # -- packets: host learning, IGMP snooping, unicast forwarding -------------------------
    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev: Any) -> None:
        msg = ev.msg
        dp = msg.datapath
        in_port = msg.match.get("in_port")
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
            self._learn(src_ip, eth.src, dp.id, in_port)
        if ip4 is not None and ip4.proto == 2:
            if edge:
                self._igmp(pkt, ip4.src)
            return
        if ip4 is not None and ipv4_is_multicast(ip4.dst):
            return  # never flood multicast: only controller-built trees carry it
        self._forward(dp, in_port, eth, msg.data, edge)

    def _learn(self, ip: str, mac: str, dpid: int, port: int) -> None:
        known = self.core.view.hosts.get(ip)
        if known is not None and (known.dpid, known.port, known.mac) == (dpid, port, mac):
            return
        try:
            plan = self.core.host_add(ip, mac, dpid, port)
        except CoreError:
            return
        log.info("host %s (%s) at switch %#x port %d", ip, mac, dpid, port)
        self._apply(plan, "host")
        self.service.save()

    def _igmp(self, pkt: packet.Packet, reporter: str) -> None:
        """Membership reports act exactly like REST joins/leaves of the (S,G) groups."""
        for proto in pkt.protocols:
            if isinstance(proto, igmp.igmpv3_report):
                for rec in proto.records:
                    if rec.type_ in IGMPV3_JOIN and rec.srcs:
                        for src in rec.srcs:
                            self._membership(reporter, rec.address, src, True)
                    elif rec.type_ == IGMPV3_BLOCK or (rec.type_ in (1, 3) and not rec.srcs):
                        for src in rec.srcs or [None]:
                            self._membership(reporter, rec.address, src, False)
                    elif rec.type_ in IGMPV3_EXCLUDE and not rec.srcs:
                        self._membership(reporter, rec.address, None, True)
            elif isinstance(proto, igmp.igmp):
                if proto.msgtype in (igmp.IGMP_TYPE_REPORT_V1, igmp.IGMP_TYPE_REPORT_V2):
                    self._membership(reporter, proto.address, None, True)
                elif proto.msgtype == igmp.IGMP_TYPE_LEAVE:
                    self._membership(reporter, proto.address, None, False)

    def _membership(self, host: str, group: str, source: str | None, join: bool) -> None:
        matches = [g for g in self.core.groups.values()
                   if g.address == group and (source is None or g.source == source)]
        if not matches:
            log.info("IGMP %s from %s for (%s, %s): no such group", "join" if join else "leave",
                     host, source or "*", group)
        for g in matches:
            if (host in g.receivers) == join or host == g.source:
                continue
            try:
                self.service.join(g.gid, host) if join else self.service.leave(g.gid, host)
                log.info("IGMP %s: %s %s group %d (%s, %s)", "join" if join else "leave", host,
                         "joined" if join else "left", g.gid, g.source, g.address)
            except CoreError as exc:
                log.warning("IGMP from %s for group %d ignored: %s", host, g.gid, exc)

    def _forward(self, dp: Any, in_port: int, eth: Any, data: bytes, edge: bool) -> None:
        """Unicast: install the shortest path to a known destination host, then send the
        packet along; broadcast and unknown destinations go to every edge port (never
        flooded over inter-switch links, so loops in the fabric cannot storm)."""
        view = self.core.view
        dst = next((h for h in view.hosts.values() if h.mac == eth.dst), None)
        if dst is not None and view.host_attached(dst) and dp.id in view.graph:
            try:
                path = nx.shortest_path(view.graph, dp.id, dst.dpid)
            except (nx.NetworkXNoPath, nx.NodeNotFound):
                return
            hops = [(a, view.link_port(a, b)) for a, b in zip(path, path[1:])] + [(dst.dpid, dst.port)]
            for dpid, port in reversed(hops):  # downstream first
                sw = self.dps.get(dpid)
                if sw is not None:
                    sw.send_msg(ofmsgs.unicast_flow(dpid, eth.dst, port))
            self._packet_out(dp, in_port, [hops[0][1]], data)
            return
        if not edge:
            return  # a copy we flooded ourselves, seen again on a link port
        for dpid, sw in self.dps.items():
            ports = [p for p in getattr(sw, "ports", {})
                     if p < ofp.OFPP_MAX and view.edge_port(dpid, p)
                     and (dpid, p) not in view.ports_down and not (dpid == dp.id and p == in_port)]
            if ports:
                self._packet_out(sw, in_port if dpid == dp.id else ofp.OFPP_CONTROLLER, ports, data)

    @staticmethod
    def _packet_out(dp: Any, in_port: int, ports: list[int], data: bytes) -> None:
        dp.send_msg(parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=in_port,
                                        actions=[parser.OFPActionOutput(p, 0) for p in ports],
                                        data=data))

    def _flush_unicast(self) -> None:
        for dpid, dp in self.dps.items():
            dp.send_msg(ofmsgs.unicast_flush(dpid))


def ipv4_is_multicast(addr: str) -> bool:
    first = int(addr.split(".", 1)[0])
    return 224 <= first <= 239

