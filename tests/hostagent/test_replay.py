"""Replay of a recorded earlier transfer (issue 11): a receiver told the transfer it is
for (the controller's announcement: a fresh key, the session id and the file digest)
drops every datagram of the earlier one and verifies the live file; a receiver told
nothing (plain ``--group`` with a long-lived key file) is the control that shows the
attack is real. In the in-memory network, virtual time."""

from __future__ import annotations

import random

import blake3

from hostagent import wire
from hostagent.common import GROUP, MemorySink, MemorySource
from hostagent.receiver import Receiver, ReceiverConfig
from hostagent.sender import Sender
from lab.netsim import SENDER_ADDR, Sim
from tests.support.agents import KIB, assert_all_verified, payload, sender_config

OLD_SESSION, NEW_SESSION = 0x1111, 0x2222
K1, K2 = wire.derive_key(b"transfer one"), wire.derive_key(b"transfer two")


def recorded_transfer(data: bytes, key: bytes, session: int) -> list[bytes]:
    """Everything a transfer multicast, as an attacker's socket on the segment saw it."""
    sim = Sim(data, sender_config(key=key, session_id=session, expected_receivers=1))
    sim.add_receiver()
    seen: list[bytes] = []
    inner = sim.sender.datagrams_to_send

    def tapped(now: float) -> list:
        out = inner(now)
        seen.extend(raw for raw, dest in out if dest == GROUP)
        return out

    sim.sender.datagrams_to_send = tapped  # type: ignore[method-assign]
    sim.run(until=60)
    assert_all_verified(sim, data)
    return seen


def replay_into(sim: Sim, recorded: list[bytes]) -> None:
    """The recording, from the sender's address, into every receiver: from before the
    live stream's first datagram to well into it."""
    for i, raw in enumerate(recorded):
        for rec in sim.receivers:
            sim.inject(i * 0.0001, rec, raw, src=SENDER_ADDR)


def test_a_recorded_transfer_cannot_make_an_announced_receiver_complete_the_old_file() -> None:
    old, new = payload(96 * KIB, seed=1), payload(96 * KIB, seed=2)
    recorded = recorded_transfer(old, K1, OLD_SESSION)
    digest = blake3.blake3(new).digest()
    # A fresh key per transfer (the controller's rekey): the recording fails its MAC --
    # its data first fails the session check (another session's data is dropped before
    # its tag is checked). The same key (a key file reused) but the announced session: it
    # is the wrong session.
    for live_key, reason in ((K2, "bad_mac"), (K1, "wrong_session")):
        sim = Sim(new, sender_config(key=live_key, session_id=NEW_SESSION, expected_receivers=2))
        for _ in range(2):
            sim.add_receiver(ReceiverConfig(session_id=NEW_SESSION, file_digest=digest))
        replay_into(sim, recorded)
        sim.run(until=60)
        assert_all_verified(sim, new)
        for rec in sim.receivers:
            assert rec.receiver is not None
            drops = rec.receiver.stats.drops
            assert drops[reason] > 0 and drops[reason] + drops["wrong_session"] >= len(recorded), (reason, dict(drops))
            if reason == "bad_mac":  # every datagram but the data (manifests, END) failed its MAC
                data = sum(wire.data_session(raw) is not None for raw in recorded)
                assert drops["bad_mac"] >= len(recorded) - data and drops["wrong_session"] >= data


def test_without_an_announcement_the_replay_wins_the_control() -> None:
    """What the announcement prevents: a receiver that locks onto the first manifest
    it hears takes the recording, and "verifies" the old file."""
    old, new = payload(96 * KIB, seed=1), payload(96 * KIB, seed=2)
    recorded = recorded_transfer(old, K1, OLD_SESSION)
    sim = Sim(new, sender_config(key=K1, session_id=NEW_SESSION, expected_receivers=1, linger_timeout=2.0))
    rec = sim.add_receiver(ReceiverConfig())
    replay_into(sim, recorded)
    sim.run(until=60)
    assert rec.receiver is not None and rec.receiver.complete
    assert bytes(rec.sink.data) == old and rec.receiver.session == OLD_SESSION


def test_a_manifest_of_another_file_is_refused_and_expect_only_before_a_lock() -> None:
    new, other = payload(32 * KIB, seed=2), payload(32 * KIB, seed=3)
    cfg = sender_config(key=K2, session_id=NEW_SESSION)
    foreign = Sender(MemorySource(other), cfg, 0.0).pages[0]
    live = Sender(MemorySource(new), sender_config(key=K2, session_id=NEW_SESSION), 0.0).pages[0]
    receiver = Receiver(MemorySink(), ReceiverConfig(), 0.0, rng=random.Random(1))
    # Announced after the receiver started (it joined before the sender rekeyed).
    assert receiver.expect(NEW_SESSION, live.file_digest, K2)
    receiver.receive_datagram(wire.encode(foreign, K2), SENDER_ADDR, 0.1)
    assert receiver.manifest is None and receiver.stats.drops["wrong_file"] == 1
    receiver.receive_datagram(wire.encode(live, K1), SENDER_ADDR, 0.1)  # the old key
    assert receiver.manifest is None and receiver.stats.drops["bad_mac"] == 1
    receiver.receive_datagram(wire.encode(live, K2), SENDER_ADDR, 0.2)
    assert receiver.manifest is not None and receiver.manifest.file_digest == live.file_digest
    assert not receiver.expect(OLD_SESSION, None, K1)  # locked: it finishes its transfer
    assert receiver.session == NEW_SESSION


def test_the_sender_holds_its_data_until_the_expected_receivers_said_hello() -> None:
    """Receivers pick an announced transfer's key up a poll after the sender made it:
    the sender sends only manifest pages until every expected receiver said HELLO (or
    ``start_wait`` ran out), so no first transmission is wasted on them."""
    def first_data_at(hellos: int) -> tuple[float, int]:
        cfg = sender_config(key=K2, session_id=NEW_SESSION, expected_receivers=2, start_wait=1.0)
        sender = Sender(MemorySource(payload(64 * KIB)), cfg, 0.0)
        now, manifests = 0.0, 0
        while now < 2.0:
            now += 0.001
            if now >= 0.3 and hellos:  # the receivers answer the announcement's manifests
                for rid in range(hellos):
                    sender.receive_datagram(wire.encode(wire.Hello(NEW_SESSION, rid), K2), ("rx", rid), now)
                hellos = 0
            sender.handle_timer(now)
            for raw, _ in sender.datagrams_to_send(now):
                kind = wire.peek_type(raw)
                if kind == wire.T_DATA:
                    return now, manifests
                manifests += kind == wire.T_MANIFEST
        raise AssertionError("no data in 2 s")

    at, manifests = first_data_at(2)
    assert 0.3 <= at < 0.31 and manifests >= 10  # at once after the HELLOs; pages every 20 ms before
    at, _ = first_data_at(1)
    assert 1.0 <= at < 1.01  # one never came: the hold ends after start_wait
