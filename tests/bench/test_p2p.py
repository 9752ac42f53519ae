"""The parts of the peer-to-peer and chain baselines that need no lab: what the fabric
traffic summary counts, the chain's order, the torrent's identity at the tracker, and the
chain node relaying a file over loopback."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import blake3
import networkx as nx
import pytest

from bench.bittorrent import info_hash
from bench.chain import NODE, chain_order
from bench.traffic import summarize
from lab.sh import free_port
from topologies.spec import Topology, leaf_spine


def _carry(topo: Topology, flows: list[tuple[str, str]], size: int) -> dict[tuple[str, str], int]:
    """Link-direction byte counters after ``size`` bytes went along the shortest path of
    every (src host, dst host) in ``flows``, keyed as ``Fabric.link_bytes`` keys them."""
    g = nx.Graph()
    for link in topo.links:
        g.add_edge(topo.switches[link.a], topo.switches[link.b])
    for h in topo.hosts:
        g.add_edge(h.name, topo.switches[h.dpid])
    counters = {(a, b): 0 for a, b in g.edges} | {(b, a): 0 for a, b in g.edges}
    for src, dst in flows:
        path = nx.shortest_path(g, src, dst)
        for a, b in zip(path, path[1:]):
            counters[(a, b)] += size
    return counters


def test_traffic_of_a_chain_counts_each_link_direction_once():
    topo = leaf_spine(1, 3, 2)  # h1 h2 on leaf1, h3 h4 on leaf2, h5 h6 on leaf3
    zero = {k: 0 for k in _carry(topo, [], 0)}
    size = 1000
    # sender h1 -> h3 -> h4 -> h5: the chain crosses the core twice per leaf change
    after = _carry(topo, [("h1", "h3"), ("h3", "h4"), ("h4", "h5")], size)
    t = summarize(topo, zero, after, "h1")
    assert t["sender_link"] == size
    assert t["host_down"] == 3 * size  # one copy delivered to each receiver
    assert t["host_up"] == 2 * size  # h3 and h4 forwarded the file
    assert t["core"] == 4 * size  # leaf1>spine>leaf2, leaf2>spine>leaf3
    assert t["total"] == (1 + 3 + 2 + 4) * size
    assert t["peak"] == size


def test_traffic_of_a_multicast_tree_and_the_busiest_link():
    topo = leaf_spine(1, 3, 2)
    before = {k: 500 for k in _carry(topo, [], 0)}  # earlier runs' bytes are subtracted
    size = 1000
    tree = _carry(topo, [("h1", "h3")], size)  # h1 leaf1 spine1 leaf2 h3
    for k in (("spine1", "leaf3"), ("leaf3", "h5"), ("leaf2", "h4")):
        tree[k] += size  # the branches: one copy per tree link
    tree[("leaf2", "h3")] += 2 * size  # a repair to h3 makes its downlink the busiest
    after = {k: v + 500 for k, v in tree.items()}
    t = summarize(topo, before, after, "h1")
    assert (t["sender_link"], t["host_up"], t["core"]) == (size, 0, 3 * size)
    assert t["host_down"] == 5 * size
    assert (t["peak"], t["peak_link"]) == (3 * size, "leaf2>h3")


def test_chain_order_keeps_the_hosts_of_one_leaf_adjacent():
    topo = leaf_spine(2, 4, 3)
    rcv = ["h4", "h7", "h10", "h5", "h8", "h11", "h6"]  # round-robin over leaves 2..4
    order = chain_order(topo, rcv)
    assert sorted(order) == sorted(rcv)
    leaves = [topo.host(h).dpid for h in order]
    assert leaves == sorted(leaves)  # each leaf visited once: 2 leaf changes, not 6
    assert sum(a != b for a, b in zip(leaves, leaves[1:])) == 2


def test_info_hash_is_the_sha1_of_the_bencoded_info_dictionary():
    info = b"d6:lengthi5e4:name5:x.bin12:piece lengthi262144e6:pieces20:" + bytes(20) + b"e"
    torrent = b"d8:announce10:http://t/a4:info" + info + b"5:nodesli1ei-2eee"
    assert info_hash(torrent) == hashlib.sha1(info).digest()
    with pytest.raises(ValueError):
        info_hash(b"d8:announce3:abce")


def test_chain_nodes_relay_a_file_in_order_over_loopback(tmp_path):
    data = os.urandom(3 * (1 << 20) + 12345)
    src = tmp_path / "model.bin"
    src.write_bytes(data)
    ports = [free_port(), free_port()]
    outs = [tmp_path / "r1.bin", tmp_path / "r2.bin"]
    procs = []
    try:  # the tail first: a node connects to its successor before it is ready
        for port, out, nxt in ((ports[1], outs[1], []), (ports[0], outs[0], [f"127.0.0.1:{ports[1]}"])):
            procs.append(subprocess.Popen([sys.executable, str(NODE), "recv", str(port), str(out), *nxt],
                                          stdout=subprocess.PIPE, text=True))
            assert procs[-1].stdout.readline().strip() == "ready"
        tail, mid = procs
        subprocess.run([sys.executable, str(NODE), "send", str(src), f"127.0.0.1:{ports[0]}"],
                       check=True, timeout=30)
        digests = [p.communicate(timeout=30)[0].strip() for p in (mid, tail)]
    finally:
        for p in procs:
            p.kill()
    want = blake3.blake3(data).hexdigest()
    assert digests == [want, want]
    assert [o.read_bytes() == data for o in outs] == [True, True]
