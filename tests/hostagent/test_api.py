"""The library API in-process: ``hostagent.send`` / ``hostagent.receive`` over loopback
multicast in two threads, and its errors as exceptions (never prints, never exits)."""

from __future__ import annotations

import re
import socket
import sys
import threading
from typing import Optional

import pytest

import hostagent
from hostagent import ReceiveOptions, SendOptions, TransferError
from hostagent import tree
from tests.support.agents import file_id
from hostagent.events import FileComplete, ManifestReceived, ReceiverCompleted, StreamFinished
from lab.models import file_digest, make_model
from lab.sh import free_port
from tests.support.agents import LOOPBACK, FakeController, loopback_group


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def test_send_and_receive_in_process(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("MODELCAST_CACHE_DIR", str(tmp_path / "cache"))
    group, port = loopback_group()
    model = make_model(tmp_path / "model.bin", 700_000, seed=3)
    out = tmp_path / "copy.bin"
    secret = b"in-process secret"
    metrics_port = free_port()
    joined = threading.Event()
    received: dict = {}
    rx_events: list = []
    rx_progress: list = []

    def on_rx_event(event: object) -> None:
        rx_events.append(event)
        if isinstance(event, hostagent.ReceiveStarted):
            joined.set()  # the group is joined: the stream may start

    def receiver() -> None:
        options = ReceiveOptions(group=f"{group}:{port}", source=LOOPBACK, interface=LOOPBACK, secret=secret,
                                 timeout=20, metrics_port=metrics_port)
        try:
            received["result"] = hostagent.receive(str(out), options, on_event=on_rx_event,
                                                   on_progress=rx_progress.append)
        finally:
            joined.set()

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    assert joined.wait(30)
    tx_events: list = []
    tx_progress: list = []
    sent = hostagent.send(
        str(model.path),
        SendOptions(group=f"{group}:{port}", interface=LOOPBACK, ttl=0, receivers=1, rate_mbit=200,
                    chunk_size=65536, secret=secret, timeout=20),
        on_event=tx_events.append, on_progress=tx_progress.append,
    )
    thread.join(30)
    got: Optional[hostagent.ReceiveResult] = received.get("result")

    assert sent.ok and sent.error is None and sent.file_digest == model.digest
    assert sent.gso and sent.gso_datagrams > 0  # GSO by default (loopback takes it)
    assert len(list((tmp_path / "cache").iterdir())) == 1  # the digests, for the next send
    assert [r.ok for r in sent.receivers] == [True] and sent.authenticated
    assert got is not None and got.ok and got.digest_ok and got.file_digest == model.digest
    assert file_digest(out) == model.digest and got.bytes == model.size
    # Events instead of output: the protocol's own, and the orchestration's.
    assert isinstance(tx_events[0], hostagent.SendStarted) and tx_events[0].size == model.size
    assert any(isinstance(e, StreamFinished) for e in tx_events)
    assert any(isinstance(e, ReceiverCompleted) for e in tx_events)
    assert hostagent.MetricsServing(LOOPBACK, metrics_port) in rx_events
    assert any(isinstance(e, ManifestReceived) for e in rx_events)
    assert FileComplete(bytes.fromhex(model.digest)) in rx_events
    assert tx_progress and all(p.total == model.size for p in tx_progress)
    assert rx_progress and all(p.total == model.size for p in rx_progress)
    # The summaries are the CLI's JSON objects; the metrics port is free for the next transfer.
    assert sent.summary()["receivers"][0]["ok"] is True and "finished" not in sent.summary()
    assert got.summary()["on_complete"] is None
    # The marks a bench times a start and an end by, in the order they happen.
    c, rc = sent.clock, got.clock
    assert c["ready"] <= c["first_data"] <= c["stream_end"] <= c["verified"] <= c["result"], c
    assert rc["ready"] <= c["first_data"] and rc["first"] <= rc["verified"] <= rc["acked"] <= rc["result"], rc
    assert rc["first"] >= c["ready"]  # (one clock for both: the first datagram came after the sender was up)
    assert capsys.readouterr() == ("", "")  # a library prints nothing


def test_setup_errors_raise_transfer_error(tmp_path) -> None:
    model = make_model(tmp_path / "m.bin", 1000)
    cases = [
        (lambda: hostagent.send(str(tmp_path / "missing.bin"), SendOptions(group="239.1.2.3:5000")), "no such file"),
        (lambda: hostagent.send(str(model.path)), "group (ADDR:PORT) is required"),
        (lambda: hostagent.send(str(model.path), SendOptions(group="10.0.0.1:5000")), "not a multicast address"),
        (lambda: hostagent.send(str(model.path), SendOptions(group="239.1.2.3:5000", chunk_size=10)), "chunk_size"),
        (lambda: hostagent.receive(str(tmp_path / "o"), ReceiveOptions(controller="http://x", source=LOOPBACK)),
         "model is required"),
        (lambda: hostagent.receive(str(tmp_path / "no" / "dir" / "o"),
                                   ReceiveOptions(group="239.1.2.3:5000", source=LOOPBACK)), "cannot write output"),
    ]
    for call, text in cases:
        with pytest.raises(TransferError, match=re.escape(text)):
            call()


def test_unreachable_controller_raises_controller_error(tmp_path) -> None:
    model = make_model(tmp_path / "m.bin", 1000)
    url = f"http://{LOOPBACK}:{free_port()}"
    with pytest.raises(hostagent.ControllerError, match=f"cannot reach controller at {url}"):
        hostagent.send(str(model.path), SendOptions(controller=url, interface=LOOPBACK))


def test_controller_that_never_installs_the_tree_times_out(tmp_path) -> None:
    model = make_model(tmp_path / "m.bin", 1000)
    events: list = []
    with FakeController(5000, stuck_state="pending") as fake:
        with pytest.raises(hostagent.ControllerError, match="timed out after 0.2s waiting for group 1"):
            hostagent.send(str(model.path), SendOptions(controller=fake.url, interface=LOOPBACK, receivers=1,
                                                        wait_timeout=0.2, poll=0.05), on_event=events.append)
    # Without --model the group is named by the content id (what receivers --expect).
    cid = file_id(model.path, SendOptions.chunk_size)
    assert events == [hostagent.GroupAssigned(1, cid, (FakeController.ADDRESS, 5000), 1, cid)]


def test_a_receiver_that_expects_a_content_id_joins_the_group_named_by_it(tmp_path) -> None:
    cid = tree.content_id(b"", 1000, 1024, bytes(32), bytes(16))
    with FakeController(free_port(socket.SOCK_DGRAM)) as fake:
        options = ReceiveOptions(controller=fake.url, expect=cid, source=LOOPBACK, interface=LOOPBACK,
                                 ip="127.0.0.9", timeout=0.2)
        with pytest.raises(hostagent.ControllerError, match="announce a transfer"):
            hostagent.receive(str(tmp_path / "o.bin"), options)
        created = [body for method, path, body, _ in fake.calls if (method, path) == ("POST", "/v1/groups")]
    assert created and created[0]["model"] == cid
    with pytest.raises(TransferError, match="content id must be blake3:"):
        hostagent.receive(str(tmp_path / "o.bin"), ReceiveOptions(group="232.1.2.3:5000", source=LOOPBACK,
                                                                  expect="sha256:abc", insecure=True))


def test_failed_receive_returns_the_reason_leaves_and_skips_the_hook(tmp_path) -> None:
    marker = tmp_path / "loaded"
    hook = f"{sys.executable} -c \"import pathlib; pathlib.Path('{marker}').write_text('x')\""
    events: list = []
    with FakeController(free_port(socket.SOCK_DGRAM)) as fake:
        options = ReceiveOptions(controller=fake.url, model="m", source=LOOPBACK, interface=LOOPBACK,
                                 ip="127.0.0.9", timeout=0.2, on_complete=hook)
        # No transfer announced (no sender has rekeyed the group): nothing to accept.
        with pytest.raises(hostagent.ControllerError, match="the source of group 1 to announce a transfer"):
            hostagent.receive(str(tmp_path / "o.bin"), options)
        # A sender announced its transfer, then went silent.
        fake.route("POST", "/v1/groups/1/rekey", {"session": "00000000000000aa", "file_digest": "ee" * 32})
        result = hostagent.receive(str(tmp_path / "o.bin"), options, on_event=events.append)
    assert not result.ok and not result.digest_ok and result.error == "sender silent"
    assert result.authenticated  # the key came with the announcement
    assert result.on_complete is None and not marker.exists()  # never load an unverified file
    assert isinstance(events[0], hostagent.GroupJoined) and events[0].ip == "127.0.0.9"
    leaves = [(m, p) for m, p, _, _ in fake.calls].count(("DELETE", "/v1/groups/1/receivers/127.0.0.9"))
    assert leaves == 2  # it left the group both times


def test_no_key_from_the_controller_is_refused_unless_insecure(tmp_path, monkeypatch) -> None:
    """A controller that shows no key (this caller has no covering token) gives nothing
    to authenticate with: refused, and the announcement is retired again; with
    ``insecure`` the transfer goes ahead, unauthenticated, and says so."""
    monkeypatch.delenv("MODELCAST_TOKEN", raising=False)
    model = make_model(tmp_path / "m.bin", 1000)
    with FakeController(5000, token="only-the-admin-has-it") as fake:
        with pytest.raises(TransferError, match=r"the controller gave no session key \(no --token\?\).*--insecure"):
            hostagent.send(str(model.path), SendOptions(controller=fake.url, interface=LOOPBACK, receivers=1))
        assert [b for m, p, b, _ in fake.calls if p.endswith("/rekey")][-1] is None  # retired
        events: list = []
        with pytest.raises(hostagent.ControllerError, match="timed out"):  # (no receiver ever comes)
            hostagent.send(str(model.path), SendOptions(controller=fake.url, interface=LOOPBACK, receivers=1,
                                                        insecure=True, wait_timeout=0.2, poll=0.05),
                           on_event=events.append)
    assert hostagent.Unauthenticated("the controller gave no session key (no --token?)") in events


def test_a_file_with_too_many_chunks_is_refused_before_it_is_read(tmp_path) -> None:
    """Receivers refuse manifests of more than MAX_CHUNK_COUNT chunks, so the sender says
    so at once (naming the fix) instead of hashing a huge file first and failing then."""
    from hostagent import wire

    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as f:  # sparse: nothing to read but holes, yet reading 17 GB would take minutes
        f.truncate((wire.MAX_CHUNK_COUNT + 1) * 1024)
    with pytest.raises(TransferError, match="use a larger chunk size"):
        hostagent.send(str(huge), SendOptions(group="239.1.2.3:5000", chunk_size=1024, secret=b"k" * 32,
                                              manifest_cache=False, timeout=1))
