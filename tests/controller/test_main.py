"""``modelcast-controller`` rejects bad input with one clear line and a non-zero exit."""

import json
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
    (["--state-file", "/proc/no-such-dir/state.json"], "--state-file: cannot create directory /proc/no-such-dir"),
    (["--token", "a", "--token-file", "/etc/hostname"], "--token and --token-file exclude each other"),
    (["--token-file", "/nonexistent-dir/token"], "--token-file: cannot read /nonexistent-dir/token"),
    (["--store", "etcd://127.0.0.1:2379"], "--store needs --cluster-secret-file"),
    (["--cluster-secret-file", "/nonexistent-dir/secret"], "--cluster-secret-file: cannot read"),
    (["--etcd-cert", "/etc/hostname"], "--etcd-cert and --etcd-key go together"),
    (["--etcd-user", "root"], "--etcd-user and --etcd-password-file go together"),
    (["--etcd-ca", "/nonexistent-dir/ca.pem"], "--etcd-ca: cannot read /nonexistent-dir/ca.pem"),
    (["--peers", "10.0.0.1:8080"], "--peers: '10.0.0.1:8080' is not an http(s)://HOST:PORT URL"),
    (["--quota-offers", "-1"], "--quota-offers must be 0.."),
    (["--group-idle", "-5"], "--group-idle must be 0 (never) or a number of seconds"),
    (["--igmp-allow", "10.0.0.0/40"], "--igmp-allow: '10.0.0.0/40' is not an IPv4 CIDR"),
    (["--no-such-option"], "unrecognized arguments"),
    (["--store", "http://127.0.0.1:2379"], "--store: 'http://127.0.0.1:2379' is not an etcd://HOST:PORT"),
    (["--store", "etcd://127.0.0.1:x"], "--store: '127.0.0.1:x': bad port"),
    (["--store", "etcd://127.0.0.1:2379", "--state-file", "/tmp/s.json"], "--store and --state-file exclude"),
    (["--store", "etcd://127.0.0.1:2379", "--lease-ttl", "0"], "--lease-ttl must be 1..60 s"),
    (["--ofp-tcp-listen-port", "x"], "Invalid Integer value"),
    (["--punt-rate", "-5"], "--punt-rate must be 0.."),
    (["--punt-port-rate", "-1"], "--punt-port-rate must be 0.."),
    (["--lldp-rate", "0"], "--lldp-rate must be 1..100000 frames/s"),
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
    for option in ("--token-file", "--cluster-secret-file", "--peers", "--etcd-ca", "--etcd-cert",
                   "--etcd-key", "--etcd-user", "--etcd-password-file", "--quota-offers",
                   "--quota-groups", "--quota-receivers", "--group-idle"):
        assert option in proc.stdout, option


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


def test_a_hostile_state_entry_is_dropped_and_the_controller_starts_with_the_rest(tmp_path):
    """The first review's attack on a real process: an offer of 2^63 bytes (and a group
    whose receiver is its source) in the state file stopped every restart with exit 2.
    Now each is dropped with one log line naming it, and the rest is served."""
    from lab.controller import Controller

    ctl = Controller(tmp_path, token="t0ken-for-tests")
    good = {"id": 5, "model": "good", "source": "10.0.0.1", "address": "232.1.1.5", "port": 5500,
            "receivers": ["10.0.0.2"], "key": "ab" * 32}
    ctl.state.write_text(json.dumps({
        "version": 1, "topology": {},
        "groups": [good, {"id": 3, "model": "m", "source": "10.0.0.1", "address": "232.1.1.1",
                          "port": 5500, "receivers": ["10.0.0.1"]}],
        "offers": [{"id": 1, "model": "good", "source": "10.0.0.1", "size": 9},
                   {"id": 2, "model": "evil", "source": "10.0.0.3", "size": 1 << 63}]}))
    ctl.start()
    try:
        assert [g["id"] for g in ctl.api("GET", "/v1/groups").json()] == [5]
        assert ctl.api("GET", "/v1/groups/5").json()["key"] == "ab" * 32
        assert [o["id"] for o in ctl.api("GET", "/v1/offers").json()] == [1]
        offer = ctl.api("POST", "/v1/offers", json={"model": "next", "source": "10.0.0.1"}).json()
        assert offer["id"] == 3  # (the dropped offer's id is not given again either)
    finally:
        ctl.stop()
    log = ctl.log_text()
    assert "Traceback" not in log and "ab" * 32 not in log
    assert [line for line in log.splitlines() if "group 3: receiver 10.0.0.1 is the group's source" in line]
    assert [line for line in log.splitlines() if "offer 2: " in line and "maximum" in line]


def test_the_state_directory_is_created_private(tmp_path):
    """``--state-file /var/lib/modelcast/state`` on a first start: the directory is made."""
    from controller.main import parse

    path = tmp_path / "var" / "lib" / "modelcast" / "state"
    conf, _ = parse(["--state-file", str(path)])
    assert conf.state_file == path and path.parent.is_dir()
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_tokens_and_secrets_come_from_files_not_the_command_line(tmp_path, monkeypatch):
    from controller.main import parse

    token = tmp_path / "token"
    token.write_text("s3cret-from-a-file\n")
    assert parse(["--token-file", str(token)])[0].token == "s3cret-from-a-file"
    token.write_text("\n")
    proc = run("--token-file", str(token))
    assert proc.returncode == 2 and f"--token-file: {token} is empty" in proc.stderr
    secret = tmp_path / "secret"
    secret.write_text("short\n")
    proc = run("--store", "etcd://127.0.0.1:2379", "--cluster-secret-file", str(secret))
    assert proc.returncode == 2 and "needs at least 32" in proc.stderr
    secret.write_text("x" * 44 + "\n")
    password = tmp_path / "password"
    password.write_text("etcd-pass\n")
    monkeypatch.setenv("MODELCAST_CLUSTER_SECRET_FILE", str(secret))
    conf, _ = parse(["--store", "etcd://127.0.0.1:2379", "--peers", "http://a:8080/,http://b:8080",
                     "--etcd-user", "modelcast", "--etcd-password-file", str(password)])
    assert conf.cluster_secret == b"x" * 44 and conf.peers == ("http://a:8080", "http://b:8080")
    assert (conf.etcd_user, conf.etcd_password) == ("modelcast", "etcd-pass")


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
