"""The one versioned wire format of modelcast.

Every other module deals in the message dataclasses below; only this module packs and
unpacks bytes, so a format change is a change here and nowhere else.

Layout of every datagram::

    magic "MC" | version u8 | type u8 | flags u8 | pad u8 | session u64 | body | [MAC 16]

DATA, REPAIR and PARITY bodies are a fixed struct followed by the raw payload (the fast path);
MANIFEST and NACK bodies are msgpack arrays (variable length, rare). When the
``FLAG_MAC`` bit is set the last 16 bytes are a tag over everything before them: for DATA
(a first transmission, the bulk of every transfer) AES-256-GMAC under a key derived from
the session key and the session id, with the sequence number as the nonce; for every
other type a keyed BLAKE3 MAC (see ``_tag``). ``decode`` raises only ``WireError``
(subclasses name the reason) on anything it does not like, so callers can drop and count
with one ``except``.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass
from typing import Any, Union

import blake3
import msgpack

import hostagent.native as native

# 2: DATA datagrams are tagged with AES-GMAC, not BLAKE3 (version 1), so a version-1 peer
# refuses them as bad_version rather than as forged.
VERSION = 2
MAGIC = b"MC"

# Datagram types.
T_MANIFEST = 1
T_DATA = 2
T_REPAIR = 3
T_NACK = 4
T_PARITY = 5
T_COMPLETE = 6
T_COMPLETE_ACK = 7
T_END = 8
T_HELLO = 9

# Header flag bits.
FLAG_MAC = 0x01  # trailing 16-byte MAC present
FLAG_CLOSING = 0x02  # END: the sender is going away; stop waiting
FLAG_MULTICAST = 0x04  # REPAIR/PARITY: sent to the group (lets receivers suppress NACKs)
_KNOWN_FLAGS = FLAG_MAC | FLAG_CLOSING | FLAG_MULTICAST

MAC_LEN = 16
KEY_LEN = 32
CHUNK_DIGEST_LEN = 16
FILE_DIGEST_LEN = 32

# Largest datagram we will build or accept (the UDP/IPv4 maximum payload).
MAX_DATAGRAM = 65507
# Limits the decoder enforces on header fields (wider than sender config limits so that
# a future sender with other settings still decodes).
MAX_CHUNK_SIZE = 16 * 1024 * 1024
MAX_PAYLOAD = MAX_DATAGRAM - 64
# A manifest is a promise the receiver sizes its work by, so it is held to what a real
# file can need: chunks of at least MIN_CHUNK_SIZE (then a file of S bytes has at most
# S / MIN_CHUNK_SIZE + 1 chunks, so an 84-byte manifest cannot declare 2^32 chunks of one
# byte), datagrams of at least MIN_PAYLOAD, and at most MAX_CHUNK_COUNT chunks (16 TiB in
# 1 MiB chunks). Equal to the sender's own minimums (hostagent.common).
MIN_CHUNK_SIZE = 1024
MIN_PAYLOAD = 64
MAX_CHUNK_COUNT = 1 << 24
MAX_FILE_SIZE = (1 << 63) - 1
MAX_NAME_BYTES = 255
U64_MAX = (1 << 64) - 1

_HEADER = struct.Struct("!2sBBBxQ")  # magic, version, type, flags, session
HEADER_LEN = _HEADER.size  # 14
_DATA = struct.Struct("!QIIH")  # seq, chunk, fragment offset, payload length
DATA_HEADER_LEN = HEADER_LEN + _DATA.size  # 32
_DATA_FULL = struct.Struct("!2sBBBxQQIIH")  # header + DATA fields: one unpack on the hot path
_COMPLETE = struct.Struct("!Q32s")  # receiver id, whole-file digest
_RID = struct.Struct("!Q")  # receiver id (HELLO, COMPLETE_ACK)
_END = struct.Struct("!QI")  # total sequence numbers, receivers hint
_PARITY = struct.Struct("!IIHHHH")  # chunk, block, k, n, share index, payload len
MAX_FEC_SHARES = 256  # zfec works in GF(2^8): at most 256 shares per block


class WireError(Exception):
    """Any datagram we refuse. ``reason`` is a short stable label for drop counters."""

    reason = "malformed"


class Truncated(WireError):
    reason = "truncated"


class Oversized(WireError):
    reason = "oversized"


class BadMagic(WireError):
    reason = "bad_magic"


class BadVersion(WireError):
    reason = "bad_version"


class BadType(WireError):
    reason = "bad_type"


class BadLength(WireError):
    reason = "bad_length"


class BadField(WireError):
    reason = "bad_field"


class BadMac(WireError):
    reason = "bad_mac"


class Unauthenticated(WireError):
    reason = "unauthenticated"


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Manifest:
    """One page of the file description; every page repeats the file-level fields so
    a late joiner can start writing from whichever page it hears first."""

    session: int
    file_size: int
    chunk_size: int
    payload_size: int
    chunk_count: int
    file_digest: bytes
    page_index: int
    page_count: int
    first_chunk: int
    digests: bytes  # CHUNK_DIGEST_LEN bytes per chunk, starting at first_chunk
    name: str = ""
    receivers_hint: int = 0  # group size estimate: scales receivers' NACK backoff
    # A transfer striped over lanes (``--lanes``): this session carries lane ``index`` of
    # ``count``, the slice of the file that starts at byte ``offset``; every lane names
    # the whole file (``file_digest``). Encoded only when count > 1, so a one-lane
    # manifest is what it always was.
    lane: tuple[int, int, int] = (0, 1, 0)
    # A directory (``hostagent.tree``): its canonical entry list, in every page. Encoded
    # only when non-empty, so a single file's manifest is what it always was.
    entries: bytes = b""
    # What the content id (``hostagent.tree``) names, so a receiver holding an expected
    # id checks it at the first page it hears, before the other pages (and any data):
    # (byte count, ``tree.digests_root`` of every chunk digest) of the whole content -- a
    # lane's: the whole file's. The receiver still hashes the digests the pages bring to
    # the id once all came. Encoded (a msgpack map) only when non-empty: in a manifest of
    # several pages and in every lane's; a one-page manifest hashes to its id as it is.
    # (A receiver built before this field refuses such pages as bad_field: receivers are
    # upgraded no later than their senders.)
    id_root: tuple[int, bytes] = (0, b"")


@dataclass(frozen=True, slots=True)
class Data:
    """One fragment of one chunk; ``repair`` marks a retransmission."""

    session: int
    seq: int
    chunk: int
    offset: int
    payload: bytes
    repair: bool = False
    multicast: bool = True


@dataclass(frozen=True, slots=True)
class Nack:
    """Receiver's list of missing sequence ranges (half-open, sorted, disjoint).

    Sequence numbers are chunk aligned (chunk c owns seqs [c*F, c*F+frags(c))), so a
    whole chunk is re-requested by its seq range and a single lost fragment costs one
    fragment of repair, not a whole chunk."""

    session: int
    receiver_id: int
    ranges: tuple[tuple[int, int], ...]
    loss_permille: int = 0


@dataclass(frozen=True, slots=True)
class Parity:
    """One zfec parity share (index ``index`` of an ``n``-share code) over FEC block
    ``block`` of chunk ``chunk``: that chunk's fragments ``[block*k, (block+1)*k)``,
    cut short at the chunk end. The payload is as long as the block's first fragment
    (shorter fragments are zero-padded before encoding); see ``hostagent.fec``."""

    session: int
    chunk: int
    block: int
    k: int
    n: int
    index: int
    payload: bytes
    multicast: bool = True


@dataclass(frozen=True, slots=True)
class Complete:
    session: int
    receiver_id: int
    file_digest: bytes


@dataclass(frozen=True, slots=True)
class CompleteAck:
    session: int
    receiver_id: int


@dataclass(frozen=True, slots=True)
class End:
    """Stream finished: there are ``total_seq`` sequence numbers; NACK the tail."""

    session: int
    total_seq: int
    receivers_hint: int = 0
    closing: bool = False


@dataclass(frozen=True, slots=True)
class Hello:
    session: int
    receiver_id: int


Message = Union[Manifest, Data, Nack, Parity, Complete, CompleteAck, End, Hello]


# --------------------------------------------------------------------------- helpers


def derive_key(secret: bytes) -> bytes:
    """Turn an operator-supplied secret of any length into a 32-byte MAC key."""
    return blake3.blake3(secret, derive_key_context="modelcast 2024 session MAC key").digest()


def chunk_digest(data: bytes | memoryview) -> bytes:
    """Per-chunk digest carried in the manifest."""
    return blake3.blake3(data).digest(length=CHUNK_DIGEST_LEN)


class StreamDigest:
    """``chunk_digest`` of the one chunk being written front to back, hashed from the
    pieces as they are written (a clean stream's payloads, still in the receive buffer),
    so verifying that chunk needs no second read of it from the file. Every write to a
    chunk goes through ``wrote`` (or ``forget``): a write that does not continue the
    chunk's stream exactly where it stands drops it, and ``digest`` then answers None
    (the caller reads the chunk back and hashes that). A write at offset 0 starts a
    chunk's stream afresh, dropping the one before."""

    __slots__ = ("chunk", "_pos", "_hasher", "_pending", "_join")

    # BLAKE3 hashes many 1 KiB blocks at once only within one long input: fed one ~9 KB
    # datagram at a time (a read without GRO) it costs ~1.3 x per byte what 64 KiB pieces
    # cost, more than copying the small pieces together first.
    JOIN = 64 * 1024

    def __init__(self, join: int = JOIN) -> None:
        self.chunk = -1
        self._pos = 0
        self._hasher = blake3.blake3()
        self._pending = bytearray()
        self._join = join  # pieces shorter than this are joined before they are hashed

    def wrote(self, chunk: int, offset: int, parts: list[memoryview] | tuple[bytes | memoryview, ...]) -> None:
        """``parts`` (consecutive) were written to ``chunk`` at ``offset``."""
        if offset == 0:
            self.chunk, self._pos, self._hasher = chunk, 0, blake3.blake3()
            self._pending.clear()
        elif chunk != self.chunk:
            return  # another chunk's bytes: this stream's are untouched
        elif offset != self._pos:
            self.chunk = -1
            self._pending.clear()
            return
        pending = self._pending
        if len(parts) == 1 and len(parts[0]) < self._join:
            pending += parts[0]  # (they are views into a buffer the next read reuses)
            self._pos += len(parts[0])
            if len(pending) >= self._join:
                self._hasher.update(pending)
                pending.clear()
            return
        if pending:
            self._hasher.update(pending)
            pending.clear()
        whole = parts[0] if len(parts) == 1 else b"".join(parts)  # a GRO batch: one update
        self._hasher.update(whole)
        self._pos += len(whole)

    def forget(self, chunk: int) -> None:
        """``chunk`` was written some other way (FEC rebuilt, a resume claim)."""
        if chunk == self.chunk:
            self.chunk = -1
            self._pending.clear()

    def digest(self, chunk: int, length: int) -> bytes | None:
        """``chunk_digest`` of ``chunk``'s ``length`` bytes if all of them, and nothing
        else, were streamed; None otherwise. Ends the stream."""
        if chunk != self.chunk or self._pos != length:
            return None
        self.chunk = -1
        if self._pending:
            self._hasher.update(self._pending)
            self._pending.clear()
        return self._hasher.digest(length=CHUNK_DIGEST_LEN)


# DATA's tag. A keyed BLAKE3 pass costs ~1 s/GB on the reference machine, AES-GMAC (AES-NI
# and carry-less multiply, through OpenSSL) ~0.4 s/GB, and DATA is nearly every byte: on
# both ends this is the largest per-byte cost after the chunk digest. GMAC is a secure MAC
# only while no nonce repeats under one key, so the key is per session
# (``_GMAC_CONTEXT`` over the session key and the session id: a random 64-bit id per
# transfer, also under a long-lived ``--key-file``) and the nonce is the sequence number,
# which a sender's stream sends as DATA exactly once per session (a retransmission is a
# REPAIR, BLAKE3-tagged). Everything rarer keeps BLAKE3.
_GMAC_CONTEXT = "modelcast 2026-12 DATA AES-256-GMAC key"
_SESSION = struct.Struct("!Q")
_SESSION_SEQ = struct.Struct("!6xQQ")  # session and seq of a DATA datagram
_NONCE = struct.Struct("!4xQ")
# GMAC objects of sessions whose DATA verified (and the sender's own): a datagram with an
# unknown session costs a key derivation, but a flood of invented sessions cannot push the
# real one out, since only a verified datagram adds its session.
_gmacs: dict[tuple[bytes, int], Any] = {}
_GMAC_CACHE = 64


def gmac_key(key: bytes, session: int) -> bytes:
    """The AES-256-GMAC key of ``session``'s DATA under the session key ``key``."""
    return blake3.blake3(key + _SESSION.pack(session), derive_key_context=_GMAC_CONTEXT).digest()


def _gmac(key: bytes, session: int) -> Any:
    gmac = _gmacs.get((key, session))
    if gmac is None:
        gmac = _new_gmac(gmac_key(key, session))
    return gmac


def _new_gmac(key: bytes) -> Any:
    """AES-256-GMAC under ``key``, as an object with ``tag(seq, data)``: the C one (one
    reused OpenSSL context) where ``hostagent.native`` says the C extension is used, else
    cryptography's AESGCM -- imported only then: it cost every agent ~10 ms of CPU at
    start-up. ``tests/hostagent/test_wire.py`` holds the tags to cryptography's."""
    return native.module.Gmac(key) if native.NATIVE else _AesGmac(key)


class _AesGmac:
    """cryptography's AES-GCM as a GMAC with the C ``Gmac``'s interface."""

    __slots__ = ("_encrypt",)

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._encrypt = AESGCM(key).encrypt

    def tag(self, seq: int, data: bytes | memoryview) -> bytes:
        return self._encrypt(_NONCE.pack(seq), b"", data)


def _remember(key: bytes, session: int, gmac: Any, cache: dict[tuple[bytes, int], Any] = _gmacs) -> None:
    """Keep ``session``'s verifier in ``cache`` (a session whose DATA verified; at most
    ``_GMAC_CACHE`` of them): ``_gmacs``, or ``hostagent.fastrun``'s C contexts."""
    if (key, session) in cache:
        return
    if len(cache) >= _GMAC_CACHE:
        cache.clear()
    cache[(key, session)] = gmac


def _tag(key: bytes, data: bytes | memoryview) -> bytes:
    """The 16-byte tag of ``data`` (a datagram without its tag), by its type; compare tags
    only with ``hmac.compare_digest`` (constant time), or use ``_verify``."""
    if data[3] == T_DATA and len(data) >= DATA_HEADER_LEN:
        session, seq = _SESSION_SEQ.unpack_from(data)
        return _gmac(key, session).tag(seq, data)
    return blake3.blake3(data, key=key).digest(length=MAC_LEN)


def _data_tag(key: bytes, session: int, seq: int, data: bytes | memoryview) -> bytes:
    """``_tag`` of a DATA datagram whose session and seq the caller already unpacked."""
    gmac = _gmac(key, session)
    _remember(key, session, gmac)
    return gmac.tag(seq, data)


def _verify(key: bytes, data: bytes | memoryview, tag: bytes | memoryview) -> bool:
    """Whether ``tag`` is ``data``'s; a DATA datagram that verifies keeps its session's key."""
    if data[3] != T_DATA or len(data) < DATA_HEADER_LEN:
        return hmac.compare_digest(blake3.blake3(data, key=key).digest(length=MAC_LEN), tag)
    session, seq = _SESSION_SEQ.unpack_from(data)
    gmac = _gmac(key, session)
    if not hmac.compare_digest(gmac.tag(seq, data), tag):
        return False
    _remember(key, session, gmac)
    return True


def seal(key: bytes, data: bytes) -> bytes:
    """``data`` (a datagram with ``FLAG_MAC`` set and no tag yet) with its tag appended: for
    tests and tools that build datagrams by hand (the agents use the encoders)."""
    _check_key(key)
    return data + _tag(key, data)


def _check_key(key: bytes | None) -> None:
    if key is not None and len(key) != KEY_LEN:
        raise ValueError(f"MAC key must be {KEY_LEN} bytes (use derive_key)")


def _u(value: object, limit: int = U64_MAX) -> int:
    """Validate an unsigned integer decoded from msgpack."""
    if type(value) is not int or value < 0 or value > limit:
        raise BadField("integer field out of range")
    return value


def _finish(mtype: int, flags: int, session: int, body: bytes, key: bytes | None) -> bytes:
    _check_key(key)
    if key is not None:
        flags |= FLAG_MAC
    out = _HEADER.pack(MAGIC, VERSION, mtype, flags, session) + body
    if key is not None:
        out += _tag(key, out)
    if len(out) > MAX_DATAGRAM:
        raise ValueError("datagram would exceed MAX_DATAGRAM")
    return out


# --------------------------------------------------------------------------- encode


def encode_data(msg: Data, key: bytes | None = None) -> bytes:
    """Fast path: fixed header + payload (+ MAC)."""
    return data_datagram(msg.session, msg.seq, msg.chunk, msg.offset, msg.payload, msg.repair, msg.multicast, key)


def data_datagram(session: int, seq: int, chunk: int, offset: int, payload: bytes | memoryview,
                  repair: bool = False, multicast: bool = True, key: bytes | None = None) -> bytes:
    """``encode_data`` without the message object (the sender's per-datagram path): one
    struct pack for both headers and one MAC over the datagram as it will be sent."""
    plen = len(payload)
    if plen > MAX_PAYLOAD:
        raise ValueError("payload too large")
    mtype = T_REPAIR if repair else T_DATA
    flags = FLAG_MULTICAST if (repair and multicast) else 0
    if key is None:
        return _DATA_FULL.pack(MAGIC, VERSION, mtype, flags, session, seq, chunk, offset, plen) + payload
    _check_key(key)
    out = _DATA_FULL.pack(MAGIC, VERSION, mtype, flags | FLAG_MAC, session, seq, chunk, offset, plen) + payload
    if repair:
        return out + blake3.blake3(out, key=key).digest(length=MAC_LEN)
    return out + _data_tag(key, session, seq, out)


def encode_manifest(msg: Manifest, key: bytes | None = None) -> bytes:
    body = msgpack.packb(
        [
            msg.file_size,
            msg.chunk_size,
            msg.payload_size,
            msg.chunk_count,
            msg.file_digest,
            msg.page_index,
            msg.page_count,
            msg.first_chunk,
            msg.digests,
            msg.name,
            msg.receivers_hint,
        ] + ([list(msg.lane)] if msg.lane[1] > 1 else []) + ([msg.entries] if msg.entries else [])
        + ([{"size": msg.id_root[0], "root": msg.id_root[1]}] if msg.id_root[1] else []),
        use_bin_type=True,
    )
    return _finish(T_MANIFEST, 0, msg.session, body, key)


def _nack_values(ranges: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> list[int]:
    values: list[int] = []
    prev = 0
    for start, end in ranges:
        values.append(start - prev)
        values.append(end - start)
        prev = end
    return values


def encode_nack(msg: Nack, key: bytes | None = None) -> bytes:
    """Ranges are delta-encoded (gap, length, gap, length...) so small numbers dominate."""
    body = msgpack.packb([msg.receiver_id, msg.loss_permille, _nack_values(msg.ranges)])
    return _finish(T_NACK, 0, msg.session, body, key)


def nack_fit(ranges: list[tuple[int, int]], max_datagram: int, keyed: bool) -> int:
    """How many leading ranges fit in one NACK datagram of ``max_datagram`` bytes."""
    budget = max_datagram - HEADER_LEN - (MAC_LEN if keyed else 0)
    budget -= 9 + 9 + 3 + 5  # receiver id, loss, outer array header, inner array header
    used = 0
    prev = 0
    for n, (start, end) in enumerate(ranges):
        cost = len(msgpack.packb(start - prev)) + len(msgpack.packb(end - start))
        if used + cost > budget:
            return n
        used += cost
        prev = end
    return len(ranges)


def encode_parity(msg: Parity, key: bytes | None = None) -> bytes:
    if len(msg.payload) > MAX_PAYLOAD:
        raise ValueError("payload too large")
    flags = FLAG_MULTICAST if msg.multicast else 0
    body = _PARITY.pack(msg.chunk, msg.block, msg.k, msg.n, msg.index, len(msg.payload)) + msg.payload
    return _finish(T_PARITY, flags, msg.session, body, key)


def encode(msg: Message, key: bytes | None = None) -> bytes:
    """Encode any message; ``key`` (32 bytes) appends a MAC."""
    if isinstance(msg, Data):
        return encode_data(msg, key)
    if isinstance(msg, Manifest):
        return encode_manifest(msg, key)
    if isinstance(msg, Nack):
        return encode_nack(msg, key)
    if isinstance(msg, Parity):
        return encode_parity(msg, key)
    if isinstance(msg, Complete):
        return _finish(T_COMPLETE, 0, msg.session, _COMPLETE.pack(msg.receiver_id, msg.file_digest), key)
    if isinstance(msg, CompleteAck):
        return _finish(T_COMPLETE_ACK, 0, msg.session, _RID.pack(msg.receiver_id), key)
    if isinstance(msg, Hello):
        return _finish(T_HELLO, 0, msg.session, _RID.pack(msg.receiver_id), key)
    if isinstance(msg, End):
        flags = FLAG_CLOSING if msg.closing else 0
        return _finish(T_END, flags, msg.session, _END.pack(msg.total_seq, msg.receivers_hint), key)
    raise TypeError(f"not a wire message: {type(msg).__name__}")


# --------------------------------------------------------------------------- decode


def peek_type(data: bytes) -> int | None:
    """Datagram type without validation (for counters); None if not even a header."""
    if len(data) < HEADER_LEN or data[:2] != MAGIC:
        return None
    return data[3]


def data_session(data: bytes | bytearray | memoryview) -> int | None:
    """The session a DATA or REPAIR datagram claims, unauthenticated (None for other
    types or a short datagram): a receiver drops another session's data before paying for
    its tag -- a DATA tag under an unknown session costs a key derivation."""
    if len(data) < HEADER_LEN or (data[3] != T_DATA and data[3] != T_REPAIR):
        return None
    return _SESSION.unpack_from(data, 6)[0]


DataFields = tuple[int, int, int, int, memoryview, bool, bool]


def parse_data(data: bytes | bytearray | memoryview, key: bytes | None = None) -> DataFields | None:
    """The receiver's hot path: a well-formed DATA/REPAIR datagram as ``(session, seq,
    chunk, offset, payload, repair, multicast)`` with ``payload`` a view into ``data``
    (no copy, no message object); None for anything else, which ``decode`` then accepts
    or refuses with its reason. It accepts exactly what ``decode`` accepts as ``Data``
    (the tests hold the two to that), so the fast path cannot widen what gets in."""
    n = len(data)
    if n < DATA_HEADER_LEN or n > MAX_DATAGRAM:
        return None
    magic, version, mtype, flags, session, seq, chunk, offset, plen = _DATA_FULL.unpack_from(data)
    if (mtype != T_DATA and mtype != T_REPAIR) or magic != MAGIC or version != VERSION or flags & ~_KNOWN_FLAGS:
        return None
    end = n
    if flags & FLAG_MAC:
        end -= MAC_LEN
        if key is not None and (end < DATA_HEADER_LEN
                                or not _verify(key, memoryview(data)[:end], memoryview(data)[end:])):
            return None
    elif key is not None:
        return None
    if end - DATA_HEADER_LEN != plen or plen == 0 or offset + plen > MAX_CHUNK_SIZE:
        return None
    if mtype == T_DATA:
        if flags & FLAG_MULTICAST:
            return None
        return session, seq, chunk, offset, memoryview(data)[DATA_HEADER_LEN:end], False, True
    return session, seq, chunk, offset, memoryview(data)[DATA_HEADER_LEN:end], True, bool(flags & FLAG_MULTICAST)


DataRun = tuple[int, int, int, int, list[memoryview]]


def parse_data_run(data: bytes | bytearray | memoryview, seg: int, key: bytes | None = None,
                   prefix: bool = False) -> DataRun | None:
    """A GRO super-packet (datagrams of ``seg`` bytes back to back, the last may be
    shorter) that is one run of first transmissions -- every datagram a DATA that
    ``parse_data`` accepts, one session, consecutive seqs of one chunk, each payload
    starting where the one before ended -- as ``(session, first seq, chunk, first
    offset, payloads)`` with the payloads views into ``data``; None otherwise (the
    caller then takes the datagrams one by one). A clean stream arrives as such runs
    (a GSO batch ends at a chunk's short last fragment), so the receiver's per-datagram
    Python is one header unpack; the tests hold it to ``parse_data``'s verdicts. With
    ``prefix``, a run that breaks after its first datagram (a loss, a repair, a forgery
    among joined reads) is taken up to the break: the payloads say how far."""
    n = len(data)
    if seg <= DATA_HEADER_LEN or seg >= n or seg > MAX_DATAGRAM:
        return None
    view = memoryview(data)
    # parse_data's checks, inlined, for the one header shape a clean run has: DATA, flags
    # exactly FLAG_MAC with a key (each MAC checked) and exactly 0 without one (a MAC'd
    # datagram, which parse_data accepts unchecked, makes the run fall back instead).
    want, tail = (FLAG_MAC, MAC_LEN) if key is not None else (0, 0)
    unpack, least = _DATA_FULL.unpack_from, DATA_HEADER_LEN + tail
    _, _, _, _, session, first, chunk, start, _ = unpack(view, 0)
    seq, pos = first, start
    payloads = []
    if tail:
        gmac = _gmac(key, session)  # type: ignore[arg-type]
        tagged = gmac.tag
    for off in range(0, n, seg):
        end = off + seg if off + seg < n else n
        if end - off <= least:
            break
        magic, version, mtype, flags, s, q, c, o, plen = unpack(view, off)
        if (mtype != T_DATA or flags != want or magic != MAGIC or version != VERSION or s != session or q != seq
                or c != chunk or o != pos or plen != end - off - least or o + plen > MAX_CHUNK_SIZE):
            break
        if tail:
            end -= MAC_LEN
            if not hmac.compare_digest(tagged(q, view[off:end]), view[end : end + MAC_LEN]):
                break
        payloads.append(view[off + DATA_HEADER_LEN : end])
        seq += 1
        pos += plen
    else:
        off = n
    if off < n and not (prefix and payloads):
        return None
    if tail:
        _remember(key, session, gmac)  # type: ignore[arg-type]
    return session, first, chunk, start, payloads


def decode(data: bytes | bytearray | memoryview, key: bytes | None = None) -> Message:
    """Parse and validate one datagram.

    With ``key`` set, datagrams without a valid MAC are refused (``BadMac`` or
    ``Unauthenticated``). Without a key, a MAC that is present is stripped unchecked.
    Raises only ``WireError`` subclasses.
    """
    try:
        return _decode(bytes(data), key)
    except WireError:
        raise
    except Exception as exc:  # defensive: any library surprise is still a WireError
        raise WireError(f"undecodable datagram: {type(exc).__name__}") from None


def _decode(data: bytes, key: bytes | None) -> Message:
    if len(data) > MAX_DATAGRAM:
        raise Oversized(f"{len(data)} bytes")
    if len(data) < HEADER_LEN:
        raise Truncated(f"{len(data)} bytes is shorter than the header")
    magic, version, mtype, flags, session = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BadMagic("not a modelcast datagram")
    if version != VERSION:
        raise BadVersion(f"version {version}")
    if flags & ~_KNOWN_FLAGS:
        raise BadField(f"unknown flags {flags:#x}")
    if flags & FLAG_MAC:
        if len(data) < HEADER_LEN + MAC_LEN:
            raise Truncated("no room for MAC")
        tag = data[-MAC_LEN:]
        data = data[:-MAC_LEN]
        if key is not None and not _verify(key, data, tag):
            raise BadMac("MAC does not verify")
    elif key is not None:
        raise Unauthenticated("datagram carries no MAC")
    body = memoryview(data)[HEADER_LEN:]
    multicast = bool(flags & FLAG_MULTICAST)
    if mtype in (T_DATA, T_REPAIR):
        return _decode_data(session, mtype, multicast, body)
    if flags & FLAG_MULTICAST and mtype != T_PARITY:
        raise BadField("multicast flag on a non-repair datagram")
    if flags & FLAG_CLOSING and mtype != T_END:
        raise BadField("closing flag on a non-END datagram")
    if mtype == T_MANIFEST:
        return _decode_manifest(session, body)
    if mtype == T_NACK:
        return _decode_nack(session, body)
    if mtype == T_PARITY:
        return _decode_parity(session, multicast, body)
    if mtype == T_COMPLETE:
        _exact(body, _COMPLETE.size)
        rid, digest = _COMPLETE.unpack(body)
        return Complete(session, rid, digest)
    if mtype == T_COMPLETE_ACK:
        _exact(body, _RID.size)
        return CompleteAck(session, _RID.unpack(body)[0])
    if mtype == T_HELLO:
        _exact(body, _RID.size)
        return Hello(session, _RID.unpack(body)[0])
    if mtype == T_END:
        _exact(body, _END.size)
        total, hint = _END.unpack(body)
        return End(session, total, hint, bool(flags & FLAG_CLOSING))
    raise BadType(f"type {mtype}")


def _exact(body: memoryview, size: int) -> None:
    if len(body) < size:
        raise Truncated("body too short")
    if len(body) > size:
        raise BadLength("trailing bytes")


def _decode_data(session: int, mtype: int, multicast: bool, body: memoryview) -> Data:
    if len(body) < _DATA.size:
        raise Truncated("DATA header too short")
    seq, chunk, offset, plen = _DATA.unpack_from(body)
    if len(body) - _DATA.size != plen:
        raise BadLength("payload length mismatch")
    if plen == 0:
        raise BadLength("empty payload")
    if offset + plen > MAX_CHUNK_SIZE:
        raise BadField("fragment beyond maximum chunk size")
    if mtype == T_DATA and multicast:
        raise BadField("multicast flag on DATA")
    return Data(session, seq, chunk, offset, bytes(body[_DATA.size :]), mtype == T_REPAIR, multicast if mtype == T_REPAIR else True)


def _unpack_array(body: memoryview, length: int, optional: int = 0) -> list:
    """A msgpack array of ``length`` fields, plus up to ``optional`` trailing ones."""
    obj = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    if type(obj) is not list or not length <= len(obj) <= length + optional:
        raise BadField("unexpected msgpack shape")
    return obj


MAX_LANES = 64


def _decode_lane(value: object, file_size: int) -> tuple[int, int, int]:
    if type(value) is not list or len(value) != 3:
        raise BadField("lane")
    index, count, offset = _u(value[0], MAX_LANES), _u(value[1], MAX_LANES), _u(value[2], MAX_FILE_SIZE)
    if not index < count or count < 2 or offset + file_size > MAX_FILE_SIZE:
        raise BadField("lane")
    return index, count, offset


def _decode_id_root(value: dict, file_size: int, lane: tuple[int, int, int]) -> tuple[int, bytes]:
    """The content's (size, digests root): a lane's slice lies within it, anything else is it."""
    if set(value) != {"size", "root"} or type(value["root"]) is not bytes or len(value["root"]) != FILE_DIGEST_LEN:
        raise BadField("id root")
    size = _u(value["size"], MAX_FILE_SIZE)
    inside = size >= lane[2] + file_size if lane[1] > 1 else size == file_size
    if not inside:
        raise BadField("id root size")
    return size, value["root"]


def _decode_manifest(session: int, body: memoryview) -> Manifest:
    fields = _unpack_array(body, 11, optional=3)
    file_size = _u(fields[0], MAX_FILE_SIZE)
    chunk_size = _u(fields[1], MAX_CHUNK_SIZE)
    payload_size = _u(fields[2], MAX_PAYLOAD)
    chunk_count = _u(fields[3], 1 << 64)
    file_digest = fields[4]
    page_index = _u(fields[5], 1 << 32)
    page_count = _u(fields[6], 1 << 32)
    first_chunk = _u(fields[7], 1 << 32)
    digests = fields[8]
    name = fields[9]
    hint = _u(fields[10], (1 << 32) - 1)
    if chunk_size < MIN_CHUNK_SIZE or payload_size < MIN_PAYLOAD:
        raise BadField(f"chunk size below {MIN_CHUNK_SIZE} or payload size below {MIN_PAYLOAD}")
    if chunk_count > MAX_CHUNK_COUNT:
        raise BadField(f"{chunk_count} chunks: more than {MAX_CHUNK_COUNT}")
    if chunk_count != -(-file_size // chunk_size):
        raise BadField("chunk count does not match file size")
    if type(file_digest) is not bytes or len(file_digest) != FILE_DIGEST_LEN:
        raise BadField("file digest")
    if type(digests) is not bytes or len(digests) % CHUNK_DIGEST_LEN:
        raise BadField("chunk digests")
    if first_chunk + len(digests) // CHUNK_DIGEST_LEN > chunk_count:
        raise BadField("digest page beyond chunk count")
    if page_index >= page_count:
        raise BadField("page index")
    if type(name) is not str or len(name.encode()) > MAX_NAME_BYTES:
        raise BadField("name")
    lane, entries, root = (0, 1, 0), b"", None
    for extra in fields[11:]:  # optional trailing fields (lane, entries, id root), in order, told apart by type
        if type(extra) is list and lane[1] == 1 and not entries and root is None:
            lane = _decode_lane(extra, file_size)
        elif type(extra) is bytes and extra and not entries and root is None:
            entries = extra  # (its contents are checked by the receiver: hostagent.tree)
        elif type(extra) is dict and root is None:
            root = extra
        else:
            raise BadField("optional manifest field")
    return Manifest(
        session, file_size, chunk_size, payload_size, chunk_count, file_digest,
        page_index, page_count, first_chunk, digests, name, hint, lane, entries,
        _decode_id_root(root, file_size, lane) if root is not None else (0, b""),
    )


def _decode_nack(session: int, body: memoryview) -> Nack:
    fields = _unpack_array(body, 3)
    rid = _u(fields[0])
    loss = _u(fields[1], 1000)
    values = fields[2]
    if type(values) is not list or len(values) % 2:
        raise BadField("NACK ranges")
    ranges: list[tuple[int, int]] = []
    pos = 0
    for i in range(0, len(values), 2):
        gap = _u(values[i])
        length = _u(values[i + 1])
        if length == 0 or (gap == 0 and i > 0):
            raise BadField("NACK ranges not disjoint and non-empty")
        start = pos + gap
        end = start + length
        if end > U64_MAX:
            raise BadField("NACK range overflow")
        ranges.append((start, end))
        pos = end
    return Nack(session, rid, tuple(ranges), loss)


def _decode_parity(session: int, multicast: bool, body: memoryview) -> Parity:
    if len(body) < _PARITY.size:
        raise Truncated("PARITY header too short")
    chunk, block, k, n, index, plen = _PARITY.unpack_from(body)
    if len(body) - _PARITY.size != plen or plen == 0:
        raise BadLength("parity payload length")
    # index >= 1: share 0 is always a data fragment. (index >= the block's true data
    # count needs the file layout; the receiver checks that.)
    if not 1 <= k < n <= MAX_FEC_SHARES or not 1 <= index < n:
        raise BadField("FEC parameters")
    if block * k >= MAX_CHUNK_SIZE:
        raise BadField("FEC block beyond maximum chunk size")
    return Parity(session, chunk, block, k, n, index, bytes(body[_PARITY.size :]), multicast)
