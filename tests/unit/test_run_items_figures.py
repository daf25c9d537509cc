"""The dashboard's packing figures from the stored counts: a kind's cumulative histogram of
items per run becomes runs per size bucket and a mean, each pool its items a second."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core.histograms import bucket_of, cumulative
from jobs.dashboard import figures
from jobs.index.counters import RUN_ITEMS_BUCKETS, RecentItems, Runs

pytestmark = pytest.mark.unit


def stored(sizes: list[int]) -> dict[str, float]:
    """What record_run leaves in a kind's hash for runs of these sizes."""
    raw: dict[str, float] = {"sum": float(sum(sizes))}
    for size in sizes:
        label = bucket_of(size, RUN_ITEMS_BUCKETS)
        raw[label] = raw.get(label, 0.0) + 1
    return raw


def test_a_kinds_runs_by_size_and_its_mean() -> None:
    hist = cumulative(stored([1, 1, 2, 3, 64, 300]), RUN_ITEMS_BUCKETS)
    runs = figures.kind_runs("eval.similarity", "gpu", hist)
    assert (runs.runs, runs.items, runs.mean_items) == (6, 371, 371 / 6)
    assert runs.sizes == [(1.0, 2), (2.0, 1), (4.0, 1), (8.0, 0), (16.0, 0), (32.0, 0),
                          (64.0, 1), (128.0, 0), (256.0, 0), (float("inf"), 1)]
    none = figures.kind_runs("echo", "default", cumulative({}, RUN_ITEMS_BUCKETS))
    assert none.runs == 0 and none.mean_items is None


@given(st.lists(st.integers(min_value=1, max_value=1000), max_size=40))
def test_every_run_is_in_exactly_the_bucket_of_its_size(sizes: list[int]) -> None:
    runs = figures.kind_runs("k", "default", cumulative(stored(sizes), RUN_ITEMS_BUCKETS))
    assert runs.runs == len(sizes) == sum(n for _, n in runs.sizes)
    assert runs.items == sum(sizes)
    lower = 0.0
    for le, n in runs.sizes:
        assert n == sum(1 for size in sizes if lower < size <= le)
        lower = le


def test_packing_lists_every_pool_and_each_kind_under_the_pool_that_ran_it() -> None:
    def hist(*sizes: int) -> dict[str, float]:
        return stored(list(sizes))

    found = {
        "default": Runs(run_items={"echo": cumulative(hist(1, 1), RUN_ITEMS_BUCKETS)},
                        items_started=2, recent=RecentItems(items=0, span_s=63.0)),
        "gpu": Runs(run_items={"embed": cumulative(hist(8), RUN_ITEMS_BUCKETS),
                               "eval.similarity": cumulative(hist(32, 30), RUN_ITEMS_BUCKETS)},
                    items_started=70, recent=RecentItems(items=35, span_s=70.0)),
    }
    packing = figures.packing(found, window_s=60.0)
    assert packing.window_s == 60.0
    assert [(p.pool, p.items_per_s, p.items_started) for p in packing.pools] == [
        ("default", 0.0, 2), ("gpu", 0.5, 70)]
    assert [(k.pool, k.kind, k.mean_items) for k in packing.kinds] == [
        ("default", "echo", 1.0), ("gpu", "embed", 8.0), ("gpu", "eval.similarity", 31.0)]
