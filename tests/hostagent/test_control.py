"""The controller REST client and the CLI's --controller mode, against a tiny fake
controller (http.server on 127.0.0.1 in a thread). Multicast stays on loopback."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Optional

import pytest

from hostagent import wire
from hostagent.api import _run_hook
from hostagent.cli import main
from hostagent.control import ControllerClient, ControllerError, session_key
from lab.models import make_model
from lab.sh import free_port
from tests.support.agents import LOOPBACK, FakeController, cli, file_id, loopback_group


# --------------------------------------------------------------------------- client


def test_wait_installed_polls_until_enough_receivers() -> None:
    states = iter([
        {"id": 4, "state": "pending", "receivers": {"10.0.0.2": "pending"}},
        {"id": 4, "state": "installed", "receivers": {"10.0.0.2": "installed"}},
        {"id": 4, "state": "installed", "receivers": {"10.0.0.2": "installed", "10.0.0.3": "installed"}},
    ])
    client = ControllerClient("http://controller.invalid")
    gets: list[int] = []
    client.get_group = lambda gid: (gets.append(gid), next(states))[1]  # type: ignore[method-assign]
    now = [0.0]
    group = client.wait_installed({"id": 4, "state": "pending", "receivers": {}}, receivers=2, timeout=10,
                                  poll=0.5, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert gets == [4, 4, 4]
    assert len(group["receivers"]) == 2


def test_wait_installed_times_out_and_reports_state() -> None:
    client = ControllerClient("http://controller.invalid")
    client.get_group = lambda gid: {"id": gid, "state": "pending", "receivers": {"10.0.0.2": "installed"}}  # type: ignore[method-assign]
    now = [0.0]
    with pytest.raises(ControllerError) as err:
        client.wait_installed({"id": 9, "state": "pending", "receivers": {}}, receivers=3, timeout=2,
                              clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert str(err.value) == "timed out after 2s waiting for group 9 to be installed (state pending, 1/3 receivers installed)"


def test_group_in_error_state_fails_with_its_errors() -> None:
    client = ControllerClient("http://controller.invalid")
    with pytest.raises(ControllerError, match="in error: no path to 10.0.0.9"):
        client.wait_installed({"id": 2, "state": "error", "errors": ["no path to 10.0.0.9"]})


def test_several_controller_urls_a_dead_or_leaderless_instance_is_skipped() -> None:
    """``--controller A,B,C``: a dead instance (connection refused) and one answering 503
    (no leader right now) are passed over; the call is served by the live one, which is
    then asked first."""
    dead = f"http://{LOOPBACK}:{free_port()}"
    with FakeController(5000, reject=(503, "no leader elected right now; retry shortly")) as busy, \
            FakeController(5000, pending_polls=0) as live:
        client = ControllerClient(f"{dead},{busy.url},{live.url}", failover_s=2)
        group = client.create_group("m", "10.0.0.1")
        assert group["address"] == FakeController.ADDRESS
        assert client.base_url == live.url
        assert [c[0] for c in busy.calls] == ["POST"] and [c[0] for c in live.calls] == ["POST"]
        client.get_group(group["id"])
        assert len(busy.calls) == 1  # the one that answered is asked first now


def test_several_controller_urls_give_up_after_the_failover_window() -> None:
    dead = [f"http://{LOOPBACK}:{free_port()}" for _ in range(2)]
    client = ControllerClient(",".join(dead), failover_s=0.5)
    with pytest.raises(ControllerError, match="no controller instance served POST /v1/groups within 0.5s"):
        client.create_group("m", "10.0.0.1")


class Follower(FakeController):
    """An instance that does not lead: mutations go to ``leader`` (the real one forwards
    them and passes the answer back), reads answer from a mirror that learns each group
    only after ``lag`` reads of it (the leader's snapshot still on its way)."""

    def __init__(self, leader: FakeController, lag: int) -> None:
        super().__init__(leader.mc_port)
        self.leader, self.lag, self.misses = leader, lag, 0

    def route(self, method: str, path: str, body: Optional[dict]) -> tuple[int, Optional[dict]]:
        if method == "GET" and path.startswith("/v1/groups/") and self.misses < self.lag:
            self.misses += 1
            return 404, {"error": f"no such group {path.rsplit('/', 1)[1]}", "detail": None}
        with self.leader.lock:
            return self.leader.route(method, path, body)


def test_a_followers_404_for_a_group_the_leader_just_made_is_asked_of_the_leader() -> None:
    """``--controller FOLLOWER,LEADER``: the group is made through the follower (which
    forwards the POST), and its mirror does not hold it yet when the sender reads it back;
    the read is answered by the leader instead of failing the send."""
    with FakeController(5000, pending_polls=0) as leader, Follower(leader, lag=10) as follower:
        client = ControllerClient(f"{follower.url},{leader.url}", failover_s=5)
        group = client.create_group("m", "10.0.0.1")
        assert group["id"] == 1 and client.base_url == follower.url
        installed = client.wait_installed(client.get_group(1), timeout=2, poll=0.01)
        assert installed["state"] == "installed" and client.base_url == leader.url
        assert follower.misses == 1  # asked once; the leader answered, and is asked first now


def test_a_lone_followers_404_is_asked_again_until_its_mirror_catches_up() -> None:
    """Given only the follower: its 404 for the group just made is asked again after a
    growing pause, and served once the mirror holds the group."""
    with FakeController(5000, pending_polls=0) as leader, Follower(leader, lag=3) as follower:
        client = ControllerClient(follower.url, failover_s=5)
        client.create_group("m", "10.0.0.1")
        started = time.monotonic()
        assert client.get_group(1)["id"] == 1
        assert follower.misses == 3
        assert 0.1 + 0.2 <= time.monotonic() - started < 2  # two pauses before the last two reads


def test_a_404_is_final_for_a_group_not_just_made_or_missing_everywhere() -> None:
    """A group this client was never handed, or one no instance has: no retry storm."""
    with FakeController(5000) as leader, Follower(leader, lag=0) as follower:
        lone = ControllerClient(leader.url, failover_s=5)
        started = time.monotonic()
        with pytest.raises(ControllerError, match=r"\(404\)") as err:
            lone.get_group(7)
        assert err.value.status == 404 and not err.value.transient
        both = ControllerClient(f"{follower.url},{leader.url}", failover_s=5)
        with pytest.raises(ControllerError, match=r"\(404\)"):
            both.get_group(7)
        assert time.monotonic() - started < 1
        # asked once each: the lone client's leader; the follower, then the leader
        assert [c[1] for c in leader.calls] == ["/v1/groups/7"] * 2
        assert [c[1] for c in follower.calls] == ["/v1/groups/7"]


def test_errors_say_whether_they_are_transient() -> None:
    """What a caller that retries (fetch) reads: unreachable and 5xx may pass, a
    refusal will not."""
    dead = f"http://{LOOPBACK}:{free_port()}"
    with pytest.raises(ControllerError) as err:
        ControllerClient(dead).get_group(1)
    assert err.value.transient and err.value.status is None and dead in str(err.value)
    for status, transient in ((500, True), (400, False), (403, False), (409, False)):
        with FakeController(5000, reject=(status, "no")) as fake:
            with pytest.raises(ControllerError) as err:
                ControllerClient(fake.url).create_group("m", "10.0.0.1")
        assert (err.value.status, err.value.transient) == (status, transient)


def test_a_503_is_asked_again_after_its_retry_after_within_the_bound() -> None:
    with FakeController(5000, reject=(503, "no leader elected right now; retry shortly")) as busy:
        client = ControllerClient(busy.url, failover_s=0.5)
        started = time.monotonic()
        with pytest.raises(ControllerError, match=r"\(503\)") as err:
            client.create_group("m", "10.0.0.1")
        elapsed = time.monotonic() - started
    assert err.value.transient and 0.5 <= elapsed < 1.5
    assert 3 <= len(busy.calls) <= 6  # 0.1, 0.2 then 0.2 (the bound): a few, not a storm


def test_a_refusal_other_than_503_is_not_retried_elsewhere() -> None:
    with FakeController(5000, reject=(403, "not yours")) as first, FakeController(5000) as second:
        client = ControllerClient(f"{first.url},{second.url}")
        with pytest.raises(ControllerError, match=r"\(403\): not yours"):
            client.create_group("m", "10.0.0.1")
        assert second.calls == []


def test_requests_carry_bearer_token_and_json(monkeypatch) -> None:
    monkeypatch.setenv("MODELCAST_TOKEN", "s3cret")
    with FakeController(5000) as fake:
        client = ControllerClient(fake.url)
        group = client.create_group("llama", "10.0.0.1", ["10.0.0.2"])
        assert client.create_group("llama", "10.0.0.1")["id"] == group["id"]  # existing: same group
        client.join(group["id"], "10.0.0.3")
        client.leave(group["id"], "10.0.0.2")
    assert [(m, p) for m, p, _, _ in fake.calls] == [
        ("POST", "/v1/groups"), ("POST", "/v1/groups"),
        ("PUT", f"/v1/groups/{group['id']}/receivers/10.0.0.3"), ("DELETE", f"/v1/groups/{group['id']}/receivers/10.0.0.2"),
    ]
    assert fake.calls[0][2] == {"model": "llama", "source": "10.0.0.1", "receivers": ["10.0.0.2"]}
    assert {auth for *_, auth in fake.calls} == {"Bearer s3cret"}
    assert session_key(group) == wire.derive_key(bytes.fromhex("ab" * 32))


def test_session_key_rejects_malformed_keys() -> None:
    assert session_key({"key": ""}) is None
    for bad in ("zz" * 32, "ab" * 16):
        with pytest.raises(ControllerError):
            session_key({"key": bad})


# --------------------------------------------------------------------------- CLI errors


def test_unreachable_controller_is_one_line_and_nonzero(tmp_path, capsys) -> None:
    url = f"http://{LOOPBACK}:{free_port()}"
    assert main(["send", str(make_model(tmp_path / "m.bin", 300_000).path), "--controller", url, "--interface", LOOPBACK]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"modelcast: error: cannot reach controller at {url}")
    assert main(["recv", "--controller", url, "--model", "m", "--source", LOOPBACK, "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach controller" in err


def test_controller_4xx_error_text_is_printed(tmp_path, capsys) -> None:
    with FakeController(5000, reject=(403, "token not allowed for model llama")) as fake:
        code = main(["send", str(make_model(tmp_path / "m.bin", 300_000).path), "--controller", fake.url, "--model", "llama", "--interface", LOOPBACK])
    assert code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.strip() == "modelcast: error: controller refused POST /v1/groups (403): token not allowed for model llama"


def test_timeout_waiting_for_installation(tmp_path, capsys) -> None:
    with FakeController(5000, stuck_state="pending") as fake:
        code = main(["send", str(make_model(tmp_path / "m.bin", 300_000).path), "--controller", fake.url, "--interface", LOOPBACK,
                     "--receivers", "2", "--wait-timeout", "0.3", "--poll", "0.05"])
    assert code == 1
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("modelcast: error:")] == err[-1:]  # one error line, last
    assert "timed out after 0.3s waiting for group 1 to be installed (state pending, 0/2 receivers installed)" in err[-1]
    assert all(m in ("POST", "GET") for m, *_ in fake.calls)  # never sent: nothing to leave


def test_either_group_or_controller_is_required(tmp_path, capsys) -> None:
    for both in ([], ["--group", "232.1.2.3:5000", "--controller", "http://x"]):
        with pytest.raises(SystemExit) as usage:
            main(["send", str(make_model(tmp_path / "m.bin", 300_000).path), *both])
        assert usage.value.code == 2
        assert "(--group ADDR:PORT | --controller URL[,URL...])" in capsys.readouterr().err
    assert main(["recv", "--controller", "http://x", "--source", LOOPBACK, "--out", str(tmp_path / "o")]) == 1
    assert "--model is required" in capsys.readouterr().err


def test_receiver_leaves_the_group_even_when_the_transfer_fails(tmp_path, capsys) -> None:
    with FakeController(free_port(socket.SOCK_DGRAM)) as fake:
        fake.route("POST", "/v1/groups", {"model": "m", "source": LOOPBACK})  # a sender announced, then died
        fake.route("POST", "/v1/groups/1/rekey", {"session": "00000000000000aa"})
        code = main(["recv", "--controller", fake.url, "--model", "m", "--source", LOOPBACK, "--interface", LOOPBACK,
                     "--ip", "127.0.0.9", "--out", str(tmp_path / "o.bin"), "--timeout", "0.2", "--json"])
    assert code == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["digest_ok"] is False and summary["error"] == "sender silent"
    assert [(m, p) for m, p, _, _ in fake.calls if m != "GET"] == [
        ("POST", "/v1/groups"), ("PUT", "/v1/groups/1/receivers/127.0.0.9"), ("DELETE", "/v1/groups/1/receivers/127.0.0.9"),
    ]
    assert fake.calls[0][2] == {"model": "m", "source": LOOPBACK}


# --------------------------------------------------------------------------- end to end


def test_send_and_receive_through_the_controller(tmp_path) -> None:
    _, port = loopback_group(FakeController.ADDRESS)
    model = make_model(tmp_path / "model.bin", 800_000, seed=11)
    digest = model.digest
    cid = file_id(model.path, 65536)
    env = {**os.environ, "MODELCAST_TOKEN": "tok"}
    with FakeController(port, pending_polls=3) as fake:
        receivers = [
            # Each receiver sends from the address it registers: the sender admits only
            # the controller's receivers (docs/security.md, "Attackers on the data path").
            # No --model: the content id they expect names the group.
            cli("recv", "--controller", fake.url, "--expect", cid, "--source", LOOPBACK,
                "--interface", f"127.0.0.{i + 2}", "--ip", f"127.0.0.{i + 2}", "--out", str(tmp_path / f"out{i}.bin"),
                "--json", "--timeout", "20", env=env)
            for i in range(2)
        ]
        try:
            sender = cli("send", str(model.path), "--controller", fake.url, "--interface", LOOPBACK, "--ttl", "0",
                         "--receivers", "2", "--poll", "0.05", "--rate", "200", "--chunk-size", "65536",
                         "--json", "--timeout", "20", env=env)
            out, err = sender.communicate(timeout=60)
            results = [json.loads(r.communicate(timeout=30)[0]) for r in receivers]
        finally:
            for proc in receivers:
                if proc.poll() is None:
                    proc.kill()
    assert sender.returncode == 0, err
    summary = json.loads(out)
    assert summary["ok"] and summary["group"] == f"239.255.77.1:{port}" and summary["group_id"] == 1
    assert summary["authenticated"] is True  # the controller's key MACs every datagram
    for i, (proc, result) in enumerate(zip(receivers, results)):
        assert proc.returncode == 0 and result["digest_ok"] and result["file_digest"] == digest
        assert result["content_id"] == cid and result["files"] == 1
        assert (tmp_path / f"out{i}.bin").read_bytes() == model.path.read_bytes()
    calls = [(m, p) for m, p, _, _ in fake.calls]
    # The sender named the model by its content id and registered as the source.
    posts = [b for m, p, b, _ in fake.calls if m == "POST"]
    assert {"model": cid, "source": LOOPBACK} in posts and len(fake.groups) == 1
    assert summary["content_id"] == cid
    for ip in ("127.0.0.2", "127.0.0.3"):
        assert ("PUT", f"/v1/groups/1/receivers/{ip}") in calls
        assert ("DELETE", f"/v1/groups/1/receivers/{ip}") in calls
    # A fresh key announced for this transfer (its session and file), retired at the end;
    # the receivers, started first, waited for the announcement.
    rekeys = [b for m, p, b, _ in fake.calls if (m, p) == ("POST", "/v1/groups/1/rekey")]
    assert len(rekeys) == 2 and rekeys[0]["file_digest"] == digest and len(rekeys[0]["session"]) == 16
    assert rekeys[1] is None and "session" not in fake.groups[1]
    assert calls.count(("GET", "/v1/groups/1")) >= 3  # waited through the pending reads
    assert {auth for *_, auth in fake.calls} == {"Bearer tok"}


# --------------------------------------------------------------------------- CLI polish


def test_on_complete_hook_status_is_reported(tmp_path) -> None:
    out = str(tmp_path / "m.bin")
    hook = _run_hook(f"{sys.executable} -c 'import sys; sys.exit(len(sys.argv[1]) % 1 + 3)'", out, None)
    assert hook.exit_status == 3 and hook.command[-1] == out and hook.error is None
    missing = _run_hook("/nonexistent/loader", out, None)
    assert missing.exit_status == 127 and missing.error


def test_metrics_endpoint_exposes_counters() -> None:
    import urllib.request

    from hostagent.common import Stats
    from hostagent.metrics import serve

    stats = Stats(datagrams_out=12, nacks_received=3, repairs_multicast=5, repair_bytes_multicast=7000)
    stats.drops["bad_mac"] = 2
    port = free_port()
    server = serve("sender", lambda: stats, lambda: (50, 100), port)
    try:
        text = urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=5).read().decode()
    finally:
        if hasattr(server, "shutdown"):
            server.shutdown()
    assert 'modelcast_datagrams_total{direction="out",role="sender"} 12.0' in text
    assert 'modelcast_nacks_total{direction="in",role="sender"} 3.0' in text
    assert 'modelcast_repairs_total{kind="multicast",role="sender"} 5.0' in text
    assert 'modelcast_drops_total{reason="bad_mac",role="sender"} 2.0' in text
    assert 'modelcast_progress_bytes{kind="done",role="sender"} 50.0' in text
