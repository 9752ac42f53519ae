"""Two real ``ModelcastApp`` instances over one simulated fabric and an in-memory etcd
(``tests.support.fake_etcd``), with switches that enforce OpenFlow 1.3 roles as OVS does:
a role request older than the newest generation is refused (OFPRRFC_STALE), a new
MASTER demotes the old one to SLAVE, and a SLAVE's flow-mods, group-mods and packet-outs
are refused (OFPBRC_IS_SLAVE). Asserted: one leader, the follower writes nothing and
mirrors the leader's groups; after the leader dies the follower takes over within the
lease, reads every switch and changes nothing on a healthy fabric, the deposed leader's
stale MASTER request is refused, and a group created after the failover installs."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from ryu.app.wsgi import WSGIApplication
from ryu.lib import hub
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller import app as app_module
from controller import ofmsgs, settings
from lab.fakeof import FakeFabric
from tests.support.fake_etcd import FakeEtcd
from tests.support.app_bench import TOPO, H, Bench, FakeDatapath, ours, start

WRITES = (parser.OFPFlowMod, parser.OFPGroupMod, parser.OFPPacketOut, parser.OFPPortMod)


class Roles:
    """Per switch, as OVS keeps it: each connection's role and the newest generation."""

    def __init__(self) -> None:
        self.role: dict[tuple[int, str], int] = {}
        self.generation: dict[int, int] = {}

    def masters(self, dpid: int) -> list[str]:
        return sorted(n for (d, n), r in self.role.items() if d == dpid and r == ofp.OFPCR_ROLE_MASTER)


class RoleDatapath(FakeDatapath):
    def __init__(self, bench: Bench, dpid: int, roles: Roles, name: str) -> None:
        super().__init__(bench, dpid)
        self.roles, self.name = roles, name

    def send_msg(self, msg: Any) -> None:
        role = self.roles.role.get((self.id, self.name), ofp.OFPCR_ROLE_EQUAL)
        if isinstance(msg, parser.OFPRoleRequest):
            if msg.xid is None:
                self.set_xid(msg)
            msg.serialize()
            self.sent.append(msg)
            seen = self.roles.generation.get(self.id)
            # OpenFlow 1.3 6.3.5: stale when (generation_id - cached) as signed 64 bits < 0
            if seen is not None and ((msg.generation_id - seen) & (1 << 63)):
                self.reply(parser.OFPErrorMsg(self, type_=ofp.OFPET_ROLE_REQUEST_FAILED,
                                              code=ofp.OFPRRFC_STALE, data=b""), msg.xid)
                return
            self.roles.generation[self.id] = msg.generation_id
            if msg.role == ofp.OFPCR_ROLE_MASTER:
                for (d, n), r in list(self.roles.role.items()):
                    if d == self.id and r == ofp.OFPCR_ROLE_MASTER:
                        self.roles.role[(d, n)] = ofp.OFPCR_ROLE_SLAVE
            self.roles.role[(self.id, self.name)] = msg.role
            self.reply(parser.OFPRoleReply(self, msg.role, msg.generation_id), msg.xid)
            return
        if role == ofp.OFPCR_ROLE_SLAVE and isinstance(msg, WRITES):
            if msg.xid is None:
                self.set_xid(msg)
            msg.serialize()
            self.sent.append(msg)
            self.reply(parser.OFPErrorMsg(self, type_=ofp.OFPET_BAD_REQUEST,
                                          code=ofp.OFPBRC_IS_SLAVE, data=b""), msg.xid)
            return
        super().send_msg(msg)


@pytest.fixture
def make_instance(monkeypatch):
    """Build one app instance named ``name`` over ``fabric`` on ``etcd``; ``kill(name)``
    stops its green threads (a SIGKILL: no resign, its lease runs out)."""
    threads: dict[str, list[Any]] = {}
    building: list[str] = []
    spawn = hub.spawn

    def tracked(*args: Any, **kwargs: Any) -> Any:
        t = spawn(*args, **kwargs)
        threads.setdefault(building[-1] if building else "", []).append(t)
        return t

    monkeypatch.setattr(hub, "spawn", tracked)

    def make(name: str, fabric: FakeFabric, etcd: FakeEtcd, roles: Roles) -> Bench:
        monkeypatch.setattr(settings, "current", settings.Settings(
            token=None, state_file=None, algorithm="spt", barrier_timeout_s=2.0,
            store_url="etcd://fake:2379", lease_ttl_s=2, advertise_url=f"http://{name}:8080",
            cluster_secret=b"s" * 32))
        monkeypatch.setattr(app_module, "open_store", lambda conf: etcd.client(name, set()))
        building.append(name)
        try:
            bench = Bench(app_module.ModelcastApp(wsgi=WSGIApplication()), fabric)
        finally:
            building.pop()
        bench.dps = {d: RoleDatapath(bench, d, roles, name) for d in fabric.switches}
        return bench

    def kill(name: str) -> None:
        for t in threads.pop(name, []):
            hub.kill(t)

    make.kill = kill  # type: ignore[attr-defined]
    yield make
    for ts in threads.values():
        for t in ts:
            hub.kill(t)


def until(pred: Any, timeout: float) -> float:
    """Run the hub until ``pred()``; the seconds it took (AssertionError on timeout)."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout} s")
        hub.sleep(0.02)
    return time.monotonic() - t0


def fixes(bench: Bench) -> list[Any]:
    """Table changes an instance sent beyond re-asserting base flows and the source table."""
    return [m for dp in bench.dps.values() for m in dp.sent
            if isinstance(m, parser.OFPGroupMod) or (isinstance(m, parser.OFPFlowMod) and m.cookie
                                                    not in (ofmsgs.COOKIE_TAG, ofmsgs.COOKIE_SOURCE))]


def test_follower_takes_over_without_touching_a_healthy_fabric(make_instance, caplog):
    caplog.set_level(logging.INFO, logger="modelcast")
    fabric, roles = FakeFabric(TOPO), Roles()
    etcd = FakeEtcd(clock=time.monotonic)
    a = make_instance("a", fabric, etcd, roles)
    b = make_instance("b", fabric, etcd, roles)
    for bench in (a, b):
        for dpid in sorted(TOPO.switches):
            bench.connect(dpid)
    until(lambda: a.app.leading != b.app.leading, 5)
    lead, follower = (a, b) if a.app.leading else (b, a)
    until(lambda: all(roles.masters(d) == [lead.dps[d].name] for d in TOPO.switches), 3)
    lead.settle()
    start(lead)  # links and hosts: the master gets the packet-ins
    g, _ = lead.app.service.create_group(
        {"model": "ha", "source": H["h1"].ip, "receivers": [H["h3"].ip, H["h4"].ip]})
    lead.settle()
    assert dict(fabric.trace(H["h1"].ip, g["address"]).delivered) == {H["h3"].ip: 1, H["h4"].ip: 1}
    # the follower mirrors the leader: same group, shown installed, and it wrote nothing
    until(lambda: g["id"] in follower.app.service.core.groups, 3)
    seen = follower.app.service.get_group(g["id"])
    assert seen["state"] == "installed" and seen["address"] == g["address"]
    assert seen["key"] == lead.app.service.get_group(g["id"])["key"]
    assert not [m for dp in follower.dps.values() for m in dp.sent if isinstance(m, WRITES)]
    held = {d: ours(fabric, d) for d in TOPO.switches}
    old_gen = lead.app.election.status.generation
    for dp in follower.dps.values():
        dp.sent.clear()

    make_instance.kill(lead.dps[3].name)  # SIGKILL: its lease runs out
    took = until(lambda: follower.app.leading, 8)
    assert took <= 5.0, took  # the lease TTL (2 s) and an election step; the bound of the lab test
    until(lambda: all(roles.masters(d) == [follower.dps[d].name] for d in TOPO.switches), 2)
    follower.settle()
    new_gen = follower.app.election.status.generation
    assert new_gen > old_gen
    # it read every switch and changed nothing: the trees stay exactly as they were
    assert all(any(isinstance(m, parser.OFPFlowStatsRequest) for m in dp.sent)
               for dp in follower.dps.values())
    assert fixes(follower) == []
    assert {d: ours(fabric, d) for d in TOPO.switches} == held
    assert follower.app.service.get_group(g["id"])["state"] == "installed"

    # the deposed leader's stale MASTER request is refused; the new master stays
    lead.dps[3].send_msg(ofmsgs.role_request(3, True, old_gen))
    lead.settle()
    assert "switch 0x3 refused our role request (code 0: stale" in caplog.text
    assert roles.masters(3) == [follower.dps[3].name]

    # a group created after the failover installs
    g2, created = follower.app.service.create_group(
        {"model": "after", "source": H["h2"].ip, "receivers": [H["h4"].ip]})
    follower.settle()
    assert created and follower.app.service.get_group(g2["id"])["state"] == "installed"
    assert dict(fabric.trace(H["h2"].ip, g2["address"]).delivered) == {H["h4"].ip: 1}
    assert dict(fabric.trace(H["h1"].ip, g["address"]).delivered) == {H["h3"].ip: 1, H["h4"].ip: 1}
    print(f"\nin-process failover: the follower led {took:.2f} s after the leader's threads "
          f"were killed (lease TTL 2 s); generation {old_gen} -> {new_gen}; 0 table changes")
