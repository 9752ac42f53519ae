"""Unicast forwarding decisions (controller.unicast), proven by applying the returned flows
to the simulated fabric and tracing frames through it."""

from __future__ import annotations

import networkx as nx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

import topologies as T
from controller import ofmsgs
from controller.hosts import source_table
from controller.topoview import TopologyView
from controller.unicast import forward, is_multicast
from lab.fakeof import FakeFabric

BROADCAST = "ff:ff:ff:ff:ff:ff"
DATA = b"frame"


def setup(topo: T.Topology) -> tuple[TopologyView, FakeFabric, dict[int, dict]]:
    """A view that knows ``topo`` and a fabric holding the pipeline a connected switch
    gets (base flows, and the source table letting known hosts and link ports through)."""
    fabric = FakeFabric(topo)
    view = TopologyView.from_topology(topo)
    for d in topo.switches:
        assert not fabric.apply_all((d, m) for m in ofmsgs.base_flows(d) + source_table(view, d))
    return view, fabric, {d: fabric.ports(d) for d in topo.switches}


def packet_outs(msgs: list) -> dict[int, tuple[int, list[int]]]:
    """dpid -> (in_port, output ports) of each packet-out."""
    outs = {}
    for dpid, m in msgs:
        if isinstance(m, parser.OFPPacketOut):
            assert dpid not in outs and m.data == DATA and m.buffer_id == ofp.OFP_NO_BUFFER
            outs[dpid] = (m.in_port, [a.port for a in m.actions])
    return outs


def test_path_flows_go_downstream_first_then_the_frame_leaves_on_the_first_hop():
    topo = T.linear(3)
    view, fabric, ports = setup(topo)
    h1, h3 = topo.host("h1"), topo.host("h3")
    msgs = forward(view, h1.dpid, h1.port, h3.mac, DATA, ports)
    flows = [(d, m) for d, m in msgs if isinstance(m, parser.OFPFlowMod)]
    assert [d for d, _ in flows] == [3, 2, 1]  # the destination's switch first
    assert all(m.cookie == ofmsgs.COOKIE_UNICAST and m.match["eth_dst"] == h3.mac for _, m in flows)
    assert isinstance(msgs[-1][1], parser.OFPPacketOut)
    assert packet_outs(msgs) == {1: (h1.port, [view.link_port(1, 2)])}
    assert not fabric.apply_all(flows)
    tr = fabric.trace(h1.ip, h3.ip)
    assert dict(tr.delivered) == {h3.ip: 1} and not tr.loops, tr.log


def test_unknown_destination_floods_edge_ports_only_never_the_ingress():
    topo = T.leaf_spine(2, 2, 2)  # spines 1, 2 (link ports only); leaves 3, 4 with 2 hosts
    view, _, ports = setup(topo)
    h1 = topo.host("h1")
    hosts_at = {d: sorted(h.port for h in topo.hosts if h.dpid == d) for d in topo.switches}
    for dst in (BROADCAST, "02:00:00:00:99:99"):
        outs = packet_outs(forward(view, h1.dpid, h1.port, dst, DATA, ports))
        assert outs == {3: (h1.port, [p for p in hosts_at[3] if p != h1.port]),
                        4: (ofp.OFPP_CONTROLLER, hosts_at[4])}


def test_flood_skips_down_ports_unconnected_switches_and_reserved_ports():
    topo = T.leaf_spine(2, 2, 2)
    view, _, ports = setup(topo)
    h1, h3, h4 = topo.host("h1"), topo.host("h3"), topo.host("h4")
    view.port_down(h3.dpid, h3.port)
    ports[4] = {**ports[4], ofp.OFPP_LOCAL: None}
    outs = packet_outs(forward(view, h1.dpid, h1.port, BROADCAST, DATA, ports))
    assert outs[4] == (ofp.OFPP_CONTROLLER, [h4.port])
    del ports[4]  # not connected: gets nothing
    assert set(packet_outs(forward(view, h1.dpid, h1.port, BROADCAST, DATA, ports))) == {3}


def test_a_flooded_copy_seen_on_a_link_port_goes_nowhere():
    topo = T.linear(3)
    view, _, ports = setup(topo)
    assert forward(view, 2, view.link_port(2, 1), BROADCAST, DATA, ports) == []


def test_a_detached_destination_is_flooded_to_and_an_unreachable_one_dropped():
    topo = T.linear(3)
    view, _, ports = setup(topo)
    h1, h3 = topo.host("h1"), topo.host("h3")
    view.port_down(h3.dpid, h3.port)  # its port is down: unknown for forwarding, flooded
    # s1's only edge port is the ingress, s3's is down: only h2's port gets a copy
    assert packet_outs(forward(view, h1.dpid, h1.port, h3.mac, DATA, ports)) == {
        2: (ofp.OFPP_CONTROLLER, [topo.host("h2").port])}
    view.port_up(h3.dpid, h3.port)
    view.port_down(2, view.link_port(2, 3))  # attached, but no path to it
    assert forward(view, h1.dpid, h1.port, h3.mac, DATA, ports) == []


def test_flows_go_only_to_connected_switches():
    topo = T.linear(3)
    view, _, ports = setup(topo)
    h1, h3 = topo.host("h1"), topo.host("h3")
    del ports[2]
    assert [d for d, _ in forward(view, h1.dpid, h1.port, h3.mac, DATA, ports)] == [3, 1, 1]


def test_is_multicast():
    assert is_multicast("224.0.0.22") and is_multicast("232.1.2.3") and is_multicast("239.255.0.1")
    assert not is_multicast("10.0.0.1") and not is_multicast("240.0.0.1")


topology_families = st.one_of(
    st.builds(T.linear, st.integers(1, 6), st.integers(1, 2)),
    st.builds(T.ring, st.integers(3, 7), st.integers(1, 2)),
    st.builds(T.leaf_spine, st.integers(1, 3), st.integers(2, 4), st.integers(1, 2)),
    st.builds(T.fat_tree, st.just(4)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topology_families, data=st.data())
def test_every_installed_hop_leads_to_the_destination_without_loops(topo, data):
    src = data.draw(st.sampled_from(topo.hosts), label="src")
    dst = data.draw(st.sampled_from([h for h in topo.hosts if h != src] or [src]), label="dst")
    view, fabric, ports = setup(topo)
    msgs = forward(view, src.dpid, src.port, dst.mac, DATA, ports)
    flows = {d: m for d, m in msgs if isinstance(m, parser.OFPFlowMod)}
    assert len(flows) == nx.shortest_path_length(view.graph, src.dpid, dst.dpid) + 1
    [(out,)] = [tuple(p) for _, p in packet_outs(msgs).values()]
    first = flows[src.dpid].instructions[0].actions[0].port
    assert out == first  # the frame itself takes the first hop
    assert not fabric.apply_all(flows.items())
    tr = fabric.trace(src.ip, dst.ip)
    assert not tr.loops, tr.log
    if dst != src:
        assert dict(tr.delivered) == {dst.ip: 1}, tr.log
        assert sum(tr.link_copies.values()) == len(flows) - 1
