"""The sender under attack from the network: forged COMPLETEs, spoofed NACKs, HELLO
floods, huge NACKs (issue 11, "Sender"). Attackers inject datagrams from addresses of
their own ("evil" hosts) into the in-memory network or straight into a Sender; every
test asserts what the attack could not do (end the transfer early, fail it, make the
sender send to a third party, grow state or work without bound) and that the real
receivers still verify. Work is counted in operations, never timed.
"""

from __future__ import annotations

import random
from collections import Counter

from hostagent import wire
from hostagent.common import GROUP, MemorySource
from hostagent.events import ReceiverFailed, TransferFinished
from hostagent.sender import Sender
from lab.netsim import Sim
from tests.support.agents import KIB, assert_all_verified, payload, sender_config, stream_out

LISTED = frozenset({"rx"})  # the simulator's receivers all live on host "rx"


def evil(index: int = 0) -> tuple[str, int]:
    return ("evil", index)


def no_delivery_to_attackers(now: float, src: object, dst: object, data: bytes) -> bool:
    """The attacker's addresses are not real endpoints: what the sender sends there is
    counted (``tap``) but delivered nowhere."""
    return isinstance(dst, tuple) and dst[0] == "evil"


def tap(sender: Sender) -> Counter:
    """Bytes the sender hands out, per destination."""
    sent: Counter = Counter()
    inner = sender.datagrams_to_send

    def counted(now: float) -> list:
        out = inner(now)
        for data, dest in out:
            sent[dest] += len(data)
        return out

    sender.datagrams_to_send = counted  # type: ignore[method-assign]
    return sent


def to_attackers(sent: Counter) -> int:
    return sum(n for dest, n in sent.items() if dest != GROUP and dest[0] == "evil")


def finished(sim: Sim) -> TransferFinished:
    done = [e for e in sim.sender_events if isinstance(e, TransferFinished)]
    assert len(done) == 1
    return done[0]


def lossy_sim(data: bytes, receivers: int, **config: object) -> Sim:
    """Receiver 0 loses 20% of everything both ways, so it is still repairing after the
    stream: the window in which a forged COMPLETE would close the session under it."""
    rng = random.Random(4)

    def loss(now: float, src: object, dst: object, raw: bytes) -> bool:
        if no_delivery_to_attackers(now, src, dst, raw):
            return True
        return (dst == ("rx", 0) or src == ("rx", 0)) and rng.random() < 0.2

    sim = Sim(data, sender_config(**config), loss=loss)
    for _ in range(receivers):
        sim.add_receiver()
    return sim


def test_forged_completes_from_invented_ids_neither_count_nor_end_the_transfer() -> None:
    data = payload(256 * KIB)
    for allowed in (LISTED, None):  # with the controller's list, and plain --group
        sim = lossy_sim(data, 3, expected_receivers=3, allowed_receivers=allowed)
        forged = [wire.encode(wire.Complete(sim.sender.session, 0xE000 + i, sim.sender.file_digest))
                  for i in range(3)]
        for step in range(400):  # from the start to well after the stream
            for i, raw in enumerate(forged):
                sim.inject_to_sender(step * 0.005, raw, evil(i))
        sim.run(until=60)
        for rec in sim.receivers:
            assert rec.receiver.complete and bytes(rec.sink.data) == data, allowed
        done = finished(sim)
        assert done.ok
        real = {1000, 1001, 1002}
        if allowed is not None:
            assert set(done.completed) == real
            assert sim.sender.stats.drops["unlisted_receiver"] > 0
            assert_all_verified(sim, data)
        else:
            # Without a list anyone may join (and, without a key, anyone may claim any
            # id): the forged ids count, but the session stays open until every
            # admitted receiver is done, so the real ones are never cut off.
            assert real <= set(done.completed)


def test_forged_bad_digest_complete_fails_only_that_id() -> None:
    data = payload(128 * KIB)
    sim = lossy_sim(data, 2, expected_receivers=2)  # plain --group: the forger is admitted
    bad = wire.encode(wire.Complete(sim.sender.session, 0xBAD, bytes(32)))
    sim.inject_to_sender(0.01, bad, evil())
    sim.run(until=60)
    done = finished(sim)
    assert done.ok, done
    assert done.failed == (0xBAD,)
    assert sorted(done.completed) == [1000, 1001]
    assert ReceiverFailed(0xBAD, "digest mismatch") in sim.sender_events
    for rec in sim.receivers:
        assert bytes(rec.sink.data) == data


def test_spoofed_whole_file_nack_from_an_unknown_address_gets_nothing() -> None:
    data = payload(256 * KIB)
    sim = Sim(data, sender_config(expected_receivers=2, allowed_receivers=LISTED), loss=no_delivery_to_attackers)
    for _ in range(2):
        sim.add_receiver()
    sent = tap(sim.sender)
    total = sim.sender.layout.total_seq
    for i, at in enumerate((0.02, 0.04, 0.06, 0.08)):  # during the stream and before it ends
        nack = wire.encode(wire.Nack(sim.sender.session, 0xE000 + i % 2, ((0, total),)))
        sim.inject_to_sender(at, nack, evil(i))
    sim.run(until=60)
    assert_all_verified(sim, data)
    assert to_attackers(sent) == 0
    assert sim.sender.stats.repair_bytes == 0  # nothing multicast for the forged ids either
    assert sim.sender.stats.drops["unlisted_receiver"] == 4


def test_without_a_list_one_peer_costs_at_most_its_repair_budget() -> None:
    """Plain --group mode admits the spoofer; it re-asks for the whole file every 50 ms
    for 20 s, and still gets at most ``repair_budget`` times the file."""
    data = payload(64 * KIB)
    cfg = sender_config(linger_timeout=30.0, receiver_timeout=30.0)
    sender = Sender(MemorySource(data), cfg, 0.0)
    sent = tap(sender)
    now = stream_out(sender)
    nack = wire.encode(wire.Nack(sender.session, 0xE000, ((0, sender.layout.total_seq),)))
    while now < 20.0:
        sender.receive_datagram(nack, evil(), now)
        for _ in range(50):
            now += 0.001
            sender.handle_timer(now)
            sender.datagrams_to_send(now)
    datagram = cfg.payload_size + wire.DATA_HEADER_LEN + wire.MAC_LEN
    budget = cfg.repair_budget * (sender.layout.file_size + sender.layout.total_seq * (datagram - cfg.payload_size))
    budget += 64 * cfg.max_datagram + datagram  # the margin, and the datagram that crossed the line
    assert sender.layout.file_size <= to_attackers(sent) <= budget  # served once, then no more
    assert sender.stats.drops["repair_budget_spent"] > 0


def test_known_id_from_another_address_is_dropped_and_the_receiver_unaffected() -> None:
    data = payload(256 * KIB)
    sim = Sim(data, sender_config(expected_receivers=2), loss=no_delivery_to_attackers)
    for _ in range(2):
        sim.add_receiver()
    sent = tap(sim.sender)
    session = sim.sender.session
    total = sim.sender.layout.total_seq
    for i, at in enumerate((0.02, 0.04, 0.06)):  # after the real 1000 said HELLO, before the end
        sim.inject_to_sender(at, wire.encode(wire.Nack(session, 1000, ((0, total),))), evil(i))
        sim.inject_to_sender(at, wire.encode(wire.Complete(session, 1000, bytes(32))), evil(i))
        sim.inject_to_sender(at, wire.encode(wire.Hello(session, 1000)), evil(i))
    sim.run(until=60)
    assert_all_verified(sim, data)
    assert not [e for e in sim.sender_events if isinstance(e, ReceiverFailed)]
    assert sim.sender.peers[1000].addr == ("rx", 0)
    assert sim.sender.stats.drops["peer_addr_mismatch"] == 9
    assert to_attackers(sent) == 0
    assert sim.sender.stats.repair_bytes == 0


def test_a_restarted_receiver_moves_port_by_hello_only() -> None:
    """Same id, same host, new socket: its HELLO moves the peer; anything else from
    another port, or any datagram from another host, does not."""
    sender = Sender(MemorySource(payload(16 * KIB)), sender_config(), 0.0)
    session = sender.session
    old, new, other = ("10.0.0.3", 4000), ("10.0.0.3", 5000), ("10.0.0.9", 4000)
    sender.receive_datagram(wire.encode(wire.Hello(session, 7)), old, 0.0)
    sender.receive_datagram(wire.encode(wire.Nack(session, 7, ((0, 1),))), new, 0.1)
    sender.receive_datagram(wire.encode(wire.Hello(session, 7)), other, 0.1)
    assert sender.peers[7].addr == old
    assert sender.stats.drops["peer_addr_mismatch"] == 2
    sender.receive_datagram(wire.encode(wire.Hello(session, 7)), new, 0.2)
    assert sender.peers[7].addr == new


def test_the_receiver_list_can_grow_during_the_transfer() -> None:
    sender = Sender(MemorySource(payload(16 * KIB)), sender_config(allowed_receivers=frozenset({"10.0.0.3"})), 0.0)
    hello = wire.encode(wire.Hello(sender.session, 8))
    sender.receive_datagram(hello, ("10.0.0.4", 4000), 0.0)
    assert 8 not in sender.peers and sender.stats.drops["unlisted_receiver"] == 1
    sender.set_allowed_receivers(frozenset({"10.0.0.3", "10.0.0.4"}))  # a late joiner joined
    sender.receive_datagram(hello, ("10.0.0.4", 4000), 0.1)
    assert 8 in sender.peers


class CountingDict(dict):
    """A peer table that counts every walk over it."""

    walks = 0

    def values(self):  # type: ignore[override]
        CountingDict.walks += 1
        return super().values()

    def items(self):  # type: ignore[override]
        CountingDict.walks += 1
        return super().items()

    def __iter__(self):  # type: ignore[override]
        CountingDict.walks += 1
        return super().__iter__()


def test_hello_flood_is_capped_and_timer_work_stays_bounded() -> None:
    cfg = sender_config(max_peers=4096, receiver_timeout=1.0)
    sender = Sender(MemorySource(payload(64 * KIB)), cfg, 0.0)
    rng = random.Random(9)
    flood = 300_000
    for i in range(flood):
        raw = wire.encode(wire.Hello(sender.session, rng.getrandbits(64)))
        sender.receive_datagram(raw, evil(i), 0.0)
    assert len(sender.peers) == cfg.max_peers
    assert sender.stats.drops["peer_table_full"] == flood - cfg.max_peers
    # A HELLO-only peer silent for hello_expiry makes room for a newcomer; the table
    # never grows past the cap.
    sender.receive_datagram(wire.encode(wire.Hello(sender.session, 1)), evil(), cfg.hello_expiry)
    assert 1 in sender.peers and len(sender.peers) == cfg.max_peers
    assert sender.stats.drops["peer_evicted"] == 1

    sender.peers = CountingDict(sender.peers)
    now = stream_out(sender)
    timers = 0
    while not sender.closed:
        assert timers < 100, "the sender did not close within 100 timer steps"  # (a bound: no endless loop)
        deadline = sender.get_timer()
        assert deadline is not None
        now = max(now, deadline)
        sender.handle_timer(now)
        sender.datagrams_to_send(now)
        timers += 1
    assert timers < 100
    # get_timer never walks the table; one sweep per distinct deadline: the flood's
    # (all heard at 0) and the newcomer's.
    assert sender.peer_sweeps == 2
    assert CountingDict.walks <= 3  # only the closing verdict (completed, failed, counted failures)
    done = sender.next_event()
    while done is not None and not isinstance(done, TransferFinished):
        done = sender.next_event()
    assert done is not None and not done.ok and len(done.failed) == cfg.max_peers


def test_hello_flood_from_unlisted_hosts_leaves_no_state() -> None:
    data = payload(64 * KIB)
    sim = Sim(data, sender_config(expected_receivers=2, allowed_receivers=LISTED), loss=no_delivery_to_attackers)
    for _ in range(2):
        sim.add_receiver()
    rng = random.Random(3)
    for i in range(20_000):
        sim.inject_to_sender(0.0001 * (i % 50), wire.encode(wire.Hello(sim.sender.session, rng.getrandbits(64))),
                             evil(i))
    sim.run(until=60)
    assert_all_verified(sim, data)
    assert set(sim.sender.peers) == {1000, 1001}
    assert sim.sender.stats.drops["unlisted_receiver"] == 20_000


def test_a_nack_with_32k_ranges_is_ingested_up_to_the_cap() -> None:
    cfg = sender_config(payload_size=64, chunk_size=4 * KIB)
    sender = Sender(MemorySource(payload(4096 * KIB)), cfg, 0.0)
    assert sender.layout.total_seq >= 65536
    now = stream_out(sender)
    peer = ("10.0.0.3", 4000)
    sender.receive_datagram(wire.encode(wire.Hello(sender.session, 7)), peer, now)
    ranges = tuple((2 * i, 2 * i + 1) for i in range(32_000))
    sender.receive_datagram(wire.encode(wire.Nack(sender.session, 7, ranges)), peer, now)
    assert sender.stats.drops["nack_ranges_cut"] == 1
    sent = tap(sender)
    for _ in range(2000):
        now += 0.001
        sender.handle_timer(now)
        sender.datagrams_to_send(now)
    assert sender.stats.repairs_unicast == cfg.max_nack_ranges  # one seq per range, the rest ignored
    assert sender.stats.repairs_multicast == 0 and set(sent) <= {peer, GROUP}


def test_a_peer_is_repaired_no_faster_than_its_repair_rate_and_real_receivers_go_on() -> None:
    """Plain --group mode without a key admits anyone: a spoofer asks for the whole file
    every 20 ms. It gets at most ``repair_rate`` of the cap per second (after one burst),
    while a real receiver at 20% loss is still repaired and verifies."""
    data = payload(512 * KIB)
    sim = lossy_sim(data, 1, expected_receivers=1, repair_rate=0.25, repair_burst=0.2, linger_timeout=30.0)
    sent = tap(sim.sender)
    total = sim.sender.layout.total_seq
    nack = wire.encode(wire.Nack(sim.sender.session, 0xE000, ((0, total),)))
    for step in range(1, 250):  # 5 s of asking, from the stream's start
        sim.inject_to_sender(step * 0.02, nack, evil())
    sim.run(until=60)
    assert_all_verified_but(sim, data, forged={0xE000})
    cfg = sim.sender.config
    rate = cfg.repair_rate * cfg.rate_bps / 8
    datagram = cfg.payload_size + wire.DATA_HEADER_LEN + wire.MAC_LEN
    # The spoofer was served for at most the 5 s it asked (+ what its last request queued).
    assert 0 < to_attackers(sent) <= rate * cfg.repair_burst + rate * 5.0 + 2 * datagram * cfg.max_nack_ranges
    assert to_attackers(sent) < len(data) * 1.5  # well under its total budget: the rate held it back
    assert sim.sender.stats.drops["repair_rate_limited"] > 0


def assert_all_verified_but(sim: Sim, data: bytes, forged: set[int]) -> None:
    """Every real receiver verified ``data``; only the ``forged`` ids are unresolved."""
    for rec in sim.receivers:
        assert rec.receiver is not None and rec.receiver.complete and bytes(rec.sink.data) == data
    done = finished(sim)
    assert {1000 + i for i in range(len(sim.receivers))} <= set(done.completed)
    assert set(done.completed).isdisjoint(forged)


def test_two_forged_ids_cannot_get_the_file_multicast_over_and_over() -> None:
    """Two invented ids asking for the same whole range make it a shared loss: multicast.
    Each multicast repair is charged to both (half each), so together they get at most
    their two repair budgets, not one more multicast of the file per request."""
    data = payload(64 * KIB)
    cfg = sender_config(linger_timeout=30.0, receiver_timeout=30.0)
    sender = Sender(MemorySource(data), cfg, 0.0)
    now = stream_out(sender)
    total = sender.layout.total_seq
    nacks = [wire.encode(wire.Nack(sender.session, 0xE000 + i, ((0, total),))) for i in range(2)]
    while now < 20.0:
        for i, raw in enumerate(nacks):
            sender.receive_datagram(raw, evil(i), now)
        for _ in range(50):
            now += 0.001
            sender.handle_timer(now)
            sender.datagrams_to_send(now)
    multicast = sender.stats.repair_bytes_multicast
    cap = sender.peers[0xE000].budget.total  # type: ignore[union-attr]
    datagram = cfg.payload_size + wire.DATA_HEADER_LEN + wire.MAC_LEN
    assert multicast >= len(data)  # served (the loss looked shared) ...
    assert multicast + sender.stats.repair_bytes_unicast <= 2 * cap + 2 * datagram  # ... within two budgets
    # (Uncharged, 20 s of asking every 50 ms multicast it ~400 times: the requests stop here.)
    assert sender.stats.drops["repair_budget_spent"] > 0
