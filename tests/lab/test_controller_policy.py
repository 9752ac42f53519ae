"""On a real Open vSwitch fabric: a frame claiming a known receiver's address from another
host's port does not move the receiver (the rule REST follows: a known host is never
moved by a declaration). The controller probes the real host, which answers and stays;
its group stays installed."""

from __future__ import annotations

import time

import pytest

import topologies as T
from lab.sh import HOST_IFACE
from tests.support.controller_lab import controller_lab, wait_for

pytestmark = pytest.mark.lab

TOPO = T.leaf_spine(2, 3, 2)  # h1 h2 @leaf1, h3 h4 @leaf2, h5 h6 @leaf3; two spines


def where(ctl, ip: str) -> tuple[int, int, str] | None:
    for h in ctl.api("GET", "/v1/topology").json()["hosts"]:
        if h["ip"] == ip:
            return h["dpid"], h["port"], h["mac"]
    return None


def test_a_spoofed_claim_does_not_move_a_receiver(tmp_path):
    ip = {h.name: h.ip for h in TOPO.hosts}
    with controller_lab(TOPO, tmp_path) as (lab, ctl):
        assert lab.ping("h3", ip["h1"]) and lab.ping("h6", ip["h1"])  # all three learned
        r = ctl.api("POST", "/v1/groups", json={"model": "spoof", "source": ip["h1"],
                                                "receivers": [ip["h3"]]})
        assert r.status_code == 201, r.text
        gid = r.json()["id"]
        ctl.wait_group(gid, lambda g: g["state"] == "installed", timeout=15)
        assert wait_for(lambda: where(ctl, ip["h3"]) is not None, 5)
        home = where(ctl, ip["h3"])
        h3 = TOPO.host("h3")
        assert home[2] == h3.mac

        # h6 (another leaf) takes h3's address and a fresh MAC, and talks from them. (With
        # its own, learned MAC its frames would pass the source table unseen: it matches
        # port and MAC, so such a frame cannot move anything either.)
        lab.run("h6", "ip", "link", "set", HOST_IFACE, "address", "02:00:00:00:66:66")
        lab.run("h6", "ip", "addr", "add", f"{ip['h3']}/32", "dev", HOST_IFACE)
        lab.run("h6", "ping", "-n", "-c", "3", "-i", "0.3", "-W", "1", "-I", ip["h3"], ip["h1"],
                check=False, timeout=15)
        assert wait_for(lambda: "claims host " + ip["h3"] in ctl.log_text(), 5), ctl.log_text()
        time.sleep(4)  # past the incumbent's 3 probes: it answered, so it stays
        assert where(ctl, ip["h3"]) == home, ctl.log_text()
        g = ctl.api("GET", f"/v1/groups/{gid}").json()
        assert g["receivers"] == {ip["h3"]: "installed"} and g["state"] == "installed"
        assert lab.ping("h3", ip["h1"])  # the real h3 still talks
