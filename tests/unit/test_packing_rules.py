"""The pure rules of packing (``jobs.core.packing``): how large a run may be, who may join,
and how a run that failed as a whole is split until the item that breaks it runs alone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core.packing import Packing, charged, may_join, run_size, split_cap

sizes = st.integers(min_value=1, max_value=10_000)


@given(sizes)
def test_splitting_again_and_again_reaches_one_item_and_only_then_charges(n: int) -> None:
    steps = 0
    while not charged(n):
        smaller = split_cap(n)
        assert 1 <= smaller < n  # every split makes progress
        n, steps = smaller, steps + 1
    assert n == 1
    assert steps <= n.bit_length() + 14  # halves: about log2 of the run


@given(sizes, st.none() | sizes)
def test_a_run_is_never_larger_than_the_kind_or_its_leads_bound(max_items: int,
                                                                run_cap: int | None) -> None:
    size = run_size(max_items, run_cap)
    assert 1 <= size <= max_items
    if run_cap is not None:
        assert size <= run_cap
    assert may_join(None, size)
    if run_cap is not None:
        assert may_join(run_cap, size) == (run_cap >= size)


def test_a_kind_packs_from_two_items_and_a_budget_prices_items() -> None:
    with pytest.raises(ValueError):
        Packing(max_items=1)
    with pytest.raises(ValueError):
        Packing(max_items=4, max_cost=0)
    chars = Packing(max_items=4, max_cost=100, cost=lambda p: len(p["text"]))
    assert chars.cost_of({"text": "abc"}) == 3
    assert Packing(max_items=4, cost=lambda p: 99).cost_of({}) == 0  # no budget, no price
    assert Packing(max_items=4, max_cost=9, cost=lambda p: -5).cost_of({}) == 0
