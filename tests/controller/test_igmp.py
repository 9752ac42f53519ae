"""IGMP snooping decisions (controller.igmp), from real IGMP frames parsed by ryu."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from ryu.lib.packet import ethernet, igmp, ipv4, packet

from controller.core import Group
import pytest

from controller.igmp import ANY, IgmpPolicy, Statement, decide, parse_allow, statements
from controller.topoview import HostLoc

HOST, OTHER = "10.0.0.4", "10.0.0.5"
S1, S2 = "10.0.0.1", "10.0.0.2"
G, G2 = "232.1.1.1", "232.9.9.9"


def frame(*messages: igmp.igmp) -> list:
    """The protocols ryu parses out of an IGMP frame carrying ``message`` (one per frame,
    as on the wire; several messages give several frames' protocols concatenated)."""
    out = []
    for msg in messages:
        pkt = packet.Packet()
        pkt.add_protocol(ethernet.ethernet("01:00:5e:00:00:16", "00:00:00:00:00:04", 0x0800))
        pkt.add_protocol(ipv4.ipv4(src=HOST, dst="224.0.0.22", proto=2, ttl=1))
        pkt.add_protocol(msg)
        pkt.serialize()
        out += packet.Packet(bytes(pkt.data)).protocols
    return out


def v3(*records: tuple[int, str, list[str]]) -> igmp.igmpv3_report:
    return igmp.igmpv3_report(records=[igmp.igmpv3_report_group(type_=t, address=a, srcs=s)
                                       for t, a, s in records])


def groups(*defs: tuple[int, str, str, set[str]]) -> dict[int, Group]:
    return {gid: Group(gid, f"m{gid}", src, addr, 5500, "spt", set(rcv))
            for gid, src, addr, rcv in defs}


def outcome(protocols: list, gs: dict[int, Group], host: str = HOST) -> list[tuple]:
    return [(d.group.gid if d.group else None, d.join) for d in decide(host, statements(protocols), gs)]


BOTH = groups((1, S1, G, set()), (2, S2, G, set()), (3, S1, G2, set()))


def test_v3_include_joins_only_the_named_source():
    assert outcome(frame(v3((igmp.MODE_IS_INCLUDE, G, [S1]))), BOTH) == [(1, True)]
    assert outcome(frame(v3((igmp.CHANGE_TO_INCLUDE_MODE, G, [S2]))), BOTH) == [(2, True)]
    assert outcome(frame(v3((igmp.ALLOW_NEW_SOURCES, G, [S1, S2]))), BOTH) == [(1, True), (2, True)]


def test_v3_block_leaves_only_a_receiver_and_only_that_source():
    gs = groups((1, S1, G, {HOST}), (2, S2, G, {HOST}))
    assert outcome(frame(v3((igmp.BLOCK_OLD_SOURCES, G, [S1]))), gs) == [(1, False)]
    assert outcome(frame(v3((igmp.BLOCK_OLD_SOURCES, G, [S1]))), BOTH) == []  # not a receiver


def test_v3_empty_include_leaves_every_group_on_the_address():
    gs = groups((1, S1, G, {HOST}), (2, S2, G, {HOST}), (3, S1, G2, {HOST}))
    for rtype in (igmp.MODE_IS_INCLUDE, igmp.CHANGE_TO_INCLUDE_MODE):
        assert outcome(frame(v3((rtype, G, []))), gs) == [(1, False), (2, False)]


def test_v3_exclude_nothing_is_an_any_source_join():
    for rtype in (igmp.MODE_IS_EXCLUDE, igmp.CHANGE_TO_EXCLUDE_MODE):
        assert outcome(frame(v3((rtype, G, []))), BOTH) == [(1, True), (2, True)]
    # EXCLUDE with sources and ALLOW of nothing say nothing we act on
    assert statements(frame(v3((igmp.MODE_IS_EXCLUDE, G, [S1]),
                               (igmp.ALLOW_NEW_SOURCES, G, [])))) == []


def test_v1_v2_reports_join_and_v2_leave_leaves_every_group_on_the_address():
    report2 = igmp.igmp(msgtype=igmp.IGMP_TYPE_REPORT_V2, address=G)
    report1 = igmp.igmp(msgtype=igmp.IGMP_TYPE_REPORT_V1, address=G)
    assert outcome(frame(report2), BOTH) == [(1, True), (2, True)]
    assert outcome(frame(report1), BOTH) == [(1, True), (2, True)]
    gs = groups((1, S1, G, {HOST}), (2, S2, G, set()))
    leave = igmp.igmp(msgtype=igmp.IGMP_TYPE_LEAVE, address=G)
    assert outcome(frame(leave), gs) == [(1, False)]
    query = igmp.igmp(msgtype=igmp.IGMP_TYPE_QUERY, address=G)
    assert statements(frame(query)) == []


def test_unknown_group_is_reported_without_a_group():
    [d] = decide(HOST, statements(frame(v3((igmp.MODE_IS_INCLUDE, G, ["10.0.0.9"])))), BOTH)
    assert d.group is None and d.statement == Statement(G, "10.0.0.9", True)
    assert outcome(frame(igmp.igmp(msgtype=igmp.IGMP_TYPE_REPORT_V2, address="232.7.7.7")),
                   BOTH) == [(None, True)]


def test_the_groups_own_source_and_a_repeated_join_are_ignored():
    gs = groups((1, S1, G, {HOST}), (2, S2, G, set()))
    assert outcome(frame(v3((igmp.MODE_IS_EXCLUDE, G, []))), gs, host=S2) == [(1, True)]
    assert outcome(frame(v3((igmp.MODE_IS_INCLUDE, G, [S1]))), gs) == []


def test_a_later_record_sees_the_earlier_ones_effect():
    protos = frame(v3((igmp.ALLOW_NEW_SOURCES, G, [S1]), (igmp.BLOCK_OLD_SOURCES, G, [S1]),
                      (igmp.BLOCK_OLD_SOURCES, G, [S1])))
    assert outcome(protos, BOTH) == [(1, True), (1, False)]


statement = st.builds(Statement, st.sampled_from([G, G2, "232.7.7.7"]),
                      st.sampled_from([None, S1, S2, HOST]), st.booleans())


@given(said=st.lists(statement, max_size=12),
       members=st.fixed_dictionaries({gid: st.booleans() for gid in (1, 2, 3, 4)}))
def test_decisions_are_minimal_and_end_in_the_last_statement(said, members):
    gs = groups((1, S1, G, set()), (2, S2, G, set()), (3, S1, G2, set()), (4, HOST, G, set()))
    for gid, member in members.items():
        if member and gid != 4:
            gs[gid].receivers.add(HOST)
    state = {gid: HOST in g.receivers for gid, g in gs.items()}
    for d in decide(HOST, said, gs):
        if d.group is None:
            assert not any(g.address == d.statement.address and d.statement.source in (None, g.source)
                           for g in gs.values())
            continue
        assert state[d.group.gid] != d.join, "a decision always changes membership"
        state[d.group.gid] = d.join
    for gid, g in gs.items():
        last = [s.join for s in said if s.address == g.address and s.source in (None, g.source)]
        want = HOST in g.receivers if gid == 4 or not last else last[-1]
        assert state[gid] == want


MAC = "00:00:00:00:00:04"
AT = (3, 4, MAC)


def test_igmp_policy_default_is_any_host_or_only_the_token_holders():
    anyone = IgmpPolicy.from_settings(None)
    assert anyone.networks == ANY and anyone.allows(HOST) and anyone.allows("192.168.1.1")
    enrolled = IgmpPolicy.from_settings(None, {HOST: "t"})
    assert enrolled.allows(HOST) and not enrolled.allows(OTHER)
    # an explicit --igmp-allow wins over the host-token default
    narrow = IgmpPolicy.from_settings(parse_allow("10.0.0.4/32, 10.1.0.0/16"), {OTHER: "t"})
    assert narrow.allows(HOST) and narrow.allows("10.1.200.3") and not narrow.allows(OTHER)
    nobody = IgmpPolicy.from_settings(parse_allow("none"))
    assert not nobody.allows(HOST) and parse_allow("ANY") == ANY


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "h1", "10.0.0.1,", ""])
def test_igmp_allow_names_the_bad_item(bad):
    with pytest.raises(ValueError, match="is not an IPv4 CIDR"):
        parse_allow(bad)


def test_a_report_counts_only_from_an_allowed_host_at_its_learned_place():
    policy = IgmpPolicy.from_settings(parse_allow("10.0.0.0/29"))
    here = HostLoc(HOST, MAC, 3, 4)
    assert policy.refuses(HOST, here, AT) is None
    assert policy.refuses(HOST, here, (3, 4, MAC.upper())) is None
    assert "learned" in policy.refuses(HOST, here, (3, 5, MAC))  # another port
    assert "learned" in policy.refuses(HOST, here, (3, 4, "02:00:00:00:00:09"))  # another MAC
    assert "learned" in policy.refuses(HOST, None, AT)  # not a known host
    assert "--igmp-allow" in policy.refuses("10.0.0.9", HostLoc("10.0.0.9", MAC, 3, 4), AT)
