"""Host discovery (controller.hosts) on the simulated fabric: hosts that never broadcast are
learned from their first frame or found by probing, receivers wait ``pending`` instead of
failing, and hosts that go silent or lose their port are forgotten with their groups
updated. Probes are answered (or not) by the hosts the fabric delivers them to, and every
frame is traced through the switches' real pipeline."""

from __future__ import annotations

import pytest
from ryu.lib.packet import arp, ethernet, packet
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller import ofmsgs
from controller.hosts import BROADCAST, MAX_PROBES_PER_TICK, PROBE_MAC, Actions, HostDiscovery
from controller.unicast import forward
from tests.support.controller_env import R1, R2, Env, S, make_env

T0 = 1000.0


def setup(*unknown: str, **options: float) -> tuple[Env, HostDiscovery]:
    env = make_env(unknown_hosts=unknown, pipeline=True)
    return env, HostDiscovery(env.core, **options)


def ports(env: Env) -> dict[int, dict]:
    return {d: env.fabric.ports(d) for d in env.topo.switches}


def run(env: Env, acts: Actions) -> None:
    """What the app does with a step's result: group changes through the service, switch
    messages to the switches (packet-outs are the probes: see ``answer``)."""
    assert not env.fabric.apply_all((d, m) for d, m in acts.msgs if isinstance(m, parser.OFPFlowMod))
    env.service.apply(acts.plan, "host")


def probes(acts: Actions) -> list[tuple[int, parser.OFPPacketOut, str, str]]:
    """(dpid, packet-out, asked address, frame destination MAC) of each ARP probe sent."""
    out = []
    for d, m in acts.msgs:
        if isinstance(m, parser.OFPPacketOut):
            pkt = packet.Packet(m.data)
            a, e = pkt.get_protocol(arp.arp), pkt.get_protocol(ethernet.ethernet)
            assert a.opcode == arp.ARP_REQUEST and a.src_mac == e.src == PROBE_MAC and a.src_ip == "0.0.0.0"
            out.append((d, m, a.dst_ip, e.dst))
    return out


def answer(env: Env, disc: HostDiscovery, acts: Actions, silent: set[str] = frozenset()) -> list[str]:
    """Every host a probe reaches and that owns the asked address (and is not ``silent``)
    answers it; the answer is traced from the host to wherever the switches send it, and
    each copy punted to the controller becomes the ``seen`` the app would call.
    Returns who answered."""
    answered = []
    for d, msg, asked, _ in probes(acts):
        for h in env.fabric.packet_out_hosts(d, msg):
            if h.ip != asked or h.ip in silent:
                continue
            tr = env.fabric.trace(h.ip, "0.0.0.0", eth_type=0x0806, eth_dst=PROBE_MAC)
            assert not tr.delivered, "an answer to a probe must reach no host"
            assert [(pd, p["in_port"], p["eth_src"]) for pd, p in tr.punted] == [(h.dpid, h.port, h.mac)]
            run(env, disc.seen(h.ip, h.mac, h.dpid, h.port))
            answered.append(h.ip)
    return answered


def test_a_host_that_only_talks_along_existing_paths_is_learned_from_its_first_frame():
    env, disc = setup(R1)
    r1, s = env.topo.host(R1), env.topo.host(S)
    # the path towards S exists (another host used it), and R1 knows S's MAC: R1 never
    # broadcasts. Its first frame still reaches the controller: its source is unknown.
    path = forward(env.core.view, r1.dpid, 99, s.mac, b"", ports(env))
    assert not env.fabric.apply_all((d, m) for d, m in path if isinstance(m, parser.OFPFlowMod))
    tr = env.fabric.trace(R1, S)
    assert not tr.delivered and [(d, p["in_port"], p["eth_src"], p["ipv4_src"]) for d, p in tr.punted] \
        == [(r1.dpid, r1.port, r1.mac, R1)], tr.log
    acts = disc.seen(R1, r1.mac, r1.dpid, r1.port)
    assert acts.learned == [R1]
    run(env, acts)
    assert env.core.view.hosts[R1].port == r1.port
    tr = env.fabric.trace(R1, S)  # learned: its frames pass the source table, unseen by us
    assert dict(tr.delivered) == {S: 1} and not tr.punted, tr.log
    # seen again at the same place: punted by the destination table (e.g. a broadcast),
    # its entry is in place and nothing is sent; punted by the source table (its entry
    # idled out), the entry is put back
    again = disc.seen(R1, r1.mac, r1.dpid, r1.port, from_dst_table=True)
    assert again.learned == [] and again.msgs == [] and not len(again.plan)
    again = disc.seen(R1, r1.mac, r1.dpid, r1.port)
    assert again.learned == [] and [m.match["eth_src"] for _, m in again.msgs] == [r1.mac]


def test_a_group_naming_hosts_never_seen_waits_pending_probes_and_installs_them():
    env, disc = setup(S, R1, R2)
    g, created = env.service.create_group({"model": "m", "source": S, "receivers": [R1, R2]})
    assert created and g["state"] == "pending" and g["receivers"] == {R1: "pending", R2: "pending"}
    acts = disc.tick(T0, ports(env))
    sent = probes(acts)
    assert {ip for _, _, ip, _ in sent} == {S, R1, R2} and {e for *_, e in sent} == {BROADCAST}
    for d, msg, _, _ in sent:  # out of every edge port, never into a link
        assert all(env.core.view.edge_port(d, a.port) for a in msg.actions)
    assert sorted(answer(env, disc, acts, silent={R2})) == [S, R1]
    g = env.service.get_group(g["id"])
    assert g["receivers"] == {R1: "installed", R2: "pending"}
    assert env.delivered(g["id"]) == {R1: 1}
    assert disc.looking_for() == [R2]
    # R2 is asked again later, less and less often, until it answers
    assert probes(disc.tick(T0 + 0.5, ports(env))) == []
    assert {ip for *_, ip, _ in probes(disc.tick(T0 + 1, ports(env)))} == {R2}
    assert probes(disc.tick(T0 + 2.5, ports(env))) == []
    acts = disc.tick(T0 + 3, ports(env))
    assert answer(env, disc, acts) == [R2]
    g = env.service.get_group(g["id"])
    assert g["state"] == "installed" and g["receivers"] == {R1: "installed", R2: "installed"}
    assert env.delivered(g["id"]) == {R1: 1, R2: 1}
    assert disc.looking_for() == [] and probes(disc.tick(T0 + 100, ports(env))) == []


def test_a_silent_host_that_does_not_answer_is_forgotten_and_its_group_updated():
    env, disc = setup(probe_interval_s=1.0, probe_tries=3)
    r1 = env.topo.host(R1)
    gid = env.service.create_group({"model": "m", "source": S, "receivers": [R1, R2]})[0]["id"]
    # the switch removes R1's source entry after the host timeout and reports it
    [idled] = [e for e in env.fabric.switches[r1.dpid].expire_idle(ofmsgs.COOKIE_SOURCE)
               if e.match["eth_src"] == r1.mac]
    disc.idle(r1.dpid, idled.match["in_port"], idled.match["eth_src"], T0)
    for i in range(3):  # three unicast probes to its MAC out of its port, one a second
        sent = probes(disc.tick(T0 + i, ports(env)))
        assert [(d, [a.port for a in m.actions], ip, e) for d, m, ip, e in sent] == [
            (r1.dpid, [r1.port], R1, r1.mac)]
        assert probes(disc.tick(T0 + i + 0.5, ports(env))) == []
    acts = disc.tick(T0 + 3, ports(env))
    assert acts.forgotten == [R1] and R1 not in env.core.view.hosts
    run(env, acts)
    g = env.service.get_group(gid)
    assert g["receivers"] == {R1: "pending", R2: "installed"}
    assert env.delivered(gid) == {R2: 1}  # the tree no longer carries R1's branch
    # ... and it is looked for again, so it comes back when it answers
    acts = disc.tick(T0 + 4, ports(env))
    assert answer(env, disc, acts) == [R1]
    assert env.service.get_group(gid)["receivers"] == {R1: "installed", R2: "installed"}


def test_a_silent_host_that_answers_a_probe_stays():
    env, disc = setup()
    r1 = env.topo.host(R1)
    gid = env.service.create_group({"model": "m", "source": S, "receivers": [R1]})[0]["id"]
    env.fabric.switches[r1.dpid].expire_idle(ofmsgs.COOKIE_SOURCE)
    disc.idle(r1.dpid, r1.port, r1.mac, T0)
    assert answer(env, disc, disc.tick(T0, ports(env))) == [R1]
    for t in (1, 2, 3, 10):
        acts = disc.tick(T0 + t, ports(env))
        assert not acts.forgotten and not probes(acts)
    assert env.service.get_group(gid)["receivers"] == {R1: "installed"}
    assert any(f.match.get("eth_src") == r1.mac for f in env.fabric.switches[r1.dpid].flows)


def test_a_host_whose_port_goes_down_is_forgotten_at_once_and_found_again():
    env, disc = setup()
    r1 = env.topo.host(R1)
    gid = env.service.create_group({"model": "m", "source": S, "receivers": [R1, R2]})[0]["id"]
    env.service.apply(env.core.port_down(r1.dpid, r1.port), "reroute")
    acts = disc.port_down(r1.dpid, r1.port)
    assert acts.forgotten == [R1]
    run(env, acts)
    assert not any(f.match.get("eth_src") == r1.mac for f in env.fabric.switches[r1.dpid].flows)
    assert env.service.get_group(gid)["receivers"] == {R1: "pending", R2: "installed"}
    # while the port is down no probe goes out of it; once it is up, R1 is found again
    acts = disc.tick(T0, ports(env))
    assert all(a.port != r1.port for d, m, *_ in probes(acts) if d == r1.dpid for a in m.actions)
    env.service.apply(env.core.port_up(r1.dpid, r1.port), "reroute")
    assert answer(env, disc, disc.tick(T0 + 1, ports(env))) == [R1]
    assert env.service.get_group(gid)["receivers"] == {R1: "installed", R2: "installed"}
    assert env.delivered(gid) == {R1: 1, R2: 1}


def test_a_claim_on_a_known_host_does_not_move_it_while_the_host_answers():
    """The REST rule (a known host is never moved by a declaration) holds for frames: a
    frame claiming R1's address from another port is refused, and R1, probed at once at
    its place, answers and stays."""
    env, disc = setup(probe_interval_s=1.0, probe_tries=3)
    r1 = env.topo.host(R1)
    gid = env.service.create_group({"model": "m", "source": S, "receivers": [R1]})[0]["id"]
    spare = 9  # a free edge port on another leaf
    for mac in (r1.mac, "02:66:66:66:66:66"):  # its MAC or another one
        acts = disc.seen(R1, mac, 5, spare)
        assert acts.refused == [R1] and not acts.learned and not acts.msgs and not len(acts.plan)
    assert acts.contested == []  # the holder is probed once per claim, not per frame
    held = env.core.view.hosts[R1]
    assert (held.mac, held.dpid, held.port) == (r1.mac, r1.dpid, r1.port)
    sent = disc.tick(T0, ports(env))
    assert [(d, [a.port for a in m.actions], ip, e) for d, m, ip, e in probes(sent)] == [
        (r1.dpid, [r1.port], R1, r1.mac)]
    assert answer(env, disc, sent) == [R1]  # the real R1 answers from its place: no move
    for t in range(1, 6):
        assert not disc.tick(T0 + t, ports(env)).forgotten
    assert env.core.view.hosts[R1].port == r1.port and env.delivered(gid) == {R1: 1}


def test_a_host_that_really_moved_is_learned_at_its_new_place_once_the_old_is_silent():
    env, disc = setup(probe_interval_s=1.0, probe_tries=3)
    r1 = env.topo.host(R1)
    gid = env.service.create_group({"model": "m", "source": S, "receivers": [R1]})[0]["id"]
    spare = 9
    acts = disc.seen(R1, r1.mac, 5, spare)
    assert acts.refused == [R1] and acts.contested == [R1]
    for t in range(3):  # nobody answers at the old place
        assert [ip for *_, ip, _ in probes(disc.tick(T0 + t, ports(env)))] == [R1]
    acts = disc.tick(T0 + 3, ports(env))
    assert acts.forgotten == [R1]
    deleted = [(d, m.match["in_port"]) for d, m in acts.msgs
               if isinstance(m, parser.OFPFlowMod) and m.command == ofmsgs.ofp.OFPFC_DELETE_STRICT]
    assert deleted == [(r1.dpid, r1.port)]
    run(env, acts)
    acts = disc.seen(R1, r1.mac, 5, spare)  # its next frame
    assert acts.learned == [R1] and not acts.refused
    run(env, acts)
    assert env.core.group(gid).tree.entries[5].out_ports == (spare,)


def test_a_host_whose_port_went_down_moves_at_once():
    env, disc = setup()
    r1 = env.topo.host(R1)
    env.service.create_group({"model": "m", "source": S, "receivers": [R1]})
    env.service.apply(env.core.port_down(r1.dpid, r1.port), "reroute")
    run(env, disc.port_down(r1.dpid, r1.port))
    acts = disc.seen(R1, r1.mac, 5, 9)
    assert acts.learned == [R1] and not acts.refused


def test_link_ports_pass_the_source_table_and_lose_that_when_the_link_goes():
    env, disc = setup()
    k = env.topo.links[0]
    assert [(d, m.match["in_port"], m.priority) for d, m in disc.link_up(k.a, k.a_port, k.b, k.b_port)] \
        == [(k.a, k.a_port, ofmsgs.PRIO_LINK_PORT), (k.b, k.b_port, ofmsgs.PRIO_LINK_PORT)]
    assert disc.link_down(k.a, k.a_port, k.b, k.b_port) == []  # the view still has the link
    env.core.link_remove(k.a, k.a_port, k.b, k.b_port)
    gone = disc.link_down(k.a, k.a_port, k.b, k.b_port)
    assert [(d, m.match["in_port"], m.command) for d, m in gone] == [
        (k.a, k.a_port, ofmsgs.ofp.OFPFC_DELETE_STRICT), (k.b, k.b_port, ofmsgs.ofp.OFPFC_DELETE_STRICT)]


def test_probing_for_many_named_hosts_is_spread_over_timer_steps():
    """A group naming thousands of unseen receivers must not stall the hub with one
    packet-out per address per switch in a single step."""
    env, disc = setup()
    many = [f"10.9.{i // 250}.{1 + i % 250}" for i in range(3 * MAX_PROBES_PER_TICK + 5)]
    env.service.create_group({"model": "m", "source": S, "receivers": many})
    asked: list[str] = []
    for step in range(4):
        now = {ip for *_, ip, _ in probes(disc.tick(T0 + step * 0.25, ports(env)))}
        assert len(now) == min(MAX_PROBES_PER_TICK, len(many) - len(asked)), step
        asked += sorted(now)
    assert sorted(asked) == sorted(many)  # every address asked once, none twice


def pinned_setup(*unknown: str, **options: float) -> tuple[Env, HostDiscovery]:
    """Discovery with every host of the topology pinned (``--fabric``) and placed."""
    env = make_env(unknown_hosts=unknown, pipeline=True)
    disc = HostDiscovery(env.core, pinned={h.ip: (h.mac, h.dpid, h.port) for h in env.topo.hosts},
                         **options)
    env.service.apply(disc.pin(), "host")
    return env, disc


def test_a_pinned_host_that_never_sent_a_frame_is_installed_without_a_probe():
    env, disc = pinned_setup(S, R1, R2)
    g, _ = env.service.create_group({"model": "m", "source": S, "receivers": [R1, R2]})
    assert g["state"] == "installed" and env.delivered(g["id"]) == {R1: 1, R2: 1}
    assert disc.looking_for() == [] and probes(disc.tick(T0, ports(env))) == []


def test_a_claim_on_a_pinned_host_never_wins_not_even_while_the_host_is_silent():
    """Unpinned, a silent host's address goes to whoever claims it once the host stays
    silent for 3 probes; pinned, the claim is refused at once and nobody is probed."""
    env, disc = pinned_setup(probe_interval_s=1.0, probe_tries=3)
    r1 = env.topo.host(R1)
    gid = env.service.create_group({"model": "m", "source": S, "receivers": [R1]})[0]["id"]
    for t in range(6):
        acts = disc.seen(R1, "02:66:66:66:66:66", 5, 9)
        assert acts.refused == [R1] and acts.spoofed == [R1] and not acts.contested
        assert not acts.learned and not acts.msgs and not len(acts.plan)
        later = disc.tick(T0 + t, ports(env))
        assert not later.forgotten and not probes(later)
    held = env.core.view.hosts[R1]
    assert (held.mac, held.dpid, held.port) == (r1.mac, r1.dpid, r1.port)
    assert env.delivered(gid) == {R1: 1}


def test_a_pinned_host_is_not_forgotten_for_silence_or_its_port_going_down():
    env, disc = pinned_setup(probe_interval_s=1.0, probe_tries=3)
    r1 = env.topo.host(R1)
    gid = env.service.create_group({"model": "m", "source": S, "receivers": [R1, R2]})[0]["id"]
    disc.idle(r1.dpid, r1.port, r1.mac, T0)  # its source entry idled out: no probing
    for t in range(5):
        acts = disc.tick(T0 + t, ports(env))
        assert not acts.forgotten and not probes(acts)
    env.service.apply(env.core.port_down(r1.dpid, r1.port), "reroute")
    assert not disc.port_down(r1.dpid, r1.port).forgotten and R1 in env.core.view.hosts
    assert env.delivered(gid) == {R2: 1}  # unreachable while its port is down ...
    env.service.apply(env.core.port_up(r1.dpid, r1.port), "reroute")
    assert env.delivered(gid) == {R1: 1, R2: 1}  # ... and back with it, nothing probed


def test_pinning_moves_a_host_a_saved_state_had_elsewhere_and_rest_cannot_remove_it():
    from controller.errors import Conflict
    from controller.linkgate import LinkGate

    env = make_env(pipeline=True)
    r1 = env.topo.host(R1)
    env.service.apply(env.core.host_remove(R1), "host")
    env.service.apply(env.core.host_add(R1, "02:66:66:66:66:66", 5, 9), "host")  # (saved)
    env.service.gate = LinkGate(env.topo)
    disc = HostDiscovery(env.core, pinned=env.service.gate.hosts)
    env.service.apply(disc.pin(), "host")
    held = env.core.view.hosts[R1]
    assert (held.mac, held.dpid, held.port) == (r1.mac, r1.dpid, r1.port)
    with pytest.raises(Conflict, match="--fabric"):
        env.service.remove_host(R1)


def test_a_claim_on_a_declared_host_never_wins_until_the_declaration_is_removed():
    """A host declared over REST: a frame claiming its address from another port or MAC
    is refused at once and nobody is probed (undeclared, the incumbent is probed and a
    silent one loses its address). The declared host itself is forgotten for silence like
    any other, and then too the claim is refused while its own frame is learned; once the
    declaration is removed, the claimant is learned."""
    env, disc = setup(R2, probe_interval_s=1.0, probe_tries=3)
    disc = HostDiscovery(env.core, probe_interval_s=1.0, probe_tries=3, reserved=env.service.declared)
    r2 = env.topo.host(R2)
    env.service.declare_host(R2, r2.mac.upper(), r2.dpid, r2.port)
    gid = env.service.create_group({"model": "m", "source": S, "receivers": [R2]})[0]["id"]
    assert env.delivered(gid) == {R2: 1}
    thief = ("02:66:66:66:66:66", 5, 9)  # another MAC on a free edge port of another leaf

    def claims_refused(t0: float) -> None:
        """Claims for 6 s: each refused; the only probes are the search for a forgotten
        R2 that its group names (broadcast), never one of the holder."""
        for t in range(6):
            for mac, dpid, port in (thief, (r2.mac, 5, 9), (thief[0], r2.dpid, r2.port)):
                acts = disc.seen(R2, mac, dpid, port)
                assert acts.refused == [R2] and acts.spoofed == [R2] and not acts.contested
                assert not acts.learned and not acts.msgs and not len(acts.plan)
            sent = probes(disc.tick(t0 + t, ports(env)))
            assert all((ip, dst) == (R2, BROADCAST) for *_, ip, dst in sent) and (
                R2 not in env.core.view.hosts or not sent)

    claims_refused(T0)
    held = env.core.view.hosts[R2]
    assert (held.mac, held.dpid, held.port) == (r2.mac, r2.dpid, r2.port) and env.delivered(gid) == {R2: 1}
    disc.idle(r2.dpid, r2.port, r2.mac, T0 + 10)  # silent past the host timeout: probed, forgotten
    for t in range(3):
        assert [ip for *_, ip, _ in probes(disc.tick(T0 + 10 + t, ports(env)))] == [R2]
    acts = disc.tick(T0 + 13, ports(env))
    assert acts.forgotten == [R2]
    run(env, acts)
    assert env.service.get_group(gid)["receivers"] == {R2: "pending"}
    claims_refused(T0 + 20)  # forgotten, and still nobody else's
    assert R2 not in env.core.view.hosts
    acts = disc.seen(R2, r2.mac, r2.dpid, r2.port)  # back at its declared place
    assert acts.learned == [R2]
    run(env, acts)
    assert env.delivered(gid) == {R2: 1}
    env.service.remove_host(R2)
    assert R2 not in env.service.declared and R2 not in env.core.view.hosts
    acts = disc.seen(R2, *thief)
    assert acts.learned == [R2] and not acts.refused


def test_a_declaration_is_saved_restored_and_removed_even_while_its_host_is_forgotten():
    from controller.errors import UnknownHost
    from controller.service import check_state

    env = make_env(unknown_hosts=(R2,), pipeline=True)
    r2 = env.topo.host(R2)
    declared = env.service.declared
    env.service.declare_host(R2, r2.mac, r2.dpid, r2.port)
    state = env.service.state()
    assert state["declared_hosts"] == [[R2, r2.mac, r2.dpid, r2.port]]
    env.service.reload(state)  # (a follower, a new leader: discovery keeps reading the same dict)
    assert env.service.declared is declared and declared == {R2: (r2.mac, r2.dpid, r2.port)}
    env.service.apply(env.core.host_remove(R2), "host")  # forgotten (silence, port down)
    env.service.remove_host(R2)  # the declaration alone: 204, not 404
    assert declared == {} and "declared_hosts" not in env.service.state()
    with pytest.raises(UnknownHost):
        env.service.remove_host(R2)
    bad = dict(state, declared_hosts=[[R2, "not-a-mac", r2.dpid, r2.port]])
    with pytest.raises(ValueError, match=r"declared_hosts\[0\] MAC"):
        check_state(bad)
