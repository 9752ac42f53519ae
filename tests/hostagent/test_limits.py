"""Every limit the wire decoders enforce, at its edge: the largest value the format allows
is accepted, one more is refused (with its reason, where the decoder names one).

Datagrams are packed by hand here, not by the encoders, so no encoder check can keep a
value off the wire. The same edges hold for every decoder of a kind: ``wire.decode`` and
the receiver's hot path ``wire.parse_data`` for one datagram; ``wire.parse_data_run``,
``hostagent.fastrun``'s C run check and its Python twin for a GRO run; and the sender's
manifest cache loader (``hostagent.manifest``) for its entries. A check weakened by one
(``>`` for ``>=``, a limit one byte wider) or dropped fails a test here.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Callable, Optional

import msgpack
import pytest

from hostagent import fastrun, wire
from hostagent.manifest import cached_digests
from hostagent.wire import (
    DATA_HEADER_LEN, HEADER_LEN, MAC_LEN, MAX_CHUNK_COUNT, MAX_CHUNK_SIZE, MAX_DATAGRAM, MAX_FILE_SIZE,
    MAX_LANES, MAX_NAME_BYTES, MAX_PAYLOAD, MIN_CHUNK_SIZE, MIN_PAYLOAD, U64_MAX, Complete, CompleteAck, Data,
    End, Hello, WireError, decode, encode,
)
from tests.support.lab import skip_or_fail

KEY = wire.derive_key(b"limits test")
SESSION = 7
_HEADER = struct.Struct("!2sBBBxQ")  # magic, version, type, flags, session
_DATA = struct.Struct("!QIIH")  # seq, chunk, offset, payload length
_PARITY = struct.Struct("!IIHHHH")  # chunk, block, k, n, share index, payload length


def slug(what: str) -> str:
    """A test id without spaces: "page count ceiling" -> "page-count-ceiling"."""
    return what.replace(", ", "-").replace(" ", "-")


def header(mtype: int, flags: int = 0) -> bytes:
    return _HEADER.pack(wire.MAGIC, wire.VERSION, mtype, flags, SESSION)


def data_raw(offset: int, plen: int, *, seq: int = 1, repair: bool = False, flags: int = 0,
             key: Optional[bytes] = None, declared: Optional[int] = None) -> bytes:
    """A DATA (or REPAIR) datagram of ``plen`` payload bytes at ``offset`` of chunk 0,
    declaring ``declared`` bytes (default: ``plen``), MAC'd with ``key`` if given."""
    flags |= wire.FLAG_MAC if key is not None else 0
    raw = (header(wire.T_REPAIR if repair else wire.T_DATA, flags)
           + _DATA.pack(seq, 0, offset, plen if declared is None else declared) + bytes([seq % 251]) * plen)
    return wire.seal(key, raw) if key is not None else raw


def largest_payload(key: Optional[bytes]) -> int:
    """The most payload one DATA datagram can carry: MAX_DATAGRAM bytes in all."""
    return MAX_DATAGRAM - DATA_HEADER_LEN - (MAC_LEN if key is not None else 0)


def verdict(raw: bytes, key: Optional[bytes] = None) -> str:
    """"ok" if ``decode`` accepts ``raw``, else the reason it refuses it with."""
    try:
        decode(raw, key)
    except WireError as exc:
        return exc.reason
    return "ok"


# --------------------------------------------------------------------------- one DATA datagram

@pytest.mark.parametrize("key", [None, KEY], ids=["plain", "keyed"])
@pytest.mark.parametrize("repair", [False, True], ids=["data", "repair"])
@pytest.mark.parametrize("plen", [1, 1400, 8952, "largest"])
def test_a_fragment_may_end_at_the_largest_chunk_size_and_not_one_byte_later(plen, repair, key) -> None:
    """``offset + len <= MAX_CHUNK_SIZE``: equal decodes (both decoders, same fields),
    one byte more is refused as bad_field by ``decode`` and dropped by ``parse_data``."""
    plen = largest_payload(key) if plen == "largest" else plen
    at = data_raw(MAX_CHUNK_SIZE - plen, plen, repair=repair, key=key)
    msg = decode(at, key)
    assert isinstance(msg, Data) and msg.offset + len(msg.payload) == MAX_CHUNK_SIZE and msg.repair is repair
    fields = wire.parse_data(at, key)
    assert fields is not None and fields[3] == MAX_CHUNK_SIZE - plen and len(fields[4]) == plen
    past = data_raw(MAX_CHUNK_SIZE - plen + 1, plen, repair=repair, key=key)
    assert verdict(past, key) == "bad_field"
    assert wire.parse_data(past, key) is None


@pytest.mark.parametrize("offset", [MAX_CHUNK_SIZE, MAX_CHUNK_SIZE + 1, (1 << 32) - 1])
def test_a_fragment_starting_at_or_past_the_largest_chunk_size_is_refused(offset) -> None:
    """(offset 2^32 - 1 plus a payload would wrap a 32-bit sum: it must not.)"""
    for key in (None, KEY):
        raw = data_raw(offset, 1, key=key)
        assert verdict(raw, key) == "bad_field" and wire.parse_data(raw, key) is None


@pytest.mark.parametrize("key", [None, KEY], ids=["plain", "keyed"])
def test_the_largest_datagram_decodes_and_one_byte_more_is_oversized(key) -> None:
    room = largest_payload(key)
    biggest = data_raw(0, room, key=key)
    assert len(biggest) == MAX_DATAGRAM and verdict(biggest, key) == "ok"
    assert wire.parse_data(biggest, key) is not None
    over = data_raw(0, room + 1, key=key)
    assert len(over) == MAX_DATAGRAM + 1 and verdict(over, key) == "oversized"
    assert wire.parse_data(over, key) is None


@pytest.mark.parametrize("key", [None, KEY], ids=["plain", "keyed"])
def test_a_payload_is_at_least_one_byte_and_exactly_as_long_as_declared(key) -> None:
    tail = MAC_LEN if key is not None else 0
    one = data_raw(0, 1, key=key)
    assert len(one) == DATA_HEADER_LEN + 1 + tail and verdict(one, key) == "ok"
    assert wire.parse_data(one, key) is not None
    for raw in (data_raw(0, 0, key=key), data_raw(0, 10, declared=9, key=key), data_raw(0, 10, declared=11, key=key)):
        assert verdict(raw, key) == "bad_length" and wire.parse_data(raw, key) is None


def test_a_data_header_cut_short_is_truncated() -> None:
    whole = data_raw(0, 0)  # the 32-byte DATA header, no payload: refused for its length
    assert verdict(whole) == "bad_length"
    assert verdict(whole[:-1]) == "truncated" and wire.parse_data(whole[:-1]) is None


def test_a_mac_d_datagram_read_without_a_key_is_stripped_at_its_smallest() -> None:
    """Without a key the tag is dropped unchecked: the smallest MAC'd DATA (one payload
    byte) still decodes, one byte shorter is an empty payload."""
    one = data_raw(0, 1, key=KEY)
    assert verdict(one) == "ok" and wire.parse_data(one, None) is not None
    empty = data_raw(0, 0, key=KEY)
    assert verdict(empty) == "bad_length" and wire.parse_data(empty, None) is None


def test_the_common_header_is_fourteen_bytes_and_a_tag_sixteen_more() -> None:
    """A MANIFEST header with nothing after it gets past the header checks (its empty
    body is what is refused); a byte less is truncated. With the MAC flag, the tag
    needs 16 bytes beyond the header."""
    bare = header(wire.T_MANIFEST)
    assert verdict(bare) == "malformed" and verdict(bare[:-1]) == "truncated"
    tagged = header(wire.T_MANIFEST, wire.FLAG_MAC) + bytes(MAC_LEN)
    assert verdict(tagged) == "malformed" and verdict(tagged, KEY) == "bad_mac"
    assert verdict(tagged[:-1]) == "truncated" and verdict(tagged[:-1], KEY) == "truncated"


def test_only_the_three_known_flag_bits_are_accepted() -> None:
    known = wire.FLAG_MAC | wire.FLAG_CLOSING | wire.FLAG_MULTICAST
    assert known == 0x07
    assert verdict(data_raw(0, 10, repair=True, flags=wire.FLAG_MULTICAST)) == "ok"
    assert verdict(header(wire.T_END, wire.FLAG_CLOSING) + struct.pack("!QI", 10, 0)) == "ok"
    for bit in (0x08, 0x10, 0x20, 0x40, 0x80):
        raw = data_raw(0, 10, repair=True, flags=wire.FLAG_MULTICAST | bit)
        assert verdict(raw) == "bad_field" and wire.parse_data(raw) is None, hex(bit)
    # and each known bit only where it means something
    multicast_data = data_raw(0, 10, flags=wire.FLAG_MULTICAST)
    assert verdict(multicast_data) == "bad_field" and wire.parse_data(multicast_data) is None
    assert verdict(header(wire.T_HELLO, wire.FLAG_CLOSING) + bytes(8)) == "bad_field"
    assert verdict(header(wire.T_HELLO, wire.FLAG_MULTICAST) + bytes(8)) == "bad_field"


@pytest.mark.parametrize("msg", [Hello(SESSION, 1), CompleteAck(SESSION, U64_MAX), End(SESSION, U64_MAX, 2**32 - 1),
                                 Complete(SESSION, 1, bytes(32))], ids=lambda m: type(m).__name__)
def test_fixed_size_bodies_are_exactly_their_size(msg) -> None:
    raw = encode(msg)
    assert decode(raw) == msg
    assert verdict(raw[:-1]) == "truncated" and verdict(raw + b"\0") == "bad_length"


# --------------------------------------------------------------------------- MANIFEST

_FIELDS = ("file_size", "chunk_size", "payload_size", "chunk_count", "file_digest", "page_index", "page_count",
           "first_chunk", "digests", "name", "receivers_hint")
BASE: dict[str, Any] = dict(file_size=3 * 4096 - 5, chunk_size=4096, payload_size=1024, chunk_count=3,
                            file_digest=bytes(32), page_index=0, page_count=1, first_chunk=0, digests=bytes(48),
                            name="m.bin", receivers_hint=2)


def manifest_raw(*extra: object, drop: int = 0, **fields: object) -> bytes:
    """A MANIFEST datagram: BASE's eleven fields with ``fields`` replaced, the last ``drop``
    left out, ``extra`` (lane, entries) appended."""
    values = [fields.get(name, BASE[name]) for name in _FIELDS]
    values = values[: len(values) - drop] + list(extra)
    return header(wire.T_MANIFEST) + msgpack.packb(values, use_bin_type=True)


def sized(chunk_size: int, chunk_count: int) -> dict[str, int | bytes]:
    """A file of ``chunk_count`` full chunks of ``chunk_size``, no digests on the page."""
    return dict(file_size=chunk_size * chunk_count, chunk_size=chunk_size, chunk_count=chunk_count, digests=b"")


LAST = sized(MAX_CHUNK_SIZE, MAX_CHUNK_COUNT)
MANIFEST_EDGES: dict[str, tuple[dict, dict]] = {  # what: (largest or smallest accepted, one past it)
    "chunk size floor": (sized(MIN_CHUNK_SIZE, 3), sized(MIN_CHUNK_SIZE - 1, 3)),
    "chunk size ceiling": (sized(MAX_CHUNK_SIZE, 3), sized(MAX_CHUNK_SIZE + 1, 3)),
    "payload size floor": ({"payload_size": MIN_PAYLOAD}, {"payload_size": MIN_PAYLOAD - 1}),
    "payload size ceiling": ({"payload_size": MAX_PAYLOAD}, {"payload_size": MAX_PAYLOAD + 1}),
    "chunk count ceiling": (sized(MIN_CHUNK_SIZE, MAX_CHUNK_COUNT), sized(MIN_CHUNK_SIZE, MAX_CHUNK_COUNT + 1)),
    "largest file": (LAST, {**LAST, "file_size": LAST["file_size"] + 1}),
    "file fills its last chunk": (sized(4096, 3), {**sized(4096, 3), "file_size": 3 * 4096 + 1}),
    "file reaches into its last chunk": ({**sized(4096, 3), "file_size": 2 * 4096 + 1},
                                         {**sized(4096, 3), "file_size": 2 * 4096}),
    "empty file": (sized(4096, 0), {**sized(4096, 0), "chunk_count": 1}),
    "file digest, long": ({"file_digest": bytes(32)}, {"file_digest": bytes(33)}),
    "file digest, short": ({"file_digest": bytes(32)}, {"file_digest": bytes(31)}),
    "chunk digests whole": ({"digests": bytes(32)}, {"digests": bytes(33)}),
    "digest page ends at the last chunk": ({"first_chunk": 1, "digests": bytes(32)},
                                           {"first_chunk": 1, "digests": bytes(48)}),
    "digest page holds every chunk": ({"first_chunk": 0, "digests": bytes(48)},
                                      {"first_chunk": 0, "digests": bytes(64)}),
    "digest page starts at the last chunk": ({"first_chunk": 2, "digests": bytes(16)},
                                             {"first_chunk": 3, "digests": bytes(16)}),
    "empty digest page at the end": ({"first_chunk": 3, "digests": b""}, {"first_chunk": 4, "digests": b""}),
    "page index": ({"page_index": 4, "page_count": 5}, {"page_index": 5, "page_count": 5}),
    "page count ceiling": ({"page_index": 2**32 - 1, "page_count": 2**32}, {"page_count": 2**32 + 1}),
    "name bytes": ({"name": "n" * MAX_NAME_BYTES}, {"name": "n" * (MAX_NAME_BYTES + 1)}),
    "name bytes, not characters": ({"name": "\u20ac" * (MAX_NAME_BYTES // 3)},
                                   {"name": "\u20ac" * (MAX_NAME_BYTES // 3) + "n"}),
    "receivers hint": ({"receivers_hint": 2**32 - 1}, {"receivers_hint": 2**32}),
}


@pytest.mark.parametrize("what", MANIFEST_EDGES, ids=slug)
def test_manifest_field_limits(what) -> None:
    accepted, refused = MANIFEST_EDGES[what]
    msg = decode(manifest_raw(**accepted))
    assert all(getattr(msg, name) == value for name, value in accepted.items())
    assert verdict(manifest_raw(**refused)) == "bad_field"


def test_a_digest_page_may_not_describe_chunks_the_file_does_not_have() -> None:
    """The receiver writes a page's digests at ``first_chunk`` onwards: one digest past
    the chunk count, from any starting chunk, is refused."""
    for count in (1, 3, 300):
        for first in range(count + 1):
            fields = dict(file_size=count * 4096, chunk_count=count, first_chunk=first)
            fits = bytes(16 * (count - first))
            assert decode(manifest_raw(**fields, digests=fits)).digests == fits
            assert verdict(manifest_raw(**fields, digests=fits + bytes(16))) == "bad_field", (count, first)


LANE_EDGES: dict[str, tuple[list, list]] = {
    "index below count": ([1, 2, 0], [2, 2, 0]),
    "count floor": ([0, 2, 0], [0, 1, 0]),
    "count ceiling": ([MAX_LANES - 1, MAX_LANES, 0], [0, MAX_LANES + 1, 0]),
    "offset ceiling": ([0, 2, MAX_FILE_SIZE - BASE["file_size"]], [0, 2, MAX_FILE_SIZE - BASE["file_size"] + 1]),
}


@pytest.mark.parametrize("what", LANE_EDGES, ids=slug)
def test_manifest_lane_limits(what) -> None:
    accepted, refused = LANE_EDGES[what]
    assert decode(manifest_raw(accepted)).lane == tuple(accepted)
    assert verdict(manifest_raw(refused)) == "bad_field"


def test_a_manifest_has_eleven_to_thirteen_fields() -> None:
    assert verdict(manifest_raw()) == "ok" and verdict(manifest_raw(drop=1)) == "bad_field"
    full = decode(manifest_raw([0, 2, 0], b"entries"))
    assert full.lane == (0, 2, 0) and full.entries == b"entries"
    assert verdict(manifest_raw([0, 2, 0], b"entries", b"more")) == "bad_field"
    assert decode(manifest_raw(b"e")).entries == b"e" and verdict(manifest_raw(b"")) == "bad_field"


# --------------------------------------------------------------------------- NACK

def nack_raw(values: list[int], loss: int = 0, *extra: object) -> bytes:
    return header(wire.T_NACK) + msgpack.packb([1, loss, values, *extra])


NACK_EDGES: dict[str, tuple[bytes, bytes]] = {
    "loss ceiling": (nack_raw([0, 1], 1000), nack_raw([0, 1], 1001)),
    "a range ends at the last sequence number": (nack_raw([U64_MAX - 5, 5]), nack_raw([U64_MAX - 5, 6])),
    "a later range ends there": (nack_raw([0, 1, U64_MAX - 2, 1]), nack_raw([0, 1, U64_MAX - 1, 1])),
    "range length floor": (nack_raw([0, 1]), nack_raw([0, 0])),
    "gap floor after the first range": (nack_raw([0, 1, 1, 1]), nack_raw([0, 1, 0, 1])),
    "gap and length pairs": (nack_raw([0, 1]), nack_raw([0, 1, 5])),
    "three fields": (nack_raw([]), nack_raw([], 0, 9)),
}


@pytest.mark.parametrize("what", NACK_EDGES, ids=slug)
def test_nack_limits(what) -> None:
    accepted, refused = NACK_EDGES[what]
    assert verdict(accepted) == "ok" and verdict(refused) == "bad_field"


def test_nack_ranges_decode_to_their_end_at_the_last_sequence_number() -> None:
    assert decode(nack_raw([0, 1, U64_MAX - 2, 1])).ranges == ((0, 1), (U64_MAX - 1, U64_MAX))
    assert verdict(header(wire.T_NACK) + msgpack.packb([1, 0])) == "bad_field"  # two fields


# --------------------------------------------------------------------------- PARITY

def parity_raw(*, block: int = 0, k: int = 4, n: int = 8, index: int = 4, plen: int = 100,
               declared: Optional[int] = None) -> bytes:
    return (header(wire.T_PARITY) + _PARITY.pack(0, block, k, n, index, plen if declared is None else declared)
            + b"p" * plen)


PARITY_EDGES: dict[str, tuple[dict, dict]] = {
    "k floor": ({"k": 1, "n": 2, "index": 1}, {"k": 0, "n": 2, "index": 1}),
    "n ceiling": ({"n": wire.MAX_FEC_SHARES, "index": wire.MAX_FEC_SHARES - 1},
                  {"n": wire.MAX_FEC_SHARES + 1, "index": 4}),
    "k below n": ({"k": 255, "n": 256, "index": 255}, {"k": 256, "n": 256, "index": 255}),
    "index floor": ({"index": 1}, {"index": 0}),
    "index below n": ({"index": 7}, {"index": 8}),
    "block inside the largest chunk, k=1": ({"k": 1, "n": 2, "index": 1, "block": MAX_CHUNK_SIZE - 1},
                                            {"k": 1, "n": 2, "index": 1, "block": MAX_CHUNK_SIZE}),
    "block inside the largest chunk, k=3": ({"k": 3, "block": (MAX_CHUNK_SIZE - 1) // 3},
                                            {"k": 3, "block": (MAX_CHUNK_SIZE - 1) // 3 + 1}),
}


@pytest.mark.parametrize("what", PARITY_EDGES, ids=slug)
def test_parity_limits(what) -> None:
    accepted, refused = PARITY_EDGES[what]
    msg = decode(parity_raw(**accepted))
    assert all(getattr(msg, name) == value for name, value in accepted.items())
    assert verdict(parity_raw(**refused)) == "bad_field"


def test_parity_payload_and_header_lengths() -> None:
    room = MAX_DATAGRAM - HEADER_LEN - _PARITY.size
    assert verdict(parity_raw(plen=room)) == "ok" and verdict(parity_raw(plen=room + 1)) == "oversized"
    assert verdict(parity_raw(plen=1)) == "ok" and verdict(parity_raw(plen=0)) == "bad_length"
    assert verdict(parity_raw(plen=10, declared=11)) == "bad_length"
    assert verdict(parity_raw(plen=0)[:-1]) == "truncated"


# --------------------------------------------------------------------------- GRO runs

def run_blob(start: int, sizes: list[int], key: Optional[bytes], seq: int = 1) -> bytes:
    """Consecutive DATA datagrams of chunk 0 from byte ``start``, payload i ``sizes[i]`` bytes."""
    raws, pos = [], start
    for i, size in enumerate(sizes):
        raws.append(data_raw(pos, size, seq=(seq + i) & U64_MAX, key=key))
        pos += size
    return b"".join(raws)


def _wire_run(blob: bytes, seg: int, key: Optional[bytes], prefix: bool) -> Optional[tuple]:
    run = wire.parse_data_run(memoryview(blob), seg, key, prefix)
    return None if run is None else (*run[:4], len(run[4]))


def _py_run(blob: bytes, seg: int, key: Optional[bytes], prefix: bool) -> Optional[tuple]:
    head = fastrun.verify_run_py(memoryview(blob), seg, key, prefix)
    return None if head is None else head[:5]


def _c_run(blob: bytes, seg: int, key: Optional[bytes], prefix: bool) -> Optional[tuple]:
    if fastrun._native is None:
        skip_or_fail(f"hostagent._fastrun is not built ({fastrun._why})", what="C extension")
    head = fastrun.verify_run_c(memoryview(blob), seg, key, prefix)
    return None if head is None else head[:5]


RUNS: dict[str, Callable[[bytes, int, Optional[bytes], bool], Optional[tuple]]] = {
    "wire.parse_data_run": _wire_run, "fastrun.verify_run_py": _py_run, "fastrun.verify_run_c": _c_run}
keys = pytest.mark.parametrize("key", [None, KEY], ids=["plain", "keyed"])
runs = pytest.mark.parametrize("check", RUNS.values(), ids=RUNS.keys())


@runs
@keys
@pytest.mark.parametrize("size", [1, 1000, "largest"])
def test_a_run_may_end_at_the_largest_chunk_size_and_not_one_byte_later(check, key, size) -> None:
    """The last datagram of a run ends exactly at MAX_CHUNK_SIZE: the whole run. One byte
    later: no run (the receiver takes the datagrams one by one), or with ``prefix`` the
    run up to the datagram that crosses."""
    size = largest_payload(key) if size == "largest" else size
    seg = DATA_HEADER_LEN + size + (MAC_LEN if key is not None else 0)
    start = MAX_CHUNK_SIZE - 3 * size
    assert check(run_blob(start, [size] * 3, key), seg, key, False) == (SESSION, 1, 0, start, 3)
    past = run_blob(start + 1, [size] * 3, key)
    assert check(past, seg, key, False) is None
    assert check(past, seg, key, True) == (SESSION, 1, 0, start + 1, 2)


@runs
@keys
def test_a_run_whose_first_datagram_crosses_the_limit_is_no_run(check, key) -> None:
    seg = DATA_HEADER_LEN + 1000 + (MAC_LEN if key is not None else 0)
    for start, sizes in ((MAX_CHUNK_SIZE - 999, [1000, 1000]), (MAX_CHUNK_SIZE, [1, 1])):
        blob = run_blob(start, sizes, key)
        assert check(blob, len(blob) // 2, key, False) is None and check(blob, len(blob) // 2, key, True) is None
    last_at_limit = run_blob(MAX_CHUNK_SIZE - 1001, [1000, 1], key)  # the short last one ends there
    assert check(last_at_limit, seg, key, False) == (SESSION, 1, 0, MAX_CHUNK_SIZE - 1001, 2)
    last_past = run_blob(MAX_CHUNK_SIZE - 1000, [1000, 1], key)
    assert check(last_past, seg, key, False) is None
    assert check(last_past, seg, key, True) == (SESSION, 1, 0, MAX_CHUNK_SIZE - 1000, 1)


@runs
@keys
def test_a_run_segment_is_at_most_the_largest_datagram(check, key) -> None:
    room = largest_payload(key)
    assert check(run_blob(0, [room, room], key), MAX_DATAGRAM, key, False) == (SESSION, 1, 0, 0, 2)
    assert check(run_blob(0, [room + 1, room + 1], key), MAX_DATAGRAM + 1, key, False) is None


@runs
@keys
def test_a_run_segment_holds_at_least_one_payload_byte(check, key) -> None:
    smallest = DATA_HEADER_LEN + 1 + (MAC_LEN if key is not None else 0)
    assert check(run_blob(0, [1, 1, 1], key), smallest, key, False) == (SESSION, 1, 0, 0, 3)
    empty = run_blob(0, [0, 0, 0], key)  # header (and tag) only: nothing to take
    assert check(empty, smallest - 1, key, False) is None and check(empty, smallest - 1, key, True) is None


@runs
@keys
def test_a_run_is_at_least_two_datagrams_and_its_last_carries_a_byte(check, key) -> None:
    seg = DATA_HEADER_LEN + 100 + (MAC_LEN if key is not None else 0)
    one = run_blob(0, [100], key)
    assert check(one, seg, key, False) is None  # a lone datagram: parse_data's, not a run
    assert check(run_blob(0, [100, 1], key), seg, key, False) == (SESSION, 1, 0, 0, 2)
    header_only = run_blob(0, [100, 0], key)
    assert check(header_only, seg, key, False) is None
    assert check(header_only, seg, key, True) == (SESSION, 1, 0, 0, 1)


@runs
@keys
def test_a_run_may_end_on_the_last_sequence_number(check, key) -> None:
    seg = DATA_HEADER_LEN + 10 + (MAC_LEN if key is not None else 0)
    assert check(run_blob(0, [10, 10, 10], key, seq=U64_MAX - 2), seg, key, False) == (SESSION, U64_MAX - 2, 0, 0, 3)
    assert check(run_blob(0, [10, 10, 10], key, seq=U64_MAX - 1), seg, key, False) is None  # it would wrap


@keys
def test_the_c_and_python_compaction_move_the_same_bytes_at_the_edges(key) -> None:
    """The runs accepted above, compacted by the C path and the Python one: the same
    payloads, in order."""
    if fastrun._native is None:
        skip_or_fail(f"hostagent._fastrun is not built ({fastrun._why})", what="C extension")
    if not fastrun.NATIVE:
        pytest.skip("MODELCAST_PURE_PYTHON=1 selects the Python receive path")
    tail = MAC_LEN if key is not None else 0
    room = largest_payload(key)
    for start, sizes in ((MAX_CHUNK_SIZE - 3000, [1000] * 3), (0, [room, room]), (0, [1, 1, 1])):
        blob = run_blob(start, sizes, key)
        seg = DATA_HEADER_LEN + sizes[0] + tail
        c, py = bytearray(blob), bytearray(blob)
        n_c = fastrun.compact_run(memoryview(c), seg, tail)
        n_py = fastrun.compact_run_py(memoryview(py), seg, tail)
        assert n_c == n_py == sum(sizes) and c[:n_c] == py[:n_py]
    with pytest.raises(ValueError):
        fastrun.compact_run(memoryview(bytearray(200)), DATA_HEADER_LEN + tail, tail)  # no room for a payload
    with pytest.raises(ValueError):
        fastrun.compact_run(memoryview(bytearray(200)), 100, -1)


# --------------------------------------------------------------------------- manifest cache entries

def test_a_cache_entry_holds_exactly_one_digest_per_chunk_and_a_whole_file_digest(tmp_path: Path) -> None:
    """An entry's digests are ``chunks * 16`` bytes and its file digest 32: another length
    (a digest more or less, a byte more or less) is a miss, and the file is digested."""
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(3 * 1024 + 1))  # four chunks of 1 KiB
    cache = tmp_path / "cache"
    computed = (bytes(range(64)), bytes(32))
    assert cached_digests(str(path), 1024, lambda: computed, str(cache)) == (computed, False)
    (entry,) = cache.iterdir()
    stored = msgpack.unpackb(entry.read_bytes(), raw=False)

    def load_with(**changes: object) -> tuple[tuple[bytes, bytes], bool]:
        entry.write_bytes(msgpack.packb({**stored, **changes}, use_bin_type=True))
        return cached_digests(str(path), 1024, lambda: computed, str(cache))

    other = (bytes(range(100, 164)), b"w" * 32)
    assert load_with(digests=other[0], file_digest=other[1]) == (other, True)
    for digests in (bytes(48), bytes(80), bytes(63), bytes(65)):
        assert load_with(digests=digests) == (computed, False), len(digests)
    for whole in (bytes(31), bytes(33)):
        assert load_with(file_digest=whole) == (computed, False), len(whole)
    assert load_with(chunk=1023) == (computed, False)
