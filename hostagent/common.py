"""Pieces shared by the sender and receiver state machines: file layout arithmetic,
storage interfaces and counters (their events are in ``events``). Nothing here does I/O
or reads a clock."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Hashable, Protocol, Union

from .wire import MIN_CHUNK_SIZE  # noqa: F401 -- the sender's minimum is what receivers accept

# A receiver's resume record is saved at most this long (seconds) after progress:
# ReceiverConfig.state_save_interval and recv --resume-interval's default.
RESUME_INTERVAL = 0.25

Addr = Hashable  # whatever the transport uses for a peer (a (host, port) tuple in net.py)
GROUP = "group"  # destination meaning "the multicast group"
Dest = Union[str, Addr]

MAX_CHUNK_SIZE = 1024 * 1024


class ChunkSource(Protocol):
    """Random-access read of the file being sent, so the file is never held in memory."""

    @property
    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes: ...


class ChunkSink(Protocol):
    """Random-access write of the file being received, plus a slot for the resume record."""

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """``data`` may be a view into a reused receive buffer: write it now, keep no reference."""

    def read(self, offset: int, length: int) -> bytes: ...

    def save_state(self, state: bytes) -> None: ...


def write_parts(sink: ChunkSink, offset: int, parts: list[memoryview]) -> None:
    """Write consecutive pieces at ``offset``: one vectored write where the sink offers
    ``write_many(offset, parts)`` (a file: one ``pwritev``), else one write per piece."""
    write_many = getattr(sink, "write_many", None)
    if write_many is not None:
        write_many(offset, parts)
        return
    for part in parts:
        sink.write(offset, part)
        offset += len(part)


def read_view(sink: ChunkSink, offset: int, length: int) -> bytes | memoryview:
    """``length`` bytes at ``offset`` to hash and drop: a view into the sink's reused
    buffer where it offers ``read_view`` (valid until its next read; a file: one
    ``preadv``, no fresh 1 MB object per chunk), else ``read``."""
    view = getattr(sink, "read_view", None)
    return sink.read(offset, length) if view is None else view(offset, length)


class MemorySource:
    """In-memory ChunkSource for tests and small payloads."""

    def __init__(self, data: bytes) -> None:
        self._data = bytes(data)

    @property
    def size(self) -> int:
        return len(self._data)

    def read(self, offset: int, length: int) -> bytes:
        return self._data[offset : offset + length]


class MemorySink:
    """In-memory ChunkSink; keeps the last saved resume record like a state file would."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.state: bytes | None = None
        self.writes = 0

    def write(self, offset: int, data: bytes | memoryview) -> None:
        end = offset + len(data)
        if len(self.data) < end:
            self.data.extend(b"\0" * (end - len(self.data)))
        self.data[offset:end] = data
        self.writes += 1

    def write_many(self, offset: int, parts: list[memoryview]) -> None:
        """Consecutive pieces as one write (what FileSink does with one pwritev)."""
        self.write(offset, b"".join(parts))

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self.data[offset : offset + length])

    def save_state(self, state: bytes) -> None:
        self.state = state


@dataclass(frozen=True)
class Layout:
    """How a file maps to chunks and sequence numbers.

    Chunk c owns sequence numbers ``[c*F, c*F + frags(c))`` where F is the fragment count
    of a full chunk; only the last chunk may have fewer, so seqs stay contiguous."""

    file_size: int
    chunk_size: int
    payload_size: int

    # Cached: these sit on every datagram's path (frozen, so they never go stale).
    @cached_property
    def chunk_count(self) -> int:
        return -(-self.file_size // self.chunk_size)

    @cached_property
    def frags_per_chunk(self) -> int:
        return -(-self.chunk_size // self.payload_size)

    @cached_property
    def total_seq(self) -> int:
        count = self.chunk_count
        if count == 0:
            return 0
        return (count - 1) * self.frags_per_chunk + self.chunk_frags(count - 1)

    def chunk_len(self, chunk: int) -> int:
        return min(self.chunk_size, self.file_size - chunk * self.chunk_size)

    def chunk_frags(self, chunk: int) -> int:
        return -(-self.chunk_len(chunk) // self.payload_size)

    def chunk_seqs(self, chunk: int) -> tuple[int, int]:
        start = chunk * self.frags_per_chunk
        return start, start + self.chunk_frags(chunk)

    def locate(self, seq: int) -> tuple[int, int, int]:
        """(chunk, offset in chunk, length) of a sequence number."""
        chunk, frag = divmod(seq, self.frags_per_chunk)
        offset = frag * self.payload_size
        return chunk, offset, min(self.payload_size, self.chunk_len(chunk) - offset)

    def chunks_of_seqs(self, start: int, end: int) -> range:
        return range(start // self.frags_per_chunk, (end - 1) // self.frags_per_chunk + 1)


@dataclass
class Stats:
    """Counters both ends keep; tests and the CLI read them, nothing decides on them."""

    datagrams_in: int = 0
    bytes_in: int = 0
    datagrams_out: int = 0
    bytes_out: int = 0
    data_sent: int = 0
    data_bytes_sent: int = 0
    data_received: int = 0
    manifests_sent: int = 0
    nacks_sent: int = 0
    nacks_received: int = 0
    nack_seqs_requested: int = 0
    nacks_suppressed: int = 0
    repairs_unicast: int = 0
    repairs_multicast: int = 0
    repair_bytes_unicast: int = 0
    repair_bytes_multicast: int = 0
    repairs_parity: int = 0  # on-demand parity shares sent (sender) ...
    repair_bytes_parity: int = 0
    parity_proactive: int = 0  # ... and shares sent with the stream (fec_overhead)
    parity_bytes_proactive: int = 0
    repairs_received: int = 0
    parity_received: int = 0  # receiver: parity shares accepted (well-formed, for us)
    parity_unneeded: int = 0  # ... of which arrived for a block already whole
    fec_decodes: int = 0  # blocks rebuilt from parity
    fec_recovered: int = 0  # data datagrams those decodes filled in
    duplicates: int = 0
    corrupt_chunks: int = 0
    rate_decreases: int = 0
    early_held: int = 0  # receiver: DATA held because it came before the first manifest page ...
    early_dropped: int = 0  # ... of which dropped when taken (another session's, forged, stale)
    drops: Counter = field(default_factory=Counter)

    @property
    def repair_bytes(self) -> int:
        """Everything sent in answer to NACKs (proactive parity is not counted)."""
        return self.repair_bytes_unicast + self.repair_bytes_multicast + self.repair_bytes_parity

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())
