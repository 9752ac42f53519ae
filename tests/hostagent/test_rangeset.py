"""RangeSet must behave exactly like a plain set of ints while storing only runs."""

from hypothesis import given, settings, strategies as st

from hostagent.rangeset import RangeSet

ops = st.lists(
    st.tuples(st.sampled_from(["add", "discard"]), st.integers(0, 200), st.integers(0, 40)),
    max_size=60,
)


def model_gaps(model: set[int], lo: int, hi: int) -> list[tuple[int, int]]:
    gaps: list[tuple[int, int]] = []
    i = lo
    while i < hi:
        if i in model:
            i += 1
            continue
        j = i
        while j < hi and j not in model:
            j += 1
        gaps.append((i, j))
        i = j
    return gaps


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, 250), st.integers(0, 250))
def test_matches_set_model(operations, lo, hi) -> None:
    rs = RangeSet()
    model: set[int] = set()
    for op, start, length in operations:
        items = set(range(start, start + length))
        if op == "add":
            assert rs.add(start, start + length) == len(items - model)
            model |= items
        else:
            assert rs.discard(start, start + length) == len(items & model)
            model -= items
    assert rs.count == len(model)
    for i in range(0, 260):
        assert (i in rs) == (i in model)
    assert rs.missing(lo, hi) == model_gaps(model, lo, hi)
    covered = [i for s, e in rs.covered(lo, hi) for i in range(s, e)]
    assert covered == sorted(i for i in model if lo <= i < hi)
    assert rs.count_in(lo, hi) == len([i for i in model if lo <= i < hi])
    assert rs.contains_range(lo, hi) == all(i in model for i in range(lo, hi))
    # Runs are canonical: sorted, disjoint, non-adjacent, non-empty.
    runs = rs.ranges()
    for (s1, e1), (s2, e2) in zip(runs, runs[1:]):
        assert s1 < e1 < s2 < e2
    assert RangeSet.from_list(rs.to_list()) == rs


def test_memory_stays_small_for_a_million_chunks() -> None:
    rs = RangeSet()
    for chunk in range(1_000_000):
        if chunk % 100_000 != 7:  # ten holes
            rs.add(chunk)
    assert rs.count == 1_000_000 - 10
    assert len(rs) == 11  # runs, not items
    assert len(rs.missing(0, 1_000_000)) == 10


def test_missing_limit_and_single_items() -> None:
    rs = RangeSet([(0, 2), (4, 6), (8, 10)])
    assert rs.missing(0, 12, limit=2) == [(2, 4), (6, 8)]
    assert rs.add(3) == 1 and rs.add(3) == 0
    assert rs.ranges() == [(0, 2), (3, 6), (8, 10)]
