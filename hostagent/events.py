"""What the sender and receiver state machines report through ``next_event()``.

Plain frozen dataclasses, so the socket loop, the library API (``hostagent.api``) and
the in-memory simulator can all hand them on unchanged; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .common import Addr


# ----------------------------------------------------------------------------- sender


@dataclass(frozen=True)
class ReceiverJoined:
    receiver_id: int
    addr: Addr


@dataclass(frozen=True)
class ReceiverCompleted:
    receiver_id: int
    addr: Addr


@dataclass(frozen=True)
class ReceiverFailed:
    receiver_id: int
    reason: str


@dataclass(frozen=True)
class StreamFinished:
    """First pass over the file is out; from now on only repairs."""

    total_seq: int


@dataclass(frozen=True)
class TransferFinished:
    """The sender's last event: every expected receiver verified (``ok``), or it gave up."""

    ok: bool
    completed: tuple[int, ...]
    failed: tuple[int, ...]
    missing: int  # expected receivers never heard from


# ----------------------------------------------------------------------------- receiver


@dataclass(frozen=True)
class ManifestReceived:
    session: int
    name: str
    file_size: int
    chunk_count: int
    resumed_chunks: int


@dataclass(frozen=True)
class ChunkCorrupt:
    chunk: int


@dataclass(frozen=True)
class FileComplete:
    """The whole file is written and its digest matched the manifest's."""

    file_digest: bytes


@dataclass(frozen=True)
class Failed:
    """The receiver gave up (e.g. the sender went silent); ``reason`` is one line."""

    reason: str


SenderEvent = Union[ReceiverJoined, ReceiverCompleted, ReceiverFailed, StreamFinished, TransferFinished]
ReceiverEvent = Union[ManifestReceived, ChunkCorrupt, FileComplete, Failed]
