"""A host agent waiting for a transfer asks the controller once per change, not ten
times a second: ``GET /v1/groups/{id}`` held until the group differs from the caller's
last answer (``If-None-Match`` + ``Prefer: wait``). A poll costs the controller ~0.7 ms
of CPU, so 100 agents polling at 10 Hz kept one core busy; these tests hold the real
controller process to the request count."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hostagent.api import _await_announced
from hostagent.control import ControllerClient
from tests.support.controller_env import R1, R2, S, TOKEN, real_controller


@pytest.fixture(scope="module")
def ctl(tmp_path_factory):
    with real_controller(Path(tmp_path_factory.mktemp("watch")), TOKEN) as ctl:
        yield ctl


def gets(ctl) -> int:
    """GET requests the controller served so far (its own /metrics count)."""
    text = ctl.api("GET", "/metrics").text
    return int(sum(float(v) for v in re.findall(r'modelcast_rest_requests_total\{method="GET",status="\d+"\} (\S+)', text)))


def test_a_held_get_answers_on_the_change_or_304_after_the_wait(ctl):
    client = ControllerClient(ctl.url, token=TOKEN)
    g = client.create_group("watch-a", S, [R1])
    first, tag = client.watch_group(g["id"])
    assert first is not None and first["id"] == g["id"] and tag
    t0 = time.monotonic()
    same, tag2 = client.watch_group(g["id"], tag, wait=0.4)
    assert same is None and tag2 == tag and time.monotonic() - t0 >= 0.35  # held, then 304
    rekey = threading.Timer(0.3, lambda: ControllerClient(ctl.url, token=TOKEN).rekey(
        g["id"], session="00000000000000aa", file_digest="ee" * 32))
    rekey.start()
    try:
        changed, tag3 = client.watch_group(g["id"], tag, wait=10)
    finally:
        rekey.join()
    assert changed is not None and changed["session"] == "00000000000000aa" and tag3 != tag


def test_a_receiver_waiting_for_the_announcement_asks_once_per_change(ctl):
    """It joined before any sender announced; the announcement comes 1.5 s later. A
    receiver polling every 0.1 s would have asked ~15 times; held GETs ask about twice."""
    client = ControllerClient(ctl.url, token=TOKEN)
    g = client.create_group("watch-b", S, [R1])
    announce = threading.Timer(1.5, lambda: ControllerClient(ctl.url, token=TOKEN).rekey(
        g["id"], session="00000000000000bb", file_digest="ff" * 32))
    before = gets(ctl)
    announce.start()
    try:
        found = _await_announced(client, g["id"], g, None, timeout=20)
    finally:
        announce.join()
    asked = gets(ctl) - before - 1  # (this count's own GET of /metrics)
    assert found.session == 0xBB and found.file_digest == bytes.fromhex("ff" * 32)
    print(f"\nGETs while waiting 1.5 s for the announcement: {asked}")
    assert 1 <= asked <= 3, asked


def test_an_idle_model_server_asks_about_once_a_second(ctl):
    """``modelcast serve``'s loop for one model, nobody fetching: it used to GET the group
    every 0.1 s; held GETs ask about once a second (each held up to ``_IDLE_WAIT``)."""
    import dataclasses
    from hostagent import serve
    from hostagent.api import SendOptions

    client = ControllerClient(ctl.url, token=TOKEN)
    g = client.create_group("watch-c", S, [])
    m = serve.Model(path="-", name="m", source=None, digests=(b"", b""), content_id="blake3:00",  # type: ignore[arg-type]
                    size=1000, files=1, group_id=g["id"])
    opts = serve.ServeOptions(controller=ctl.url, token=TOKEN, poll=0.1)
    send = dataclasses.replace(SendOptions(), controller=ctl.url, token=TOKEN)
    stop = threading.Event()
    events: list = []
    before = gets(ctl)
    loop = threading.Thread(target=serve._model_loop, args=(m, send, opts, stop, events.append))
    loop.start()
    time.sleep(3.0)
    stop.set()
    loop.join(5)
    asked = gets(ctl) - before - 1
    print(f"\nGETs of an idle model server in 3 s: {asked}")
    assert not loop.is_alive() and not events  # stopped within its wait; no round started
    assert 1 <= asked <= 6, asked  # (polling: ~30)


def test_held_gets_never_take_the_connections_other_calls_need(tmp_path):
    """A controller serving 16 REST connections holds at most 12 GETs (3/4): a 13th
    waiting GET is answered at once (304), a create and /metrics are answered while the
    12 are held, the client that was not held pauses instead of asking again at once,
    and a change answers every held one. (With eventlet's default of 1024 connections
    and no limit, ~1000 waiting host agents left no connection for any other call.)"""
    import concurrent.futures

    with real_controller(tmp_path, TOKEN, args=["--rest-connections", "16"]) as ctl:
        client = ControllerClient(ctl.url, token=TOKEN)
        g = client.create_group("watch-d", S, [R1])
        _, tag = client.watch_group(g["id"])
        path, wait = f"/v1/groups/{g['id']}", {"If-None-Match": tag, "Prefer": "wait=15"}

        def metric(name: str) -> float:
            text = ctl.api("GET", "/metrics").text
            return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            held = [pool.submit(ctl.api, "GET", path, headers=dict(wait), timeout=30) for _ in range(12)]
            deadline = time.monotonic() + 10
            while metric("modelcast_rest_held_requests") < 12 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert metric("modelcast_rest_held_requests") == 12
            t0 = time.monotonic()
            extra = ctl.api("GET", path, headers=dict(wait))
            answered_s = time.monotonic() - t0
            assert extra.status_code == 304 and answered_s < 2, answered_s  # not held: at once
            assert metric("modelcast_rest_holds_refused") == 1
            t0 = time.monotonic()
            same, _ = client.watch_group(g["id"], tag, wait=5)  # not held either: paces itself
            paced_s = time.monotonic() - t0
            assert same is None and 0.45 <= paced_s < 3, paced_s
            t0 = time.monotonic()
            other = client.create_group("watch-e", S, [R1])  # the other calls still get through
            assert other["id"] != g["id"] and time.monotonic() - t0 < 3
            assert not any(f.done() for f in held)  # (the create changed another group)
            client.join(g["id"], R2)  # a change of theirs: every held GET answers it
            answers = [f.result(timeout=10) for f in held]
        assert [a.status_code for a in answers] == [200] * 12
        assert all(a.json()["receivers"].get(R2) for a in answers)
        assert metric("modelcast_rest_held_requests") == 0
        print(f"\n12 held, the 13th answered in {answered_s * 1000:.0f} ms; an unheld client paused {paced_s:.2f} s")


def kept_open(ctl, n: int) -> list:
    """``n`` raw connections to the controller, each answered one request (200) and then
    left open, as a keep-alive client between calls."""
    import socket

    host, port = ctl.url.split("//")[1].rsplit(":", 1)
    conns = []
    deadline = time.monotonic() + 5
    while len(conns) < n:
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"GET /v1/groups HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = s.recv(65536)
        if answer.startswith(b"HTTP/1.1 503") and time.monotonic() < deadline:
            # (an earlier call's connection, closed by this side, that the server has not
            # seen closed yet still counts against the per-client cap: as until_served)
            s.close()
            time.sleep(0.1)
            continue
        assert answer.startswith(b"HTTP/1.1 200"), answer
        conns.append(s)
    return conns


def test_idle_connections_are_closed_so_they_cannot_take_every_slot(tmp_path):
    """16 connections each sent one request and then stayed open doing nothing: with
    eventlet's defaults they kept all 16 of the server's connections forever and every
    other client waited; with ``--rest-idle 1`` the server closes them after ~1 s and
    the next call is served."""
    with real_controller(tmp_path, TOKEN, args=["--rest-connections", "16", "--rest-idle", "1"]) as ctl:
        idle = kept_open(ctl, 16)
        try:
            served, waited = timed_get(ctl, "/v1/groups")
            assert served.status_code == 200 and 0.5 <= waited < 5, waited  # after the idle ones closed
            assert all(s.recv(1) == b"" for s in idle)  # the server closed them
        finally:
            for s in idle:
                s.close()
        print(f"\n16 idle connections held every slot; the next call was served after {waited:.2f} s")


def timed_get(ctl, path: str) -> tuple[Any, float]:
    """(the answer to GET ``path``, the seconds it took)"""
    t0 = time.monotonic()
    answer = ctl.api("GET", path, timeout=10)
    return answer, time.monotonic() - t0


def until_served(ctl, path: str) -> Any:
    """GET ``path`` again while it is refused (503) for up to 5 s: the server sees a
    client's closed connection a moment after the client closed it."""
    deadline = time.monotonic() + 5
    while (answer := ctl.api("GET", path, timeout=10)).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    return answer


def test_one_client_cannot_take_every_connection(tmp_path):
    """``--rest-per-client 4``: a client holding 4 connections gets a 503 with a JSON
    error and ``Retry-After`` for a fifth (counted in /metrics), not a hang; once it
    closes one, its next call is served. (eventlet's default: one host could hold all.)"""
    with real_controller(tmp_path, TOKEN, args=["--rest-connections", "16", "--rest-per-client", "4"]) as ctl:
        held = kept_open(ctl, 4)
        try:
            refused, answered_s = timed_get(ctl, "/v1/groups")
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
            assert "at most 4 at once from one client" in refused.json()["error"] and answered_s < 2
            held.pop().close()
            assert until_served(ctl, "/v1/groups").status_code == 200  # one closed: served again
        finally:
            for s in held:
                s.close()
        text = until_served(ctl, "/metrics").text
        assert float(re.search(r"^modelcast_rest_connections_refused (\S+)$", text, re.M).group(1)) >= 1
        assert float(re.search(r"^modelcast_rest_connections (\S+)$", text, re.M).group(1)) >= 1
        print(f"\nthe fifth connection of one client: 503 in {answered_s * 1000:.0f} ms")


def test_a_request_trickled_a_byte_at_a_time_is_cut_and_honest_clients_are_not(tmp_path):
    """Slowloris: eventlet's timeouts are per read, so a client sending one byte of its
    request every 0.2 s kept its connection forever (``--rest-per-client`` of them per
    address). With ``--rest-idle 1`` a request must arrive whole within 1 s of its first
    byte: the trickling connection is closed after ~1 s, while on the same server a
    keep-alive client making a request every 0.6 s for 2 s, and a GET held 2 s for a
    change, are answered as before (the clock runs only while a request arrives). A body
    trickled the same way is answered 408."""
    import socket

    with real_controller(tmp_path, TOKEN, args=["--rest-connections", "16", "--rest-idle", "1"]) as ctl:
        host, port = ctl.url.split("//")[1].rsplit(":", 1)
        slow = socket.create_connection((host, int(port)), timeout=5)
        request = b"GET /v1/groups HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100 + b"\r\n\r\n"
        t0, closed_after, sent = time.monotonic(), None, 0
        slow.settimeout(0.01)
        while closed_after is None and time.monotonic() - t0 < 5 and sent < len(request) - 1:
            try:
                slow.send(request[sent:sent + 1])
                sent += 1
                if slow.recv(1) == b"":
                    closed_after = time.monotonic() - t0
            except socket.timeout:
                pass
            except OSError:  # reset: closed
                closed_after = time.monotonic() - t0
            time.sleep(0.2)
        slow.close()
        assert closed_after is not None and 0.8 <= closed_after < 2.5, (closed_after, sent)

        honest = socket.create_connection((host, int(port)), timeout=5)
        answers = []
        for _ in range(4):  # 4 requests over ~2 s on one connection, each sent whole
            honest.sendall(b"GET /v1/groups HTTP/1.1\r\nHost: x\r\n\r\n")
            answers.append(honest.recv(65536)[:12])
            time.sleep(0.6)
        honest.close()
        assert answers == [b"HTTP/1.1 200"] * 4, answers

        # a body trickled the same way: 408 with a JSON error (the client's doing, not a
        # 500 with a traceback), and the connection closed
        body = b'{"model": "slow-b", "source": "%s", "receivers": []}' % S.encode()
        slow = socket.create_connection((host, int(port)), timeout=5)
        slow.sendall(b"POST /v1/groups HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (TOKEN.encode(), len(body)))
        answer, t2 = b"", time.monotonic()
        slow.settimeout(0.01)
        for i in range(len(body)):
            try:
                slow.send(body[i:i + 1])
                answer += slow.recv(65536)
            except socket.timeout:
                pass
            except OSError:
                break
            if answer.endswith(b"}") or time.monotonic() - t2 > 5:
                break
            time.sleep(0.2)
        slow.close()
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"within 1 s of its first byte" in answer and b"Connection: close" in answer, answer
        assert "Traceback" not in ctl.log_text()

        client = ControllerClient(ctl.url, token=TOKEN)
        g = client.create_group("slow-a", S, [R1])
        _, tag = client.watch_group(g["id"])
        t1 = time.monotonic()
        held = ctl.api("GET", f"/v1/groups/{g['id']}", headers={"If-None-Match": tag, "Prefer": "wait=2"}, timeout=10)
        held_s = time.monotonic() - t1
        assert held.status_code == 304 and 1.8 <= held_s < 4, (held.status_code, held_s)
    print(f"\na request trickled a byte per 0.2 s: closed after {closed_after:.2f} s ({sent} bytes); "
          f"4 whole requests over 2 s on one connection answered; a 2 s hold answered 304 after {held_s:.2f} s")
