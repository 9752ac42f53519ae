"""Unicast forwarding decisions for a frame punted to the controller.

Pure: from the topology view and the connected switches' ports, the messages that
forward the frame. A known, attached destination gets its shortest path installed
(downstream switch first, so the first hop never sends into a switch that does not
know the MAC yet) and the frame sent along it. Anything else, broadcast included,
goes out of every edge port of every connected switch: never over inter-switch links,
so loops in the fabric cannot storm.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import networkx as nx
from ryu.ofproto import ofproto_v1_3 as ofp

from controller import ofmsgs
from controller.topoview import TopologyView


def is_multicast(ip: str) -> bool:
    """224/4: only controller-built trees carry it, it is never flooded."""
    return 224 <= int(ip.split(".", 1)[0]) <= 239


def forward(view: TopologyView, dpid: int, in_port: int, eth_dst: str, data: bytes,
            switch_ports: Mapping[int, Iterable[int]]) -> list[tuple[int, ofmsgs.Msg]]:
    """Messages (per dpid, in sending order) that deliver a frame switch ``dpid`` got on
    ``in_port``. ``switch_ports`` holds the connected switches and their port numbers;
    only those get messages. Empty when the frame cannot or must not go anywhere."""
    dst = next((h for h in view.hosts.values() if h.mac == eth_dst), None)
    if dst is not None and view.host_attached(dst) and dpid in view.graph:
        try:
            path = nx.shortest_path(view.graph, dpid, dst.dpid)
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            return []
        hops = [(a, view.link_port(a, b)) for a, b in zip(path, path[1:])] + [(dst.dpid, dst.port)]
        msgs = [(d, ofmsgs.unicast_flow(d, eth_dst, port))
                for d, port in reversed(hops) if d in switch_ports]  # downstream first
        return msgs + [(dpid, ofmsgs.packet_out(dpid, in_port, [hops[0][1]], data))]
    if not view.edge_port(dpid, in_port):
        return []  # a copy we flooded ourselves, seen again on a link port
    msgs = []
    for d, ports in switch_ports.items():
        out = flood_ports(view, d, ports, in_port if d == dpid else None)
        if out:
            msgs.append((d, ofmsgs.packet_out(d, in_port if d == dpid else ofp.OFPP_CONTROLLER,
                                              out, data)))
    return msgs


def flood_ports(view: TopologyView, dpid: int, ports: Iterable[int],
                ingress: int | None = None) -> list[int]:
    """The ports of ``dpid`` a flooded frame leaves by: edge ports that are up (never an
    inter-switch link, so loops cannot storm), reserved ports and ``ingress`` excluded."""
    return [p for p in ports if p < ofp.OFPP_MAX and p != ingress and view.edge_port(dpid, p)
            and (dpid, p) not in view.ports_down]
