"""A hostile host on the Open vSwitch lab forges link discovery (LLDP) frames.

Ryu's discovery frames carry no secret, and every host sees them (they leave every switch
port). A host sending one that claims to come from spine 1's port to the host's leaf
made the controller drop that real link and believe one into the host's own port: every
group through it was rerouted, and sent again every second the link flapped for as long
as the host liked. The controller now signs its frames (``controller.lldpauth``): the
forged ones, and a genuine one replayed by the host into its own port, change nothing."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

import topologies as T
from tests.support.controller_lab import controller_lab

pytestmark = pytest.mark.lab

TOPO = T.leaf_spine(2, 3, 2)  # h1 h2 @leaf 3, h3 h4 @leaf 4, h5 h6 @leaf 5; spines 1, 2

# run inside the host's netns: Ryu's plain discovery frame for dpid:port, sent N times
# 0.2 s apart out of eth0; and every frame the host receives in the meantime replayed
# back out of eth0 (a genuine, signed frame from its own switch port)
FORGER = r'''
import select, socket, struct, sys, time
dpid, port, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def tlv(t, v): return struct.pack("!H", (t << 9) | len(v)) + v
frame = (bytes.fromhex("0180c200000e020000000099") + b"\x88\xcc"
         + tlv(1, b"\x07" + b"dpid:%016x" % dpid) + tlv(2, b"\x02" + struct.pack("!I", port))
         + tlv(3, struct.pack("!H", 120)) + tlv(0, b""))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88CC))
s.bind(("eth0", 0))
replayed = 0
for _ in range(n):
    s.send(frame)
    end = time.monotonic() + 0.2
    while (left := end - time.monotonic()) > 0:
        if select.select([s], [], [], left)[0]:
            data, addr = s.recvfrom(2048)
            if addr[2] != socket.PACKET_OUTGOING:
                s.send(data)
                replayed += 1
print(replayed)
'''


def links(ctl) -> set[tuple[int, int, int, int]]:
    out = set()
    for link in ctl.client.topology()["links"]:
        if link.get("up", True):
            a, b = (link["a"], link["a_port"]), (link["b"], link["b_port"])
            out.add((*min(a, b), *max(a, b)))
    return out


def test_forged_and_replayed_discovery_frames_from_a_host_change_no_link(tmp_path):
    with controller_lab(TOPO, tmp_path) as (lab, ctl):
        for h in TOPO.hosts[1:]:
            assert lab.ping(h.name, "h1", count=1, wait=2), ctl.log_text()
        ip = {h.name: h.ip for h in TOPO.hosts}
        r = ctl.api("POST", "/v1/groups", json={"model": "lldp-test", "source": ip["h1"],
                                                "receivers": [ip["h3"], ip["h5"]]})
        assert r.status_code == 201, r.text
        gid = r.json()["id"]
        tree = ctl.wait_group(gid, lambda g: g["state"] == "installed")["tree"]["links"]
        before = links(ctl)
        assert len(before) == len(TOPO.links)
        spine, leaf = next((p, c) for p, c in tree if p in (1, 2))  # a tree link from a spine
        spine_port = next(lk.a_port if lk.a == spine else lk.b_port for lk in TOPO.links
                          if {lk.a, lk.b} == {spine, leaf})
        script = tmp_path / "forge.py"
        script.write_text(FORGER)
        # h1 claims the spine's tree port is cabled to h1's own port, 15 times over 3 s
        forger = subprocess.Popen(["ip", "netns", "exec", lab._netns["h1"], sys.executable, str(script),
                                   str(spine), str(spine_port), "15"], stdout=subprocess.PIPE, text=True)
        seen = []
        try:
            while forger.poll() is None:
                seen.append(links(ctl))
                time.sleep(0.1)
            replayed = int(forger.stdout.read().strip() or 0)
        finally:
            if forger.poll() is None:
                forger.kill()
            forger.wait()
        assert forger.returncode == 0
        time.sleep(1.0)  # what the last frames would have done
        seen.append(links(ctl))
        assert all(s == before for s in seen), [s ^ before for s in seen if s != before]
        g = ctl.client.get_group(gid)
        assert g["tree"]["links"] == tree and g["state"] == "installed"
        log = ctl.log_text()
        assert not re.search(r"link .* lost", log), log[-2000:]
        refused = float(re.search(r"^modelcast_lldp_refused (\S+)$", ctl.api("GET", "/metrics").text,
                                  re.M).group(1))
        assert refused >= 15, refused  # (Ryu's genuine frames replayed into their own port:
        # the same switch on both ends, which Ryu ignores before checking anything)
        assert "refused a discovery frame claiming switch" in log
    print(f"\n15 forged discovery frames and {replayed} replayed ones from h1 over 3 s: "
          f"links unchanged in {len(seen)} looks, the group's tree unchanged, {refused:.0f} refused")
