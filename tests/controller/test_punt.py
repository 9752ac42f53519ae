"""One host port flooding the controller is put on a meter of its own (controller.punt),
so the other hosts of its switch are still learned and its links still found."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st
from ryu.ofproto import ofproto_v1_3 as ofp

import topologies as T
from controller import ofmsgs
from controller.core import MulticastCore
from controller.punt import QUARANTINE_S, RELAPSE, PuntGuard
from controller.reconnect import Reconnect
from controller.topoview import TopologyView
from lab.fakeof import FakeFabric

TOPO = T.leaf_spine(2, 3, 2)  # spines 1, 2; leaves 3, 4, 5; h1 h2 @3 (ports 3, 4), h3 h4 @4, h5 h6 @5


def test_a_port_over_its_limit_in_one_second_is_quarantined_once():
    guard = PuntGuard(limit=10)
    assert not any(guard.note(3, 4, 0.01 * i) for i in range(10))  # 10 in 0.1 s: at the limit
    assert guard.note(3, 4, 0.2)  # the 11th within the second
    assert guard.quarantined == 1
    # held: its frames now pass the quarantine meter (at most ~3x the limit in a second)
    assert not any(guard.note(3, 4, 0.3 + 0.01 * i) for i in range(3 * 10))
    assert not guard.note(3, 5, 0.4)  # another port has its own count
    assert not any(guard.note(4, 4, 0.5) for _ in range(10))  # and another switch


def test_the_window_is_one_second_and_a_slow_port_is_never_quarantined():
    guard = PuntGuard(limit=5)
    # 5 frames every second for a minute: never more than the limit in a window
    assert not any(guard.note(3, 4, s + 0.1 * i) for s in range(60) for i in range(5))
    assert guard.quarantined == 0


def test_a_held_port_that_floods_again_lost_its_entries_and_is_quarantined_again():
    """Many more frames than the quarantine meter passes: the switch restarted or someone
    deleted the entries. And after the hold the port is judged afresh."""
    guard = PuntGuard(limit=10, hold_s=30)
    assert any(guard.note(3, 4, 0.0) for _ in range(11))
    frames = [guard.note(3, 4, 1.5) for _ in range(RELAPSE * 10 + 1)]
    assert frames[-1] and not any(frames[:-1])
    assert guard.quarantined == 2
    assert not any(guard.note(3, 4, 20.0) for _ in range(RELAPSE * 10))  # held, within the meter
    assert any(guard.note(3, 4, 40.0) for _ in range(11))  # hold over, still flooding
    assert guard.quarantined == 3


def test_a_switch_that_reconnects_holds_no_quarantine_and_state_stays_bounded():
    guard = PuntGuard(limit=3)
    assert any(guard.note(3, 4, 0.0) for _ in range(4))
    guard.forget(3)  # (its tables were emptied: the next flood is judged at once)
    assert any(guard.note(3, 4, 0.1) for _ in range(4))
    for port in range(1000):
        guard.note(5, port, 1.0)
    guard.expire(3.5)
    assert not guard._window
    guard.expire(QUARANTINE_S + 1.0)
    assert not guard._held


def test_limit_zero_never_quarantines():
    guard = PuntGuard(limit=0)
    assert not any(guard.note(3, 4, 0.0) for _ in range(100_000))


@given(st.lists(st.floats(0, 20, allow_nan=False), max_size=300), st.integers(1, 20))
def test_quarantine_follows_the_rate_in_any_one_second(times, limit):
    """Never for a port that sends at most ``limit`` frames in every interval of one
    second; always (by then) for one that sent more than twice that within one second."""
    times = sorted(times)
    guard = PuntGuard(limit)
    verdicts = [guard.note(3, 4, t) for t in times]

    def most_in_a_second(upto: int) -> int:
        return max((sum(1 for u in times[:upto + 1] if t <= u < t + 1.0) for t in times[:upto + 1]), default=0)

    for i in range(len(times)):
        if most_in_a_second(i) <= limit:
            assert not any(verdicts[:i + 1])
        if most_in_a_second(i) > 2 * limit:
            assert any(verdicts[:i + 1])


def _switch(port_rate: int = 50) -> tuple[MulticastCore, FakeFabric]:
    core = MulticastCore(TopologyView.from_topology(TOPO))
    fabric = FakeFabric(TOPO)
    for dpid in TOPO.switches:
        assert not fabric.apply_all((dpid, m) for m in Reconnect(core, punt_port_rate=port_rate).features(dpid))
        assert not fabric.apply_all(core.switch_enter(dpid))
    return core, fabric


def test_a_quarantined_port_punts_through_its_own_meter_and_the_others_keep_theirs():
    """h2's port (leaf 3, port 4) quarantined: everything it sends the controller --
    unknown sources, unknown destinations, membership reports, discovery frames --
    passes QUARANTINE_METER; h1 on the same switch and the switch's links still go
    through the switch's own meters; what the tables forward for h2 is unchanged."""
    core, fabric = _switch()
    h1, h2 = TOPO.host("h1"), TOPO.host("h2")
    msgs = ofmsgs.quarantine_flows(3, h2.port, 50, QUARANTINE_S)
    errors = fabric.apply_all((3, m) for m in msgs)
    assert [(e.type, e.code) for e in errors] == [(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_METER_EXISTS)]
    assert all(ofmsgs.benign_error(e.type, e.code, e.meter_id) for e in errors)  # (the app ignores it)
    flows = [m for m in msgs if hasattr(m, "match")]
    assert {m.hard_timeout for m in flows} == {QUARANTINE_S} and {m.idle_timeout for m in flows} == {0}

    def via(src: str, dst: str, **kw) -> list:
        tr = fabric.trace(src, dst, **kw)
        assert len(tr.punted) == 1, tr.log
        return tr.punt_meters

    lldp = {"eth_type": ofmsgs.ETH_LLDP, "eth_dst": ofmsgs.LLDP_DST}
    # unknown destination (table 1), a membership report, a discovery frame: h2 on its
    # own meter, h1 on the switch's
    for src, meter, lldp_meter in ((h2.ip, ofmsgs.QUARANTINE_METER, ofmsgs.QUARANTINE_METER),
                                   (h1.ip, ofmsgs.PUNT_METER, ofmsgs.LLDP_METER)):
        assert via(src, "10.9.9.9") == [meter]
        assert via(src, "224.0.0.22", ip_proto=2) == [meter]
        assert via(src, "0.0.0.0", **lldp) == [lldp_meter]
    # an unknown source on h2's port (table 0 miss): its own meter too
    fabric.hosts[h2.ip] = dataclasses.replace(h2, mac="02:aa:bb:cc:dd:ee")
    assert via(h2.ip, "10.9.9.9") == [ofmsgs.QUARANTINE_METER]
    fabric.hosts[h2.ip] = h2
    # a group from h2 still reaches its receiver, unpunted
    group, plan = core.create_group("m", h2.ip, ["10.0.0.3"])
    assert not fabric.apply_all(plan)
    tr = fabric.trace(h2.ip, group.address)
    assert dict(tr.delivered) == {"10.0.0.3": 1} and not tr.punted, tr.log


def test_the_audit_leaves_a_quarantine_alone():
    """Quarantine entries expire by themselves; the audit neither deletes them nor
    counts anything missing."""
    core, fabric = _switch()
    fabric.apply_all((3, m) for m in ofmsgs.quarantine_flows(3, 4, 50, QUARANTINE_S))
    before = sorted(map(repr, fabric.switches[3].flows))
    done, errors = fabric.audit(3, Reconnect(core, punt_port_rate=50))
    assert done is not None and not errors and not len(done.plan), (errors, done)
    assert sorted(map(repr, fabric.switches[3].flows)) == before
