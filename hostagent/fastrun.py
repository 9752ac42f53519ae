"""The receiver's clean-stream path: check a GRO super-packet (or a coalesced run) of
first-transmission DATA as one run, then move its payloads together at the front of the
buffer, so the receiver writes and hashes one contiguous piece.

Two implementations of the same two functions: ``hostagent._fastrun`` (C, built by pip
with the system compiler against OpenSSL's libcrypto; one reused AES-GCM context per
session) and the pure Python below (``wire.parse_data_run`` itself). The tests run the
receiver and generated runs against both and hold them to the same verdicts and bytes;
the C one is used when it was built, otherwise the Python one, with a warning (the
transfer is the same, the receiver's CPU per GB higher). ``MODELCAST_PURE_PYTHON=1``
selects the Python one (``hostagent.native``).
"""

from __future__ import annotations

from typing import Any, Optional

import hostagent.native as native
import hostagent.wire as wire

# (session, first seq, chunk, offset of the first payload, datagrams, first payload's
# length, last payload's length)
RunHead = tuple[int, int, int, int, int, int, int]


def verify_run_py(data: memoryview, seg: int, key: Optional[bytes], prefix: bool = False) -> Optional[RunHead]:
    """``wire.parse_data_run``'s verdict on ``data``, as a ``RunHead`` (with ``prefix``:
    on its verified beginning, the datagram count saying how far it goes)."""
    run = wire.parse_data_run(data, seg, key, prefix)
    if run is None:
        return None
    session, first, chunk, start, payloads = run
    return session, first, chunk, start, len(payloads), len(payloads[0]), len(payloads[-1])


def compact_run_py(data: memoryview, seg: int, tail: int) -> int:
    """Each ``seg``-byte datagram's payload (header and ``tail`` bytes of tag dropped)
    moved to follow the one before at the front of ``data``; returns their length."""
    n, out = len(data), 0
    for off in range(0, n, seg):
        end = min(off + seg, n) - tail
        size = end - off - wire.DATA_HEADER_LEN
        data[out : out + size] = data[off + wire.DATA_HEADER_LEN : end]
        out += size
    return out


_native, _why = native.module, native.why

_natives: dict[tuple[bytes, int], Any] = {}  # sessions whose runs verified, as wire._gmacs


def verify_run_c(data: memoryview, seg: int, key: Optional[bytes], prefix: bool = False) -> Optional[RunHead]:
    """``verify_run_py`` in C."""
    assert _native is not None
    if key is None:
        return _native.verify_run(data, seg, None, prefix)
    session = wire.data_session(data)
    if session is None:
        return None
    gmac = _natives.get((key, session)) or _native.Gmac(wire.gmac_key(key, session))
    head = _native.verify_run(data, seg, gmac, prefix)
    if head is not None:  # only a verified run keeps its session's context
        wire._remember(key, session, gmac, _natives)
    return head


NATIVE = native.NATIVE
verify_run = verify_run_c if NATIVE else verify_run_py
compact_run = _native.compact_run if NATIVE else compact_run_py


def warn_if_pure() -> None:
    """Say once per process that the receive path runs in Python, and why."""
    global _warned
    if not NATIVE and not _warned:
        _warned = True
        import logging  # (here: a receiver with the C path never loads it)

        reason = "MODELCAST_PURE_PYTHON is set" if _native is not None else f"hostagent._fastrun is not built ({_why})"
        logging.getLogger("modelcast.agent").warning(
            "receiver: the pure-Python receive path is in use (%s): the same transfer, ~0.3 s more CPU per GB; "
            "reinstall with a C compiler and OpenSSL headers (libssl-dev) to build it", reason)


_warned = False
