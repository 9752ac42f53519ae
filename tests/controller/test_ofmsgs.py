"""The message builders pack OpenFlow bytes instead of calling ryu's constructors (for
speed): each must be sent, by Ryu's own send path, as exactly the bytes the constructor
gives, and read back as the same message."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ryu.base import app_manager  # noqa: F401  (Ryu's import order: app_manager, then the controller)
from ryu.controller.controller import Datapath
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller import capabilities, ofmsgs
from controller.protect import MAX_PORT, OWN_GROUP, TO_OWN_GROUP, ff_id, ff_port
from controller.reconnect import normalise_actions


def wire(msg: object) -> bytes:
    msg.set_xid(7)
    msg.serialize()
    return bytes(msg.buf)


def reference_buckets(in_port: int, outs: list[int]) -> list:
    return [parser.OFPBucket(actions=[parser.OFPActionOutput(
        ofp.OFPP_IN_PORT if p == in_port else p, 0)]) for p in sorted(outs)]


@pytest.mark.parametrize("cmd,build", [
    (ofp.OFPGC_ADD, ofmsgs.group_add), (ofp.OFPGC_MODIFY, ofmsgs.group_modify)])
def test_group_mods_serialise_like_ryus_constructor(cmd: int, build) -> None:
    dp = ofmsgs.datapath(9)
    ref = parser.OFPGroupMod(dp, cmd, ofp.OFPGT_ALL, 42, reference_buckets(3, [5, 3, 1]))
    assert wire(build(9, 42, 3, [5, 3, 1])) == wire(ref)
    ref = parser.OFPGroupMod(dp, ofp.OFPGC_DELETE, ofp.OFPGT_ALL, 42, [])
    assert wire(ofmsgs.group_delete(9, 42)) == wire(ref)


def test_flow_add_serialises_like_ryus_constructor_and_copies_share_nothing_mutable() -> None:
    dp = ofmsgs.datapath(9)
    ref = parser.OFPFlowMod(
        dp, cookie=ofmsgs.cookie(42), table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD,
        priority=ofmsgs.PRIO_SG, flags=ofp.OFPFF_SEND_FLOW_REM,
        match=parser.OFPMatch(in_port=4, eth_type=0x0800, ipv4_src="10.0.0.1",
                              ipv4_dst="232.1.2.3"),
        instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                                   [parser.OFPActionGroup(42)])])
    a = ofmsgs.flow_add(9, 42, 4, "10.0.0.1", "232.1.2.3")
    b = ofmsgs.flow_add(9, 43, 5, "10.0.0.2", "232.1.2.4")
    assert wire(a) == wire(ref)
    assert a.buf is not b.buf and a.match is not b.match and a.xid != b.xid
    assert dict(b.match.items()) == {"in_port": 5, "eth_type": 0x0800,
                                     "ipv4_src": "10.0.0.2", "ipv4_dst": "232.1.2.4"}
    assert a.datapath.id == 9 and b.cookie == ofmsgs.cookie(43)


def test_protection_messages_serialise_like_ryus_constructor() -> None:
    """FF groups, ALL groups chained to them, transit and rejoin flows, and the
    normalised actions the reconnect reads back are the ones that were sent."""
    from controller.reconnect import normalise_actions
    dp = ofmsgs.datapath(9)
    tag = "02:00:00:09:00:03"
    spec = ((3, (("output", 3),)), (2, (("set_field", "eth_dst", tag), ("output", ofp.OFPP_IN_PORT))))
    ref = parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_FF, 0xFFFF8003, [
        parser.OFPBucket(watch_port=3, actions=[parser.OFPActionOutput(3, 0)]),
        parser.OFPBucket(watch_port=2, actions=[parser.OFPActionSetField(eth_dst=tag),
                                                parser.OFPActionOutput(ofp.OFPP_IN_PORT, 0)])])
    assert wire(ofmsgs.ff_group(9, 0xFFFF8003, spec)) == wire(ref)
    ref = parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_ALL, 42, [
        parser.OFPBucket(actions=[parser.OFPActionOutput(1, 0)]),
        parser.OFPBucket(actions=[parser.OFPActionGroup(0xFFFF0003)])])
    assert wire(ofmsgs.group_add(9, 42, 4, (1, 3), (0xFFFF0003,))) == wire(ref)
    acts = (("set_field", "eth_dst", "01:00:5e:01:02:03"), ("group", 42))
    for source, group, match in [
            (None, None, dict(in_port=2, eth_dst=tag, eth_type=0x0800, ipv4_dst=("232.0.0.0", "255.0.0.0"))),
            ("10.0.0.1", "232.1.2.3", dict(in_port=2, eth_dst=tag, eth_type=0x0800,
                                           ipv4_src="10.0.0.1", ipv4_dst="232.1.2.3"))]:
        ref = parser.OFPFlowMod(
            dp, cookie=ofmsgs.cookie(42), table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD,
            priority=ofmsgs.PRIO_DETOUR, flags=ofp.OFPFF_SEND_FLOW_REM, match=parser.OFPMatch(**match),
            instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, ofmsgs.actions(acts))])
        # (a group's rejoin is given its actions as kept: the group's MAC and ALL group implied)
        msg = ofmsgs.detour_flow(9, ofmsgs.cookie(42), 2, tag, acts if source is None else TO_OWN_GROUP,
                                 source, group)
        assert wire(msg) == wire(ref)
        parsed = parser.OFPFlowMod.parser(dp, ofp.OFP_VERSION, ofp.OFPT_FLOW_MOD, len(msg.buf), 7, msg.buf)
        assert normalise_actions(parsed.instructions[0].actions) == acts
        assert dict(parsed.match.items()) == match


def test_a_detours_rejoin_flow_is_what_ryu_sends_and_reads_back_the_same() -> None:
    """The one flow that ends a detour (``protect.rejoin_actions``: Nicira's move and
    resubmit) packs as Ryu's constructor does, and a switch's flow stats read back as the
    actions the core wants (else the audit would rewrite it for ever)."""
    from controller.protect import rejoin_actions
    dp = ofmsgs.datapath(9)
    tag = "02:00:00:05:00:07"
    acts = rejoin_actions(4, ofmsgs.TABLE)
    ref = parser.OFPFlowMod(
        dp, cookie=ofmsgs.COOKIE_DETOUR, table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD,
        priority=ofmsgs.PRIO_REJOIN, flags=ofp.OFPFF_SEND_FLOW_REM,
        match=parser.OFPMatch(in_port=2, eth_dst=tag, eth_type=0x0800, ipv4_dst=("232.0.0.0", "255.0.0.0")),
        instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [
            parser.OFPActionSetField(eth_dst="01:00:5e:00:00:00"),
            parser.NXActionRegMove(src_field="ipv4_dst", dst_field="eth_dst", n_bits=23, src_ofs=0, dst_ofs=0),
            parser.NXActionRegLoad(ofs_nbits=15, dst="in_port_nxm", value=4),
            parser.NXActionResubmitTable(in_port=4, table_id=0)])])
    msg = ofmsgs.detour_flow(9, ofmsgs.COOKIE_DETOUR, 2, tag, acts, priority=ofmsgs.PRIO_REJOIN)
    assert wire(msg) == wire(ref)
    parsed = parser.OFPFlowMod.parser(dp, ofp.OFP_VERSION, ofp.OFPT_FLOW_MOD, len(msg.buf), 7, msg.buf)
    assert normalise_actions(parsed.instructions[0].actions) == acts
    # Open vSwitch reports the move by the fields' NXM headers (NXM_OF_IP_DST...): the same
    as_ovs = [parser.OFPActionSetField(eth_dst="01:00:5e:00:00:00"),
              parser.NXActionRegMove(src_field="ipv4_dst_nxm", dst_field="eth_dst_nxm", n_bits=23, src_ofs=0,
                                     dst_ofs=0), parser.NXActionRegLoad(ofs_nbits=15, dst="in_port_nxm", value=4),
              parser.NXActionResubmitTable(in_port=4, table_id=0)]
    buf = bytearray()
    for a in as_ovs:
        a.serialize(buf, len(buf))
    read, at = [], 0
    while at < len(buf):
        read.append(parser.OFPAction.parser(bytes(buf), at))
        at += read[-1].len
    assert read[1].src_field == "ipv4_dst_nxm" and normalise_actions(read) == acts


# -- the ready-bytes messages against Ryu, on generated values --------------------------
ports = st.integers(1, ofp.OFPP_MAX)
ipv4 = st.ip_addresses(v=4).map(str)
ssm = st.integers(0, (1 << 24) - 1).map(lambda n: f"232.{n >> 16}.{(n >> 8) & 255}.{n & 255}")
macs = st.integers(0, (1 << 48) - 1).map(lambda n: ":".join(f"{b:02x}" for b in n.to_bytes(6, "big")))
gids = st.integers(1, 0xFFFEFFFF)
acts = st.lists(st.one_of(st.tuples(st.just("output"), st.one_of(ports, st.just(ofp.OFPP_IN_PORT))),
                          st.tuples(st.just("group"), gids),
                          st.tuples(st.just("set_field"), st.just("eth_dst"), macs),
                          st.tuples(st.just("set_field"), st.just("in_port"), st.integers(1, 0xFEFF)),
                          st.tuples(st.just("resubmit"), st.integers(1, 0xFEFF), st.integers(0, 254)),  # (a 16-bit port)
                          st.tuples(st.just("move"), st.sampled_from(["ipv4_dst", "ipv4_src"]), st.integers(0, 8),
                                    st.just("eth_dst"), st.integers(0, 24), st.integers(1, 23))),
                min_size=1, max_size=4).map(tuple)


class _Box:
    """Just what Ryu's ``Datapath.send_msg`` uses of its datapath (its own methods run)."""

    ofproto, ofproto_parser = ofp, parser
    set_xid = Datapath.set_xid

    def __init__(self) -> None:
        self.xid = 41
        self.sent: list[bytes] = []

    def send(self, buf: bytes, close_socket: bool = False) -> bool:
        self.sent.append(bytes(buf))
        return True


def _sent_by_ryu(msg: object) -> tuple[bytes, int]:
    box = _Box()
    Datapath.send_msg(box, msg)
    return box.sent[0], msg.xid


def _same_as_ryu(msg: object, ref: object) -> None:
    """Ryu's send path sends ``msg`` as the constructor-built ``ref`` (xid included), and
    every attribute read back from ``msg`` rebuilds the same bytes."""
    sent, xid = _sent_by_ryu(msg)
    assert xid == 42 and sent == wire_with_xid(ref, 42)
    if isinstance(ref, parser.OFPFlowMod):
        again = parser.OFPFlowMod(msg.datapath, msg.cookie, msg.cookie_mask, msg.table_id, msg.command,
                                  msg.idle_timeout, msg.hard_timeout, msg.priority, msg.buffer_id,
                                  msg.out_port, msg.out_group, msg.flags, msg.match, msg.instructions)
    else:
        again = parser.OFPGroupMod(msg.datapath, msg.command, msg.type, msg.group_id, msg.buckets)
    assert wire_with_xid(again, 42) == sent and msg.datapath.id == ref.datapath.id


def wire_with_xid(msg: object, xid: int) -> bytes:
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def _flow(dp, cookie, prio, match, inst, delete=False):
    if delete:
        return parser.OFPFlowMod(dp, cookie=cookie, cookie_mask=ofmsgs.FULL_MASK, table_id=ofmsgs.TABLE,
                                 command=ofp.OFPFC_DELETE_STRICT, priority=prio, out_port=ofp.OFPP_ANY,
                                 out_group=ofp.OFPG_ANY, match=match)
    return parser.OFPFlowMod(dp, cookie=cookie, table_id=ofmsgs.TABLE, command=ofp.OFPFC_ADD, priority=prio,
                             flags=ofp.OFPFF_SEND_FLOW_REM, match=match, instructions=inst)


@settings(max_examples=150, deadline=None)
@given(dpid=st.integers(1, 1 << 48), gid=gids, in_port=ports, source=ipv4, group=ssm)
def test_sg_flows_are_what_ryu_sends(dpid, gid, in_port, source, group) -> None:
    dp = ofmsgs.datapath(dpid)
    match = parser.OFPMatch(in_port=in_port, eth_type=0x0800, ipv4_src=source, ipv4_dst=group)
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionGroup(gid)])]
    _same_as_ryu(ofmsgs.flow_add(dpid, gid, in_port, source, group),
                 _flow(dp, ofmsgs.cookie(gid), ofmsgs.PRIO_SG, match, inst))
    match = parser.OFPMatch(in_port=in_port, eth_type=0x0800, ipv4_src=source, ipv4_dst=group)
    _same_as_ryu(ofmsgs.flow_delete(dpid, gid, in_port, source, group),
                 _flow(dp, ofmsgs.cookie(gid), ofmsgs.PRIO_SG, match, None, delete=True))


@settings(max_examples=150, deadline=None)
@given(dpid=st.integers(1, 1 << 48), gid=gids, in_port=ports, source=ipv4, group=ssm,
       color=st.integers(0, 1), target=gids)
def test_the_version_stamp_and_version_flows_are_what_ryu_sends(dpid, gid, in_port, source, group, color,
                                                                 target) -> None:
    """The tree's first flow pushes the version tag and sets its id; a moving tree's
    version flow matches that id above the (S,G) flow."""
    dp = ofmsgs.datapath(dpid)
    vid = ofp.OFPVID_PRESENT | ofmsgs.VERSION_VIDS[color]
    match = parser.OFPMatch(in_port=in_port, eth_type=0x0800, ipv4_src=source, ipv4_dst=group)
    for to in (None, target):
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [
            parser.OFPActionPushVlan(0x8100), parser.OFPActionSetField(vlan_vid=vid),
            parser.OFPActionGroup(gid if to is None else to)])]
        _same_as_ryu(ofmsgs.ingress_add(dpid, gid, in_port, source, group, color, to),
                     _flow(dp, ofmsgs.cookie(gid), ofmsgs.PRIO_SG, match, inst))
    match = parser.OFPMatch(in_port=in_port, eth_type=0x0800, vlan_vid=vid, ipv4_src=source, ipv4_dst=group)
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionGroup(target)])]
    _same_as_ryu(ofmsgs.version_flow(dpid, gid, in_port, source, group, color, target),
                 _flow(dp, ofmsgs.cookie(gid), ofmsgs.PRIO_VERSION, match, inst))
    _same_as_ryu(ofmsgs.version_flow_delete(dpid, gid, in_port, source, group, color),
                 _flow(dp, ofmsgs.cookie(gid), ofmsgs.PRIO_VERSION, match, None, delete=True))


@settings(max_examples=150, deadline=None)
@given(dpid=st.integers(1, 1 << 48), gid=gids, in_port=ports, outs=st.lists(ports, min_size=0, max_size=6),
       protected=st.sets(ports, max_size=3), data=st.data())
def test_all_groups_are_what_ryu_sends(dpid, gid, in_port, outs, protected, data) -> None:
    outs = tuple(sorted(set(outs) | ({in_port} if data.draw(st.booleans()) else set())))
    ff = tuple(sorted(ff_id(p, data.draw(st.booleans())) for p in protected if p in outs and p <= MAX_PORT))
    via = {ff_port(f): f for f in ff}
    edge = tuple(p for p in outs if p not in via and data.draw(st.booleans()))
    ref = [parser.OFPBucket(actions=[parser.OFPActionGroup(via[p])] if p in via else
                            ([parser.OFPActionPopVlan()] if p in edge else [])
                            + [parser.OFPActionOutput(ofp.OFPP_IN_PORT if p == in_port else p, 0)])
           for p in outs]
    dp = ofmsgs.datapath(dpid)
    for cmd, build in ((ofp.OFPGC_ADD, ofmsgs.group_add), (ofp.OFPGC_MODIFY, ofmsgs.group_modify)):
        _same_as_ryu(build(dpid, gid, in_port, outs, ff, edge), parser.OFPGroupMod(dp, cmd, ofp.OFPGT_ALL, gid, ref))
        # (a list, not the tuples of a tree entry: the uncached path)
        _same_as_ryu(build(dpid, gid, in_port, list(outs), list(ff), list(edge)),
                     parser.OFPGroupMod(dp, cmd, ofp.OFPGT_ALL, gid, ref))
    _same_as_ryu(ofmsgs.group_delete(dpid, gid), parser.OFPGroupMod(dp, ofp.OFPGC_DELETE, ofp.OFPGT_ALL, gid, []))


@settings(max_examples=150, deadline=None)
@given(dpid=st.integers(1, 1 << 48), ck=st.integers(0, (1 << 64) - 1), in_port=ports, tag=macs,
       actions=acts, sg=st.one_of(st.none(), st.tuples(ipv4, ssm)),
       buckets=st.lists(st.tuples(ports, acts), min_size=1, max_size=3).map(tuple), ffid=st.integers(0, ofp.OFPG_MAX))
def test_protection_entries_are_what_ryu_sends(dpid, ck, in_port, tag, actions, sg, buckets, ffid) -> None:
    dp = ofmsgs.datapath(dpid)
    source, group = sg or (None, None)
    fields = dict(in_port=in_port, eth_dst=tag, eth_type=0x0800)
    fields.update(ipv4_dst=ofmsgs.SSM_NET) if sg is None else fields.update(ipv4_src=source, ipv4_dst=group)
    whole = actions if sg is None else ofmsgs.rejoin_actions(actions, group, ck & ~ofmsgs.COOKIE_MASK)
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, ofmsgs.actions(whole))]
    _same_as_ryu(ofmsgs.detour_flow(dpid, ck, in_port, tag, actions, source, group),
                 _flow(dp, ck, ofmsgs.PRIO_DETOUR, parser.OFPMatch(**fields), inst))
    _same_as_ryu(ofmsgs.detour_flow_delete(dpid, ck, in_port, tag, source, group),
                 _flow(dp, ck, ofmsgs.PRIO_DETOUR, parser.OFPMatch(**fields), None, delete=True))
    for cmd in (ofp.OFPGC_ADD, ofp.OFPGC_MODIFY):
        ref = parser.OFPGroupMod(dp, cmd, ofp.OFPGT_FF, ffid, [
            parser.OFPBucket(watch_port=w, actions=ofmsgs.actions(a)) for w, a in buckets])
        _same_as_ryu(ofmsgs.ff_group(dpid, ffid, buckets, cmd), ref)


def test_a_ready_message_is_sent_again_with_its_new_xid_and_reads_as_a_ryu_message() -> None:
    """The install loop keys a plan's errors by the xid the datapath gave; a switch that
    reconnects may be sent the same object again."""
    msg = ofmsgs.flow_add(9, 42, 4, "10.0.0.1", "232.1.2.3")
    first, xid = _sent_by_ryu(msg)
    # numbered and serialised in its slots: sending ~300 messages per new tree made an
    # attribute dict for each, ~40% of what the shell spent sending them
    assert not msg.__dict__ and msg.buf == first
    msg.xid = None  # (what a resend would need with any MsgBase)
    second, xid2 = _sent_by_ryu(msg)
    assert xid == xid2 == 42 and first == second and first[4:8] == (42).to_bytes(4, "big")
    assert isinstance(msg, parser.OFPFlowMod) and msg.command == ofp.OFPFC_ADD and msg.priority == ofmsgs.PRIO_SG
    assert [normalise_actions(i.actions) for i in msg.instructions] == [(("group", 42),)]
    with pytest.raises(AttributeError):
        msg.no_such_attribute  # noqa: B018


@settings(max_examples=150, deadline=None)
@given(gid=gids, sg=st.tuples(ipv4, ssm), data=st.data(),
       switches=st.lists(st.tuples(st.integers(1, 1 << 48), ports, st.lists(ports, max_size=4),
                                   st.sets(ports, max_size=3),
                                   st.one_of(st.none(), st.tuples(ports, macs, st.sampled_from(["group", "own"])))),
                         max_size=8, unique_by=lambda s: s[0]))
def test_a_new_trees_adds_are_the_builders_messages(gid, sg, data, switches) -> None:
    """``tree_adds`` (one loop for a new tree) gives, switch by switch in order, the
    messages of ``group_add``, ``flow_add`` and ``detour_flow``, byte for byte and sent
    by Ryu's path; rejoins that share one action list and ones that list outputs."""
    source, group = sg
    entries, want, edge = {}, [], {}
    root = data.draw(st.sampled_from([d for d, *_ in switches] or [None]), label="root")
    color = data.draw(st.integers(0, 1), label="color")
    for dpid, in_port, outs, protected, rejoin in switches:
        outs = tuple(sorted(set(outs)))
        ff = tuple(sorted(ff_id(p, data.draw(st.booleans())) for p in protected if p in outs and p <= MAX_PORT))
        hosts = tuple(p for p in outs if p not in {ff_port(f) for f in ff}
                      and data.draw(st.booleans()))
        if hosts:
            edge[dpid] = hosts
        if rejoin is not None:
            arrival, tag, kind = rejoin
            rejoin = (arrival, tag, TO_OWN_GROUP if kind == "group" else tuple(("output", p) for p in outs))
        entries[dpid] = e = (in_port, outs, ff, rejoin or ())
        want += [(dpid, ofmsgs.group_add(dpid, gid, in_port, outs, ff, hosts)),
                 (dpid, ofmsgs.ingress_add(dpid, gid, in_port, source, group, color) if dpid == root
                  else ofmsgs.flow_add(dpid, gid, in_port, source, group))]
        if rejoin:
            want.append((dpid, ofmsgs.detour_flow(dpid, ofmsgs.cookie(gid), *rejoin, source, group, edge=hosts)))
    order = data.draw(st.permutations(sorted(entries)))
    want.sort(key=lambda m: order.index(m[0]))  # (stable: each switch's own order kept)
    got: list = []
    ofmsgs.tree_adds(gid, source, group, order, entries, got, edge, root, color)
    assert [(d, type(m), _sent_by_ryu(m)) for d, m in got] == [(d, type(m), _sent_by_ryu(m)) for d, m in want]
    assert all(m.datapath.id == d for d, m in got)


kept_acts = st.one_of(st.just(TO_OWN_GROUP), st.lists(st.one_of(
    st.tuples(st.just("output"), st.one_of(ports, st.just(ofp.OFPP_IN_PORT))),
    st.tuples(st.just("group"), st.integers(0xFFFF0000, 0xFFFFFFFF)),
    st.just(("group", OWN_GROUP))), min_size=1, max_size=5).map(tuple))


@settings(max_examples=150, deadline=None)
@given(acts=kept_acts, group=ssm, other=ssm, gid=st.integers(1, 0x7FFEFFFF))
def test_a_rejoin_kept_without_its_group_is_made_whole_and_read_back(acts, group, other, gid) -> None:
    """Rejoin actions are kept the same for every group; made whole for one they restore
    its multicast MAC first and go on into its ALL group; read back off a switch they
    give the kept form again, and None when the MAC is another group's."""
    whole = ofmsgs.rejoin_actions(acts, group, gid)
    assert whole[0] == ("set_field", "eth_dst", ofmsgs.multicast_mac(group))
    assert [a for a in whole[1:] if a == ("group", OWN_GROUP)] == []
    assert len(whole) == len(acts) + 1
    assert ofmsgs.rejoin_kept(whole, group, gid) == acts
    if ofmsgs.multicast_mac(other) != ofmsgs.multicast_mac(group):
        assert ofmsgs.rejoin_kept(ofmsgs.rejoin_actions(acts, other, gid), group, gid) is None


@settings(max_examples=150, deadline=None)
@given(dpid=st.integers(1, 1 << 48), ffid=st.integers(0, ofp.OFPG_MAX), port=ports, first=ports, tag=macs,
       via=st.booleans(), command=st.sampled_from([ofp.OFPGC_ADD, ofp.OFPGC_MODIFY]))
def test_an_ff_group_of_the_usual_shape_is_what_ryu_sends(dpid, ffid, port, first, tag, via, command) -> None:
    """The link's bucket then the detour's (tag, then output: the first port, or
    IN_PORT), packed in one go: the bytes Ryu's constructors give."""
    out = ofp.OFPP_IN_PORT if via else first
    spec = ((port, (("output", port),)), (first, (("set_field", "eth_dst", tag), ("output", out))))
    ref = parser.OFPGroupMod(ofmsgs.datapath(dpid), command, ofp.OFPGT_FF, ffid, [
        parser.OFPBucket(watch_port=port, actions=[parser.OFPActionOutput(port, 0)]),
        parser.OFPBucket(watch_port=first, actions=[parser.OFPActionSetField(eth_dst=tag),
                                                    parser.OFPActionOutput(out, 0)])])
    _same_as_ryu(ofmsgs.ff_group(dpid, ffid, spec, command), ref)


@settings(max_examples=300, deadline=None)
@given(address=st.one_of(ipv4, st.text(alphabet="0123456789. x", max_size=17),
                         st.lists(st.integers(0, 300).map(str), min_size=3, max_size=5).map(".".join)))
def test_sg_match_addresses_are_read_as_strictly_as_ipaddress(address) -> None:
    """(S,G) matches pack their addresses with ``socket.inet_pton``: it must take and
    refuse exactly what ``ipaddress.IPv4Address`` does (leading zeros, short forms)."""
    import ipaddress

    try:
        want = ipaddress.IPv4Address(address).packed
    except ValueError:
        with pytest.raises(ValueError):
            ofmsgs._ipv4(address)
        return
    assert ofmsgs._ipv4(address) == want


def test_a_switch_is_taken_for_open_vswitch_by_its_description_alone():
    """OFPMP_DESC as Ryu parses it off the wire (bytes; NUL padding possible): Open vSwitch
    has the Nicira actions, another vendor's switch is taken to lack them."""
    assert capabilities.speaks_nicira(b"Nicira, Inc.", b"Open vSwitch")
    assert capabilities.speaks_nicira(b"Nicira, Inc.\0\0\0", b"Open vSwitch\0")
    assert capabilities.speaks_nicira("Nicira, Inc.", "something else")
    assert not capabilities.speaks_nicira(b"Example Networks", b"OF-1.3 ASIC switch")
    assert not capabilities.speaks_nicira(b"", b"")
    assert capabilities.desc_text(b"caf\xc3\xa9 \0") == "caf\ufffd\ufffd"
    assert capabilities.refuses_nicira(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_EXPERIMENTER)
    assert not capabilities.refuses_nicira(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT)


def test_what_a_switch_lacking_an_optional_feature_answers_is_told_apart():
    """Meters and fast-failover groups are optional in OpenFlow 1.3: the errors a switch
    without them answers ours with, by the request each quotes, and nothing else."""
    meter_add = ofmsgs.punt_meter(1, 500)[0]
    meter_add.set_xid(1)
    meter_add.serialize()
    quoted = bytes(meter_add.buf[:64])
    assert capabilities.refuses_meters(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_OUT_OF_METERS, quoted)
    assert capabilities.refuses_meters(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_BAD_FLAGS, quoted)  # (no pktps)
    assert capabilities.refuses_meters(ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_TYPE, quoted)
    assert not capabilities.refuses_meters(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_METER_EXISTS, quoted)
    flow = ofmsgs.base_flows(1, True)[0]
    flow.set_xid(2)
    flow.serialize()
    assert capabilities.refuses_meters(ofp.OFPET_BAD_INSTRUCTION, ofp.OFPBIC_UNSUP_INST, bytes(flow.buf[:64]))
    assert capabilities.refuses_meters(ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_UNKNOWN_METER, bytes(flow.buf[:64]))
    assert not capabilities.refuses_meters(ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_TYPE, bytes(flow.buf[:64]))
    assert capabilities.has_meters(65536) and not capabilities.has_meters(0) and not capabilities.has_meters(2)

    ff = ofmsgs.ff_group(1, ff_id(2, False), ((2, (("output", 2),)),))
    ff.set_xid(3)
    ff.serialize()
    assert capabilities.refused_fast_failover(ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_TYPE, bytes(ff.buf[:64]))
    assert not capabilities.refused_fast_failover(ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_TYPE, quoted)
    assert not capabilities.refused_fast_failover(ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_OUT_OF_GROUPS, bytes(ff.buf[:64]))
    assert capabilities.has_fast_failover(0xF) and capabilities.has_fast_failover(0x7) is False
    assert capabilities.has_fast_failover(0) is None  # (not filled in: its refusals tell)


def test_a_rejoin_to_hosts_takes_the_version_tag_off_before_them_and_reads_back_in_port_order() -> None:
    """A rejoin that lists its outputs (its detour arrives over one of the switch's own
    outputs) sends to links first, tagged, then pops the version tag once and sends to
    the hosts; read back, the outputs are in the trees' port order again."""
    ff3 = ff_id(3, False)
    kept = (("output", ofp.OFPP_IN_PORT), ("output", 2), ("group", ff3), ("output", 5))  # (arrival 1)
    whole = ofmsgs.rejoin_actions(kept, "232.1.2.3", 7, edge=(2, 5))
    assert whole == (("set_field", "eth_dst", ofmsgs.multicast_mac("232.1.2.3")), ("output", ofp.OFPP_IN_PORT),
                     ("group", ff3), ("pop_vlan",), ("output", 2), ("output", 5))
    assert ofmsgs.rejoin_kept(whole, "232.1.2.3", 7, arrival=1) == kept
    assert ofmsgs.rejoin_actions(kept, "232.1.2.3", 7) == (whole[0],) + kept  # (no hosts: as kept)
