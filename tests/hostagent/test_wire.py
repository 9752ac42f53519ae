"""The decoder is the attack surface: it must round-trip what we send and refuse
everything else with a WireError (never another exception)."""

import dataclasses
import struct

import blake3
import msgpack
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import example, given, settings, strategies as st

from hostagent import fastrun, wire
from tests.support.mutate import data_run, mutate, near
from tests.support.profiles import examples
from hostagent.wire import (
    Complete, CompleteAck, Data, End, Hello, Manifest, Nack, Parity, WireError,
    decode, encode,
)

KEY = wire.derive_key(b"test secret")
u64 = st.one_of(st.integers(0, wire.U64_MAX), near(wire.U64_MAX, 2))
u32 = st.one_of(st.integers(0, (1 << 32) - 1), near((1 << 32) - 1, 2))
MAX_CHUNK = wire.MAX_CHUNK_SIZE


@st.composite
def lanes(draw):
    """No lanes (the one-lane default), or lane index of count at a file offset."""
    if draw(st.booleans()):
        return (0, 1, 0)
    count = draw(st.integers(2, wire.MAX_LANES))
    return draw(st.integers(0, count - 1)), count, draw(st.integers(0, 1 << 40))


@st.composite
def manifests(draw):
    """Valid manifests, each field often at (or next to) the edge the decoder allows:
    the smallest and largest chunk and payload sizes, a file that fills or just reaches
    into its last chunk, a digest page that ends at the last chunk, the longest name."""
    chunk_size = draw(st.one_of(st.integers(wire.MIN_CHUNK_SIZE, 1 << 20), near(wire.MIN_CHUNK_SIZE, 0, 2),
                                near(MAX_CHUNK, 2)))
    chunk_count = draw(st.one_of(st.integers(0, 50), near(wire.MAX_CHUNK_COUNT, 1)))
    file_size = 0 if chunk_count == 0 else draw(st.one_of(
        st.integers((chunk_count - 1) * chunk_size + 1, chunk_count * chunk_size),
        st.sampled_from([(chunk_count - 1) * chunk_size + 1, chunk_count * chunk_size])))
    first = draw(st.integers(0, min(chunk_count, 60)))
    if chunk_count > 60:  # (a page holds a few digests of a huge file: its first or last ones)
        first = draw(st.sampled_from([first, chunk_count - first]))
    n = draw(st.one_of(st.integers(0, min(chunk_count - first, 60)), st.just(min(chunk_count - first, 60))))
    page_count = draw(st.one_of(st.integers(1, 100), near(1 << 32, 1)))
    lane = draw(lanes())
    whole = file_size if lane[1] == 1 else draw(st.integers(lane[2] + file_size, wire.MAX_FILE_SIZE))
    id_root = draw(st.one_of(st.just((0, b"")), st.tuples(st.just(whole), st.binary(min_size=32, max_size=32))))
    return Manifest(
        session=draw(u64), file_size=file_size, chunk_size=chunk_size,
        payload_size=draw(st.one_of(st.integers(wire.MIN_PAYLOAD, 9000), near(wire.MIN_PAYLOAD, 0, 1),
                                    near(wire.MAX_PAYLOAD, 1))),
        chunk_count=chunk_count, file_digest=draw(st.binary(min_size=32, max_size=32)),
        page_index=draw(st.one_of(st.integers(0, page_count - 1), st.just(page_count - 1))), page_count=page_count,
        first_chunk=first, digests=draw(st.binary(min_size=16 * n, max_size=16 * n)),
        name=draw(st.one_of(st.text(max_size=40), st.just("n" * wire.MAX_NAME_BYTES))),
        receivers_hint=draw(u32), lane=lane,
        entries=draw(st.binary(max_size=300)),  # a directory's entry list (optional field)
        id_root=id_root,  # what the content id names (optional field)
    )


@st.composite
def nack_ranges(draw):
    points = sorted(draw(st.sets(st.integers(0, 1 << 40), max_size=40)))
    ranges = []
    for i in range(0, len(points) - 1, 2):
        ranges.append((points[i], points[i + 1]))
    # Canonical form: non-adjacent.
    merged = []
    for s, e in ranges:
        if merged and merged[-1][1] == s:
            merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return tuple(merged)


def payloads() -> st.SearchStrategy[bytes]:
    """A DATA payload: usually a datagram's worth, sometimes the most one can carry."""
    return st.one_of(st.binary(min_size=1, max_size=1500), near(wire.MAX_PAYLOAD, 1).map(lambda n: b"p" * n))


@st.composite
def datas(draw, past: int = 0):
    """DATA messages; the fragment often ends right at MAX_CHUNK_SIZE or, with ``past``,
    up to ``past`` bytes beyond it (messages the decoders must refuse)."""
    repair = draw(st.booleans())
    payload = draw(payloads())
    end = MAX_CHUNK - len(payload)
    return Data(
        session=draw(u64), seq=draw(u64), chunk=draw(u32),
        offset=draw(st.one_of(st.integers(0, 1 << 20), near(end, 2, past))), payload=payload,
        repair=repair, multicast=draw(st.booleans()) if repair else True,
    )


@st.composite
def parities(draw):
    k = draw(st.one_of(st.integers(1, 255), st.sampled_from([1, 255])))
    n = draw(st.one_of(st.integers(k + 1, 256), st.sampled_from([k + 1, 256])))
    last_block = (MAX_CHUNK - 1) // k  # the last block that starts inside the largest chunk
    return Parity(
        session=draw(u64), chunk=draw(u32), block=draw(st.one_of(st.integers(0, last_block), near(last_block, 1))),
        k=k, n=n, index=draw(st.one_of(st.integers(1, n - 1), st.just(n - 1))),
        payload=draw(st.binary(min_size=1, max_size=1400)), multicast=draw(st.booleans()),
    )


messages = st.one_of(
    datas(),
    manifests(),
    st.builds(Nack, session=u64, receiver_id=u64, ranges=nack_ranges(), loss_permille=st.integers(0, 1000)),
    st.builds(Complete, session=u64, receiver_id=u64, file_digest=st.binary(min_size=32, max_size=32)),
    st.builds(CompleteAck, session=u64, receiver_id=u64),
    st.builds(Hello, session=u64, receiver_id=u64),
    st.builds(End, session=u64, total_seq=u64, receivers_hint=u32, closing=st.booleans()),
    parities(),
)


EDGE_MANIFEST = Manifest(  # every field at the largest value a valid manifest can hold
    session=wire.U64_MAX, file_size=wire.MAX_CHUNK_COUNT * MAX_CHUNK, chunk_size=MAX_CHUNK,
    payload_size=wire.MAX_PAYLOAD, chunk_count=wire.MAX_CHUNK_COUNT, file_digest=b"f" * 32,
    page_index=(1 << 32) - 1, page_count=1 << 32, first_chunk=wire.MAX_CHUNK_COUNT - 2, digests=b"d" * 32,
    name="\u20ac" * (wire.MAX_NAME_BYTES // 3), receivers_hint=(1 << 32) - 1,
    lane=(wire.MAX_LANES - 1, wire.MAX_LANES, wire.MAX_FILE_SIZE - wire.MAX_CHUNK_COUNT * MAX_CHUNK), entries=b"e",
    id_root=(wire.MAX_FILE_SIZE, b"r" * 32))


@settings(max_examples=examples(300), deadline=None)
@given(messages, st.booleans())
@example(EDGE_MANIFEST, True)
@example(Data(1, wire.U64_MAX, (1 << 32) - 1, MAX_CHUNK - wire.MAX_PAYLOAD, b"p" * wire.MAX_PAYLOAD), True)
@example(Parity(1, 0, (MAX_CHUNK - 1) // 3, 3, 256, 255, b"p"), False)
@example(Nack(1, 2, ((0, 1), (wire.U64_MAX - 1, wire.U64_MAX)), 1000), True)
def test_round_trip(msg, keyed) -> None:
    key = KEY if keyed else None
    assert decode(encode(msg, key), key) == msg


@settings(max_examples=examples(500), deadline=None)
@given(st.binary(max_size=2000))
def test_random_bytes_only_raise_wire_error(data) -> None:
    for key in (None, KEY):
        try:
            decode(data, key)
        except WireError:
            pass


@settings(max_examples=examples(500), deadline=None)
@given(messages, st.data())
def test_mutated_datagrams_only_raise_wire_error(msg, data) -> None:
    raw = mutate(bytearray(encode(msg)), data, ["flip", "truncate", "extend", "splice"])
    try:
        decode(bytes(raw))
    except WireError:
        pass


@settings(max_examples=examples(200), deadline=None)
@given(messages, st.data())
def test_any_tampering_fails_the_mac(msg, data) -> None:
    raw = bytearray(encode(msg, KEY))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(WireError):
        decode(bytes(raw), KEY)


def test_specific_refusals_name_their_reason() -> None:
    good = encode(Data(7, 1, 0, 0, b"abc"))
    assert decode(good).payload == b"abc"
    cases = {
        "truncated": good[:10],
        "bad_length": good[:-1],
        "oversized": good + b"\0" * wire.MAX_DATAGRAM,
        "bad_version": good[:2] + b"\x09" + good[3:],
        "bad_type": good[:3] + b"\x63" + good[4:],
        "bad_magic": b"XX" + good[2:],
    }
    for reason, raw in cases.items():
        with pytest.raises(WireError) as info:
            decode(raw)
        assert info.value.reason == reason, reason
    with pytest.raises(WireError) as info:
        decode(good, KEY)
    assert info.value.reason == "unauthenticated"
    forged = encode(Data(7, 1, 0, 0, b"abc"), wire.derive_key(b"other"))
    with pytest.raises(WireError) as info:
        decode(forged, KEY)
    assert info.value.reason == "bad_mac"


def test_data_is_tagged_with_a_per_session_gmac_everything_else_with_blake3() -> None:
    """Version 2: a first-transmission DATA carries AES-256-GMAC under a key of its
    session (nonce: its seq), a REPAIR of the same bytes and every other type a keyed
    BLAKE3 MAC. A version-1 datagram (BLAKE3 on DATA) is refused as bad_version, not
    taken for a forgery."""
    payload = bytes(range(256)) * 4
    data = encode(Data(7, 3, 0, 0, payload), KEY)
    body = data[: -wire.MAC_LEN]
    blake = blake3.blake3(body, key=KEY).digest(length=wire.MAC_LEN)
    assert data[-wire.MAC_LEN:] != blake
    gmac_key = blake3.blake3(KEY + (7).to_bytes(8, "big"), derive_key_context=wire._GMAC_CONTEXT).digest()
    assert data[-wire.MAC_LEN:] == AESGCM(gmac_key).encrypt((3).to_bytes(12, "big"), b"", body)
    assert decode(data, KEY).payload == payload
    repair = encode(Data(7, 3, 0, 0, payload, repair=True), KEY)
    assert repair[-wire.MAC_LEN:] == blake3.blake3(repair[: -wire.MAC_LEN], key=KEY).digest(length=wire.MAC_LEN)
    end = encode(End(7, 10), KEY)
    assert end[-wire.MAC_LEN:] == blake3.blake3(end[: -wire.MAC_LEN], key=KEY).digest(length=wire.MAC_LEN)
    # The same DATA under another session, or as another seq, is another tag: no tag moves.
    moved = bytearray(body)
    struct.pack_into("!Q", moved, 6, 8)
    assert wire.seal(KEY, bytes(moved))[-wire.MAC_LEN:] != data[-wire.MAC_LEN:]
    assert encode(Data(7, 4, 0, 0, payload), KEY)[-wire.MAC_LEN:] != data[-wire.MAC_LEN:]
    v1 = bytearray(body)
    v1[2] = 1
    with pytest.raises(WireError) as info:
        decode(bytes(v1) + blake3.blake3(bytes(v1), key=KEY).digest(length=wire.MAC_LEN), KEY)
    assert info.value.reason == "bad_version"


def test_a_flood_of_invented_sessions_does_not_evict_the_real_one() -> None:
    """A receiver keeps the GMAC key of a session only once one of its datagrams
    verified: forged DATA for 10,000 invented sessions is refused and leaves the real
    session's key where it was (no re-derivation per genuine datagram under attack)."""
    real = encode(Data(42, 0, 0, 0, b"x" * 100), KEY)
    assert wire.parse_data(real, KEY) is not None
    assert (KEY, 42) in wire._gmacs
    cached = dict(wire._gmacs)
    for session in range(1000, 11000):
        forged = bytearray(encode(Data(session, 0, 0, 0, b"x" * 100)))
        forged[4] |= wire.FLAG_MAC
        assert wire.parse_data(bytes(forged) + bytes(wire.MAC_LEN), KEY) is None
    assert wire._gmacs == cached
    assert wire.parse_data(encode(Data(42, 1, 0, 100, b"y" * 100), KEY), KEY) is not None


def test_agents_drop_other_sessions_data_before_deriving_any_key(monkeypatch) -> None:
    """A receiver that knows its session (and any sender, which never takes data) drops
    DATA of other sessions before its tag is checked: a flood of small forged DATA costs
    no GMAC key derivation (~8 us each), only a header peek."""
    from hostagent.receiver import Receiver, ReceiverConfig
    from hostagent.sender import Sender, SenderConfig
    from hostagent.common import MemorySink, MemorySource

    made = []
    real = wire._new_gmac
    monkeypatch.setattr(wire, "_new_gmac", lambda k: made.append(k) or real(k))
    receiver = Receiver(MemorySink(), ReceiverConfig(key=KEY, session_id=42), 0.0)
    sender = Sender(MemorySource(b"x" * 5000), SenderConfig(chunk_size=4096, payload_size=1024, key=KEY,
                                                             session_id=42), 0.0)
    for session in range(1000, 3000):
        forged = bytearray(encode(Data(session, 0, 0, 0, b"x" * 32)))
        forged[4] |= wire.FLAG_MAC
        receiver.receive_datagram(bytes(forged) + bytes(wire.MAC_LEN), ("10.0.0.9", 5000), 0.1)
        sender.receive_datagram(bytes(forged) + bytes(wire.MAC_LEN), ("10.0.0.9", 5000), 0.1)
    assert receiver.stats.drops["wrong_session"] == 2000 and sender.stats.drops["unexpected_type"] == 2000
    assert made == []
    assert wire.data_session(encode(End(42, 1))) is None and wire.data_session(b"MC") is None


def test_data_is_a_fixed_header_plus_raw_payload() -> None:
    payload = bytes(range(200))
    raw = encode(Data(1, 2, 3, 4, payload))
    assert len(raw) == wire.DATA_HEADER_LEN + len(payload)
    assert raw[-len(payload):] == payload
    assert struct.unpack_from("!QIIH", raw, wire.HEADER_LEN) == (2, 3, 4, len(payload))


def test_nack_is_capped_to_one_datagram() -> None:
    ranges = [(i * 1000, i * 1000 + 3) for i in range(10_000)]
    n = wire.nack_fit(ranges, 1400, keyed=True)
    assert 100 < n < 10_000
    raw = encode(Nack(1, 2, tuple(ranges[:n])), KEY)
    assert len(raw) <= 1400
    assert len(encode(Nack(1, 2, tuple(ranges[: n + 1])), KEY)) > 1400 - 30


def test_parity_refusals() -> None:
    good = Parity(5, 2, 3, 16, 256, 16, b"p" * 100)
    assert decode(encode(good, KEY), KEY) == good
    bad = [
        Parity(5, 2, 3, 0, 256, 16, b"p"),  # k = 0
        Parity(5, 2, 3, 16, 16, 16, b"p"),  # n <= k
        Parity(5, 2, 3, 16, 257, 16, b"p"),  # n beyond GF(2^8)
        Parity(5, 2, 3, 16, 256, 256, b"p"),  # index >= n
        Parity(5, 2, 3, 16, 256, 0, b"p"),  # index 0 is always data
        Parity(5, 2, wire.MAX_CHUNK_SIZE, 16, 256, 16, b"p"),  # block past any chunk
    ]
    for msg in bad:
        with pytest.raises(WireError) as info:
            decode(encode(msg))
        assert info.value.reason == "bad_field", msg
    raw = encode(good)
    with pytest.raises(WireError) as info:
        decode(raw[:-1])
    assert info.value.reason == "bad_length"
    with pytest.raises(WireError) as info:
        decode(raw[: wire.HEADER_LEN + 5])
    assert info.value.reason == "truncated"
    assert decode(raw).multicast is True


def _as_data(raw: bytes, key: bytes | None) -> Data | None:
    """What ``decode`` makes of ``raw`` if it is a Data message, else None."""
    try:
        msg = decode(raw, key)
    except WireError:
        return None
    return msg if isinstance(msg, Data) else None


def _fast(raw: bytes, key: bytes | None) -> Data | None:
    fields = wire.parse_data(memoryview(raw), key)
    if fields is None:
        return None
    session, seq, chunk, offset, payload, repair, multicast = fields
    return Data(session, seq, chunk, offset, bytes(payload), repair, multicast)


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(datas(past=2), messages), st.sampled_from([None, KEY]), st.sampled_from([None, KEY]), st.data())
def test_fast_data_path_accepts_exactly_what_decode_accepts(msg, send_key, recv_key, data) -> None:
    """The receiver's hot path may not widen (or narrow) what gets in: on intact, mutated,
    keyed and unkeyed datagrams it returns exactly decode's Data, or None."""
    raw = mutate(bytearray(encode(msg, send_key)), data, ["intact", "flip", "truncate", "extend", "splice"])
    assert _fast(bytes(raw), recv_key) == _as_data(bytes(raw), recv_key)


@settings(max_examples=examples(200), deadline=None)
@given(datas(past=2), st.sampled_from([None, KEY]))
@example(Data(1, 1, 0, MAX_CHUNK - 1, b"x"), None)  # the last byte of the largest chunk
@example(Data(1, 1, 0, MAX_CHUNK, b"x"), KEY)  # one byte past it
@example(Data(1, 1, 0, MAX_CHUNK - wire.MAX_PAYLOAD + 1, b"p" * wire.MAX_PAYLOAD, repair=True), None)
def test_both_decoders_take_a_fragment_exactly_when_it_ends_inside_the_largest_chunk(msg, key) -> None:
    """``offset + len <= MAX_CHUNK_SIZE``, asked of ``decode`` and ``parse_data`` on
    fragments drawn at that edge: one byte past it is refused by both."""
    raw = encode(msg, key)
    fits = msg.offset + len(msg.payload) <= MAX_CHUNK
    assert (_as_data(raw, key) == msg) is fits
    assert (_fast(raw, key) == msg) is fits


def test_fast_data_path_payload_is_a_view_not_a_copy() -> None:
    raw = bytearray(encode(Data(7, 3, 0, 3000, b"x" * 1000), KEY))
    fields = wire.parse_data(memoryview(raw), KEY)
    assert fields is not None and fields[:4] == (7, 3, 0, 3000) and fields[5:] == (False, True)
    raw[wire.DATA_HEADER_LEN] = ord("y")  # the buffer changes under the view
    assert bytes(fields[4][:2]) == b"yx" and len(fields[4]) == 1000
    assert wire.parse_data(encode(Hello(7, 1)), None) is None  # other types: decode's job


def _run_by_parse_data(blob: bytes, seg: int, key: bytes | None):
    """What ``parse_data_run`` must return, from ``parse_data`` on each datagram."""
    fields = [wire.parse_data(memoryview(blob)[off : off + seg], key) for off in range(0, len(blob), seg)]
    if len(fields) < 2 or any(f is None or f[5] for f in fields):
        return None
    session, seq, chunk, pos = fields[0][:4]
    for i, f in enumerate(fields):
        if (f[0], f[1], f[2], f[3]) != (session, seq + i, chunk, pos):
            return None
        pos += len(f[4])
    return session, seq, chunk, fields[0][3], [bytes(f[4]) for f in fields]


@settings(max_examples=examples(400), deadline=None)
@given(u64, u64, u32, st.one_of(st.integers(0, 1 << 20), st.integers(-5, -1)),
       st.integers(1, 1200), st.integers(2, 8), st.integers(1, 1200),
       st.sampled_from([None, KEY]), st.sampled_from([None, KEY]), st.data())
def test_gro_run_parser_agrees_with_parse_data(session, seq, chunk, offset, size, count, last_size,
                                               send_key, recv_key, data) -> None:
    """The receiver's super-packet fast path: a run of consecutive DATA datagrams, one of
    them perhaps damaged. It never accepts what parse_data would not take as that run,
    and an intact run (sent as the receiver expects it: keyed or not) always gets in.
    A negative ``offset`` (-5..-1) puts the run's end -2..2 bytes past MAX_CHUNK_SIZE."""
    seq, last_size = min(seq, wire.U64_MAX - count), min(last_size, size)
    sizes = [size] * (count - 1) + [last_size]
    if offset < 0:
        offset = MAX_CHUNK - sum(sizes) + (-offset - 3)
    raws = data_run(session, seq, chunk, offset, sizes, send_key)
    victim = data.draw(st.integers(0, count - 1))
    field = data.draw(st.sampled_from(["bytes", "session", "seq", "chunk", "offset", "repair"]))
    if field == "bytes":
        raws[victim] = mutate(raws[victim], data, ["intact", "flip", "truncate", "splice"])
    else:  # a well-formed datagram that does not belong in the run
        msg = Data(session, seq + victim, chunk, offset + size * victim, bytes([victim % 251]) * sizes[victim])
        if field == "repair":
            tweak = {"repair": True, "multicast": data.draw(st.booleans())}
        else:
            tweak = {field: (getattr(msg, field) + 1) % (1 << (32 if field == "chunk" else 20))}
        raws[victim] = bytearray(encode(dataclasses.replace(msg, **tweak), send_key))
    seg = len(raws[0])
    blob = b"".join(bytes(r) for r in raws)
    run = wire.parse_data_run(memoryview(blob), seg, recv_key)
    if run is not None:
        assert run[:4] + ([bytes(p) for p in run[4]],) == _run_by_parse_data(blob, seg, recv_key)
    intact = bytes(raws[victim]) == encode(Data(session, seq + victim, chunk, offset + size * victim,
                                                bytes([victim % 251]) * sizes[victim]), send_key)
    if intact and send_key == recv_key and seg < len(blob) and offset + sum(sizes) <= wire.MAX_CHUNK_SIZE:
        assert run is not None and run[1] == seq and len(run[4]) == count
    if run is not None:  # whatever was damaged: nothing taken ends past the largest chunk
        assert run[3] + sum(len(p) for p in run[4]) <= wire.MAX_CHUNK_SIZE


@settings(max_examples=examples(300), deadline=None)
@given(u64, st.integers(1, 1400), st.integers(2, 8), st.integers(1, 1400), st.integers(-2, 2),
       st.sampled_from([None, KEY]), st.booleans())
@example(wire.U64_MAX, 1400, 8, 1400, 0, KEY, False)  # ends at the last seq and the last byte of a chunk
@example(0, 1400, 8, 1400, 1, KEY, True)  # one byte past: the first 7 only
@example(0, 1000, 3, 1, 2, None, True)  # its short last one and the one before end past: the first only
@example(0, 1, 2, 1, 1, None, True)  # a run of two 1-byte payloads, the second past: the first
def test_an_intact_run_at_the_chunk_limit_is_taken_up_to_its_first_datagram_past_it(
        seq, size, count, last_size, past, key, prefix) -> None:
    """Runs whose end is ``past`` bytes beyond MAX_CHUNK_SIZE (<= 0: inside), their seqs
    ending at most at 2^64 - 1: the Python run parser and ``fastrun.verify_run`` (the C
    one where it is built) take the whole run when it fits; else none of it, or with
    ``prefix`` the datagrams before the first that ends past the limit."""
    last_size = min(last_size, size)
    sizes = [size] * (count - 1) + [last_size]
    seq, start = min(seq, wire.U64_MAX - count + 1), MAX_CHUNK - sum(sizes) + past
    raws = data_run(7, seq, 3, start, sizes, key)
    blob, seg = b"".join(bytes(r) for r in raws), len(raws[0])
    ends = [start + sum(sizes[: i + 1]) for i in range(count)]
    fit = next((i for i, end in enumerate(ends) if end > MAX_CHUNK), count)
    want = fit if prefix else (count if fit == count else 0)
    run = wire.parse_data_run(memoryview(blob), seg, key, prefix)
    head = fastrun.verify_run(memoryview(blob), seg, key, prefix)
    if want == 0:
        assert run is None and head is None
    else:
        assert run is not None and run[:4] == (7, seq, 3, start) and [len(p) for p in run[4]] == sizes[:want]
        assert head is not None and head[:5] == (7, seq, 3, start, want)


@settings(max_examples=examples(300), deadline=None)
@given(manifests(), st.integers(1, 2))
@example(Manifest(1, 3 * 4096, 4096, 1024, 3, b"f" * 32, 0, 1, 1, b"d" * 32), 1)  # page ends at the last chunk
@example(Manifest(1, 0, 4096, 1024, 0, b"f" * 32, 0, 1, 0, b""), 1)  # an empty file has no chunk to describe
def test_a_manifest_page_is_refused_once_its_digests_run_past_the_last_chunk(msg, more) -> None:
    """A receiver writes a page's digests from ``first_chunk`` on: ``more`` digests added to
    a valid page are refused exactly when they describe chunks beyond ``chunk_count``."""
    longer = dataclasses.replace(msg, digests=msg.digests + bytes(wire.CHUNK_DIGEST_LEN * more))
    fits = msg.first_chunk + len(longer.digests) // wire.CHUNK_DIGEST_LEN <= msg.chunk_count
    if fits:
        assert decode(encode(longer)) == longer
    else:
        with pytest.raises(WireError) as info:
            decode(encode(longer))
        assert info.value.reason == "bad_field"


def test_lane_field_is_absent_for_one_lane_and_checked_when_present() -> None:
    """A one-lane manifest is the 11-field array it always was (old receivers read it);
    a lane that is not index < count <= MAX_LANES, count >= 2, is refused."""
    base = Manifest(5, 10000, 4096, 1024, 3, b"d" * 32, 0, 1, 0, b"x" * 48, "m", 2)
    assert len(msgpack.unpackb(encode(base)[wire.HEADER_LEN:])) == 11
    laned = dataclasses.replace(base, lane=(1, 2, 1 << 30))
    assert decode(encode(laned)).lane == (1, 2, 1 << 30)
    for bad in [(2, 2, 0), (0, 1, 0), (0, wire.MAX_LANES + 1, 0), (0, 2, wire.MAX_FILE_SIZE)]:
        body = msgpack.unpackb(encode(base)[wire.HEADER_LEN:]) + [list(bad)]
        raw = encode(base)[: wire.HEADER_LEN] + msgpack.packb(body, use_bin_type=True)
        with pytest.raises(WireError) as info:
            decode(raw)
        assert info.value.reason == "bad_field", bad


def test_id_root_is_absent_unless_set_and_checked_when_present() -> None:
    """A page without ``id_root`` is the array it was; with one it carries the content's
    size and digests root, and anything else there -- a short root, a size that is not
    the file's (or does not hold a lane's slice), another key, a second map -- is refused."""
    base = Manifest(5, 10000, 4096, 1024, 3, b"d" * 32, 0, 2, 0, b"x" * 32, "m", 2)
    assert len(msgpack.unpackb(encode(base)[wire.HEADER_LEN:])) == 11
    rooted = dataclasses.replace(base, id_root=(10000, b"r" * 32))
    assert decode(encode(rooted, KEY), KEY) == rooted
    laned = dataclasses.replace(base, lane=(1, 2, 1 << 20), id_root=((1 << 20) + 10000, b"r" * 32))
    assert decode(encode(laned)) == laned
    plain = msgpack.unpackb(encode(base)[wire.HEADER_LEN:])
    good = {"size": 10000, "root": b"r" * 32}
    for extra in ([{"size": 10000, "root": b"r" * 31}], [{"size": 9999, "root": b"r" * 32}],
                  [{**good, "more": 1}], [{"size": 10000}], [good, good], [[1, 2, 1 << 20], {**good, "size": 10000}]):
        raw = encode(base)[: wire.HEADER_LEN] + msgpack.packb(plain + extra, use_bin_type=True)
        with pytest.raises(WireError) as info:
            decode(raw)
        assert info.value.reason == "bad_field", extra


_write = st.tuples(st.integers(0, 2), st.integers(0, 2), st.lists(st.integers(1, 4), min_size=1, max_size=3),
                   st.booleans(), st.integers(-1, 2))


@settings(max_examples=examples(500), deadline=None)
@given(st.lists(_write, max_size=25), st.integers(0, 255))
@example([(0, 0, [4], False, -1), (0, 2, [4], False, -1), (0, 1, [4], False, 0)], 0)  # out of order
@example([(0, 0, [4, 4], False, -1), (0, 0, [4], True, -1), (0, 2, [4], False, 0)], 0)  # FEC rewrote a streamed part
@pytest.mark.parametrize("join", [wire.StreamDigest.JOIN, 3, 1])
def test_stream_digest_is_the_digest_of_what_was_written(join, writes, fill) -> None:
    """``StreamDigest`` against a model of three 12-byte chunks written in any order, in
    pieces, some rebuilt by FEC (``forget``), asked for a chunk's digest at any time:
    whenever it names one, that is ``chunk_digest`` of what the chunk holds; and a chunk
    written front to back in one go always gets one. ``join``: small pieces are joined
    before they are hashed (then pieces of 1-4 bytes are small or not, both ways)."""
    length = 12
    chunks = [bytearray(length) for _ in range(3)]
    stream = wire.StreamDigest(join)
    for n, (chunk, unit, sizes, fec, ask) in enumerate(writes):
        offset = min(unit * 4, length - 1)
        parts, pos = [], offset
        for size in sizes:
            part = bytes([(fill + n + pos) % 256]) * min(size, length - pos)
            if part:
                parts.append(memoryview(part))
                chunks[chunk][pos : pos + len(part)] = part
                pos += len(part)
        if fec:
            stream.forget(chunk)
        else:
            stream.wrote(chunk, offset, parts)
        if ask >= 0:
            got = stream.digest(ask, length)
            assert got is None or got == wire.chunk_digest(bytes(chunks[ask]))
    whole = bytes(range(length))
    stream.wrote(1, 0, [memoryview(whole[:7])])
    stream.wrote(0, 4, [memoryview(b"repair")])  # another chunk's repair does not end the stream
    stream.wrote(1, 7, [memoryview(whole[7:])])
    assert stream.digest(0, length) is None and stream.digest(1, length) == wire.chunk_digest(whole)
    assert stream.digest(1, length) is None  # one answer per stream
