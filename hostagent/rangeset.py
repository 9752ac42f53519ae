"""Sparse sorted set of half-open integer ranges.

A receiver of a 1 TB file tracks ~10^6 chunks and ~10^9 fragments; a per-item array
would be large while the set of held items is almost always a handful of runs. Storing
runs keeps memory proportional to the number of gaps, not to the file size.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Iterable, Iterator


class RangeSet:
    """Disjoint, non-adjacent, sorted ``[start, end)`` runs with an O(1) item count."""

    __slots__ = ("_starts", "_ends", "_count")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._count = 0
        for start, end in ranges:
            self.add(start, end)

    # -- mutation -------------------------------------------------------------------

    def add(self, start: int, end: int | None = None) -> int:
        """Add ``[start, end)`` (or the single item ``start``); return how many items
        were new, so callers can tell duplicates from progress without a second lookup."""
        if end is None:
            end = start + 1
        if end <= start:
            return 0
        starts, ends = self._starts, self._ends
        if ends and start >= ends[-1]:  # an in-order stream: at or past the last run's end
            if start == ends[-1]:
                ends[-1] = end
            else:
                starts.append(start)
                ends.append(end)
            self._count += end - start
            return end - start
        # Runs that overlap or touch [start, end): first with end >= start, last with
        # start <= end.
        i = bisect_left(ends, start)
        j = bisect_right(starts, end)
        if i == j:
            starts.insert(i, start)
            ends.insert(i, end)
            self._count += end - start
            return end - start
        new_start = min(start, starts[i])
        new_end = max(end, ends[j - 1])
        removed = sum(ends[k] - starts[k] for k in range(i, j))
        starts[i:j] = [new_start]
        ends[i:j] = [new_end]
        added = (new_end - new_start) - removed
        self._count += added
        return added

    def discard(self, start: int, end: int | None = None) -> int:
        """Remove ``[start, end)``; return how many items were actually removed."""
        if end is None:
            end = start + 1
        if end <= start:
            return 0
        starts, ends = self._starts, self._ends
        i = bisect_right(ends, start)  # first run ending after start
        j = bisect_left(starts, end)  # runs starting before end
        if i >= j:
            return 0
        new_starts: list[int] = []
        new_ends: list[int] = []
        removed = 0
        for k in range(i, j):
            s, e = starts[k], ends[k]
            removed += min(e, end) - max(s, start)
            if s < start:
                new_starts.append(s)
                new_ends.append(start)
            if e > end:
                new_starts.append(end)
                new_ends.append(e)
        starts[i:j] = new_starts
        ends[i:j] = new_ends
        self._count -= removed
        return removed

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()
        self._count = 0

    # -- queries --------------------------------------------------------------------

    def __contains__(self, item: int) -> bool:
        i = bisect_right(self._starts, item) - 1
        return i >= 0 and item < self._ends[i]

    def contains_range(self, start: int, end: int) -> bool:
        """True when every item of ``[start, end)`` is present (empty range: True)."""
        if end <= start:
            return True
        i = bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def count_in(self, start: int, end: int) -> int:
        """Number of present items within ``[start, end)``."""
        if end <= start:
            return 0
        starts, ends = self._starts, self._ends
        if not ends or start >= ends[-1]:  # beyond everything held: fresh data, in order
            return 0
        i = bisect_right(ends, start)
        j = bisect_left(starts, end)
        return sum(min(ends[k], end) - max(starts[k], start) for k in range(i, j))

    @property
    def count(self) -> int:
        """Number of items (not runs) in the set."""
        return self._count

    def __len__(self) -> int:
        """Number of runs (memory cost), not items; see ``count``."""
        return len(self._starts)

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._ends))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RangeSet):
            return NotImplemented
        return self._starts == other._starts and self._ends == other._ends

    def __repr__(self) -> str:
        return f"RangeSet({list(self)!r})"

    def ranges(self) -> list[tuple[int, int]]:
        return list(self)

    def missing(self, start: int, end: int, limit: int | None = None) -> list[tuple[int, int]]:
        """Gaps within ``[start, end)``, in order, at most ``limit`` of them."""
        gaps: list[tuple[int, int]] = []
        if end <= start:
            return gaps
        starts, ends = self._starts, self._ends
        pos = start
        k = bisect_right(ends, start)
        while pos < end and (limit is None or len(gaps) < limit):
            if k >= len(starts) or starts[k] >= end:
                gaps.append((pos, end))
                break
            if starts[k] > pos:
                gaps.append((pos, starts[k]))
            pos = max(pos, ends[k])
            k += 1
        return gaps

    def covered(self, start: int, end: int) -> list[tuple[int, int]]:
        """Parts of ``[start, end)`` present in the set, in order (the complement of
        ``missing`` within the window)."""
        parts: list[tuple[int, int]] = []
        pos = start
        for s, e in self.missing(start, end) + [(end, end)]:
            if s > pos:
                parts.append((pos, s))
            pos = e
        return parts

    def missing_count(self, start: int, end: int) -> int:
        return max(0, end - start) - self.count_in(start, end)

    def copy(self) -> "RangeSet":
        other = RangeSet()
        other._starts = list(self._starts)
        other._ends = list(self._ends)
        other._count = self._count
        return other

    def to_list(self) -> list[int]:
        """Flat ``[s0, e0, s1, e1, ...]`` for persistence (msgpack/json friendly)."""
        flat: list[int] = []
        for s, e in self:
            flat.extend((s, e))
        return flat

    @classmethod
    def from_list(cls, flat: list[int]) -> "RangeSet":
        if len(flat) % 2:
            raise ValueError("odd-length range list")
        return cls((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))
