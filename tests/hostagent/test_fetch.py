"""``modelcast fetch`` against sources and a controller that do not cooperate (issue 46,
finding 3; issue 49, bug 1): a permanent refusal ends the fetch at once, what may go
another way is asked again with a bounded back-off, offers are ranked and a source that
failed is set aside, every attempt has a hard deadline and ``patience`` caps the whole
fetch; ``recv --model`` without ``--expect`` says that nothing pins the content. The
attempts run against the fake controller, with the receive replaced where only the fetch's
own decisions are under test, and for real on loopback where a liar holds the group's key."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import msgpack
import pytest

import hostagent.serve as serve
from hostagent import ReceiveOptions, api, tree, wire
from hostagent.control import ControllerClient, ControllerError, session_key
from hostagent.net import FileSource
from hostagent.sender import build_manifest_pages, file_digests
from lab.models import file_digest, make_model
from tests.support.agents import LOOPBACK, FakeController, cli, loopback_group, sender_config

MODEL = tree.ID_PREFIX + "ab" * 32
SOURCE_REFUSAL = "receiver 127.0.0.1 is the group's source"


class Scripted(FakeController):
    """The fake controller with answers scripted per call: ``script`` maps (method,
    path prefix) to a list of (status, error) answers used up in order, then as usual;
    one given as (status, error, "forever") is kept."""

    def __init__(self, *args: Any, script: Optional[dict] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.script = {k: list(v) for k, v in (script or {}).items()}

    def route(self, method: str, path: str, body: Optional[dict]) -> tuple[int, Any]:
        for (m, prefix), answers in self.script.items():
            if m == method and path.startswith(prefix) and answers:
                status, error, *forever = answers[0]
                if not forever:
                    answers.pop(0)
                return status, {"error": error, "detail": None}
        return super().route(method, path, body)

    def count(self, method: str, prefix: str) -> int:
        return sum(1 for m, p, _, _ in self.calls if m == method and p.startswith(prefix))


def options(ctl: FakeController, ip: str = "127.0.0.2", timeout: float = 10) -> ReceiveOptions:
    return ReceiveOptions(controller=ctl.url, ip=ip, interface=ip, source="", timeout=timeout, insecure=True)


def offer(ctl: FakeController, source: str, model: str = MODEL) -> None:
    ControllerClient(ctl.url).offer(model, source, "model.bin", 1000, 1)


# ----------------------------------------------------------------------------- issue 49, bug 1


def test_a_permanent_refusal_ends_the_fetch_at_once_with_the_controllers_message(tmp_path: Path) -> None:
    """The join is refused (400: this host is the group's source): asking again gets the
    same answer, so the fetch ends after one join, at once, with that answer -- it used
    to ask 2,079 times in 15 s."""
    _, port = loopback_group()
    with Scripted(port, pending_polls=0, script={("PUT", "/v1/groups/"): [(400, SOURCE_REFUSAL, "forever")]}) as ctl:
        offer(ctl, LOOPBACK)
        started = time.monotonic()
        with pytest.raises(ControllerError) as caught:
            serve.fetch(MODEL, str(tmp_path / "out"), options(ctl), patience=10)
        assert time.monotonic() - started < 2.0
        assert SOURCE_REFUSAL in str(caught.value) and "(400)" in str(caught.value)
        assert ctl.count("PUT", "/v1/groups/") == 1


def test_what_may_go_another_way_is_asked_again_after_a_growing_pause(tmp_path: Path) -> None:
    """The offers answer 500 four times, then the join is refused: four pauses, each about
    twice the last and none above the bound, then the refusal ends the fetch."""
    _, port = loopback_group()
    script = {("GET", "/v1/offers"): [(500, "store unavailable")] * 4,
              ("PUT", "/v1/groups/"): [(400, SOURCE_REFUSAL, "forever")]}
    pauses: list[float] = []
    events: list = []
    with Scripted(port, pending_polls=0, script=script) as ctl:
        offer(ctl, LOOPBACK)
        with pytest.raises(ControllerError, match="group's source"):
            serve.fetch(MODEL, str(tmp_path / "out"), options(ctl), patience=60, sleep=pauses.append,
                        on_event=events.append)
    assert len(pauses) == 4 and ctl.count("GET", "/v1/offers") == 5
    assert 0.8 * serve.BACKOFF_FIRST_S <= pauses[0] <= 1.2 * serve.BACKOFF_FIRST_S
    for a, b in zip(pauses, pauses[1:]):
        assert 1.3 * a <= b <= serve.BACKOFF_MAX_S, pauses
    assert [e.seconds for e in events if isinstance(e, serve.FetchWaiting)] == [round(p, 3) for p in pauses]


def test_a_controller_that_keeps_failing_is_asked_only_until_patience_ends(tmp_path: Path) -> None:
    """Every call answers 500: the fetch gives up when its patience ends, having asked a
    few times (not thousands), and says why."""
    _, port = loopback_group()
    with Scripted(port, script={("GET", "/v1/offers"): [(500, "store unavailable", "forever")]}) as ctl:
        started = time.monotonic()
        with pytest.raises(api.TransferError, match=r"within --patience 3s \(.*store unavailable"):
            serve.fetch(MODEL, str(tmp_path / "out"), options(ctl), patience=3)
        assert 2.9 <= time.monotonic() - started < 5
        assert 3 <= ctl.count("GET", "/v1/offers") <= 6


# ----------------------------------------------------------------------------- issue 46, finding 3


def test_offers_are_ranked_and_a_source_that_failed_is_set_aside() -> None:
    sources = serve.Sources()
    offers = [{"id": 3, "source": "10.0.0.3", "group": 7}, {"id": 1, "source": "10.0.0.1", "group": None},
              {"id": 2, "source": "10.0.0.2", "group": 5}, {"id": "x"}, "junk"]
    assert sources.pick(offers)["source"] == "10.0.0.2"  # its group exists; the earliest such offer
    sources.failed("10.0.0.2", 1.0)
    assert sources.pick(offers)["source"] == "10.0.0.3"
    sources.failed("10.0.0.3", 2.0)
    assert sources.pick(offers)["source"] == "10.0.0.1"
    sources.failed("10.0.0.1", 3.0)
    assert sources.pick(offers)["source"] == "10.0.0.2", "all failed once: the one that failed longest ago"
    sources.failed("10.0.0.2", 4.0)
    assert sources.pick(offers)["source"] == "10.0.0.3", "fewest failures first"
    sources.failed("10.0.0.3", 5.0)
    sources.gave("10.0.0.1", 10)
    sources.failed("10.0.0.1", 6.0)
    assert sources.pick(offers)["source"] == "10.0.0.2", "all failed twice: the one that failed longest ago"
    fresh = serve.Sources()
    fresh.gave("10.0.0.3", 1)
    assert fresh.pick(offers)["source"] == "10.0.0.3", "a source that gave verified chunks first"
    assert sources.pick([]) is None and sources.pick(["junk"]) is None


def result(out: str, ok: bool, error: Optional[str] = None, dropped: Optional[dict] = None) -> api.ReceiveResult:
    """A ReceiveResult as an attempt that ended so would return it."""
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(api.ReceiveResult):
        if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            values[spec.name] = {"bool": False, "int": 0, "float": 0.0, "str": ""}.get(str(spec.type), None)
    values.update(ok=ok, digest_ok=ok, out=out, error=error, dropped=dropped or {}, content_id=MODEL if ok else None)
    return api.ReceiveResult(**values)


def write_record(out: str, chunks: int) -> None:
    """What a receiver that verified ``chunks`` chunks leaves beside ``out``."""
    with open(out + ".modelcast-state", "wb") as handle:
        handle.write(msgpack.packb({"v": 1, "digest": b"d" * 32, "size": 1 << 30, "chunk": 1 << 20,
                                    "verified": [[0, chunks]], "complete": False, "rid": 1}))


def test_liars_are_each_tried_once_then_set_aside_and_every_attempt_has_a_deadline(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """Three hosts offer the model and send another content (refused); one serves it. Each
    liar is tried once, never again, and every attempt is given a hard deadline within
    its share of the patience."""
    _, port = loopback_group()
    tried: list[tuple[str, float]] = []

    def fake_receive(out: str, opts: ReceiveOptions, **_: Any) -> api.ReceiveResult:
        assert opts.expect == MODEL and opts.deadline is not None
        tried.append((opts.source, opts.deadline - time.monotonic()))
        if opts.source != "10.0.0.9":
            return result(out, False, "content id mismatch", {"wrong_content_id": 1})
        return result(out, True)

    monkeypatch.setattr(serve, "receive", fake_receive)
    with FakeController(port) as ctl:
        for host in ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.9"):
            offer(ctl, host)
        events: list = []
        got = serve.fetch(MODEL, str(tmp_path / "out"), options(ctl), patience=100, attempt_s=20,
                          on_event=events.append, sleep=lambda s: None)
    assert got.ok
    assert [source for source, _ in tried] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.9"]
    assert all(19 <= left <= 20 for _, left in tried), tried
    assert [(e.source, e.set_aside) for e in events if isinstance(e, serve.Fetched)] == [
        ("10.0.0.1", True), ("10.0.0.2", True), ("10.0.0.3", True)]


def test_patience_caps_the_whole_fetch_even_while_a_source_makes_progress(tmp_path: Path, monkeypatch) -> None:
    """A source that trickles: every attempt verifies a little and runs into its deadline.
    The fetch goes on from the record while that helps, and ends when patience does,
    saying so -- no attempt runs past it."""
    _, port = loopback_group()
    now = [0.0]
    held = [0]
    out = str(tmp_path / "out")

    def slow_receive(out: str, opts: ReceiveOptions, **_: Any) -> api.ReceiveResult:
        assert opts.deadline is not None
        now[0] += round(opts.deadline - time.monotonic(), 2)  # (the receiver runs until its deadline)
        held[0] += 3
        write_record(out, held[0])
        return result(out, False, "deadline passed before the content was verified")

    monkeypatch.setattr(serve, "receive", slow_receive)
    with FakeController(port) as ctl:
        offer(ctl, "10.0.0.1")
        events: list = []
        got = serve.fetch(MODEL, out, options(ctl), patience=100, attempt_s=30, on_event=events.append,
                          clock=lambda: now[0], sleep=lambda s: None)
    assert not got.ok and got.error is not None and "within --patience 100s" in got.error
    assert 99.9 <= now[0] <= 100.1 and held[0] == 12  # attempts of 30, 30, 30 and the last 10 s
    assert [e.set_aside for e in events if isinstance(e, serve.Fetched)] == [False, False, False]


def test_a_liar_holding_the_key_cannot_hold_a_fetch_and_the_server_then_serves_it(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """A host offers the model before its real server and sends only the model's own
    manifest pages (so they are accepted, then only repeated), never data. The fetch
    tries the earlier offer, gives up on it one --timeout later (its repeated pages are
    no sign of life), sets it aside and verifies the model from the server."""
    monkeypatch.setenv("MODELCAST_CACHE_DIR", str(tmp_path / "cache"))
    group, port = loopback_group()
    model = make_model(tmp_path / "model.bin", 600_000, seed=8)
    liar_ip = "127.0.0.5"
    with FakeController(port, pending_polls=0, address=group) as ctl, \
            Liar(ctl, str(model.path), liar_ip, group, port) as liar:
        stop = threading.Event()
        opts = serve.ServeOptions(
            controller=ctl.url, ip=LOOPBACK, poll=0.05,
            send=api.SendOptions(interface=LOOPBACK, ttl=0, rate_mbit=100, chunk_size=liar.chunk, insecure=True,
                                 poll=0.1, wait_timeout=5, timeout=10),
            rounds=serve.RoundSettings(quiet_s=0.2, max_wait_s=0.5))
        server = threading.Thread(target=serve.serve, args=([str(model.path)], opts, stop))
        server.start()
        try:
            client = ControllerClient(ctl.url)
            deadline = time.monotonic() + 20
            while len(client.offers(liar.model_id)) < 2:
                assert time.monotonic() < deadline, "the server did not offer the model"
                time.sleep(0.05)
            events: list = []
            started = time.monotonic()
            got = serve.fetch(liar.model_id, str(tmp_path / "copy.bin"), options(ctl, timeout=2), patience=60,
                              on_event=events.append)
            took = time.monotonic() - started
        finally:
            stop.set()
            server.join(30)
    assert got.ok and file_digest(tmp_path / "copy.bin") == model.digest
    fetched = [e for e in events if isinstance(e, serve.Fetched)]
    assert [(e.source, e.error, e.set_aside) for e in fetched] == [(liar_ip, "sender silent", True)]
    assert liar.pages_sent > 40 and took < 15, took


class Liar:
    """A host that offers ``path``'s model and sends only its manifest pages, MAC'd with
    the key of the group it is the source of, every 50 ms (``pages_sent``)."""

    def __init__(self, ctl: FakeController, path: str, ip: str, group: str, port: int) -> None:
        self.chunk = 65536
        self.ip, self.dest = ip, (group, port)
        client = ControllerClient(ctl.url)
        with FileSource(path) as source:
            digests = file_digests(source, self.chunk)
            size = source.size
            self.model_id = tree.content_id(b"", size, self.chunk, digests[1], digests[0])
            gid = client.create_group(self.model_id, ip)["id"]
            client.offer(self.model_id, ip, os.path.basename(path), size, 1)
            session = 0x5EED
            key = session_key(client.rekey(gid, f"{session:016x}", digests[1].hex()))
            cfg = sender_config(key=key, chunk_size=self.chunk, session_id=session)
            self.pages = [wire.encode(p, key) for p in build_manifest_pages(source, cfg, session, digests)]
        self.pages_sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Liar":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(self.ip))
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 0)
            sock.bind((self.ip, 0))
            while not self._stop.wait(0.05):
                for page in self.pages:
                    sock.sendto(page, self.dest)
                    self.pages_sent += 1


# ----------------------------------------------------------------------------- issue 46, finding 7


def test_recv_model_without_expect_says_nothing_pins_the_content(tmp_path: Path) -> None:
    """One line on stderr, before anything else happens; none with --expect."""
    _, port = loopback_group()
    with FakeController(port, pending_polls=0) as ctl:
        runs = {}
        for name, extra in (("model", ["--model", "llama"]), ("expect", ["--expect", MODEL])):
            proc = cli("recv", "--controller", ctl.url, "--source", LOOPBACK, "--ip", "127.0.0.2",
                       "--out", str(tmp_path / name), "--timeout", "1", "--insecure", *extra)
            _, err = proc.communicate(timeout=30)
            runs[name] = err.splitlines()
    warned = [line for line in runs["model"] if "no --expect" in line]
    assert len(warned) == 1 and "'llama'" in warned[0] and "pins" in warned[0], runs["model"]
    assert not any("no --expect" in line for line in runs["expect"]), runs["expect"]
