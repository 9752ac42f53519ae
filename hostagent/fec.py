"""Block erasure coding (zfec Reed-Solomon) over the datagrams of a chunk.

Why: with independent loss every receiver misses *different* datagrams, so per-datagram
repairs cost roughly (receivers x loss) of the file. One parity datagram over a block of
k data datagrams repairs a *different* single loss at *every* receiver at once, so the
repair cost of a block is the largest number of losses any one receiver has in it.

Geometry: block b of chunk c covers that chunk's fragments ``[b*k, min((b+1)*k, F_c))``
(blocks never straddle chunks, so a chunk's digest still covers everything a decode
wrote). Every data symbol of a block is zero-padded to the block's *symbol size*, the
length of its first fragment (only a chunk's last fragment can be shorter). Parity share
``j`` (``k_eff <= j < 256``) of zfec's systematic code does not depend on the code length
n, so the sender can hand out fresh share indices round after round and a receiver can
combine shares from different rounds.

Pure functions plus small caches; no I/O, no clock.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Iterable, Sequence

from .common import Layout

if TYPE_CHECKING:
    import zfec  # imported on first use below: most transfers never code a block, and
    # zfec's package import (its command-line tools too) is a tenth of the agent's start-up

MAX_SHARES = 256  # zfec's GF(2^8) limit: data + parity shares of one block
MAX_K = 128  # largest block we allow (leaves >= 128 parity indices per block)


@lru_cache(maxsize=MAX_SHARES)
def _encoder(k: int) -> zfec.Encoder:
    import zfec

    return zfec.Encoder(k, MAX_SHARES)


@lru_cache(maxsize=MAX_SHARES)
def _decoder(k: int) -> zfec.Decoder:
    import zfec

    return zfec.Decoder(k, MAX_SHARES)


def block_bounds(layout: Layout, chunk: int, block: int, k: int) -> tuple[int, int]:
    """Sequence range ``[first, end)`` of a block (empty when the block does not exist)."""
    if chunk >= layout.chunk_count:
        return 0, 0
    start, stop = layout.chunk_seqs(chunk)
    first = start + block * k
    return first, max(first, min(first + k, stop))


def block_of(layout: Layout, seq: int, k: int) -> tuple[int, int, int, int]:
    """(chunk, block index, first seq, end seq) of the block holding ``seq``."""
    chunk, frag = divmod(seq, layout.frags_per_chunk)
    block = frag // k
    first, end = block_bounds(layout, chunk, block, k)
    return chunk, block, first, end


def symbol_size(layout: Layout, first_seq: int) -> int:
    """Every share of a block is as long as its first (longest) fragment."""
    return layout.locate(first_seq)[2]


def pad(data: bytes, size: int) -> bytes:
    return data if len(data) == size else data + bytes(size - len(data))


def encode(symbols: Sequence[bytes], indices: Iterable[int]) -> list[bytes]:
    """Parity shares ``indices`` (each >= len(symbols)) of equal-length data symbols."""
    k = len(symbols)
    wanted = tuple(indices)
    if not wanted:
        return []
    if any(not k <= i < MAX_SHARES for i in wanted):
        raise ValueError("parity index out of range")
    return [bytes(b) for b in _encoder(k).encode(tuple(symbols), wanted)]


def decode(k: int, shares: dict[int, bytes]) -> list[bytes]:
    """All k data symbols from exactly k distinct shares (data indices < k, parity >= k).

    Raises ValueError on a malformed share set (wrong count, unequal lengths)."""
    if len(shares) != k:
        raise ValueError("need exactly k shares")
    lengths = {len(b) for b in shares.values()}
    if len(lengths) != 1 or any(not 0 <= i < MAX_SHARES for i in shares):
        raise ValueError("shares of unequal length or bad index")
    nums = sorted(shares)
    import zfec

    try:
        out = _decoder(k).decode([shares[i] for i in nums], nums)
    except zfec.Error as exc:  # pragma: no cover - guarded above
        raise ValueError(str(exc)) from None
    return [bytes(b) for b in out]


def plan_shares(needs: Iterable[int], max_shares: int) -> tuple[int, int]:
    """Choose how many parity shares ``m`` to multicast for one block.

    ``needs`` is, per receiver, how many more shares it lacks. A receiver needing r > m
    also gets r - m of its own missing datagrams (any of them: with the m parity shares
    it then holds k), so the sender's cost is ``m + sum(max(0, r - m))``. Returns
    ``(m, cost)`` minimising that over ``1 <= m <= max_shares`` (ties: fewer shares);
    ``(0, sum(needs))`` when no share can be sent. The caller compares the cost with
    plain repair."""
    rs = sorted((r for r in needs if r > 0), reverse=True)
    total = sum(rs)
    if not rs or max_shares < 1:
        return 0, total
    best_m, best_cost = 0, total + 1
    for m in range(1, min(rs[0], max_shares) + 1):
        cost = m + sum(r - m for r in rs if r > m)
        if cost < best_cost:
            best_m, best_cost = m, cost
    return best_m, best_cost
