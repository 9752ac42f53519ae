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
from typing import Any

import pytest
from ryu.app.wsgi import WSGIApplication
from ryu.controller.handler import DEAD_DISPATCHER
from ryu.lib import hub
from ryu.lib.packet import arp, ethernet, packet
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller import app as app_module
from controller import ofmsgs, settings
from lab.fakeof import FakeFabric
from tests.support.app_bench import (TOPO, H, Bench, arp_reply_to_probe, arp_request,
                                     igmpv3_include, ours, start, udp_to)
from tests.support.controller_env import assert_exact
from tests.support.fabric_checks import nicira_actions

HANDLERS = sorted(name for name, m in inspect.getmembers(app_module.ModelcastApp)
                  if hasattr(m, "callers"))


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

    def make(fake: FakeFabric, state_file=None, **more: Any) -> Bench:
        monkeypatch.setattr(settings, "current", settings.Settings(
            token=None, state_file=state_file, algorithm="spt", barrier_timeout_s=2.0, **more))
        return Bench(app_module.ModelcastApp(wsgi=WSGIApplication()), fake)

    thresholds = gc.get_threshold()  # the app tunes the collector process-wide
    yield make
    for t in threads:
        hub.kill(t)
    gc.set_threshold(*thresholds)



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
    assert [f.cookie for f in fabric.switches[3].flows] == [ofmsgs.COOKIE_TAG] * len(ofmsgs.base_flows(3))
    assert set(fabric.switches[3].meters) == set(ofmsgs.METERS)  # (the app's default --punt-rate)
    assert [type(m) for m in dp3.sent_of(parser.OFPMultipartRequest)] == [
        parser.OFPDescStatsRequest, parser.OFPGroupFeaturesStatsRequest, parser.OFPMeterFeaturesStatsRequest,
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

    # a trace reads the switches' counters: between two traces, every hop to every
    # receiver counted the 3 packets sent, on its (S,G) flow, its group and the bucket
    # towards that receiver
    app.counters.ttl_s = 0  # (no cached reading: each trace asks the switches)

    def counts() -> dict[str, list[dict[str, int]]]:
        traced = svc.trace(g["id"], None, app.counters.read)
        assert all(r["state"] == "installed" and r["why"] is None for r in traced["receivers"])
        assert all(r["hops"][0]["dpid"] == H["h1"].dpid and r["hops"][-1]["next"] == r["ip"]
                   for r in traced["receivers"])
        return {r["ip"]: [{k: h["counters"][k]["packets"] for k in ("flow", "group", "bucket")}
                          for h in r["hops"]] for r in traced["receivers"]}

    before = counts()
    for _ in range(3):
        fabric.trace(H["h1"].ip, g["address"])
    after = counts()
    assert sorted(after) == [H["h3"].ip, H["h4"].ip]
    assert {ip: [{k: h[k] - b[k] for k in h} for h, b in zip(hops, before[ip])] for ip, hops in after.items()} \
        == {ip: [{"flow": 3, "group": 3, "bucket": 3}] * len(hops) for ip, hops in after.items()}
    assert sum(isinstance(m, parser.OFPGroupStatsRequest) for dp in bench.dps.values()
               for m in dp.sent_of(parser.OFPMultipartRequest)) == 2 * len(core.groups[g["id"]].tree.parent)

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


def _bypassed_alone(fabric: FakeFabric, source: str, address: str, want: dict[str, int]) -> None:
    """Each link of the fabric fails in turn, the controller hears nothing: the switches
    alone still deliver one copy to each receiver."""
    for k in TOPO.links:
        fabric.set_link(k.a, k.b, False)
        try:
            tr = fabric.trace(source, address)
            assert dict(tr.delivered) == want and not tr.loops and not tr.to_controller, (k, tr.log)
        finally:
            fabric.set_link(k.a, k.b, True)


def test_a_switch_that_is_not_open_vswitch_gets_no_nicira_action(make_bench, caplog):
    """Spine 2 describes itself as another vendor's switch (OFPMP_DESC) and would refuse
    Open vSwitch's Nicira actions: as it connects, detours turn plain OpenFlow 1.3 on every
    switch, before any is sent; no switch refuses anything, and every link failure is
    still bypassed by the switches alone."""
    fabric = FakeFabric(TOPO, plain=[2])
    bench = make_bench(fabric)
    with caplog.at_level(logging.WARNING, logger="modelcast.app"):
        start(bench)
    assert not bench.app.core.nicira
    assert any("switch 0x2 is not Open vSwitch ('Example Networks'" in r.getMessage() for r in caplog.records)
    g, _ = bench.app.service.create_group(
        {"model": "plain", "source": H["h1"].ip, "receivers": [H["h3"].ip, H["h4"].ip]})
    bench.settle()
    assert bench.app.service.get_group(g["id"])["state"] == "installed"
    assert not nicira_actions(fabric)
    assert not [m for dp in bench.dps.values() for m in dp.sent if isinstance(m, parser.OFPErrorMsg)]
    assert bench.calls["_error"] == 0
    _bypassed_alone(fabric, H["h1"].ip, g["address"], {H["h3"].ip: 1, H["h4"].ip: 1})


def test_a_switch_refusing_nicira_actions_turns_detours_plain(make_bench, caplog):
    """Every switch claims to be Open vSwitch but refuses its Nicira actions: the trees go
    up with them, the refusals (OFPET_BAD_ACTION, bad experimenter) come back, and the
    controller moves every detour to plain OpenFlow 1.3; afterwards the switches hold
    exactly that and every link failure is bypassed by the switches alone."""
    fabric = FakeFabric(TOPO, plain=TOPO.switches)
    for sw in fabric.switches.values():
        sw.PLAIN_DESC = sw.OVS_DESC  # (lies)
    bench = make_bench(fabric)
    start(bench)
    assert bench.app.core.nicira
    with caplog.at_level(logging.WARNING, logger="modelcast.app"):
        g, _ = bench.app.service.create_group(
            {"model": "liar", "source": H["h1"].ip, "receivers": [H["h3"].ip, H["h4"].ip]})
        bench.settle()
    assert bench.calls["_error"] > 0 and not bench.app.core.nicira
    assert any("refused an experimenter action" in r.getMessage() and "plain OpenFlow 1.3" in r.getMessage()
               for r in caplog.records)
    bench.settle()
    assert not nicira_actions(fabric)
    assert_exact(bench.app.core, fabric)
    assert bench.app.service.get_group(g["id"])["state"] == "installed"
    _bypassed_alone(fabric, H["h1"].ip, g["address"], {H["h3"].ip: 1, H["h4"].ip: 1})


@pytest.mark.parametrize("reported", [True, False], ids=["group-features", "refusal"])
def test_a_switch_without_fast_failover_groups_protects_none_of_its_links(make_bench, caplog, reported):
    """Spine 1 has no OFPGT_FF groups (optional in OpenFlow 1.3). Its group features say
    so as it connects, or (``refusal``) it leaves their types out and refuses the first
    tree's FF group: then the controller stops protecting its links and audits it, and the
    switch ends up holding exactly the trees' entries. Either way it holds no FF group,
    the other switches still protect their links, and every receiver gets one copy."""
    fabric = FakeFabric(TOPO, no_ff=[1])
    fabric.switches[1].reports_group_types = reported
    bench = make_bench(fabric)
    with caplog.at_level(logging.WARNING, logger="modelcast.app"):
        start(bench)
        assert bench.app.core.no_ff == ({1} if reported else set())
        g, _ = bench.app.service.create_group(
            {"model": "noff", "source": H["h1"].ip, "receivers": [H["h3"].ip, H["h4"].ip]})
        bench.settle()
        deadline = time.monotonic() + 10
        while g["id"] not in fabric.switches[1].groups and time.monotonic() < deadline:
            hub.sleep(0.05)  # (after a refusal: the audit the app's timer loop starts)
        bench.settle()
    assert bench.app.core.no_ff == {1}
    why = "has no fast-failover groups (its group features)" if reported else "refused a fast-failover group"
    assert any(f"switch 0x1 {why}" in r.getMessage() and "not protected" in r.getMessage() for r in caplog.records)
    assert (bench.calls["_error"] == 0) == reported  # (known from its features: nothing refused)
    assert not [gid for gid in fabric.switches[1].groups if gid >= 0x80000000]
    assert any(gid >= 0x80000000 for d in (3, 4) for gid in fabric.switches[d].groups)
    assert_exact(bench.app.core, fabric)
    assert dict(fabric.trace(H["h1"].ip, g["address"]).delivered) == {H["h3"].ip: 1, H["h4"].ip: 1}
    assert bench.app.service.get_group(g["id"])["state"] == "installed"


def test_a_switch_without_meters_still_sends_the_controller_its_frames(make_bench, caplog):
    """Leaf 3 has no meters (optional in OpenFlow 1.3) and refuses the punt meters sent as
    it connects and the flows using them: it ends up holding every base flow, unmetered,
    so its hosts are learned and its links found; the refusals are one error and a
    warning saying what changed, and nothing more is refused (an audit finds it whole); a
    host flooding the controller from it is reported, not quarantined. Replaced by a
    switch with meters (its meter features say so), it gets its metered flows back."""
    fabric = FakeFabric(TOPO, no_meters=[3])
    bench = make_bench(fabric)
    with caplog.at_level(logging.WARNING, logger="modelcast.app"):
        start(bench)
    assert bench.app.reconnect.unmetered == {3}
    assert [r.getMessage() for r in caplog.records if "switch 0x3" in r.getMessage()] == [
        "switch 0x3: OpenFlow error type 12 code 10 (xid 1)",
        "switch 0x3 refused our punt meters or a flow using them: its frames to the controller are not "
        "rate-limited (as with --punt-rate 0 for it)"]
    base = {(m.table_id, m.priority) for m in ofmsgs.base_flows(3, False)}

    def held(dpid: int) -> dict:
        return {(f.table_id, f.priority): f for f in fabric.switches[dpid].flows if f.cookie == ofmsgs.COOKIE_TAG}

    assert set(held(3)) == base and not any(k == "meter" for f in held(3).values() for k, _ in f.instructions)
    assert set(held(4)) == base and set(fabric.switches[4].meters) == set(ofmsgs.METERS)  # (the others: metered)
    assert bench.app.core.view.hosts.keys() >= {H["h1"].ip, H["h2"].ip}  # (learned from leaf 3's punts)
    errors, reads = bench.calls["_error"], bench.calls["_stats_reply"]
    bench.app.audits.soon(3)
    hub.sleep(0.5)  # (the app's timer loop starts the audit)
    bench.settle()
    assert bench.calls["_stats_reply"] > reads and bench.calls["_error"] == errors  # (nothing refused any more)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="modelcast.app"):
        for _ in range(bench.app.punt_guard.limit + 1):
            bench.packet_in("h2", udp_to("h2", "h3"))
    assert "switch 0x3 port 4 sent the controller more than" in caplog.text and "no meters" in caplog.text
    assert not [f for f in fabric.switches[3].flows if f.cookie == ofmsgs.COOKIE_QUARANTINE]

    sw = fabric.switches[3]  # replaced by one with meters
    sw.has_meters, sw.max_meter = True, 65536
    bench.state(3, DEAD_DISPATCHER)
    bench.connect(3)
    bench.settle()
    assert bench.app.reconnect.unmetered == set()
    assert set(sw.meters) == set(ofmsgs.METERS)
    assert set(held(3)) == base and {v for f in held(3).values() for k, v in f.instructions if k == "meter"} == {
        ofmsgs.PUNT_METER, ofmsgs.LLDP_METER}


def _relay(bench: Bench, a: str, b: str) -> None:
    """Hosts ``a`` and ``b`` relay the (genuine, signed) discovery frames their switch
    ports send them to each other: Ryu reports a link between their two ports."""
    bench.link(H[a].dpid, H[a].port, H[b].dpid, H[b].port, True)


def test_discovery_frames_relayed_between_two_known_hosts_make_no_link(make_bench, caplog):
    """Before, the relay made a one-hop link between leaves 3 and 4 through h1 and h3,
    forgot both hosts and moved the group's tree onto it."""
    fabric = FakeFabric(TOPO)
    bench = make_bench(fabric)
    start(bench)
    g, _ = bench.app.service.create_group(
        {"model": "relay", "source": H["h2"].ip, "receivers": [H["h3"].ip, H["h4"].ip]})
    bench.settle()
    view = bench.app.core.view
    before = (set(view.links), dict(view.hosts), bench.app.service.get_group(g["id"])["tree"])
    with caplog.at_level(logging.WARNING, logger="modelcast.app"):
        _relay(bench, "h1", "h3")
        bench.settle()
    assert (set(view.links), dict(view.hosts), bench.app.service.get_group(g["id"])["tree"]) == before
    assert bench.app.service.get_group(g["id"])["state"] == "installed"
    assert dict(fabric.trace(H["h2"].ip, g["address"]).delivered) == {H["h3"].ip: 1, H["h4"].ip: 1}
    said = [r.getMessage() for r in caplog.records if "not believed" in r.getMessage()]
    assert len(said) == 2 and H["h1"].ip in said[0] and H["h3"].ip in said[0], said  # (each direction)
    assert bench.app.service.metrics.registry.get_sample_value(
        "modelcast_links_refused_total", {"why": "host ports"}) == 2
    fab = bench.app.service.health()["fabric"]
    assert fab["pinned"] is False and fab["refused_total"] == 2 and len(fab["refused"]) == 1


def test_a_pinned_fabric_refuses_a_relay_between_silent_hosts_also_from_saved_state(make_bench, tmp_path, caplog):
    """h2 and h4 never sent a frame of their own, so no host is attached at their ports:
    without --fabric the relayed link is believed (the documented limit of the default
    rule), and saved; with the fabric pinned it is refused, and dropped from the saved
    state at start. The pinned fabric's hosts are known from the start and not moved by
    a frame claiming one's address."""
    state = tmp_path / "state.json"
    fabric = FakeFabric(TOPO)
    loose = make_bench(fabric, state)
    for dpid in sorted(TOPO.switches):
        loose.connect(dpid)
    loose.settle()
    for k in TOPO.links:
        loose.link(k.a, k.a_port, k.b, k.b_port, True)
    for name in ("h1", "h3"):
        loose.packet_in(name, arp_request(name, "h1" if name != "h1" else "h3"))
    loose.settle()
    _relay(loose, "h2", "h4")
    loose.settle()
    wormhole = (H["h2"].dpid, H["h2"].port, H["h4"].dpid, H["h4"].port)
    assert len(loose.app.core.view.links) == len(TOPO.links) + 1
    assert loose.app.service.save()

    with caplog.at_level(logging.WARNING):
        pinned = make_bench(fabric, state, fabric=TOPO)
    view = pinned.app.core.view
    assert len(view.links) == len(TOPO.links)  # the saved relay link was not restored
    assert any("not a link of the pinned fabric (--fabric): not restored" in r.getMessage()
               for r in caplog.records)
    for dpid in sorted(TOPO.switches):
        pinned.connect(dpid)
    pinned.settle()
    for k in TOPO.links:
        pinned.link(k.a, k.a_port, k.b, k.b_port, True)
    pinned.settle()
    _relay(pinned, "h2", "h4")
    pinned.settle()
    assert len(view.links) == len(TOPO.links)
    fab = pinned.app.service.health()["fabric"]
    assert fab["pinned"] is True and fab["missing_links"] == [] and fab["refused_total"] == 2
    assert fab["refused"][0]["why"].startswith("not a link of the pinned fabric")
    assert (fab["refused"][0]["a"], fab["refused"][0]["b"]) == (wormhole[0], wormhole[2])
    # the fabric's hosts are pinned: h4 never sent a frame, and is installed at once; a
    # frame from h2's port claiming h4's address is dropped, and moves nothing
    assert fab["pinned_hosts"] == len(TOPO.hosts) and H["h4"].ip in view.hosts
    g, _ = pinned.app.service.create_group(
        {"model": "pinned", "source": H["h1"].ip, "receivers": [H["h3"].ip, H["h4"].ip]})
    pinned.settle()
    assert pinned.app.service.get_group(g["id"])["state"] == "installed"
    want = {H["h3"].ip: 1, H["h4"].ip: 1}
    assert dict(fabric.trace(H["h1"].ip, g["address"]).delivered) == want
    spoof = packet.Packet()
    spoof.add_protocol(ethernet.ethernet("ff:ff:ff:ff:ff:ff", H["h2"].mac, 0x0806))
    spoof.add_protocol(arp.arp_ip(arp.ARP_REQUEST, H["h2"].mac, H["h4"].ip, "00:00:00:00:00:00", H["h1"].ip))
    with caplog.at_level(logging.WARNING, logger="modelcast.app"):
        for _ in range(3):
            pinned.packet_in("h2", spoof)
        pinned.settle()
    assert (view.hosts[H["h4"].ip].dpid, view.hosts[H["h4"].ip].port) == (H["h4"].dpid, H["h4"].port)
    assert dict(fabric.trace(H["h1"].ip, g["address"]).delivered) == want
    said = [r.getMessage() for r in caplog.records if f"claims host {H['h4'].ip}" in r.getMessage()]
    assert len(said) == 1 and "--fabric pins it" in said[0], said  # (once a minute, not per frame)


def test_a_declared_host_keeps_its_address_against_a_claim_also_after_a_restart(make_bench, tmp_path, caplog):
    """Without --fabric: h4 declared over REST; h2 sending frames that claim h4's address
    moves nothing and is logged once, and an app restarted on the same state file still
    refuses the claim (the declaration is saved and wired into discovery again)."""
    state = tmp_path / "state.json"
    fabric = FakeFabric(TOPO)
    h4 = H["h4"]
    spoof = packet.Packet()
    spoof.add_protocol(ethernet.ethernet("ff:ff:ff:ff:ff:ff", H["h2"].mac, 0x0806))
    spoof.add_protocol(arp.arp_ip(arp.ARP_REQUEST, H["h2"].mac, h4.ip, "00:00:00:00:00:00", H["h1"].ip))
    for attempt in ("first", "restarted"):
        bench = make_bench(fabric, state)
        start(bench)
        if attempt == "first":
            bench.app.service.declare_host(h4.ip, h4.mac, h4.dpid, h4.port)
        g, _ = bench.app.service.create_group(
            {"model": "declared", "source": H["h1"].ip, "receivers": [H["h3"].ip, h4.ip]})
        bench.settle()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="modelcast.app"):
            for _ in range(3):
                bench.packet_in("h2", spoof)
            bench.settle()
            for _ in range(12):  # timer steps (the holder of a contested address would be probed)
                bench.app._discovery_tick()
        view = bench.app.core.view
        assert (view.hosts[h4.ip].dpid, view.hosts[h4.ip].port, view.hosts[h4.ip].mac) == (
            h4.dpid, h4.port, h4.mac), attempt
        want = {H["h3"].ip: 1, h4.ip: 1}
        assert dict(fabric.trace(H["h1"].ip, g["address"]).delivered) == want, attempt
        said = [r.getMessage() for r in caplog.records if f"claims host {h4.ip}" in r.getMessage()]
        assert len(said) == 1 and "declared over REST" in said[0], (attempt, said)
        assert bench.app.service.save()


def test_a_link_found_where_one_host_was_is_believed_and_the_host_named(make_bench, caplog):
    """A host learned on a switch port before the link behind it was discovered (a start-up
    race) is one end only: the link is believed, the host forgotten, and the warning says
    which host and what to do if that port is not cabled to a switch."""
    fabric = FakeFabric(TOPO)
    bench = make_bench(fabric)
    for dpid in sorted(TOPO.switches):
        bench.connect(dpid)
    bench.settle()
    for k in TOPO.links:
        bench.link(k.a, k.a_port, k.b, k.b_port, True)
    bench.packet_in("h1", arp_request("h1", "h3"))
    bench.settle()
    with caplog.at_level(logging.WARNING, logger="modelcast.app"):
        _relay(bench, "h1", "h4")  # h4 silent
        bench.settle()
    view = bench.app.core.view
    assert len(view.links) == len(TOPO.links) + 1 and H["h1"].ip not in view.hosts
    said = [r.getMessage() for r in caplog.records if "discovered where host" in r.getMessage()]
    assert said and H["h1"].ip in said[0] and "--fabric" in said[0], said
    assert bench.app.service.health()["fabric"]["refused_total"] == 0


def test_trace_file_shows_a_plan_in_the_order_it_reached_the_switches(make_bench, tmp_path, monkeypatch):
    """``--trace FILE``: each plan, its messages phase by phase (decoded) and each
    switch's barrier confirmation, in the order they happened."""
    from controller import tracing

    monkeypatch.setattr(tracing, "_FILE", None)  # (one trace file per process: this test's)
    path = tmp_path / "trace.txt"
    bench = make_bench(FakeFabric(TOPO), trace_file=path)
    start(bench)
    g, _ = bench.app.service.create_group(
        {"model": "traced", "source": H["h1"].ip, "receivers": [H["h3"].ip]})
    bench.settle()
    tracing._FILE.flush()
    lines = [line.split(" ", 1)[1] for line in path.read_text().splitlines()]
    assert "link-add s1:1 s3:1" in lines  # (topology events too)
    after = lines[max(i for i, line in enumerate(lines) if line.startswith("link-add")) + 1:]
    on_leaf4 = f"send phase 0 s4 group-add all {g['id']:#x} [w-:('pop_vlan',),('output', {H['h3'].port})]"
    assert on_leaf4 in after, after
    assert after.index("barrier s4 confirmed") > after.index(on_leaf4)


def test_the_app_stays_a_shim_and_high_availability_stays_pure() -> None:
    """The Ryu app is events in, calls into pure modules, messages out: it stays small,
    and the HA logic it calls (``controller.ha``) runs without Ryu or eventlet, so its
    tests step time by hand."""
    import ast
    from pathlib import Path

    import controller.app
    import controller.ha

    app = Path(controller.app.__file__).read_text()
    assert len(app.splitlines()) <= 450
    classes = [n for n in ast.walk(ast.parse(app)) if isinstance(n, ast.ClassDef)]
    assert classes and all(c.end_lineno - c.lineno + 1 <= 600 for c in classes)
    tree = ast.parse(Path(controller.ha.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported and not {m for m in imported if m.split(".")[0] in ("ryu", "eventlet")}
