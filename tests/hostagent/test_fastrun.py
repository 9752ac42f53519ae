"""hostagent.fastrun: the C receive path and its pure-Python twin give the same verdict on
every run and move the same bytes (the receiver tests in test_hostagent_receive_batch.py
run the whole receiver on both as well)."""

from __future__ import annotations

import logging
import os

import pytest
from hypothesis import given, settings, strategies as st

from hostagent import fastrun, wire
from hostagent.wire import Data, encode
from tests.support.mutate import data_run, mutate

KEY = wire.derive_key(b"fastrun test")
u64 = st.integers(0, wire.U64_MAX)
u32 = st.integers(0, (1 << 32) - 1)

pytestmark = pytest.mark.skipif(
    fastrun._native is None and os.environ.get("CI") != "true",
    reason=f"hostagent._fastrun is not built ({fastrun._why}): reinstall with gcc and libssl-dev")


def test_the_native_path_is_built_under_ci() -> None:
    """CI installs with a compiler and OpenSSL's headers: there the C path must exist."""
    assert fastrun._native is not None, fastrun._why


def _both(blob: bytes, seg: int, key: bytes | None, prefix: bool = False) -> tuple:
    """(C verdict, Python verdict, C-compacted bytes, Python-compacted bytes) -- with
    ``prefix``, of the run's verified beginning."""
    c = fastrun.verify_run_c(memoryview(blob), seg, key, prefix)
    py = fastrun.verify_run_py(memoryview(blob), seg, key, prefix)
    if c is None:
        return c, py, None, None
    took = min(len(blob), c[4] * seg)
    tail = wire.MAC_LEN if key is not None else 0
    a, b = bytearray(blob[:took]), bytearray(blob[:took])
    na = fastrun._native.compact_run(memoryview(a), seg, tail)
    nb = fastrun.compact_run_py(memoryview(b), seg, tail)
    return c, py, bytes(a[:na]), bytes(b[:nb])


@settings(max_examples=600, deadline=None)
@given(u64, u64, u32, st.integers(0, 1 << 20), st.integers(1, 1200), st.integers(2, 8), st.integers(1, 1200),
       st.sampled_from([None, KEY]), st.sampled_from([None, KEY]), st.data())
def test_c_and_python_agree_on_every_run(session, seq, chunk, offset, size, count, last_size,
                                         send_key, recv_key, data) -> None:
    """Intact, damaged, foreign, keyed and unkeyed runs: the same verdict, and for an
    accepted run the same payload bytes moved to the front -- the payloads in order."""
    seq, last_size = min(seq, wire.U64_MAX - count + 1), min(last_size, size)
    sizes = [size] * (count - 1) + [last_size]
    raws = data_run(session, seq, chunk, offset, sizes, send_key)
    victim = data.draw(st.integers(0, count - 1))
    intact = bytes(raws[victim])
    raws[victim] = mutate(raws[victim], data, ["intact", "intact", "flip", "truncate", "extend", "splice"])
    blob = b"".join(bytes(r) for r in raws)
    natural = len(raws[0])
    seg = data.draw(st.sampled_from([natural, natural - 1, natural + 1, 33, len(blob)]))
    c, py, moved_c, moved_py = _both(blob, seg, recv_key)
    assert c == py and moved_c == moved_py
    # Its verified beginning (the receiver's joined reads): the same on both, the whole run
    # where that was taken, and up to a damaged datagram that breaks it.
    pc, ppy, pmoved_c, pmoved_py = _both(blob, seg, recv_key, prefix=True)
    assert pc == ppy and pmoved_c == pmoved_py
    assert c is None or (pc, pmoved_c) == (c, moved_c)
    if (bytes(raws[victim]) != intact and victim > 0 and seg == natural == len(raws[victim])
            and send_key == recv_key is not None and offset + sum(sizes) <= wire.MAX_CHUNK_SIZE):
        assert pc is not None and pc[:4] == (session, seq, chunk, offset) and pc[4] == victim
        assert pmoved_c == b"".join(bytes([i % 251]) * n for i, n in enumerate(sizes[:victim]))
    if (bytes(raws[victim]) == intact and seg == len(encode(Data(0, 0, 0, 0, b"z" * size), send_key))
            and send_key == recv_key and offset + sum(sizes) <= wire.MAX_CHUNK_SIZE):
        assert c is not None and c[:4] == (session, seq, chunk, offset) and c[4:] == (count, sizes[0], sizes[-1])
        assert moved_c == b"".join(bytes([i % 251]) * n for i, n in enumerate(sizes))


def test_a_run_across_the_last_sequence_number_is_refused_by_both() -> None:
    """A u64 seq does not wrap: the datagram after 2^64 - 1 cannot follow it."""
    raws = [encode(Data(9, seq, 0, i * 100, b"x" * 100), KEY) for i, seq in enumerate((wire.U64_MAX, 0))]
    c, py, _, _ = _both(b"".join(raws), len(raws[0]), KEY)
    assert c is None and py is None


def test_native_tag_is_the_wire_tag() -> None:
    raw = encode(Data(77, 12345, 3, 900, b"abc" * 300), KEY)
    gmac = fastrun._native.Gmac(wire.gmac_key(KEY, 77))
    assert gmac.tag(12345, raw[: -wire.MAC_LEN]) == raw[-wire.MAC_LEN:]
    with pytest.raises(ValueError):
        fastrun._native.Gmac(b"short")
    bare = fastrun._native.Gmac.__new__(fastrun._native.Gmac)  # never given a key
    with pytest.raises(ValueError):
        bare.tag(1, raw)
    with pytest.raises(ValueError):
        fastrun._native.verify_run(raw + raw, len(raw), bare)


@settings(max_examples=400, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.integers(0, wire.U64_MAX),
       st.one_of(st.integers(0, 600), st.integers(600, 20_000)), st.randoms(use_true_random=False))
def test_the_native_gmac_is_cryptographys(key: bytes, seq: int, size: int, rnd) -> None:
    """The C ``Gmac`` (OpenSSL's EVP, one context reused across calls) gives
    cryptography's AES-GCM tag over the same data at every length (empty, partial
    blocks, jumbo datagrams), also for a second tag from the same context."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    data, gmac = rnd.randbytes(size), fastrun._native.Gmac(key)
    for n, piece in ((seq, data), ((seq + 1) & wire.U64_MAX, data[1:])):
        assert gmac.tag(n, piece) == AESGCM(key).encrypt(b"\0\0\0\0" + n.to_bytes(8, "big"), b"", piece)


def test_only_verified_sessions_keep_a_native_context() -> None:
    """As wire's GMAC cache: a forged run under an invented session costs a derivation
    but is not remembered, so a flood of them cannot push the real session out."""
    fastrun._natives.clear()
    good = [encode(Data(5, s, 0, s * 10, b"y" * 10), KEY) for s in range(3)]
    forged = [bytearray(r) for r in good]
    for r in forged:
        r[6:14] = (6).to_bytes(8, "big")  # another session, tags now wrong
    assert fastrun.verify_run_c(memoryview(b"".join(bytes(r) for r in forged)), len(good[0]), KEY) is None
    assert not fastrun._natives
    assert fastrun.verify_run_c(memoryview(b"".join(good)), len(good[0]), KEY) is not None
    assert list(fastrun._natives) == [(KEY, 5)]


def test_pure_python_says_so_once(monkeypatch, caplog) -> None:
    monkeypatch.setattr(fastrun, "NATIVE", False)
    monkeypatch.setattr(fastrun, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="modelcast.agent"):
        fastrun.warn_if_pure()
        fastrun.warn_if_pure()
    assert len([r for r in caplog.records if "pure-Python receive path" in r.getMessage()]) == 1
