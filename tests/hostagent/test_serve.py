"""``modelcast serve`` / ``fetch``: the round policy (pure: arrivals and ``now`` in,
decisions out) and one server and fetcher in-process on loopback against the fake
controller. The OVS lab run with a fleet arriving over time is tests/lab/test_serve.py."""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
import urllib.request
from contextlib import contextmanager
from typing import Iterator, Optional

import pytest

import hostagent.serve as serve
from hostagent import ReceiveOptions, SendOptions
from hostagent.control import ControllerClient
from hostagent.serve import RoundSettings, Rounds
from lab.models import file_digest, make_model
from lab.sh import free_port
from tests.support.agents import LOOPBACK, FakeController, loopback_group

A, B, C, D = "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"
T = 8.0  # one transfer, seconds
SETTINGS = RoundSettings(quiet_s=0.5, max_wait_s=3.0, window_share=0.25, admit_share=0.5)


def policy() -> Rounds:
    return Rounds(SETTINGS, T)


def test_a_lone_request_waits_only_the_quiet_gap():
    p = policy()
    p.observe(frozenset({A}), 10.0)
    assert p.due(10.4) is None and p.window_closes() == 10.5
    assert p.due(10.5) == {A}


def test_a_burst_keeps_the_window_open_but_never_longer_than_its_bound():
    """Requests 0.4 s apart keep extending the window; it closes 2 s (a quarter of one
    transfer, below max_wait_s) after the first, with everyone who came by then."""
    p = policy()
    hosts = [f"10.0.1.{i}" for i in range(1, 10)]
    asking: set[str] = set()
    started = None
    for i, host in enumerate(hosts):
        now = 100.0 + 0.4 * i
        asking.add(host)
        p.observe(frozenset(asking), now)
        started = p.due(now)
        if started is not None:
            break
    assert started is not None and now == pytest.approx(102.0)  # 0.25 x 8 s after the first
    assert started == frozenset(hosts[:6])


def test_arrivals_during_a_round_join_it_while_little_was_missed_else_the_next():
    p = policy()
    p.observe(frozenset({A}), 0.0)
    p.started(p.due(0.5), 0.5)
    assert p.running and p.admitted() == {A} and p.due(1.0) is None
    assert p.observe(frozenset({A, D}), 0.6) == [D]  # the round is still being set up: nothing missed
    assert p.late == {D: 0.0}
    p.streaming(0.7)
    # 1.8 s into an 8 s stream: 22.5% missed -> admitted, repaired in this round
    assert p.observe(frozenset({A, D, B}), 2.5) == [B]
    assert p.admitted() == {A, B, D} and p.late == {D: 0.0, B: 0.225}
    # 6 s in: 69% missed -> not admitted; it waits for the next round
    assert p.observe(frozenset({A, D, B, C}), 6.0) == []
    assert C not in p.admitted() and p.deferred == {C} and p.due(6.0) is None
    # the round ends: A and B verified (still in the group until they leave), C starts the next at once
    p.ended(frozenset({A, B, D}), 9.5, stream_s=8.4)
    assert not p.running and p.transfer_s == 8.4
    assert p.due(9.5) == {C}
    p.started(frozenset({C}), 9.5)
    p.observe(frozenset({A, B, C, D}), 9.6)  # the verified ones have not left yet: not new requests
    assert p.admitted() == {C} and not p.waiting


def test_an_admitted_host_that_did_not_verify_is_first_in_the_next_round():
    p = policy()
    p.observe(frozenset({A, B}), 0.0)
    p.started(p.due(0.5), 0.5)
    p.ended(frozenset({A}), 9.0)
    p.observe(frozenset({A, B, D}), 9.1)  # D is new: its own window would close at 9.6
    assert p.due(9.1) == {B, D}  # B has waited since the round began: no new window


def test_a_host_that_leaves_is_forgotten_and_a_verified_one_may_ask_again():
    p = policy()
    p.observe(frozenset({A, B}), 0.0)
    p.observe(frozenset({A}), 0.2)  # B gave up before the round
    p.started(p.due(0.7), 0.7)
    assert p.admitted() == {A}
    p.ended(frozenset({A}), 9.0)
    p.observe(frozenset({A}), 9.1)
    assert p.due(20.0) is None  # verified, still leaving: no round for it
    p.observe(frozenset(), 9.2)  # it left
    p.observe(frozenset({A}), 30.0)  # a new replica on the same host asks again
    assert p.due(30.5) == {A}
    q = policy()
    q.observe(frozenset({A}), 0.0)
    q.started(q.due(0.5), 0.5)
    q.ended(frozenset({A}), 9.0)
    q.observe(frozenset({A}), 9.0 + SETTINGS.done_grace_s)  # never left: it asks again
    assert q.due(9.5 + SETTINGS.done_grace_s) == {A}


def test_while_busy_a_request_is_held_for_others_but_not_at_an_idle_server():
    """With a hold, a request that comes while a round runs (or within one transfer after
    one) waits the hold for others; one at an idle server waits only its window."""
    p = Rounds(dataclasses.replace(SETTINGS, hold_share=0.5), T)  # hold: 0.5 x 8 s = 4 s (max_wait_s 3)
    p.observe(frozenset({A}), 0.0)
    assert p.window_closes() == 0.5  # idle: the usual window
    p.started(p.due(0.5), 0.5)
    p.streaming(0.6)
    p.observe(frozenset({A, B}), 6.0)  # 67% of the stream out: deferred, held from when it asked
    assert B in p.deferred
    p.ended(frozenset({A}), 8.7, stream_s=8.1)
    assert p.due(8.7) is None and p.window_closes() == 6.0 + 3.0
    p.observe(frozenset({A, B, C}), 8.8)  # C comes in the hold: in the same round
    assert p.due(9.0) == {B, C}
    p.started(frozenset({B, C}), 9.0)
    p.ended(frozenset({B, C}), 17.0)
    p.observe(frozenset({D}), 17.5)  # within one transfer of the end: busy, held
    assert p.window_closes() == 17.5 + 3.0
    p.started(p.due(20.5), 20.5)
    p.ended(frozenset({D}), 28.0, stream_s=8.0)
    p.observe(frozenset({A}), 40.0)  # idle again
    assert p.window_closes() == 40.5


@pytest.mark.parametrize("bad", [dict(quiet_s=0), dict(window_share=2), dict(admit_share=-0.1),
                                 dict(done_grace_s=0), dict(hold_share=-1)])
def test_settings_are_checked(bad):
    with pytest.raises(ValueError):
        Rounds(RoundSettings(**bad), T)


# ----------------------------------------------------------------------------- in-process


@contextmanager
def serving(ctl: FakeController, path: str, rate: float, events: list, metrics_port: Optional[int] = None,
            ip: Optional[str] = LOOPBACK, interface: str = LOOPBACK, **rounds: float) -> Iterator[str]:
    """``serve`` of ``path`` in a thread until the block ends; yields the offered model id
    (from the controller, as a fetcher finds it), offered as ``ip`` (None: as the server
    finds its address, here ``interface``). ``events`` gets the server's events and,
    last, the list of models it returns."""
    stop = threading.Event()
    opts = serve.ServeOptions(
        controller=ctl.url, ip=ip, poll=0.05, metrics_port=metrics_port,
        send=SendOptions(interface=interface, ttl=0, rate_mbit=rate, chunk_size=65536, insecure=True,
                         poll=0.1, wait_timeout=5, timeout=10),
        rounds=RoundSettings(quiet_s=0.2, max_wait_s=0.5, **rounds))
    server = threading.Thread(target=lambda: events.append(serve.serve([path], opts, stop, on_event=events.append)))
    server.start()
    try:
        client = ControllerClient(ctl.url)
        deadline = time.monotonic() + 20
        while not client.offers() and time.monotonic() < deadline:
            time.sleep(0.05)
        (offer,) = client.offers()
        assert offer["source"] == (ip or interface) and offer["size"] == os.path.getsize(path)
        yield offer["model"]
    finally:
        stop.set()
        server.join(30)
    assert not server.is_alive()


def fetch_options(ctl: FakeController, ip: str = LOOPBACK) -> ReceiveOptions:
    """A fetcher on ``ip`` (a loopback address of its own: the server tells hosts apart by address)."""
    return ReceiveOptions(controller=ctl.url, ip=ip, interface=ip, source="", timeout=10, insecure=True)


def test_serve_and_fetch_on_loopback(tmp_path, monkeypatch):
    """One server, a fetcher that knows only the model id; it verifies; a second fetch
    is a second round; stopping withdraws the offer and deletes the group."""
    monkeypatch.setenv("MODELCAST_CACHE_DIR", str(tmp_path / "cache"))
    group, port = loopback_group()
    model = make_model(tmp_path / "model.bin", 900_000, seed=5)
    events: list = []
    metrics_port = free_port()
    with FakeController(port, pending_polls=0, address=group) as ctl:
        with serving(ctl, str(model.path), 200, events, metrics_port) as model_id:
            for i in range(2):
                got = serve.fetch(model_id, str(tmp_path / f"copy{i}.bin"), fetch_options(ctl), patience=30)
                assert got.ok and got.content_id == model_id
                assert file_digest(tmp_path / f"copy{i}.bin") == model.digest
            deadline = time.monotonic() + 30  # (the fetcher may verify before the server's round is over)
            while sum(isinstance(e, serve.RoundDone) for e in events) < 2:
                assert time.monotonic() < deadline, f"the server did not finish its second round: {events}"
                time.sleep(0.02)
            with urllib.request.urlopen(f"http://{LOOPBACK}:{metrics_port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        rounds = [e for e in events if isinstance(e, serve.RoundDone)]
        assert [r.verified for r in rounds] == [(LOOPBACK,), (LOOPBACK,)] and all(r.error is None for r in rounds)
        (served,) = [e for e in events if isinstance(e, list)]
        assert served[0].stats.rounds == 2 and served[0].stats.receivers == 2
        assert served[0].stats.bytes_sent >= 2 * model.size
        assert ctl.offers == {} and ctl.groups == {}
    labels = f'{{model="{model_id}",name="model.bin"}}'
    for line in (f"modelcast_serve_rounds_total{labels} 2.0", f"modelcast_serve_receivers_total{labels} 2.0",
                 f"modelcast_serve_receivers_per_round{labels} 1.0", f"modelcast_serve_model_bytes{labels} 900000.0"):
        assert line in text, (line, text)
    # (scraped after both rounds, before the server's last datagrams: at least the model
    # per receiver, at most the final count's share)
    per = float(re.search(rf"^modelcast_serve_bytes_per_receiver{re.escape(labels)} (\S+)$", text, re.M).group(1))
    assert model.size <= per <= served[0].stats.bytes_sent / 2, (per, served[0].stats.bytes_sent)


def test_a_late_arrival_is_repaired_in_the_round_and_a_later_one_takes_the_tail_and_the_next(tmp_path, monkeypatch):
    """Three hosts (loopback addresses of their own): the second asks as the first's
    round starts and is repaired in it; the third asks ~0.6 of a stream later, past
    ``admit_share``: it keeps the tail, sees the round close, and resumes in the next
    round from its record -- a round that ends as soon as it has the start."""
    monkeypatch.setenv("MODELCAST_CACHE_DIR", str(tmp_path / "cache"))
    group, port = loopback_group()
    model = make_model(tmp_path / "model.bin", 12_000_000, seed=6)
    events: list = []
    done: dict[str, tuple] = {}  # ip -> (result, its Fetched events)
    with FakeController(port, pending_polls=0, address=group) as ctl:
        with serving(ctl, str(model.path), 50, events, admit_share=0.2) as model_id:
            transfer = model.size * 8 / 50e6  # one stream at the cap (the sender starts at 70%: longer)

            def one(ip: str) -> threading.Thread:
                def run() -> None:
                    seen: list = []
                    got = serve.fetch(model_id, str(tmp_path / f"copy-{ip}.bin"), fetch_options(ctl, ip),
                                      patience=60, on_event=seen.append)
                    done[ip] = (got, [e for e in seen if isinstance(e, serve.Fetched)])
                thread = threading.Thread(target=run)
                thread.start()
                return thread

            fleet = [one("127.0.0.2")]
            deadline = time.monotonic() + 20
            while not any(isinstance(e, serve.RoundStarted) for e in events) and time.monotonic() < deadline:
                time.sleep(0.01)
            fleet.append(one("127.0.0.3"))
            time.sleep(0.6 * transfer)
            fleet.append(one("127.0.0.4"))
            for t in fleet:
                t.join(90)
    assert all(done[ip][0].ok for ip in done) and len(done) == 3
    for ip in done:
        assert file_digest(tmp_path / f"copy-{ip}.bin") == model.digest
    first, second = [e for e in events if isinstance(e, serve.RoundDone)]
    assert first.receivers == ("127.0.0.2",) and set(first.late) == {"127.0.0.3"}
    assert first.verified == ("127.0.0.2", "127.0.0.3") and first.deferred == ("127.0.0.4",), f"{first}\n{second}"
    assert second.receivers == ("127.0.0.4",) and second.verified == ("127.0.0.4",)
    assert [f.error for f in done["127.0.0.4"][1]] == ["sender closed before the file was complete"]
    assert not done["127.0.0.2"][1] and not done["127.0.0.3"][1]
    assert done["127.0.0.4"][0].resumed_chunks > 0  # it kept the tail of the first round
    # and the second round ended once it had the start: no whole stream for a host holding the tail
    assert second.bytes_sent < 0.9 * model.size, (second.bytes_sent, model.size)


def test_the_server_registers_the_address_its_multicast_leaves_from_not_the_route_to_the_controller(
        tmp_path, monkeypatch):
    """No --ip: the server offers the model as its interface's address (what its
    datagrams come from), not the one the route to the controller (here 127.0.0.1) leaves
    from; ``serving`` checks the offer."""
    monkeypatch.setenv("MODELCAST_CACHE_DIR", str(tmp_path / "cache"))
    group, port = loopback_group()
    model = make_model(tmp_path / "model.bin", 100_000, seed=7)
    with FakeController(port, pending_polls=0, address=group) as ctl:
        with serving(ctl, str(model.path), 100, [], ip=None, interface="127.0.0.2"):
            assert [g["source"] for g in ctl.groups.values()] == ["127.0.0.2"]
