"""Hosts that never broadcast, on a real Open vSwitch fabric: every host's ARP cache is
filled by hand (``nud permanent``), so no host ever sends an ARP request. The controller
still learns a host from its first frame (the source table), and a group naming hosts it
has never seen gets every receiver installed (ARP probes find them) and a multicast
stream reaches exactly them."""

from __future__ import annotations

import time

import pytest

import topologies as T
from lab.controller import Controller
from lab.ovs import Lab
from lab.probes import Capture, send
from lab.sh import HOST_IFACE
from tests.support.controller_lab import controller_lab, wait_for

pytestmark = pytest.mark.lab

TOPO = T.leaf_spine(2, 3, 2)  # h1 h2 @leaf1, h3 h4 @leaf2, h5 h6 @leaf3; two spines
INTERVAL = 0.005


def known_hosts(ctl: Controller) -> set[str]:
    return {h["ip"] for h in ctl.api("GET", "/v1/topology").json()["hosts"]}


def fill_arp_caches(lab: Lab) -> None:
    """Every host knows every peer's MAC for good: it never sends an ARP request."""
    for h in TOPO.hosts:
        for peer in TOPO.hosts:
            if peer is not h:
                lab.run(h.name, "ip", "neigh", "replace", peer.ip, "lladdr", peer.mac,
                        "dev", HOST_IFACE, "nud", "permanent")


@pytest.fixture(scope="module")
def silent(tmp_path_factory):
    """Controller + lab whose hosts never ARP."""
    work = tmp_path_factory.mktemp("silent")
    with controller_lab(TOPO, work, fill_arp_caches) as (lab, ctl):
        yield lab, ctl, work


def test_silent_hosts_are_learned_from_their_first_frame_and_found_by_probing(silent):
    lab, ctl, work = silent
    ip = {h.name: h.ip for h in TOPO.hosts}
    time.sleep(1.0)
    assert known_hosts(ctl) == set(), "the hosts were meant to stay silent until now"

    # h2 sends one unicast datagram to h1, whose MAC it already knows: no broadcast, yet
    # its first frame reaches the controller through the source table
    send(lab, "h2", ip["h1"], 9, 0, 1).wait(10)
    assert wait_for(lambda: ip["h2"] in known_hosts(ctl), 5), ctl.log_text()

    # a group naming receivers the controller has never seen (the source h1 may be known
    # from its answer to h2): accepted, receivers pending, found by ARP probes and
    # installed without any further call
    t0 = time.monotonic()
    r = ctl.api("POST", "/v1/groups", json={"model": "silent-hosts", "source": ip["h1"],
                                            "receivers": [ip["h3"], ip["h5"]]})
    assert r.status_code == 201, r.text
    g = r.json()
    assert set(g["receivers"].values()) <= {"pending", "installed"}
    g = ctl.wait_group(g["id"], lambda g: g["state"] == "installed", timeout=15)
    assert g["receivers"] == {ip["h3"]: "installed", ip["h5"]: "installed"}, ctl.log_text()
    print(f"\nREST create naming 2 never-seen receivers -> both installed in "
          f"{(time.monotonic() - t0) * 1000:.0f} ms")
    assert {ip["h1"], ip["h3"], ip["h5"]} <= known_hosts(ctl)
    assert ip["h4"] not in known_hosts(ctl)  # never sent a frame and nobody asked for it

    probes = {h: Capture(lab, h, g["address"], work) for h in ("h3", "h4", "h5")}
    try:
        time.sleep(0.3)
        sender = send(lab, "h1", g["address"], g["port"], INTERVAL, 200)
        sender.wait(15)
        assert wait_for(lambda: all(len(probes[h].seqs()) >= 190 for h in ("h3", "h5")), 5), \
            {h: len(p.seqs()) for h, p in probes.items()}
        assert probes["h4"].seqs() == [], "a non-receiver got multicast"
        for h in ("h3", "h5"):
            seqs = probes[h].seqs()
            assert len(seqs) == len(set(seqs)), f"{h} got duplicates"
    finally:
        for p in probes.values():
            p.stop()
    assert ctl.api("DELETE", f"/v1/groups/{g['id']}").status_code == 204
