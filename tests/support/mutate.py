"""Runs of DATA datagrams and damage to encoded datagrams, drawn by hypothesis: shared by
the wire-format and the receive-path tests."""

from __future__ import annotations

from hypothesis import strategies as st

from hostagent.wire import Data, encode


def data_run(session: int, seq: int, chunk: int, offset: int, sizes: list[int],
             key: bytes | None) -> list[bytearray]:
    """Consecutive DATA datagrams of ``chunk`` (payload i is ``sizes[i]`` bytes of i % 251),
    each payload starting where the one before ended, as a sender streams them."""
    raws, pos = [], offset
    for i, n in enumerate(sizes):
        raws.append(bytearray(encode(Data(session, seq + i, chunk, pos, bytes([i % 251]) * n), key)))
        pos += n
    return raws


def near(limit: int, below: int = 3, above: int = 0) -> st.SearchStrategy[int]:
    """Integers from ``below`` under ``limit`` to ``above`` over it (never negative): where
    a check off by one lets a value through or keeps one out."""
    return st.integers(max(0, limit - below), limit + above)


def mutate(raw: bytearray, data: st.DataObject, kinds: list[str]) -> bytearray:
    """Damage an encoded datagram in one of the ways ``kinds`` names ("intact": not at all)."""
    kind = data.draw(st.sampled_from(kinds))
    if kind == "flip" and raw:
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    elif kind == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=50))
    elif kind == "splice":
        i = data.draw(st.integers(0, len(raw)))
        raw[i:i] = data.draw(st.binary(min_size=1, max_size=20))
    return raw
