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
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

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


# run inside a host's netns: N ARP requests 0.5 s apart whose sender is ADDRESS (another
# host's), out of eth0
CLAIM = r'''
import socket, struct, sys, time
address, n = socket.inet_aton(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind(("eth0", 0))
mac = s.getsockname()[4]
frame = (b"\xff" * 6 + mac + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1)
         + mac + address + b"\x00" * 6 + socket.inet_aton("10.0.0.1"))
for _ in range(n):
    s.send(frame)
    time.sleep(0.5)
'''

# run inside a host's netns: "recv" writes every discovery frame the host's port sends it
# to stdout (length-prefixed); "send" sends each one read from stdin out of the host's port
RELAY = r'''
import socket, struct, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88CC))
s.bind(("eth0", 0))
if sys.argv[1] == "recv":
    while True:
        data, addr = s.recvfrom(2048)
        if addr[2] != socket.PACKET_OUTGOING:
            sys.stdout.buffer.write(struct.pack("!H", len(data)) + data)
            sys.stdout.buffer.flush()
else:
    while len(head := sys.stdin.buffer.read(2)) == 2:
        s.send(sys.stdin.buffer.read(struct.unpack("!H", head)[0]))
'''


@contextmanager
def relay(lab, a: str, b: str, work: Path) -> Iterator[None]:
    """Hosts ``a`` and ``b`` relay discovery frames to each other (both ways) until the
    block ends; the relay processes are stopped by PID."""
    script = work / "relay.py"
    script.write_text(RELAY)
    procs: list[subprocess.Popen] = []
    try:
        for src, dst in ((a, b), (b, a)):
            rx = subprocess.Popen(["ip", "netns", "exec", lab._netns[src], sys.executable, str(script), "recv"],
                                  stdout=subprocess.PIPE)
            procs.append(rx)
            procs.append(subprocess.Popen(["ip", "netns", "exec", lab._netns[dst], sys.executable,
                                           str(script), "send"], stdin=rx.stdout))
            rx.stdout.close()  # (the sender holds the pipe now)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def links(ctl) -> set[tuple[int, int, int, int]]:
    out = set()
    for link in ctl.client.topology()["links"]:
        if link.get("up", True):
            a, b = (link["a"], link["a_port"]), (link["b"], link["b_port"])
            out.add((*min(a, b), *max(a, b)))
    return out


def installed_group(lab, ctl, model: str, source: str, receivers: list[str]) -> tuple[int, list]:
    """Every host pings h1 (so all are known); a group from ``source`` to ``receivers``
    (host names) is created and installed: (its id, its tree's links)."""
    for h in TOPO.hosts[1:]:
        assert lab.ping(h.name, "h1", count=1, wait=2), ctl.log_text()
    ip = {h.name: h.ip for h in TOPO.hosts}
    r = ctl.api("POST", "/v1/groups", json={"model": model, "source": ip[source],
                                            "receivers": [ip[r] for r in receivers]})
    assert r.status_code == 201, r.text
    gid = r.json()["id"]
    return gid, ctl.wait_group(gid, lambda g: g["state"] == "installed")["tree"]["links"]


def test_forged_and_replayed_discovery_frames_from_a_host_change_no_link(tmp_path):
    with controller_lab(TOPO, tmp_path) as (lab, ctl):
        gid, tree = installed_group(lab, ctl, "lldp-test", "h1", ["h3", "h5"])
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


RELAY_S = 4.0  # Ryu sends each port's discovery frame about every 0.9 s


def watch_links(ctl, seconds: float) -> list[set]:
    seen, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        seen.append(links(ctl))
        time.sleep(0.1)
    return seen


def test_discovery_frames_relayed_between_two_known_hosts_make_no_link(tmp_path):
    """h1 (leaf 3) and h3 (leaf 4), both known to the controller, relay the frames their
    ports send them: before, leaves 3 and 4 got a one-hop link through the two hosts
    within a few seconds, both hosts were forgotten and trees moved onto it."""
    with controller_lab(TOPO, tmp_path) as (lab, ctl):
        gid, tree = installed_group(lab, ctl, "relay-test", "h2", ["h4", "h6"])
        ip = {h.name: h.ip for h in TOPO.hosts}
        before = links(ctl)
        hosts = {h["ip"] for h in ctl.client.topology()["hosts"]}
        assert {ip["h1"], ip["h3"]} <= hosts
        t0 = time.monotonic()
        with relay(lab, "h1", "h3", tmp_path):
            seen = watch_links(ctl, RELAY_S)
            fabric = ctl.api("GET", "/v1/health").json()["fabric"]
        assert all(s == before for s in seen), [s ^ before for s in seen if s != before]
        assert fabric["pinned"] is False and fabric["refused_total"] >= 1, fabric
        h1, h3 = TOPO.host("h1"), TOPO.host("h3")
        assert [(x["a"], x["a_port"], x["b"], x["b_port"]) for x in fabric["refused"]] == [
            (*min((h1.dpid, h1.port), (h3.dpid, h3.port)), *max((h1.dpid, h1.port), (h3.dpid, h3.port)))]
        assert {h["ip"] for h in ctl.client.topology()["hosts"]} == hosts  # nobody forgotten
        g = ctl.client.get_group(gid)
        assert g["tree"]["links"] == tree and g["state"] == "installed"
        log = ctl.log_text()
        said = [ln for ln in log.splitlines() if "not believed" in ln]
        assert said and ip["h1"] in said[0] and ip["h3"] in said[0], log[-2000:]
    print(f"\nh1 <-> h3 relaying discovery frames for {RELAY_S:.0f} s: links unchanged in "
          f"{len(seen)} looks, {fabric['refused_total']} reports refused, tree and hosts unchanged "
          f"({time.monotonic() - t0:.1f} s)")


def test_a_pinned_fabric_refuses_a_relay_between_hosts_that_never_spoke(tmp_path):
    """h2 and h4 send nothing of their own, so without --fabric no host would be attached
    at their ports and the default rule would believe their relay; with it the link is
    refused. The fabric's hosts are pinned: known from the start, so a group to the silent
    h4 installs at once."""
    spec = "leaf-spine:2,3,2"
    assert T.parse(spec).links == TOPO.links
    with controller_lab(TOPO, tmp_path, args=["--fabric", spec]) as (lab, ctl):
        before = links(ctl)
        known = {h["ip"] for h in ctl.client.topology()["hosts"]}
        assert known == {h.ip for h in TOPO.hosts}
        r = ctl.api("POST", "/v1/groups", json={"model": "pinned", "source": TOPO.host("h1").ip,
                                                "receivers": [TOPO.host("h4").ip]})
        assert r.status_code == 201, r.text
        ctl.wait_group(r.json()["id"], lambda g: g["state"] == "installed")
        with relay(lab, "h2", "h4", tmp_path):
            seen = watch_links(ctl, RELAY_S)
        assert all(s == before for s in seen), [s ^ before for s in seen if s != before]
        # h4 answers no ARP (a host that is busy, hung or rebooting), and h2 claims its
        # address for 5 s: unpinned, h4 would be forgotten after 3 unanswered probes and h2
        # take its place; pinned, every claim is dropped and h4 stays
        script = tmp_path / "claim.py"
        script.write_text(CLAIM)
        h4 = TOPO.host("h4")
        subprocess.run(["ip", "netns", "exec", lab._netns["h4"], "ip", "link", "set", "eth0", "arp", "off"],
                       check=True)
        subprocess.run(["ip", "netns", "exec", lab._netns["h2"], sys.executable, str(script), h4.ip, "10"],
                       check=True, timeout=30)
        at = {h["ip"]: (h["dpid"], h["port"], h["mac"]) for h in ctl.client.topology()["hosts"]}
        assert at[h4.ip] == (h4.dpid, h4.port, h4.mac), at[h4.ip]
        assert ctl.client.get_group(r.json()["id"])["state"] == "installed"
        assert f"claims host {h4.ip}'s address from elsewhere: dropped" in ctl.log_text()
        health = ctl.api("GET", "/v1/health").json()["fabric"]
        assert health["pinned"] is True and health["missing_links"] == [], health
        assert health["refused_total"] >= 1 and health["refused"][0]["why"].startswith(
            "not a link of the pinned fabric"), health
        assert re.search(r'^modelcast_links_refused_total\{why="not pinned"\} [1-9]',
                         ctl.api("GET", "/metrics").text, re.M)
    print(f"\nh2 <-> h4 (silent) relaying for {RELAY_S:.0f} s with --fabric {spec}: links unchanged in "
          f"{len(seen)} looks, {health['refused_total']} reports refused")


def test_a_declared_host_keeps_its_address_without_a_fabric(tmp_path):
    """Without --fabric, h4 (which never sent a frame) is declared over REST; a group to
    it installs at once. h4 then answers no ARP and h2 claims its address for 5 s: an
    undeclared silent host would lose it to h2 (at once, having never spoken); declared,
    every claim is dropped and h4 stays, until the declaration is removed."""
    with controller_lab(TOPO, tmp_path) as (lab, ctl):
        h1, h2, h4 = TOPO.host("h1"), TOPO.host("h2"), TOPO.host("h4")
        assert h4.ip not in {h["ip"] for h in ctl.client.topology()["hosts"]}
        r = ctl.api("POST", "/v1/hosts", json={"ip": h4.ip, "mac": h4.mac, "dpid": h4.dpid, "port": h4.port})
        assert r.status_code == 201, r.text
        r = ctl.api("POST", "/v1/groups", json={"model": "declared", "source": h1.ip, "receivers": [h4.ip]})
        assert r.status_code == 201, r.text
        ctl.wait_group(r.json()["id"], lambda g: g["state"] == "installed")
        script = tmp_path / "claim.py"
        script.write_text(CLAIM)
        subprocess.run(["ip", "netns", "exec", lab._netns["h4"], "ip", "link", "set", "eth0", "arp", "off"],
                       check=True)
        t0 = time.monotonic()
        subprocess.run(["ip", "netns", "exec", lab._netns["h2"], sys.executable, str(script), h4.ip, "10"],
                       check=True, timeout=30)
        claimed_s = time.monotonic() - t0
        at = {h["ip"]: (h["dpid"], h["port"], h["mac"]) for h in ctl.client.topology()["hosts"]}
        assert at[h4.ip] == (h4.dpid, h4.port, h4.mac), at[h4.ip]
        assert ctl.client.get_group(r.json()["id"])["receivers"] == {h4.ip: "installed"}
        log = ctl.log_text()
        assert f"claims host {h4.ip}'s address from elsewhere: dropped (declared over REST" in log, log[-2000:]
        # the declaration removed, the next claim teaches h2's place (h4 is silent)
        assert ctl.api("DELETE", f"/v1/hosts/{h4.ip}").status_code == 204
        subprocess.run(["ip", "netns", "exec", lab._netns["h2"], sys.executable, str(script), h4.ip, "4"],
                       check=True, timeout=30)
        at = {h["ip"]: (h["dpid"], h["port"]) for h in ctl.client.topology()["hosts"]}
        assert at.get(h4.ip) == (h2.dpid, h2.port), at.get(h4.ip)
    print(f"\nh2 claiming the declared, silent h4's address 10 times over {claimed_s:.1f} s: every "
          "claim refused, h4 kept; after DELETE /v1/hosts the next claims were learned")
