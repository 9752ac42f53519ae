"""``modelcast-controller`` rejects bad input with one clear line and a non-zero exit."""

import subprocess
import sys
from pathlib import Path

import pytest

from lab.sh import free_port

EXE = str(Path(sys.executable).parent / "modelcast-controller")


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args,needle", [
    (["--algorithm", "ospf"], "--algorithm must be one of spt, steiner"),
    (["--udp-port", "70000"], "--udp-port must be 1..65535"),
    (["--host-timeout", "0"], "--host-timeout must be 1..65535 s"),
    (["--audit-interval", "-1"], "--audit-interval must be >= 0 s"),
    (["--trace", "/nonexistent-dir/trace.txt"], "--trace: cannot write /nonexistent-dir/trace.txt"),
    (["--state-file", "/nonexistent-dir/state.json"], "does not exist"),
    (["--igmp-allow", "10.0.0.0/40"], "--igmp-allow: '10.0.0.0/40' is not an IPv4 CIDR"),
    (["--no-such-option"], "unrecognized arguments"),
    (["--store", "http://127.0.0.1:2379"], "--store: 'http://127.0.0.1:2379' is not an etcd://HOST:PORT"),
    (["--store", "etcd://127.0.0.1:x"], "--store: '127.0.0.1:x': bad port"),
    (["--store", "etcd://127.0.0.1:2379", "--state-file", "/tmp/s.json"], "--store and --state-file exclude"),
    (["--store", "etcd://127.0.0.1:2379", "--lease-ttl", "0"], "--lease-ttl must be 1..60 s"),
    (["--ofp-tcp-listen-port", "x"], "Invalid Integer value"),
    (["--punt-rate", "-5"], "--punt-rate must be 0.."),
    (["--punt-port-rate", "-1"], "--punt-port-rate must be 0.."),
    (["--fabric", "mesh:3"], "--fabric: unknown topology family 'mesh'"),
    (["--fabric", "file:/nonexistent-dir/fabric.yaml"], "--fabric: cannot read topology file"),
    (["--fabric", "linear:1"], "--fabric: linear:1 has no links between switches"),
])
def test_bad_options_exit_nonzero_with_a_clear_message(args, needle):
    proc = run(*args)
    assert proc.returncode != 0
    assert needle in proc.stderr + proc.stdout


def test_unreadable_state_file_stops_the_controller(tmp_path):
    state = tmp_path / "state.json"
    state.write_text("{not json")
    proc = run("--state-file", str(state), "--ofp-tcp-listen-port", str(free_port()),
               "--wsapi-host", "127.0.0.1", "--wsapi-port", str(free_port()))
    assert proc.returncode == 2
    assert "is not valid JSON" in proc.stdout + proc.stderr
    assert state.read_text() == "{not json"  # never overwritten


def test_help_lists_our_options():
    proc = run("--help")
    assert proc.returncode == 0 and "--state-file" in proc.stdout and "--token" in proc.stdout
    assert "--host-tokens" in proc.stdout and "--igmp-allow" in proc.stdout
    assert "--store" in proc.stdout and "--advertise-url" in proc.stdout


def test_no_token_is_refused_unless_rest_is_on_loopback(monkeypatch):
    monkeypatch.delenv("MODELCAST_TOKEN", raising=False)
    proc = run("--ofp-tcp-listen-port", str(free_port()), "--wsapi-host", "0.0.0.0",
               "--wsapi-port", str(free_port()))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to serve REST on 0.0.0.0 without a token" in lines[0]


@pytest.mark.parametrize("content,needle", [
    ("{not json", "is not JSON"),
    ('["10.0.0.3"]', "must hold an object"),
    ('{"10.0.0.300": "0123456789abcdef"}', "is not an IPv4 address"),
    ('{"232.1.1.1": "0123456789abcdef"}', "is not a host address"),
    ('{"10.0.0.3": "short"}', "at least 16 characters"),
    ('{"10.0.0.3": "0123456789abcdef", "10.0.0.4": "0123456789abcdef"}', "not unique"),
])
def test_bad_host_token_file_is_one_line(tmp_path, content, needle):
    path = tmp_path / "hosts.json"
    path.write_text(content)
    proc = run("--host-tokens", str(path))
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_a_hostile_state_file_stops_the_controller_with_one_line(tmp_path):
    state = tmp_path / "state.json"
    content = ('{"version": 1, "topology": {}, "groups": [{"id": 3, "model": "m", "source": "10.0.0.1", '
               '"address": "232.1.1.1", "port": 5500, "receivers": ["10.0.0.1"]}]}')
    state.write_text(content)
    proc = run("--state-file", str(state), "--ofp-tcp-listen-port", str(free_port()),
               "--wsapi-host", "127.0.0.1", "--wsapi-port", str(free_port()))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out
    [line] = [l for l in out.splitlines() if "move it aside" in l]
    assert "group 3 receiver 10.0.0.1 is the group's source" in line
    assert state.read_text() == content


def test_no_protection_turns_fast_failover_off():
    from controller.main import parse
    assert parse([])[0].protection is True
    conf, rest = parse(["--no-protection", "--ofp-tcp-listen-port", "6653"])
    assert conf.protection is False and rest == ["--ofp-tcp-listen-port", "6653"]


def test_a_fabric_file_pins_its_links(tmp_path):
    """The cabling as a topology file (topologies.spec's format, real dpids and ports)."""
    from controller.main import parse
    assert parse([])[0].fabric is None
    path = tmp_path / "fabric.json"
    path.write_text('{"switches": [{"name": "a", "dpid": 7}, {"name": "b", "dpid": 9}],'
                    ' "links": [{"a": "a", "b": "b", "a_port": 48, "b_port": 1}]}')
    conf, _ = parse(["--fabric", f"file:{path}"])
    assert [(lk.a, lk.a_port, lk.b, lk.b_port) for lk in conf.fabric.links] == [(7, 48, 9, 1)]
    # its hosts are pinned, so each needs its own addresses: none are made up for it
    path.write_text('{"switches": [{"name": "a", "dpid": 7}, {"name": "b", "dpid": 9}],'
                    ' "links": [{"a": "a", "b": "b", "a_port": 48, "b_port": 1}],'
                    ' "hosts": [{"switch": "a", "name": "gpu1", "ip": "10.1.0.1"}]}')
    proc = run("--fabric", f"file:{path}")
    assert proc.returncode == 2 and "--fabric: host gpu1: no ip and mac of its own" in proc.stderr


def test_no_nicira_keeps_plain_openflow_detour_ends():
    """Switches without Open vSwitch's Nicira actions: one rejoin flow per group."""
    from controller.main import parse
    assert parse([])[0].nicira is True
    conf, rest = parse(["--no-nicira"])
    assert conf.nicira is False and conf.protection is True and rest == []


@pytest.mark.parametrize("limits, connections, raised_to, said", [
    ((1024, 1 << 20), 4096, 4096 + 512, "raised to 4608"),  # (a common default soft limit)
    ((1024, 2048), 4096, 2048, "lowered to 1536"),  # the hard limit is too low: fewer connections
    ((8192, 8192), 4096, None, None),  # enough already: left alone
])
def test_the_open_file_limit_is_fitted_to_the_rest_connections(monkeypatch, limits, connections, raised_to, said):
    """~1000 waiting agents need ~1000 sockets: with the usual soft limit of 1024 open
    files the controller ran out of descriptors before its connection limit."""
    import resource

    from controller import main, settings

    set_to = []
    monkeypatch.setattr(resource, "getrlimit", lambda what: limits)
    monkeypatch.setattr(resource, "setrlimit", lambda what, value: set_to.append(value))
    conf = settings.Settings(rest_connections=connections)
    note = main.fit_open_files(conf)
    assert (set_to[0][0] if set_to else None) == raised_to and all(v[1] == limits[1] for v in set_to)
    assert (note is None) if said is None else (said in note)
    assert conf.rest_connections == (1536 if said and "lowered" in said else connections)


def test_bad_rest_limits_are_refused(tmp_path):
    for args, words in ((["--rest-connections", "3"], "--rest-connections must be 16.."),
                        (["--rest-idle", "0"], "--rest-idle must be 0.5..3600 s")):
        out = subprocess.run([sys.executable, "-m", "controller.main", *args], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and words in out.stderr, out.stderr


def test_a_bad_per_client_limit_is_refused():
    out = subprocess.run([sys.executable, "-m", "controller.main", "--rest-per-client", "0"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--rest-per-client must be 1.." in out.stderr, out.stderr
