"""The Ryu app itself, driven like faucet's ``test_valveapp_smoke``: a real ``ModelcastApp``
whose handlers are registered and dispatched as Ryu does (event class and dispatcher
state), wired to fake datapaths that apply every message to the simulated fabric and
answer barriers, stats requests and errors with events. Every ``@set_ev_cls`` handler
runs, and each is checked by its effect on the fabric or the view."""

from __future__ import annotations

import gc
import inspect
import logging
import time
from collections import Counter
from typing import Any, Callable

import pytest
from ryu.app.wsgi import WSGIApplication
from ryu.controller import handler, ofp_event
from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER
from ryu.lib import hub
from ryu.lib.packet import arp, ethernet, igmp, ipv4, packet, udp
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser
from ryu.topology import event as topo_event
from ryu.topology.switches import Link, Port

import topologies as T
from controller import app as app_module
from controller import ofmsgs, settings
from controller.core import Plan
from controller.hosts import PROBE_MAC
from lab.fakeof import FakeFabric, OFError

TOPO = T.leaf_spine(2, 2, 2)  # spines 1, 2; leaf 3: h1 h2, leaf 4: h3 h4; leaf port i -> spine i
H = {h.name: h for h in TOPO.hosts}
HANDLERS = sorted(name for name, m in inspect.getmembers(app_module.ModelcastApp)
                  if hasattr(m, "callers"))


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
                self.reply(parser.OFPErrorMsg(self, type_=err.type, code=err.code, data=b""),
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


@pytest.fixture
def make_bench(monkeypatch):
    """Build an app (settings as ``modelcast-controller`` sets them) over a fabric; the
    app's install loop is killed afterwards."""
    threads: list[Any] = []
    spawn = hub.spawn

    def tracked(*args: Any, **kwargs: Any) -> Any:
        t = spawn(*args, **kwargs)
        threads.append(t)
        return t

    monkeypatch.setattr(hub, "spawn", tracked)

    def make(fabric: FakeFabric, state_file=None) -> Bench:
        monkeypatch.setattr(settings, "current", settings.Settings(
            token=None, state_file=state_file, algorithm="spt", barrier_timeout_s=2.0))
        return Bench(app_module.ModelcastApp(wsgi=WSGIApplication()), fabric)

    thresholds = gc.get_threshold()  # the app tunes the collector process-wide
    yield make
    for t in threads:
        hub.kill(t)
    gc.set_threshold(*thresholds)


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


def test_every_handler_runs_with_real_effects(make_bench, caplog):
    caplog.set_level(logging.INFO, logger="modelcast")
    fabric = FakeFabric(TOPO)
    for sw in fabric.switches.values():
        sw.reply_part_size = 1  # every read arrives as several OFPMPF_REPLY_MORE parts
    bench = make_bench(fabric)
    app, core, svc = bench.app, bench.app.core, bench.app.service

    # features -> base flows; MAIN -> our stats requests; replies -> reconciled
    bench.connect(3)
    dp3 = bench.dps[3]
    assert [f.cookie for f in fabric.switches[3].flows] == [ofmsgs.COOKIE_TAG] * 4
    assert [type(m) for m in dp3.sent_of(parser.OFPMultipartRequest)] == [
        parser.OFPFlowStatsRequest, parser.OFPGroupDescStatsRequest]
    bench.settle()
    assert 3 in core.installed and 3 in core.view.switches
    assert "switch 0x3 reconciled: held 0 of our groups, 0 messages to fix" in caplog.text

    start(bench)
    assert core.view.switches == set(TOPO.switches)
    assert len(core.view.links) == len(TOPO.links) and core.view.graph.number_of_edges() == 4
    assert {ip: (h.dpid, h.port, h.mac) for ip, h in core.view.hosts.items()} == {
        h.ip: (h.dpid, h.port, h.mac) for h in TOPO.hosts}
    assert f"host {H['h4'].ip} ({H['h4'].mac}) at switch 0x4 port {H['h4'].port}" in caplog.text

    # ARP broadcast: out of every edge port but the ingress, never over links
    for dp in bench.dps.values():
        dp.sent.clear()
    bench.packet_in("h1", arp_request("h1", "h3"))
    outs = {d: [(m.in_port, [a.port for a in m.actions]) for m in dp.sent_of(parser.OFPPacketOut)]
            for d, dp in bench.dps.items()}
    assert outs == {1: [], 2: [], 3: [(H["h1"].port, [H["h2"].port])],
                    4: [(ofp.OFPP_CONTROLLER, [H["h3"].port, H["h4"].port])]}

    # a group, as REST creates it: installed through the install loop and its barriers
    g, created = svc.create_group({"model": "smoke", "source": H["h1"].ip, "receivers": [H["h3"].ip]})
    bench.settle()
    assert created and svc.get_group(g["id"])["state"] == "installed"
    assert all(dp.sent_of(parser.OFPBarrierRequest) for d, dp in bench.dps.items()
               if d in core.groups[g["id"]].tree.parent)
    assert dict(fabric.trace(H["h1"].ip, g["address"]).delivered) == {H["h3"].ip: 1}

    # an IGMPv3 INCLUDE(h1) report from h4 makes it a receiver
    bench.packet_in("h4", igmpv3_include("h4", g["address"], H["h1"].ip))
    bench.settle()
    assert svc.get_group(g["id"])["receivers"] == {H["h3"].ip: "installed", H["h4"].ip: "installed"}
    assert dict(fabric.trace(H["h1"].ip, g["address"]).delivered) == {H["h3"].ip: 1, H["h4"].ip: 1}
    assert f"IGMP join: {H['h4'].ip} joined group {g['id']}" in caplog.text

    # a tree link fails: both ends report the port down, the tree moves to the other spine
    spine, leaf = next((p, c) for p, c in core.groups[g["id"]].tree.links() if c == 4)
    k = next(k for k in TOPO.links if {k.a, k.b} == {spine, leaf})
    fabric.set_link(spine, leaf, False)
    for dp in bench.dps.values():
        dp.sent.clear()
    bench.port_status(k.a, k.a_port)
    bench.port_status(k.b, k.b_port)
    bench.settle()
    assert {(k.a, k.a_port), (k.b, k.b_port)} <= core.view.ports_down
    assert spine not in core.groups[g["id"]].tree.parent
    tr = fabric.trace(H["h1"].ip, g["address"])
    assert dict(tr.delivered) == {H["h3"].ip: 1, H["h4"].ip: 1} and not tr.loops, tr.log
    assert all(any(m.cookie == ofmsgs.COOKIE_UNICAST and m.command == ofp.OFPFC_DELETE
                   for m in dp.sent_of(parser.OFPFlowMod)) for dp in bench.dps.values())
    # ... and LLDP then loses the link
    bench.link(k.a, k.a_port, k.b, k.b_port, False)
    assert not any({x.a, x.b} == {spine, leaf} for x in core.view.links)

    # unicast: the path to a known MAC is installed and the frame sent along it
    bench.packet_in("h1", udp_to("h1", "h3"))
    [out] = bench.dps[3].sent_of(parser.OFPPacketOut)[-1:]
    assert out.in_port == H["h1"].port and [a.port for a in out.actions] == [3 - spine]
    tr = fabric.trace(H["h1"].ip, H["h3"].ip)
    assert dict(tr.delivered) == {H["h3"].ip: 1} and not tr.to_controller, tr.log

    # h3 goes silent: its source entry idles out, the switch reports it, and the controller
    # probes h3 (a unicast ARP request out of its port); h3's answer re-learns it
    h3 = H["h3"]
    [idled] = [e for e in fabric.switches[4].expire_idle(ofmsgs.COOKIE_SOURCE)
               if e.match["eth_src"] == h3.mac]
    assert idled.idle_timeout == settings.current.host_timeout_s
    for dp in bench.dps.values():
        dp.sent.clear()
    bench.flow_removed(4, idled)
    [probe] = bench.dps[4].sent_of(parser.OFPPacketOut)
    asked = packet.Packet(probe.data)
    assert [a.port for a in probe.actions] == [h3.port]
    assert (asked.get_protocol(ethernet.ethernet).dst, asked.get_protocol(arp.arp).dst_ip) == (h3.mac, h3.ip)
    bench.packet_in("h3", arp_reply_to_probe("h3"))
    assert not any(dp.sent_of(parser.OFPPacketOut)[1:] for dp in bench.dps.values())  # not forwarded
    assert any(f.cookie == ofmsgs.COOKIE_SOURCE and f.match.get("eth_src") == h3.mac
               for f in fabric.switches[4].flows)
    assert svc.get_group(g["id"])["receivers"][h3.ip] == "installed"

    # someone deletes our group on leaf 4 by hand: the switch reports the (S,G) flow that
    # went with it, so leaf 4 is audited at the next timer step, and exactly that is put back
    before = ours(fabric, 4)
    [sg] = [f for f in fabric.switches[4].flows if f.cookie == ofmsgs.cookie(g["id"])]
    fabric.apply(4, ofmsgs.group_delete(4, g["id"]))
    assert ours(fabric, 4) != before
    bench.flow_removed(4, sg, ofp.OFPRR_GROUP_DELETE)
    app._start_audits(time.monotonic())  # what the timer loop does every 0.25 s
    bench.settle()
    assert ours(fabric, 4) == before
    assert svc.metrics.audits.labels(result="repaired")._value.get() == 1
    assert "switch 0x4 drifted from the intended state" in caplog.text
    # the periodic audits of the others (one interval after they were first seen) are clean
    now = time.monotonic()
    app._start_audits(now + settings.current.audit_interval_s)
    bench.settle()
    assert svc.metrics.audits.labels(result="clean")._value.get() >= len(TOPO.switches) - 1

    # a switch refuses a message: the OFPT_ERROR lands in the group's state
    fabric.apply(4, ofmsgs.group_add(4, 2, 1, frozenset({2})))  # id 2 taken on leaf 4
    g2, _ = svc.create_group({"model": "clash", "source": H["h2"].ip, "receivers": [H["h4"].ip]})
    bench.settle()
    assert g2["id"] == 2
    err = svc.get_group(2)
    assert err["state"] == "error" and "OpenFlow error type 6 code 0" in err["errors"][0], err

    # a role reply (several instances: controller.election) is what the switch says we are
    bench.dps[3].reply(parser.OFPRoleReply(bench.dps[3], ofp.OFPCR_ROLE_SLAVE, 7), 99)
    bench.settle()
    assert app.switch_roles[3] == ("slave", 7)
    assert "switch 0x3: our role is slave (generation 7)" in caplog.text

    # a switch disconnects: forgotten, its groups rerouted
    bench.state(spine, DEAD_DISPATCHER)
    bench.settle()
    assert spine not in core.view.switches and spine not in app.dps and spine not in core.installed
    assert f"switch {spine:#x} disconnected" in caplog.text

    assert HANDLERS and set(bench.calls) == set(HANDLERS), (
        f"handlers never run: {sorted(set(HANDLERS) - set(bench.calls))}")


def test_a_restarted_app_reconciles_and_leaves_healthy_switches_alone(make_bench, tmp_path):
    state = tmp_path / "state.json"
    fabric = FakeFabric(TOPO)
    first = make_bench(fabric, state)
    start(first)
    g, _ = first.app.service.create_group(
        {"model": "restart", "source": H["h1"].ip, "receivers": [H["h3"].ip, H["h4"].ip]})
    first.settle()
    held = {d: ours(fabric, d) for d in TOPO.switches}
    gid = g["id"]
    # while no controller runs, leaf 4 loses the group's entry (and with it the flow)
    fabric.apply(4, ofmsgs.group_delete(4, gid))
    assert ours(fabric, 4) != held[4]

    second = make_bench(fabric, state)  # same state file, switches keep their tables
    for dpid in sorted(TOPO.switches):
        second.connect(dpid)
    second.settle()
    assert {d: ours(fabric, d) for d in TOPO.switches} == held
    for d, dp in second.dps.items():  # (base flows and the known source table are re-asserted)
        fixes = [m for m in dp.sent if isinstance(m, parser.OFPGroupMod) or (
            isinstance(m, parser.OFPFlowMod) and m.cookie not in (ofmsgs.COOKIE_TAG, ofmsgs.COOKIE_SOURCE))]
        assert bool(fixes) == (d == 4), (d, fixes)
    assert dict(fabric.trace(H["h1"].ip, g["address"]).delivered) == {H["h3"].ip: 1, H["h4"].ip: 1}
    assert second.app.service.get_group(gid)["state"] == "installed"
