import json

import networkx as nx
import pytest

import topologies as t
from tests.support.lab import skip_or_fail


@pytest.mark.parametrize("spec,switches,hosts,links", [
    ("linear:3", 3, 3, 2),
    ("ring:5,2", 5, 10, 5),
    ("leaf-spine:2,4,2", 6, 8, 8),
    ("fat_tree:4", 20, 16, 32),
])
def test_families_have_expected_shape_and_are_connected(spec, switches, hosts, links):
    topo = t.parse(spec)
    assert (len(topo.switches), len(topo.hosts), len(topo.links)) == (switches, hosts, links)
    g = topo.graph()
    assert nx.is_connected(g)
    # every edge names a port on each of its ends, and no switch port is used twice
    seen = set()
    for u, v, d in g.edges(data=True):
        assert set(d["ports"]) == {u, v}
        for node, port in d["ports"].items():
            if g.nodes[node]["kind"] == "switch":
                assert (node, port) not in seen
                seen.add((node, port))


def test_fat_tree_16_is_the_standard_k_ary_fat_tree():
    topo = t.fat_tree(16)
    assert len(topo.switches) == 5 * 16 * 16 // 4
    assert len(topo.hosts) == 16 ** 3 // 4
    g = topo.graph()
    assert all(g.degree(d) == 16 for d in topo.switches)


def test_same_parameters_give_identical_topologies():
    assert t.leaf_spine(2, 3, 2) == t.leaf_spine(2, 3, 2)


def test_load_from_json_and_yaml(tmp_path):
    data = {"name": "tri", "switches": ["s1", "s2", {"name": "s3", "dpid": 9}],
            "links": [["s1", "s2"], {"a": "s2", "b": "s3", "a_port": 7}, ["s3", "s1"]],
            "hosts": [{"switch": "s1"}, {"switch": "s3", "name": "gpu", "ip": "10.1.0.5"}]}
    (tmp_path / "t.json").write_text(json.dumps(data))
    import yaml
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    a, b = t.from_file(tmp_path / "t.json"), t.parse(f"file:{tmp_path / 't.yaml'}")
    assert a == b
    assert a.switch_dpid("s3") == 9
    assert a.host("gpu").ip == "10.1.0.5" and a.host("gpu").dpid == 9
    assert any(link.a_port == 7 for link in a.links)


@pytest.mark.parametrize("topo", [t.leaf_spine(2, 3, 2), t.fat_tree(4), t.ring(5, 2)], ids=str)
def test_what_the_controller_found_saves_as_a_fabric_to_pin(tmp_path, topo):
    """GET /v1/topology saved to a file loads as the same fabric (``--fabric file:...``)."""
    from controller.linkgate import LinkGate
    from controller.topoview import LinkKey
    from tests.support.controller_env import make_env

    found = make_env(topo).service.topology()
    (tmp_path / "fabric.json").write_text(json.dumps(found))
    pinned = t.parse(f"file:{tmp_path / 'fabric.json'}")
    keys = {LinkKey.make(lk.a, lk.a_port, lk.b, lk.b_port) for lk in topo.links}
    assert LinkGate(pinned).pinned == keys
    assert sorted(pinned.switches) == sorted(topo.switches)
    assert {(h.ip, h.mac, h.dpid, h.port) for h in pinned.hosts} == {
        (h.ip, h.mac, h.dpid, h.port) for h in topo.hosts}


@pytest.mark.parametrize("bad,msg", [
    ({"switches": ["s1"], "links": [["s1", "s1"]]}, "itself"),
    ({"switches": ["s1", "s2"], "links": [["s1", "s2"], ["s2", "s1"]]}, "parallel"),
    ({"switches": ["s1"], "hosts": [{"switch": "s1", "ip": "10.0.0.300"}]}, "bad IPv4"),
    ({"switches": ["s1", "s2"], "links": [{"a": "s1", "b": "s2", "a_port": 1}],
      "hosts": [{"switch": "s1", "port": 1}]}, "already used"),
    ({"switches": ["s1"], "links": [["s1", "s9"]]}, "unknown switch"),
    ({"switches": [1, 2], "links": [{"a": 1, "a_port": 1, "b": 3, "b_port": 1}]}, "unknown switch dpid 3"),
    ({"links": []}, "malformed"),
])
def test_bad_definitions_are_rejected_with_a_clear_message(bad, msg):
    with pytest.raises(t.TopologyError, match=msg):
        t.from_dict(bad)


@pytest.mark.parametrize("spec", ["mesh:3", "ring:2", "fat-tree:3", "linear:x", "linear:1,2,3,4"])
def test_bad_specs_are_rejected(spec):
    with pytest.raises(t.TopologyError):
        t.parse(spec)


def test_mininet_topo_matches_the_graph():
    try:
        import mininet.topo as mn_topo
    except ImportError:
        skip_or_fail("Mininet (Debian package) not installed: `make test` as root installs it "
                     "(scripts/lab-deps.sh) and links it into the venv (scripts/venv-mininet.sh)")
    ns: dict = {}
    exec(compile(open("topologies/mn.py").read(), "topologies/mn.py", "exec"), ns, ns)
    spec = t.leaf_spine(2, 3, 2)
    topo = ns["topos"]["leaf_spine"](2, 3, 2)
    assert isinstance(topo, mn_topo.Topo)
    names = {dpid: name for dpid, name in spec.switches.items()}
    for h in spec.hosts:
        assert topo.nodeInfo(h.name)["ip"] == h.ip + "/8"
        assert topo.nodeInfo(h.name)["mac"] == h.mac
        assert topo.port(h.name, names[h.dpid]) == (0, h.port)
    for link in spec.links:
        assert topo.port(names[link.a], names[link.b]) == (link.a_port, link.b_port)
    for dpid, name in names.items():
        assert int(topo.nodeInfo(name)["dpid"], 16) == dpid
