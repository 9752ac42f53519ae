"""The agent's metrics port against clients that connect and do not go away (issue 46,
finding 6): the threads it runs stay within its connection limit however many connect,
an idle connection is closed after its idle time and a trickling one at its whole
time, and a scrape is served again as soon as a slot is free."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from typing import Iterator

import pytest

from hostagent import metrics
from hostagent.common import Stats
from lab.sh import free_port
from tests.support.agents import LOOPBACK

LIMIT = 8  # metrics.MAX_CONNECTIONS


@pytest.fixture
def port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The receiver's exporter on a free port, with short times (2 s idle, 3 s whole)."""
    monkeypatch.setattr(metrics, "IDLE_S", 2.0, raising=False)
    monkeypatch.setattr(metrics, "CONNECTION_S", 3.0, raising=False)
    stats = Stats(datagrams_in=42)
    chosen = free_port()
    server = metrics.serve("receiver", lambda: stats, lambda: (1, 2), chosen)
    try:
        yield chosen
    finally:
        server.shutdown()
        server.server_close()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_many_idle_connections_cost_a_bounded_number_of_threads_and_are_closed(port: int) -> None:
    before = threading.active_count()
    idle = [socket.create_connection((LOOPBACK, port)) for _ in range(60)]
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= LIMIT
        closed = 0
        for conn in idle:  # all but the served ones were closed at once, unread
            conn.settimeout(0.2)
            try:
                closed += conn.recv(1) == b""
            except (socket.timeout, ConnectionResetError):
                pass
        assert closed >= 60 - LIMIT
        time.sleep(2.5)  # past the idle time: the served ones are closed too
        assert threading.active_count() - before <= 0
        assert 'modelcast_datagrams_total{direction="in",role="receiver"} 42.0' in scrape(port)
    finally:
        for conn in idle:
            conn.close()


def test_a_connection_trickling_bytes_is_cut_at_its_whole_time(port: int) -> None:
    conn = socket.create_connection((LOOPBACK, port))
    started = time.monotonic()
    try:
        conn.settimeout(0.1)
        for byte in b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 200:  # one byte every 0.1 s: never idle
            try:
                conn.sendall(bytes([byte]))
                if conn.recv(1) == b"":
                    break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        took = time.monotonic() - started
        assert 3.0 <= took <= 4.5, took
    finally:
        conn.close()
    assert "modelcast_progress_bytes" in scrape(port)
