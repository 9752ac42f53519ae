"""A receiver against a source that holds the session key and lies (issue 46, finding 3,
the receiver's part): manifest pages it refuses, and pages it already took, are no sign of
life, so a source sending nothing else cannot hold it past its idle timeout; a hard
deadline ends it whatever arrives; a refused page does not lock it onto the liar's
session. Sans-IO: datagrams and time are stepped by hand."""

from __future__ import annotations

import random
from typing import Iterable, Optional

import pytest

from hostagent import tree, wire
from hostagent.common import MemorySink, MemorySource
from hostagent.events import Failed
from hostagent.receiver import Receiver, ReceiverConfig
from hostagent.sender import Sender
from tests.support.agents import KIB, payload, sender_config

KEY = wire.derive_key(b"hostile sources")
SOURCE = ("10.0.0.9", 7000)


def stream(data: bytes, session: int, key: Optional[bytes] = KEY, **config: object) -> list[bytes]:
    """Every datagram a sender of ``data`` sends with nobody listening, up to its END."""
    sender = Sender(MemorySource(data), sender_config(key=key, session_id=session, **config), 0.0,
                    rng=random.Random(session))
    out: list[bytes] = []
    now = 0.0
    while not out or wire.peek_type(out[-1]) != wire.T_END:
        assert now < 60, "no END after 60 virtual seconds"
        now += 0.001
        out.extend(raw for raw, _ in sender.datagrams_to_send(now))
    return out


def pages(datagrams: Iterable[bytes]) -> list[bytes]:
    return [raw for raw in datagrams if wire.peek_type(raw) == wire.T_MANIFEST]


def manifest_id(data: bytes, session: int, **config: object) -> bytes:
    """The content id a receiver would be told to expect for ``data``."""
    sender = Sender(MemorySource(data), sender_config(key=KEY, session_id=session, **config), 0.0)
    return tree.parse_content_id(tree.manifest_id(sender.pages))


def repeat(rx: Receiver, datagrams: list[bytes], start: float, until: float, every: float = 0.05) -> Optional[float]:
    """Send ``datagrams`` round and round every ``every`` s from ``start``, firing the
    receiver's timers as they fall due; returns when it failed (None: it did not)."""
    now, i = start, 0
    while now < until:
        timer = rx.get_timer()
        if timer is not None and timer <= now:
            rx.handle_timer(timer)
            if rx.failed:
                return timer
        rx.receive_datagram(datagrams[i % len(datagrams)], SOURCE, now)
        rx.datagrams_to_send(now)
        i += 1
        now += every
    return None


def failure(rx: Receiver) -> Optional[str]:
    events = []
    while (event := rx.next_event()) is not None:
        events.append(event)
    return next((e.reason for e in events if isinstance(e, Failed)), None)


def test_manifest_pages_it_refuses_are_no_sign_of_life() -> None:
    """A source (key holder) sends another model's manifest over and over to a receiver
    expecting a content id: every page is refused, and the receiver gives up at its
    idle timeout instead of waiting as long as the pages come."""
    lie = pages(stream(payload(48 * KIB, seed=2), 5))
    rx = Receiver(MemorySink(), ReceiverConfig(key=KEY, session_id=5, idle_timeout=2.0,
                                               content_id=manifest_id(payload(48 * KIB), 5)), 0.0)
    failed_at = repeat(rx, lie, 0.0, 30.0)
    assert rx.stats.drops["wrong_content_id"] > 10 and rx.manifest is None
    assert rx.offered_content_id == tree.manifest_id(Sender(MemorySource(payload(48 * KIB, seed=2)),
                                                            sender_config(key=KEY, session_id=5), 0.0).pages)
    assert failed_at is not None and failed_at <= 2.0 + 1e-9, failed_at
    assert failure(rx) == "sender silent"


@pytest.mark.parametrize("key", [KEY, None], ids=["keyed", "insecure"])
def test_pages_it_already_took_are_no_sign_of_life(key: Optional[bytes]) -> None:
    """The genuine manifest, taken, then only its pages again (a liar that recorded
    them, holding the group's key, sends no data): the receiver gives up one idle
    timeout after the last page that was news, with or without the page cache."""
    genuine = pages(stream(payload(256 * KIB), 9, key=key, chunk_size=KIB, max_datagram=1200))
    distinct = list(dict.fromkeys(genuine))
    assert len(distinct) > 1, "a manifest of several pages"
    rx = Receiver(MemorySink(), ReceiverConfig(key=key, session_id=9, idle_timeout=2.0), 0.0)
    for raw in distinct:
        rx.receive_datagram(raw, SOURCE, 0.5)
    assert rx.manifest is not None and rx._last_heard == 0.5
    failed_at = repeat(rx, distinct, 1.0, 30.0)
    assert failed_at is not None and failed_at <= 2.5 + 1e-9, failed_at
    assert failure(rx) == "sender silent"


def test_a_deadline_ends_a_receiver_whatever_arrives() -> None:
    """A source that sends real data, slowly: every datagram is news, so the idle timer
    never fires; the deadline (a fetch attempt's) ends the receiver all the same, with
    what it verified kept in its record."""
    data = payload(64 * KIB)
    sent = stream(data, 3)
    sink = MemorySink()
    rx = Receiver(sink, ReceiverConfig(key=KEY, session_id=3, idle_timeout=2.0, deadline=5.0), 0.0)
    now = 0.0
    for raw in sent:  # one datagram every 0.5 s: ~20 s for the file
        timer = rx.get_timer()
        if timer is not None and timer <= now:
            rx.handle_timer(timer)
            if rx.failed:
                break
        rx.receive_datagram(raw, SOURCE, now)
        now += 0.5
    assert rx.failed and not rx.complete and 5.0 <= now <= 5.5
    assert failure(rx) == "deadline passed before the content was verified"
    assert sink.state is not None and rx.verified.count > 0


def test_a_page_it_refuses_does_not_lock_it_onto_the_liars_session() -> None:
    """Told no session (``--group`` mode) but a content id: a liar's manifest for another
    model arrives first and is refused; the genuine transfer that follows is taken."""
    data = payload(48 * KIB)
    lie = stream(payload(48 * KIB, seed=2), 11)
    good = stream(data, 12)
    sink = MemorySink()
    rx = Receiver(sink, ReceiverConfig(key=KEY, content_id=manifest_id(data, 12)), 0.0)
    for raw in pages(lie)[:1] * 3:
        rx.receive_datagram(raw, ("10.0.0.66", 7000), 0.01)
    assert rx.stats.drops["wrong_content_id"] == 3 and rx.session is None and rx.sender_addr is None
    for raw in good:
        rx.receive_datagram(raw, SOURCE, 0.1)
    assert rx.complete and bytes(sink.data[: len(data)]) == data and rx.sender_addr == SOURCE
