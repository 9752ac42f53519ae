"""The controller on a real Open vSwitch fabric (userspace datapath, netns hosts):
groups created, changed, rerouted and torn down over REST, verified on the wire."""

from __future__ import annotations

import subprocess
import time

import pytest

import topologies as T
from lab.ovs import Lab
from lab.probes import Capture, member, send
from tests.support.controller_lab import controller_lab, wait_for

pytestmark = pytest.mark.lab

TOPO = T.leaf_spine(2, 3, 2)  # h1 h2 @leaf1, h3 h4 @leaf2, h5 h6 @leaf3; two spines
INTERVAL = 0.005  # sender: one datagram every 5 ms


@pytest.fixture(scope="module")
def fabric(tmp_path_factory):
    work = tmp_path_factory.mktemp("ovs")
    with controller_lab(TOPO, work) as (lab, ctl):
        for h in TOPO.hosts[1:]:  # hosts are learned from their own traffic
            assert lab.ping(h.name, "h1", count=1, wait=2), ctl.log_text()
        topo = ctl.api("GET", "/v1/topology").json()
        assert {h["ip"] for h in topo["hosts"]} == {h.ip for h in TOPO.hosts}, topo
        yield lab, ctl, work


def ovs_groups(lab: Lab) -> dict[int, str]:
    out = {}
    for dpid in TOPO.switches:
        out[dpid] = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-groups", lab.bridge(dpid)],
                                   capture_output=True, text=True, check=True).stdout
    return out


def test_group_lifecycle_join_leave_reroute_delete(fabric):
    lab, ctl, work = fabric
    ip = {h.name: h.ip for h in TOPO.hosts}
    t0 = time.monotonic()
    r = ctl.api("POST", "/v1/groups", json={"model": "llama-3-8b@sha256:abc", "source": ip["h1"],
                                            "receivers": [ip["h3"], ip["h5"]]})
    assert r.status_code == 201, r.text
    g = r.json()
    gid, group, port = g["id"], g["address"], g["port"]
    assert group.startswith("232.")
    g = ctl.wait_group(gid, lambda g: g["state"] == "installed")
    created_ms = (time.monotonic() - t0) * 1000
    assert g["receivers"] == {ip["h3"]: "installed", ip["h5"]: "installed"}
    # the same model and source again returns the same group
    again = ctl.api("POST", "/v1/groups", json={"model": "llama-3-8b@sha256:abc", "source": ip["h1"]})
    assert again.status_code == 200 and again.json()["id"] == gid

    probes = {h: Capture(lab, h, group, work) for h in ("h2", "h3", "h4", "h5", "h6")}
    time.sleep(0.5)
    sender = send(lab, "h1", group, port, INTERVAL, 100_000)
    try:
        assert wait_for(lambda: len(probes["h3"].seqs()) > 50 and len(probes["h5"].seqs()) > 50, 10)
        for h in ("h2", "h4", "h6"):
            assert probes[h].seqs() == [], f"non-receiver {h} got multicast"
        for h in ("h3", "h5"):  # exactly one copy of each datagram
            seqs = probes[h].seqs()
            assert len(seqs) == len(set(seqs)), f"{h} got duplicates"

        # join h4, leave h3
        assert ctl.api("PUT", f"/v1/groups/{gid}/receivers/{ip['h4']}").status_code == 200
        ctl.wait_group(gid, lambda g: g["receivers"].get(ip["h4"]) == "installed")
        assert wait_for(lambda: len(probes["h4"].seqs()) > 20, 5)
        assert ctl.api("DELETE", f"/v1/groups/{gid}/receivers/{ip['h3']}").status_code == 200
        ctl.wait_group(gid, lambda g: ip["h3"] not in g["receivers"])
        time.sleep(0.3)
        mark = time.time()
        time.sleep(0.5)
        assert probes["h3"].since(mark) == [], "h3 still receives after leaving"
        assert len(probes["h4"].since(mark)) > 20 and len(probes["h5"].since(mark)) > 20

        # take a link of the tree down: delivery resumes on the other spine
        g = ctl.api("GET", f"/v1/groups/{gid}").json()
        a, b = g["tree"]["links"][0]
        down_at = time.time()
        lab.set_link(a, b, False)
        try:
            def resumed() -> bool:
                return all(len(probes[h].since(down_at + 0.05)) > 5 for h in ("h4", "h5"))
            assert wait_for(resumed, 10), ctl.log_text()
            g2 = ctl.api("GET", f"/v1/groups/{gid}").json()
            assert [a, b] not in g2["tree"]["links"]
            # reroute time: the longest silence any receiver saw around the failure
            gaps = []
            for h in ("h4", "h5"):
                ts = [t for _, t in probes[h].records() if down_at - 1 <= t]
                gaps.append(max(y - x for x, y in zip(ts, ts[1:])))
            print(f"\nREST create->installed {created_ms:.0f} ms; link down -> delivery restored "
                  f"in at most {max(gaps) * 1000:.0f} ms")
        finally:
            lab.set_link(a, b, True)
    finally:
        sender.kill()
        sender.wait()

    # delete: 204, nothing of ours left on any switch, nothing delivered
    assert ctl.api("DELETE", f"/v1/groups/{gid}").status_code == 204
    assert all("group_id" not in text for text in ovs_groups(lab).values()), ovs_groups(lab)
    sender = send(lab, "h1", group, port, INTERVAL, 200)
    sender.wait(10)
    time.sleep(0.3)
    mark_total = {h: len(p.seqs()) for h, p in probes.items()}
    sender = send(lab, "h1", group, port, INTERVAL, 100)
    sender.wait(10)
    time.sleep(0.3)
    assert {h: len(p.seqs()) for h, p in probes.items()} == mark_total
    for p in probes.values():
        p.stop()


def test_controller_restart_does_not_interrupt_delivery(fabric):
    lab, ctl, work = fabric
    ip = {h.name: h.ip for h in TOPO.hosts}
    g = ctl.api("POST", "/v1/groups", json={"model": "restart-test", "source": ip["h2"],
                                            "receivers": [ip["h4"], ip["h6"]]}).json()
    gid = g["id"]
    ctl.wait_group(gid, lambda g: g["state"] == "installed")
    probes = {h: Capture(lab, h, g["address"], work) for h in ("h4", "h6")}
    time.sleep(0.3)
    sender = send(lab, "h2", g["address"], g["port"], INTERVAL, 100_000)
    try:
        assert wait_for(lambda: all(len(p.seqs()) > 20 for p in probes.values()), 10)
        ctl.stop()
        time.sleep(1.0)
        ctl.start()
        ctl.wait_topology(switches=len(TOPO.switches), links=len(TOPO.links))
        g2 = ctl.wait_group(gid, lambda g: g["state"] == "installed", timeout=20)
        assert g2["address"] == g["address"] and set(g2["receivers"]) == {ip["h4"], ip["h6"]}
        time.sleep(1.0)
    finally:
        sender.kill()
        sender.wait()
    for h, p in probes.items():
        seqs = p.seqs()
        lost = (max(seqs) - min(seqs) + 1) - len(set(seqs))
        assert lost == 0, f"{h} lost {lost} datagrams across the controller restart"
    log = ctl.log_text()
    assert "reconciled" in log
    assert ctl.api("DELETE", f"/v1/groups/{gid}").status_code == 204
    for p in probes.values():
        p.stop()


@pytest.mark.parametrize("mode", ["ssm", "v2"])
def test_igmp_membership_joins_and_leaves_the_group(fabric, mode):
    """An IGMPv3 INCLUDE(S) report joins the (S,G) group exactly as a REST join would;
    an IGMPv2 report joins every group on G; leaving removes the host again."""
    lab, ctl, work = fabric
    ip = {h.name: h.ip for h in TOPO.hosts}
    who = "h5" if mode == "ssm" else "h6"
    g = ctl.api("POST", "/v1/groups", json={"model": f"igmp-{mode}", "source": ip["h1"]}).json()
    gid = g["id"]
    assert g["receivers"] == {}
    if mode == "v2":
        lab.run(who, "sysctl", "-qw", "net.ipv4.conf.eth0.force_igmp_version=2")
    probe = Capture(lab, who, g["address"], work)
    proc = member(lab, who, mode, g["address"], ip["h1"], 4, ip[who])
    try:
        joined = ctl.wait_group(gid, lambda g: g["receivers"].get(ip[who]) == "installed", timeout=10)
        assert set(joined["receivers"]) == {ip[who]}
        sender = send(lab, "h1", g["address"], g["port"], INTERVAL, 200)
        sender.wait(10)
        assert wait_for(lambda: len(probe.seqs()) >= 190, 5), len(probe.seqs())
        ctl.wait_group(gid, lambda g: ip[who] not in g["receivers"], timeout=15)
    finally:
        proc.kill()
        proc.wait()
        probe.stop()
        if mode == "v2":
            lab.run(who, "sysctl", "-qw", "net.ipv4.conf.eth0.force_igmp_version=0")
    assert ctl.api("DELETE", f"/v1/groups/{gid}").status_code == 204
