"""Damage to encoded datagrams, drawn by hypothesis: shared by the wire-format and the
receive-path tests."""

from __future__ import annotations

from hypothesis import strategies as st


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
