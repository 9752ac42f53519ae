"""The controller REST client and the CLI's --controller mode, against a tiny fake
controller (http.server on 127.0.0.1 in a thread). Multicast stays on loopback."""

from __future__ import annotations

import io
import json
import os
import random
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

import blake3
import pytest

from hostagent import wire
from hostagent.cli import Progress, _run_hook, build_parser, main
from hostagent.control import ControllerClient, ControllerError, session_key

from .test_hostagent_net import LOOPBACK, _free_port, _loopback_multicast_works

REPO = Path(__file__).resolve().parent.parent


class FakeController:
    """Just enough of /v1/groups: one group per (model, source); it reports ``pending``
    for the first ``pending_polls`` reads, then ``installed`` (or ``stuck_state``)."""

    def __init__(self, port: int, pending_polls: int = 2, stuck_state: Optional[str] = None,
                 reject: Optional[tuple[int, str]] = None) -> None:
        self.calls: list[tuple[str, str, Optional[dict], Optional[str]]] = []
        self.groups: dict[int, dict] = {}
        self.pending_polls = pending_polls
        self.stuck_state = stuck_state
        self.reject = reject
        self.mc_port = port
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def _reply(self, code: int, obj: Optional[dict]) -> None:
                body = json.dumps(obj).encode() if obj is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with fake.lock:
                    fake.calls.append((self.command, self.path, body, self.headers.get("Authorization")))
                    code, obj = fake.route(self.command, self.path, body)
                self._reply(code, obj)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.url = f"http://{LOOPBACK}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeController":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _view(self, g: dict) -> dict:
        state = self.stuck_state or ("pending" if g["reads"] < self.pending_polls else "installed")
        return {**{k: v for k, v in g.items() if k != "reads"}, "state": state,
                "receivers": {ip: ("installed" if state == "installed" else "pending") for ip in g["receivers"]}}

    def route(self, method: str, path: str, body: Optional[dict]) -> tuple[int, Optional[dict]]:
        if self.reject is not None:
            return self.reject[0], {"error": self.reject[1], "detail": {"path": path}}
        parts = path.strip("/").split("/")
        if method == "POST" and parts == ["v1", "groups"]:
            for g in self.groups.values():
                if (g["model"], g["source"]) == (body["model"], body["source"]):
                    return 200, self._view(g)
            gid = len(self.groups) + 1
            self.groups[gid] = g = {
                "id": gid, "model": body["model"], "source": body["source"], "address": "239.255.77.1",
                "port": self.mc_port, "receivers": list(body.get("receivers") or []), "tree": {},
                "errors": [], "key": "ab" * 32, "reads": 0,
            }
            return 201, self._view(g)
        if len(parts) >= 3 and parts[:2] == ["v1", "groups"] and parts[2].isdigit() and int(parts[2]) in self.groups:
            g = self.groups[int(parts[2])]
            if method == "GET" and len(parts) == 3:
                g["reads"] += 1
                return 200, self._view(g)
            if len(parts) == 5 and parts[3] == "receivers":
                if method == "PUT":
                    if parts[4] not in g["receivers"]:
                        g["receivers"].append(parts[4])
                    return 200, self._view(g)
                if method == "DELETE":
                    if parts[4] in g["receivers"]:
                        g["receivers"].remove(parts[4])
                    return 200, self._view(g)
        return 404, {"error": f"no such resource {path}", "detail": None}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]  # nothing listens once closed


def _model(tmp_path: Path, size: int = 300_000) -> Path:
    path = tmp_path / "model.bin"
    path.write_bytes(random.Random(11).randbytes(size))
    return path


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
    url = f"http://{LOOPBACK}:{_closed_port()}"
    assert main(["send", str(_model(tmp_path)), "--controller", url, "--interface", LOOPBACK]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"modelcast: error: cannot reach controller at {url}")
    assert main(["recv", "--controller", url, "--model", "m", "--source", LOOPBACK, "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach controller" in err


def test_controller_4xx_error_text_is_printed(tmp_path, capsys) -> None:
    with FakeController(5000, reject=(403, "token not allowed for model llama")) as fake:
        code = main(["send", str(_model(tmp_path)), "--controller", fake.url, "--model", "llama", "--interface", LOOPBACK])
    assert code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.strip() == "modelcast: error: controller refused POST /v1/groups (403): token not allowed for model llama"


def test_timeout_waiting_for_installation(tmp_path, capsys) -> None:
    with FakeController(5000, stuck_state="pending") as fake:
        code = main(["send", str(_model(tmp_path)), "--controller", fake.url, "--interface", LOOPBACK,
                     "--receivers", "2", "--wait-timeout", "0.3", "--poll", "0.05"])
    assert code == 1
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("modelcast: error:")] == err[-1:]  # one error line, last
    assert "timed out after 0.3s waiting for group 1 to be installed (state pending, 0/2 receivers installed)" in err[-1]
    assert all(m in ("POST", "GET") for m, *_ in fake.calls)  # never sent: nothing to leave


def test_either_group_or_controller_is_required(tmp_path, capsys) -> None:
    assert main(["send", str(_model(tmp_path))]) == 1
    assert "--group ADDR:PORT is required without --controller" in capsys.readouterr().err
    assert main(["recv", "--controller", "http://x", "--source", LOOPBACK, "--out", str(tmp_path / "o")]) == 1
    assert "--model is required" in capsys.readouterr().err


def test_receiver_leaves_the_group_even_when_the_transfer_fails(tmp_path, capsys) -> None:
    port = _free_port()
    with FakeController(port) as fake:
        code = main(["recv", "--controller", fake.url, "--model", "m", "--source", LOOPBACK, "--interface", LOOPBACK,
                     "--ip", "127.0.0.9", "--out", str(tmp_path / "o.bin"), "--timeout", "0.2", "--json"])
    assert code == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["digest_ok"] is False and summary["error"] == "sender silent"
    assert [(m, p) for m, p, _, _ in fake.calls] == [
        ("POST", "/v1/groups"), ("PUT", "/v1/groups/1/receivers/127.0.0.9"), ("DELETE", "/v1/groups/1/receivers/127.0.0.9"),
    ]
    assert fake.calls[0][2] == {"model": "m", "source": LOOPBACK}


# --------------------------------------------------------------------------- end to end


def _cli(*args: str, env: Optional[dict] = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hostagent.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)


def test_send_and_receive_through_the_controller(tmp_path) -> None:
    port = _free_port()
    if not _loopback_multicast_works("239.255.77.1", port):
        pytest.skip("multicast on the loopback interface is not available here")
    model = _model(tmp_path, 800_000)
    digest = blake3.blake3(model.read_bytes()).hexdigest()
    env = {**os.environ, "MODELCAST_TOKEN": "tok"}
    with FakeController(port, pending_polls=3) as fake:
        receivers = [
            _cli("recv", "--controller", fake.url, "--model", digest, "--source", LOOPBACK, "--interface", LOOPBACK,
                 "--ip", f"127.0.0.{i + 2}", "--out", str(tmp_path / f"out{i}.bin"), "--json", "--timeout", "20", env=env)
            for i in range(2)
        ]
        try:
            sender = _cli("send", str(model), "--controller", fake.url, "--interface", LOOPBACK, "--ttl", "0",
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
        assert (tmp_path / f"out{i}.bin").read_bytes() == model.read_bytes()
    calls = [(m, p) for m, p, _, _ in fake.calls]
    # The sender named the model by its digest and registered as the source.
    posts = [b for m, p, b, _ in fake.calls if m == "POST"]
    assert {"model": digest, "source": LOOPBACK} in posts and len(fake.groups) == 1
    for ip in ("127.0.0.2", "127.0.0.3"):
        assert ("PUT", f"/v1/groups/1/receivers/{ip}") in calls
        assert ("DELETE", f"/v1/groups/1/receivers/{ip}") in calls
    assert calls.count(("GET", "/v1/groups/1")) >= 3  # waited through the pending reads
    assert {auth for *_, auth in fake.calls} == {"Bearer tok"}


# --------------------------------------------------------------------------- CLI polish


def test_on_complete_hook_status_is_reported(tmp_path) -> None:
    args = build_parser().parse_args(["recv", "--group", "239.1.1.1:5000", "--source", LOOPBACK, "--out",
                                      str(tmp_path / "m.bin"), "--json", "--on-complete",
                                      f"{sys.executable} -c 'import sys; sys.exit(len(sys.argv[1]) % 1 + 3)'"])
    hook = _run_hook(args, ok=True)
    assert hook is not None and hook["exit_status"] == 3 and hook["command"][-1] == str(tmp_path / "m.bin")
    assert _run_hook(args, ok=False) is None  # never load an unverified file
    args.on_complete = "/nonexistent/loader"
    assert _run_hook(args, ok=True)["exit_status"] == 127


def test_progress_bar_only_on_a_terminal(monkeypatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    args = build_parser().parse_args(["recv", "--group", "239.1.1.1:5000", "--source", LOOPBACK, "--out", "x"])
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    bar = Progress(args, "recv")
    bar.update(500_000, 1_000_000, repairs=7, note="nacks 2", force=True)
    bar.close()
    assert "repairs 7" in tty.getvalue() and "nacks 2" in tty.getvalue()
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    bar = Progress(args, "recv")
    bar.update(1, 2, repairs=0, force=True)
    bar.close()
    assert pipe.getvalue() == ""


def test_metrics_endpoint_exposes_counters() -> None:
    import urllib.request

    from hostagent.common import Stats
    from hostagent.metrics import serve

    stats = Stats(datagrams_out=12, nacks_received=3, repairs_multicast=5, repair_bytes_multicast=7000)
    stats.drops["bad_mac"] = 2
    port = _closed_port()
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
