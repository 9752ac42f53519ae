"""Open vSwitch + netns lab (lab/ovs.py). Lab tests need root and a running
ovs-vswitchd: off CI they skip with the reason, under CI=true a missing lab is a failure.

All traffic stays between namespaces the lab creates (10.0.0.0/8 on lab veths, multicast
with TTL 1 routed out of the namespace's eth0)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import lab.ovs as labmod
from lab.ovs import Lab
from lab.sh import LabError, leftovers, sh
from topologies.spec import leaf_spine, linear, ring
from tests.support.lab import need_lab, skip_or_fail

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lab_env() -> None:
    need_lab()


def _sh(*cmd: str) -> str:
    return sh(cmd).stdout


def ovs_ofport(ifname: str) -> int:
    return int(_sh("ovs-vsctl", "get", "Interface", ifname, "ofport").strip())


# ------------------------------------------------------------------------ no root needed

def test_cli_rejects_bad_topology(capsys: pytest.CaptureFixture[str]) -> None:
    assert labmod.main(["up", "nosuch:1"]) == 2
    assert "unknown topology family" in capsys.readouterr().err
    assert labmod.main(["up", "ring:2"]) == 2  # a ring needs >= 3 switches


def test_cli_not_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(labmod.os, "geteuid", lambda: 1000)
    assert labmod.main(["up", "linear:2"]) == 1
    assert "needs root" in capsys.readouterr().err


def test_bad_arguments() -> None:
    with pytest.raises(LabError, match="fail_mode"):
        Lab(linear(2), fail_mode="open")
    with pytest.raises(LabError, match="prefix"):
        Lab(linear(2), prefix="much-too-long")


def test_has_loop() -> None:
    assert labmod.has_loop(ring(3)) and labmod.has_loop(leaf_spine(2, 2, 1))
    assert not labmod.has_loop(linear(4)) and not labmod.has_loop(leaf_spine(1, 4, 1))
    assert Lab(ring(3), controller=None, fail_mode="standalone").stp is True
    assert Lab(ring(3)).stp is False  # secure mode: the controller handles loops
    assert Lab(linear(3), controller=None, fail_mode="standalone").stp is False


# ------------------------------------------------------------------------------ lab tests

TCP_SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.create_server((sys.argv[1], 5001))
    print("ready", flush=True)
    s.settimeout(10)
    c, _ = s.accept()
    c.settimeout(10)
    n = 0
    while (b := c.recv(65536)):
        n += len(b)
    print(n, flush=True)
""")
TCP_CLIENT = ("import socket, sys; c = socket.create_connection((sys.argv[1], 5001), timeout=10); "
              "c.sendall(b'x' * (4 << 20)); c.close()")


@pytest.mark.lab
def test_linear3_standalone_ping_ports_and_cleanup(lab_env: None) -> None:
    topo = linear(3)
    lab = Lab(topo, controller=None, fail_mode="standalone")
    with lab:
        base = lab.base
        names = [lab.bridge(d) for d in topo.switches]
        names += [lab.switch_port_iface(link.a, link.a_port) for link in topo.links]
        names += [lab.switch_port_iface(h.dpid, h.port) for h in topo.hosts]
        assert all(len(n) <= 15 and n.startswith(base) for n in names)
        for link in topo.links:
            assert ovs_ofport(lab.switch_port_iface(link.a, link.a_port)) == link.a_port
            assert ovs_ofport(lab.switch_port_iface(link.b, link.b_port)) == link.b_port
        for h in topo.hosts:
            assert ovs_ofport(lab.switch_port_iface(h.dpid, h.port)) == h.port
            assert lab.ns(h.ip) == lab.ns(h.name)
            shown = lab.run(h.name, "ip", "-o", "addr", "show", lab.host_iface(h.name)).stdout
            assert f"{h.ip}/8" in shown
            assert h.mac in lab.run(h.name, "ip", "-o", "link", "show", "eth0").stdout
        dpid = _sh("ovs-vsctl", "get", "bridge", lab.bridge(2), "other-config:datapath-id")
        assert dpid.strip().strip('"') == "%016x" % 2
        first, last = topo.hosts[0], topo.hosts[-1]
        ping = lab.run(first.name, "ping", "-c", "2", "-W", "2", last.ip, check=False) \
            if shutil.which("ping") else None
        assert ping is None or ping.returncode == 0, ping.stdout + ping.stderr
        assert lab.ping(first.name, last.name)
        # TCP through the userspace datapath (needs tx checksum offload off on eth0).
        srv = lab.popen(last.name, sys.executable, "-c", TCP_SERVER, last.ip,
                        stdout=subprocess.PIPE, text=True)
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        lab.run(first.name, sys.executable, "-c", TCP_CLIENT, last.ip, timeout=20)
        assert srv.communicate(timeout=10)[0].strip() == str(4 << 20)
        assert leftovers(base)
    assert leftovers(base) == []
    lab.stop()  # idempotent
    assert not Path(labmod.STATE_DIR / f"{base}.json").exists()


def _vswitchd_port_buffers() -> list[int]:
    """Receive buffers (bytes) of ovs-vswitchd's packet sockets, from ``ss -0 -m -p``."""
    out = _sh("ss", "-0", "-m", "-p")
    return [int(line.split("skmem:(")[1].split(",rb")[1].split(",")[0])
            for line in out.splitlines() if "ovs-vswitchd" in line and "skmem:(" in line]


@pytest.mark.lab
def test_switch_ports_buffer_a_busy_cpu_and_nothing_else_changes(lab_env: None) -> None:
    """Every port the lab adds is a packet socket in ovs-vswitchd: it gets PORT_RCVBUF
    (not the kernel's 208 KB default, ~16 ms of 100 Mbit/s, which the loaded lab's
    vswitchd overran on the tree's first hops), and the machine's default is back as
    it was once the bridges exist."""
    before = labmod.RMEM_DEFAULT.read_text()
    had = _vswitchd_port_buffers()
    topo = linear(3)
    with Lab(topo, controller=None, fail_mode="standalone"):
        assert labmod.RMEM_DEFAULT.read_text() == before
        ports = len(topo.hosts) + 2 * len(topo.links)
        big = [rb for rb in _vswitchd_port_buffers() if rb >= labmod.PORT_RCVBUF]
        assert len(big) >= ports + sum(rb >= labmod.PORT_RCVBUF for rb in had), (ports, big)
    assert labmod.RMEM_DEFAULT.read_text() == before
    assert not (labmod.STATE_DIR / "rmem_default.orig").exists()


@pytest.mark.lab
def test_a_lab_killed_while_its_ports_opened_is_undone_by_the_next(lab_env: None) -> None:
    """A lab SIGKILLed inside ``_port_buffers`` leaves the raised default and the value it
    replaced; the next lab's build puts that value back."""
    before = labmod.RMEM_DEFAULT.read_text().strip()
    saved = labmod.STATE_DIR / "rmem_default.orig"
    saved.write_text(before)  # what the killed lab left
    labmod.RMEM_DEFAULT.write_text(str(labmod.PORT_RCVBUF))
    try:
        with labmod._port_buffers():
            assert int(labmod.RMEM_DEFAULT.read_text()) == labmod.PORT_RCVBUF
        assert labmod.RMEM_DEFAULT.read_text().strip() == before and not saved.exists()
    finally:
        labmod.RMEM_DEFAULT.write_text(before)
        saved.unlink(missing_ok=True)


@pytest.mark.lab
def test_controller_mode_bridge_config_and_popen_cleanup(lab_env: None) -> None:
    # Nothing listens on this port: we only check the configuration OVS was given.
    with Lab(linear(2), controller="tcp:127.0.0.1:1", fail_mode="secure") as lab:
        base = lab.base
        br = lab.bridge(1)
        assert _sh("ovs-vsctl", "get-controller", br).strip() == "tcp:127.0.0.1:1"
        assert _sh("ovs-vsctl", "get-fail-mode", br).strip() == "secure"
        assert "OpenFlow13" in _sh("ovs-vsctl", "get", "bridge", br, "protocols")
        assert "netdev" in _sh("ovs-vsctl", "get", "bridge", br, "datapath_type")
        proc = lab.popen("h1", "sleep", "300")
        assert proc.poll() is None
    assert proc.poll() is not None
    assert leftovers(base) == []


@pytest.mark.lab
def test_every_switch_connects_to_each_of_several_controllers(lab_env: None) -> None:
    targets = ["tcp:127.0.0.1:1", "tcp:127.0.0.1:2", "tcp:127.0.0.1:3"]
    with Lab(linear(2), controller=" ".join(targets), fail_mode="secure") as lab:
        for dpid in (1, 2):
            br = lab.bridge(dpid)
            assert sorted(_sh("ovs-vsctl", "get-controller", br).split()) == targets
            for uuid in _sh("ovs-vsctl", "get", "bridge", br, "controller").strip("[]\n").split(", "):
                assert _sh("ovs-vsctl", "get", "controller", uuid, "max_backoff").strip() == "1000"


RECEIVER = textwrap.dedent("""
    import socket, struct, sys
    group, port, iface = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((group, port))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                 socket.inet_aton(group) + socket.inet_aton(iface))
    s.settimeout(10)
    print("ready", flush=True)
    data, addr = s.recvfrom(2048)
    print(addr[0], data.decode(), flush=True)
""")

SENDER = textwrap.dedent("""
    import socket, sys, time
    group, port, iface = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)   # never leaves the lab
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(iface))
    for i in range(20):
        s.sendto(b"modelcast-hello", (group, port))
        time.sleep(0.1)
""")


@pytest.mark.lab
def test_udp_multicast_between_namespaces(lab_env: None) -> None:
    topo = linear(2)
    h1, h2 = topo.hosts
    group, port = "232.1.2.3", 45678
    with Lab(topo, controller=None, fail_mode="standalone") as lab:
        base = lab.base
        rx = lab.popen(h2.name, sys.executable, "-c", RECEIVER, group, str(port), h2.ip,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert rx.stdout is not None
        assert rx.stdout.readline().strip() == "ready", rx.stderr.read() if rx.stderr else ""
        sender = lab.popen(h1.name, sys.executable, "-c", SENDER, group, str(port), h1.ip)
        out, err = rx.communicate(timeout=15)
        sender.kill()
        assert rx.returncode == 0, err
        assert out.split() == [h1.ip, "modelcast-hello"]
    assert leftovers(base) == []


@pytest.mark.lab
def test_standalone_ring_uses_rstp(lab_env: None) -> None:
    """A learning-switch ring would flood forever; the lab turns RSTP on by default."""
    topo = ring(3)
    with Lab(topo, controller=None, fail_mode="standalone") as lab:
        base = lab.base
        assert "true" in _sh("ovs-vsctl", "get", "bridge", lab.bridge(1), "rstp_enable")
        deadline = time.monotonic() + 20
        while not lab.ping("h1", "h3", count=1, wait=1):
            assert time.monotonic() < deadline, "no connectivity after RSTP convergence"
    assert leftovers(base) == []


@pytest.mark.lab
@pytest.mark.parametrize("when,exc", [
    ("add-br", LabError),                 # a failing command after veths/netns exist
    ("ethtool", KeyboardInterrupt),       # Ctrl-C in the middle of host setup
])
def test_failed_start_leaves_nothing(lab_env: None, monkeypatch: pytest.MonkeyPatch,
                                     when: str, exc: type[BaseException]) -> None:
    real = labmod.sh
    calls = {"n": 0}

    def flaky(cmd, *a, **kw):  # type: ignore[no-untyped-def]
        if when in cmd:
            calls["n"] += 1
            if calls["n"] == 2:  # the second bridge / second host: something already exists
                if exc is KeyboardInterrupt:
                    raise KeyboardInterrupt
                cmd = ["false", *cmd]  # fail for real, through the normal error path
        return real(cmd, *a, **kw)

    monkeypatch.setattr(labmod, "sh", flaky)
    lab = Lab(linear(3), controller=None, fail_mode="standalone")
    with pytest.raises(exc) as info:
        lab.start()
    assert calls["n"] == 2
    if exc is LabError:
        assert "false" in str(info.value)  # the message names the failing command
    monkeypatch.setattr(labmod, "sh", real)
    assert lab.tag and leftovers(lab.base) == []
    assert not lab.started


@pytest.mark.lab
def test_ofport_mismatch_is_an_error(lab_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    real = labmod.sh

    def skew(cmd, *a, **kw):  # type: ignore[no-untyped-def]
        cmd = [c.replace("ofport_request=2", "ofport_request=7") for c in cmd]
        return real(cmd, *a, **kw)

    monkeypatch.setattr(labmod, "sh", skew)
    lab = Lab(linear(2), controller=None, fail_mode="standalone")
    with pytest.raises(LabError, match="ofport 7, wanted 2"):
        lab.start()
    assert leftovers(lab.base) == []


@pytest.mark.lab
def test_set_link_down_and_up(lab_env: None) -> None:
    topo = linear(2)
    h1, h2 = topo.hosts
    with Lab(topo, controller=None, fail_mode="standalone") as lab:
        base = lab.base
        assert lab.ping(h1.name, h2.ip, count=1, wait=2)
        lab.set_link(2, 1, up=False)
        iface = lab.switch_port_iface(1, 1)
        assert "state DOWN" in _sh("ip", "-o", "link", "show", iface)
        assert _sh("ovs-vsctl", "get", "Interface", iface, "link_state").strip() == "down"
        assert not lab.ping(h1.name, h2.ip, count=2, wait=1)
        lab.set_link(1, 2, up=True)
        deadline = time.monotonic() + 10
        while not lab.ping(h1.name, h2.ip, count=1, wait=1):
            assert time.monotonic() < deadline, "ping did not recover after set_link(up)"
        with pytest.raises(LabError, match="no link"):
            lab.set_link(1, 3, up=False)
    assert leftovers(base) == []


MN_NAMES = ("s1", "s2", "s1-eth1", "s1-eth2", "s2-eth1", "s2-eth2", "h1-eth0", "h2-eth0")


def _present(names: tuple[str, ...]) -> list[str]:
    links = {line.split(":")[1].strip().split("@")[0]
             for line in _sh("ip", "-o", "link").splitlines()}
    return sorted(set(names) & (links | set(_sh("ovs-vsctl", "list-br").split())))


# Runs the real `mn` program, but with mininet.clean.cleanup disabled: on *any* exception
# (or Ctrl-C) `mn` calls cleanup() -- i.e. `mn -c` -- which deletes every OVS bridge on the
# machine, kills every ryu-manager/ping and removes /tmp/*.log. Never let a test do that.
MN_WRAPPER = textwrap.dedent("""
    import runpy, sys
    import mininet.clean
    def _no_global_cleanup(*a, **k):
        print("*** mn -c suppressed by the modelcast test", flush=True)
    mininet.clean.cleanup = _no_global_cleanup
    mininet.clean.Cleanup.cleanup = classmethod(_no_global_cleanup)
    sys.argv = ["mn"] + sys.argv[1:]
    runpy.run_path("/usr/bin/mn", run_name="__main__")
""")


@pytest.mark.lab
def test_mininet_custom_topo(lab_env: None) -> None:
    """`mn --custom topologies/mn.py` builds the spec's ports and forwards. Mininet uses
    global names (s1, s1-eth1, ...) and deletes same-named objects first, so this refuses
    to run if any exist, and afterwards removes only those names if mn left them."""
    mn_py = "/usr/bin/python3"
    if shutil.which("mn") is None or not Path(mn_py).exists():
        skip_or_fail("mn (Mininet, Debian's /usr/bin/python3) is not installed")
    if shutil.which("ping") is None:
        skip_or_fail("Mininet's pingall needs `ping` (apt-get install iputils-ping)")
    busy = _present(MN_NAMES)
    if busy:
        skip_or_fail(f"Mininet names already in use on this machine (another Mininet?): {busy}")
    with tempfile.TemporaryDirectory() as tmp:
        ports = Path(tmp, "ports.csv")
        post = Path(tmp, "post.cli")  # --post runs after the test, before mn stops the net
        post.write_text(f"sh ovs-vsctl -f csv --no-headings --columns=name,ofport "
                        f"list Interface > {ports}\n")
        cmd = [mn_py, "-c", MN_WRAPPER,
               "--custom", str(REPO / "topologies" / "mn.py"), "--topo", "linear,2",
               "--switch", "ovs,datapath=user,protocols=OpenFlow13,failMode=standalone",
               "--controller", "none", "--test", "pingall", "--post", str(post)]
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=45)
            got = dict(line.split(",") for line in ports.read_text().split()
                       if line.split(",")[0] in MN_NAMES) if ports.exists() else {}
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)  # our own session: mn and its host shells only
                proc.wait()
            left = _present(MN_NAMES)
            for name in left:
                if name in ("s1", "s2"):
                    subprocess.run(["ovs-vsctl", "--if-exists", "del-br", name])
                subprocess.run(["ip", "link", "del", name], capture_output=True)
    assert proc.returncode == 0 and "suppressed" not in out, out
    assert "Results: 0% dropped" in out, out
    topo = linear(2)
    want = {f"s{link.a}-eth{link.a_port}": str(link.a_port) for link in topo.links}
    want |= {f"s{link.b}-eth{link.b_port}": str(link.b_port) for link in topo.links}
    want |= {f"s{h.dpid}-eth{h.port}": str(h.port) for h in topo.hosts}
    assert {k: got.get(k) for k in want} == want, out
    assert left == [], f"mn left {left} behind (removed now)"


@pytest.mark.lab
def test_management_network_reaches_the_root_namespace(lab_env):
    """Agents in the hosts reach a service listening on the management gateway."""
    import socket
    import threading

    with Lab(linear(2), controller=None, fail_mode="standalone", mgmt=True) as lab:
        gw = lab.mgmt_gateway
        srv = socket.create_server((gw, 0))
        port = srv.getsockname()[1]
        got: list[bytes] = []
        t = threading.Thread(target=lambda: got.append(srv.accept()[0].recv(16)))
        t.start()
        code = f"import socket; socket.create_connection(({gw!r}, {port}), 5).sendall(b'hello')"
        lab.run("h2", sys.executable, "-c", code)
        t.join(5)
        srv.close()
        assert got == [b"hello"]
        assert lab.mgmt_ip("h2") != lab.mgmt_ip("h1")
        base = lab.base
    assert leftovers(base) == []
