"""Which discovered links are believed (``controller.linkgate``): a relay of genuine,
signed discovery frames between two hosts must not make a link -- never with a pinned
fabric, and not between two ports where hosts are attached without one; every real
link of the fabric is believed either way."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

import topologies as T
from controller.linkgate import REFUSED_KEPT, LinkGate
from controller.topoview import LinkKey, TopologyView

TOPOLOGIES = st.one_of(
    st.builds(T.linear, st.integers(2, 5), st.integers(1, 3)),
    st.builds(T.ring, st.integers(3, 6), st.integers(1, 2)),
    st.builds(T.leaf_spine, st.integers(1, 3), st.integers(2, 4), st.integers(1, 3)),
    st.builds(T.fat_tree, st.just(4)),
)


def host_ports(topo: T.Topology) -> list[tuple[int, int]]:
    return [(h.dpid, h.port) for h in topo.hosts]


@settings(max_examples=60, deadline=None)
@given(TOPOLOGIES, st.booleans(), st.data())
def test_every_real_link_is_believed_and_no_relay_between_two_hosts(topo, pinned, data):
    view = TopologyView.from_topology(topo)
    gate = LinkGate(topo if pinned else None)
    for lk in topo.links:  # rediscovered (a controller restart, a flap): believed
        assert gate.check(view, lk.a, lk.a_port, lk.b, lk.b_port) is None
        assert gate.check(view, lk.b, lk.b_port, lk.a, lk.a_port) is None
    ports = host_ports(topo)
    (a, ap), (b, bp) = data.draw(st.sampled_from([p for p in itertools.combinations(ports, 2)
                                                  if p[0] != p[1]]))
    before = (set(view.links), dict(view.hosts))
    r = gate.check(view, a, ap, b, bp)
    assert r is not None and r.link == LinkKey.make(a, ap, b, bp)
    assert r.kind == ("not pinned" if pinned else "host ports")
    assert (set(view.links), dict(view.hosts)) == before  # checking changes nothing
    assert gate.refused_total == 1 and list(gate.refused) == [r.link]


@settings(max_examples=40, deadline=None)
@given(TOPOLOGIES, st.data())
def test_a_pinned_fabric_refuses_any_other_link_even_between_ports_no_host_spoke_from(topo, data):
    """The relay that the default rule lets through: hosts that stayed silent until it."""
    view = TopologyView.from_topology(topo)
    for ip in list(view.hosts):
        view.remove_host(ip)
    (a, ap), (b, bp) = data.draw(st.sampled_from(list(itertools.combinations(host_ports(topo), 2))))
    assert LinkGate().check(view, a, ap, b, bp) is None  # without a pin: believed (documented)
    refused = LinkGate(topo).check(view, a, ap, b, bp)
    assert refused is not None and "pinned fabric" in refused.why


def test_a_link_with_a_host_at_one_end_only_is_believed():
    """A host learned on a switch port before the link behind it was discovered (a start-up
    race): the link is real, and the host is forgotten when the view takes the link."""
    topo = T.leaf_spine(2, 3, 2)
    view = TopologyView.from_topology(topo)
    h1 = topo.hosts[0]
    spine_port = 10 + 0  # a port of spine 1 that no link uses
    assert LinkGate().check(view, 1, spine_port, h1.dpid, h1.port) is None
    assert LinkGate.hosts_at(view, h1.dpid, h1.port) == [h1.ip]


def test_hosts_behind_a_port_that_went_down_are_not_counted():
    topo = T.leaf_spine(2, 3, 2)
    view = TopologyView.from_topology(topo)
    h1, h3 = topo.hosts[0], topo.hosts[2]
    view.port_down(h1.dpid, h1.port)  # h1 unplugged, a switch cabled there instead
    assert LinkGate().check(view, h1.dpid, h1.port, h3.dpid, h3.port) is None


def test_the_refusal_names_both_hosts_and_says_what_to_do():
    topo = T.leaf_spine(2, 3, 2)
    view = TopologyView.from_topology(topo)
    h1, h3 = topo.hosts[0], topo.hosts[2]
    r = LinkGate().check(view, h1.dpid, h1.port, h3.dpid, h3.port)
    assert h1.ip in r.why and h3.ip in r.why and "--fabric" in r.why


def test_health_reports_missing_pinned_links_and_the_latest_refusals_once_each():
    topo = T.leaf_spine(2, 3, 2)
    view = TopologyView.from_topology(topo)
    gate = LinkGate(topo)
    lk = topo.links[0]
    view.remove_link(lk.a, lk.a_port, lk.b, lk.b_port)
    ports = host_ports(topo)
    for _ in range(2):  # each direction of one relayed link, twice
        gate.check(view, *ports[0], *ports[1])
        gate.check(view, *ports[1], *ports[0])
    h = gate.health(view)
    assert h["pinned"] is True
    k = LinkKey.make(lk.a, lk.a_port, lk.b, lk.b_port)
    assert h["missing_links"] == [{"a": k.a, "a_port": k.a_port, "b": k.b, "b_port": k.b_port}]
    assert h["refused_total"] == 4 and len(h["refused"]) == 1
    assert h["refused"][0]["why"].startswith("not a link of the pinned fabric")
    for i in range(REFUSED_KEPT + 4):  # more than are kept: the latest stay
        gate.check(view, 3, 100 + i, 4, 100 + i)
    kept = gate.health(view)["refused"]
    assert len(kept) == REFUSED_KEPT and kept[-1]["a_port"] == 100 + REFUSED_KEPT + 3
    other = topo.links[1]
    view.port_down(other.a, other.a_port)  # still a known link, but not up
    assert len(gate.health(view)["missing_links"]) == 2
    assert h["pinned_hosts"] == len(topo.hosts)
    assert LinkGate().health(view) == {"pinned": False, "pinned_hosts": 0, "missing_links": [],
                                       "refused_total": 0, "refused": []}


def test_restored_links_stay_only_if_pinned():
    topo = T.leaf_spine(2, 3, 2)
    gate = LinkGate(topo)
    assert all(gate.allowed(LinkKey.make(lk.a, lk.a_port, lk.b, lk.b_port)) for lk in topo.links)
    assert not gate.allowed(LinkKey.make(3, 3, 4, 3))
    assert LinkGate().allowed(LinkKey.make(3, 3, 4, 3))
