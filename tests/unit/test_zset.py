"""The twin's sorted set against a plain model, small and past the point where it grows."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.index import zset
from jobs.index.zset import ZSet

pytestmark = pytest.mark.unit

members = st.sampled_from([f"m{i}" for i in range(40)] + ["", "é", "\U0010ffff"])
scores = st.sampled_from([0.0, 1.0, 1.5, -2.0, 1e9])
ops = st.lists(st.tuples(st.sampled_from(["add", "add", "remove"]), members, scores),
               max_size=200)


# A tiny SMALL makes every set cross over to a SortedList at once.
@pytest.mark.parametrize("small", [2, zset.SMALL])
@settings(max_examples=100, deadline=None)
@given(steps=ops, probe=st.tuples(scores, members), limit=st.integers(0, 50))
def test_zset_orders_like_redis(small: int, steps: list[tuple[str, str, float]],
                                probe: tuple[float, str], limit: int) -> None:
    saved, zset.SMALL = zset.SMALL, small
    try:
        _check(steps, probe, limit)
    finally:
        zset.SMALL = saved


def _check(steps: list[tuple[str, str, float]], probe: tuple[float, str], limit: int) -> None:
    model: dict[str, float] = {}
    z = ZSet()
    for op, member, score in steps:
        if op == "add":
            z.add(member, score)
            model[member] = score
        else:
            assert z.remove(member) == (model.pop(member, None) is not None)
    ordered = sorted((score, member) for member, score in model.items())
    assert len(z) == len(model)
    assert z.items() == [(m, s) for s, m in ordered]
    assert z.first() == (None if not ordered else (ordered[0][1], ordered[0][0]))
    for member, score in model.items():
        assert z.score(member) == score
        assert z.rank(member) == ordered.index((score, member))
    assert z.rank_at(*probe) == bisect.bisect_left(ordered, probe)
    assert z.upto(probe[0], limit) == [(m, s) for s, m in ordered if s <= probe[0]][:limit]
