"""``controller.webserver.RequestClock``: the deadline a REST request must arrive within
(slowloris), apart from eventlet's per-read timeouts. The real server is exercised in
``tests/controller/test_watch.py``."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.webserver import RequestClock


def test_idle_between_requests_waits_as_long_as_the_server_says():
    clock = RequestClock(10)
    assert clock.timeout(now=100.0, server_timeout=30) == 30  # no request begun
    assert clock.timeout(now=100.0, server_timeout=None) is None


def test_a_request_has_limit_seconds_from_its_first_byte_however_it_trickles():
    clock = RequestClock(10)
    clock.received(now=100.0, n=1)
    assert clock.timeout(now=101.0, server_timeout=30) == pytest.approx(9)
    clock.received(now=105.0, n=1)  # more bytes do not restart the clock
    assert clock.timeout(now=108.0, server_timeout=30) == pytest.approx(2)
    assert clock.timeout(now=108.0, server_timeout=1) == 1  # the server's own is shorter
    with pytest.raises(socket.timeout, match="within 10 s of its first byte"):
        clock.timeout(now=110.0, server_timeout=30)


def test_an_empty_read_does_not_start_the_clock_and_an_answer_stops_it():
    clock = RequestClock(10)
    clock.received(now=100.0, n=0)  # (the peer closed: nothing arrived)
    assert clock.timeout(now=200.0, server_timeout=30) == 30
    clock.received(now=200.0, n=5)
    clock.answered()  # a held GET's wait and the next idle gap do not count
    assert clock.timeout(now=500.0, server_timeout=30) == 30


@given(st.lists(st.tuples(st.floats(0, 5), st.integers(0, 3)), max_size=30), st.floats(0.5, 20))
def test_no_read_may_wait_past_the_deadline(reads, limit):
    """Whatever a client sends when, the next read never waits past the first byte +
    ``limit``, and past it every read is refused."""
    clock, now, first = RequestClock(limit), 0.0, None
    for gap, n in reads:
        now += gap
        if first is not None and now >= first + limit:
            with pytest.raises(socket.timeout):
                clock.timeout(now, 30)
            return
        t = clock.timeout(now, 30)
        assert t is not None and now + t <= (first + limit if first is not None else now + 30) + 1e-9
        clock.received(now, n)
        if n and first is None:
            first = now
