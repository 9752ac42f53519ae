"""The Ryu app driven as Ryu drives it, without a network (faucet's
``test_valveapp_smoke`` pattern): fake datapaths that apply every message to the simulated
fabric and answer barriers, stats requests and errors with events from another green
thread; a ``Bench`` that dispatches events to a real ``ModelcastApp`` by event class and
dispatcher state, as Ryu does. Shared by ``tests/controller/test_app.py`` and
``tests/controller/test_ha.py``."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from ryu.controller import handler, ofp_event
from ryu.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER
from ryu.lib import hub
from ryu.lib.packet import arp, ethernet, igmp, ipv4, packet, udp
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser
from ryu.topology import event as topo_event
from ryu.topology.switches import Link, Port

import topologies as T
from controller import ofmsgs
from controller.core import Plan
from controller.hosts import PROBE_MAC
from lab.fakeof import FakeFabric, OFError

TOPO = T.leaf_spine(2, 2, 2)  # spines 1, 2; leaf 3: h1 h2, leaf 4: h3 h4; leaf port i -> spine i
H = {h.name: h for h in TOPO.hosts}


class FakeDatapath:
    """What the app uses of ryu's ``Datapath``. Messages are serialized as Ryu would and
    applied to the fake switch; replies come back later, as events, from another green
    thread: barrier replies, stats replies, and OFPT_ERROR for what the switch refuses."""

    def __init__(self, bench: Bench, dpid: int) -> None:
        self.bench = bench
        self.id = dpid
        self.address = ("127.0.0.1", 40000 + dpid)
        self.ofproto, self.ofproto_parser = ofp, parser
        self.xid = 0
        self.sent: list[Any] = []

    @property
    def ports(self) -> dict[int, Any]:
        return self.bench.fabric.ports(self.id)

    def set_xid(self, msg: Any) -> None:
        self.xid += 1
        msg.set_xid(self.xid)

    def send_msg(self, msg: Any) -> None:
        assert isinstance(msg, parser.MsgBase)
        if msg.xid is None:
            self.set_xid(msg)
        msg.serialize()  # what Ryu does before writing it to the socket
        self.sent.append(msg)
        if isinstance(msg, parser.OFPBarrierRequest):
            self.reply(parser.OFPBarrierReply(self), msg.xid)
        elif isinstance(msg, parser.OFPMultipartRequest):
            for part in self.bench.fabric.request(self.id, msg):
                self.reply(part, msg.xid)
        elif not isinstance(msg, parser.OFPPacketOut):
            try:
                self.bench.fabric.apply(self.id, msg)
            except OFError as err:
                # (quoting the request's first 64 bytes, as OpenFlow 1.3 asks)
                self.reply(parser.OFPErrorMsg(self, type_=err.type, code=err.code, data=bytes(msg.buf[:64])),
                           msg.xid)

    def reply(self, msg: Any, xid: int) -> None:
        msg.datapath, msg.xid = self, xid
        self.bench.later(ofp_event.ofp_msg_to_ev(msg), MAIN_DISPATCHER)

    def sent_of(self, kind: type) -> list[Any]:
        return [m for m in self.sent if isinstance(m, kind)]


class Bench:
    """One app over one fake fabric; ``calls`` counts handler runs by name."""

    def __init__(self, app: Any, fabric: FakeFabric) -> None:
        self.app, self.fabric = app, fabric
        self.dps = {d: FakeDatapath(self, d) for d in fabric.switches}
        self.calls: Counter[str] = Counter()
        self.busy = 0
        handler.register_instance(app)  # as app_manager does: by @set_ev_cls
        for ev_cls, hs in app.event_handlers.items():
            app.event_handlers[ev_cls] = [self._counted(h) for h in hs]
        self.inflight = 0
        real = app.service.installer

        class Tracking:  # the app stays the installer; this only counts unconfirmed plans
            def install(inner, plan: Plan, done: Callable[[list[str]], None]) -> None:
                self.inflight += 1

                def confirmed(errors: list[str]) -> None:
                    self.inflight -= 1
                    done(errors)
                real.install(plan, confirmed)

        app.service.installer = Tracking()

    def _counted(self, h: Any) -> Any:
        def run(ev: Any) -> None:
            self.calls[h.__name__] += 1
            h(ev)
        run.callers = h.callers  # get_handlers filters on the dispatcher states
        return run

    def deliver(self, ev: Any, state: str | None = MAIN_DISPATCHER) -> None:
        """As Ryu dispatches: the handlers registered for this event class and state."""
        hs = self.app.get_handlers(ev, state)
        assert hs, f"no handler for {type(ev).__name__} in {state}"
        for h in hs:
            h(ev)

    def later(self, ev: Any, state: str) -> None:
        self.busy += 1

        def run() -> None:
            try:
                self.deliver(ev, state)
            finally:
                self.busy -= 1
        hub.spawn(run)

    def settle(self) -> None:
        """Run green threads until every reply is handled and every plan confirmed."""
        quiet = 0
        for _ in range(5000):
            hub.sleep(0.001)
            quiet = quiet + 1 if not self.busy and not self.inflight else 0
            if quiet >= 3:
                return
        raise AssertionError(f"not settled: {self.busy} replies, {self.inflight} plans pending")

    # ---- events, as the switches and ryu.topology would raise them

    def connect(self, dpid: int) -> None:
        dp = self.dps[dpid]
        self.deliver(ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(
            dp, datapath_id=dpid, n_buffers=0, n_tables=254, auxiliary_id=0, capabilities=0)),
            CONFIG_DISPATCHER)
        self.state(dpid, MAIN_DISPATCHER)

    def state(self, dpid: int, state: str) -> None:
        ev = ofp_event.EventOFPStateChange(self.dps[dpid])
        ev.state = state
        self.deliver(ev, state)

    def link(self, a: int, a_port: int, b: int, b_port: int, up: bool) -> None:
        for (s, sp), (d, dport) in (((a, a_port), (b, b_port)), ((b, b_port), (a, a_port))):
            link = Link(Port(s, ofp, self.fabric.ports(s)[sp]), Port(d, ofp, self.fabric.ports(d)[dport]))
            self.deliver((topo_event.EventLinkAdd if up else topo_event.EventLinkDelete)(link), None)

    def port_status(self, dpid: int, port: int) -> None:
        dp = self.dps[dpid]
        self.deliver(ofp_event.EventOFPPortStatus(parser.OFPPortStatus(
            dp, ofp.OFPPR_MODIFY, self.fabric.ports(dpid)[port])))

    def flow_removed(self, dpid: int, entry: Any, reason: int = ofp.OFPRR_IDLE_TIMEOUT) -> None:
        """The switch reports an entry it removed (it idled out, or was deleted)."""
        self.deliver(ofp_event.EventOFPFlowRemoved(parser.OFPFlowRemoved(
            self.dps[dpid], cookie=entry.cookie, priority=entry.priority,
            reason=reason, table_id=entry.table_id, duration_sec=400,
            duration_nsec=0, idle_timeout=entry.idle_timeout, hard_timeout=0, packet_count=1,
            byte_count=64, match=parser.OFPMatch(**entry.match))))

    def packet_in(self, host: str, pkt: packet.Packet) -> None:
        h = H[host]
        pkt.serialize()
        dp = self.dps[h.dpid]
        self.deliver(ofp_event.EventOFPPacketIn(parser.OFPPacketIn(
            dp, buffer_id=ofp.OFP_NO_BUFFER, total_len=len(pkt.data), reason=ofp.OFPR_NO_MATCH,
            table_id=0, cookie=ofmsgs.COOKIE_TAG, match=parser.OFPMatch(in_port=h.port),
            data=bytes(pkt.data))))


def eth(src: str, dst: str, ethertype: int) -> packet.Packet:
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst, H[src].mac, ethertype))
    return pkt


def arp_request(src: str, dst: str) -> packet.Packet:
    pkt = eth(src, "ff:ff:ff:ff:ff:ff", 0x0806)
    pkt.add_protocol(arp.arp_ip(arp.ARP_REQUEST, H[src].mac, H[src].ip, "00:00:00:00:00:00", H[dst].ip))
    return pkt


def arp_reply_to_probe(src: str) -> packet.Packet:
    pkt = eth(src, PROBE_MAC, 0x0806)
    pkt.add_protocol(arp.arp_ip(arp.ARP_REPLY, H[src].mac, H[src].ip, PROBE_MAC, "0.0.0.0"))
    return pkt


def igmpv3_include(src: str, group: str, source: str) -> packet.Packet:
    pkt = eth(src, "01:00:5e:00:00:16", 0x0800)
    pkt.add_protocol(ipv4.ipv4(src=H[src].ip, dst="224.0.0.22", proto=2, ttl=1))
    pkt.add_protocol(igmp.igmpv3_report(records=[
        igmp.igmpv3_report_group(type_=igmp.MODE_IS_INCLUDE, address=group, srcs=[source])]))
    return pkt


def udp_to(src: str, dst: str) -> packet.Packet:
    pkt = eth(src, H[dst].mac, 0x0800)
    pkt.add_protocol(ipv4.ipv4(src=H[src].ip, dst=H[dst].ip, proto=17))
    pkt.add_protocol(udp.udp(src_port=5000, dst_port=5001))
    return pkt


def start(bench: Bench) -> None:
    """Every switch connects and is reconciled, every link discovered, every host heard."""
    for dpid in sorted(TOPO.switches):
        bench.connect(dpid)
    bench.settle()
    for k in TOPO.links:
        bench.link(k.a, k.a_port, k.b, k.b_port, True)
    for name in H:
        bench.packet_in(name, arp_request(name, "h1" if name != "h1" else "h2"))
    bench.settle()


def ours(fabric: FakeFabric, dpid: int) -> set:
    """The multicast flows and groups of ours a switch holds (base flows, the source
    table and unicast paths excluded)."""
    sw = fabric.switches[dpid]
    return ({f.key() for f in sw.flows if f.cookie & ofmsgs.COOKIE_MASK == ofmsgs.COOKIE_TAG
             and f.cookie not in (ofmsgs.COOKIE_TAG, ofmsgs.COOKIE_UNICAST, ofmsgs.COOKIE_SOURCE)}
            | set(sw.groups.items()))
