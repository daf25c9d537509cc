"""Each tier's arrival rate over the span since it last changed (``jobs.core.arrivals``):
the window's at a steady rate, the recent span's within seconds of a step up or down, and a
client's few jobs sent at once taken for no stream."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core.arrivals import ArrivalCounter, arrivals_from, spans, steady_rate

pytestmark = pytest.mark.unit

WINDOW = 60.0


def poisson(rng: random.Random, rate: float, start: float, until: float) -> list[float]:
    times, at = [], start
    while rate > 0:
        at += rng.expovariate(rate)
        if at >= until:
            return times
        times.append(at)
    return times


def rate_at(times: list[float], now: float) -> float:
    counter = ArrivalCounter(WINDOW)
    for at in times:
        if at <= now:
            counter.arrived("premium", at)
    counts = counter.counts(now).get(("premium", ""))
    return 0.0 if counts is None else steady_rate(counts, counter.spans)[0]


@given(rate=st.floats(0.05, 50.0), offset=st.floats(0.0, 1.0))
def test_even_arrivals_are_the_windows_rate(rate: float, offset: float) -> None:
    times = [offset + i / rate for i in range(int(200 * rate))]
    now = times[-1]
    counter = ArrivalCounter(WINDOW)
    for at in times:
        counter.arrived("premium", at)
    counts = counter.counts(now)[("premium", "")]
    assert steady_rate(counts, counter.spans) == (counts[-1] / WINDOW, len(counter.spans) - 1)


@pytest.mark.parametrize("rate", [0.5, 5.0, 50.0])
def test_a_steady_rate_is_no_noisier_than_the_windows(rate: float) -> None:
    """Poisson arrivals for an hour, read every 10 s: the rate over the span since the last
    change is the window's to within noise, no further from the truth."""
    rng = random.Random(7)
    times = poisson(rng, rate, 0.0, 3600.0)
    counter, found, window = ArrivalCounter(WINDOW), [], []
    fed = 0
    for now in range(120, 3600, 10):
        while fed < len(times) and times[fed] <= now:
            counter.arrived("premium", times[fed])
            fed += 1
        counts = counter.counts(float(now))[("premium", "")]
        found.append(steady_rate(counts, counter.spans)[0])
        window.append(counts[-1] / WINDOW)
    assert statistics.mean(found) == pytest.approx(rate, rel=0.05)
    assert statistics.pstdev(found) <= 1.1 * statistics.pstdev(window)


@pytest.mark.parametrize(("before", "after"), [(0.0, 6.0), (1.0, 6.0), (0.5, 4.0)])
def test_a_step_up_is_followed_within_seconds(before: float, after: float) -> None:
    """5 s after the step the rate is the new one's to within 25 % (median of 50 draws),
    where a minute's window says a fraction of it."""
    rng = random.Random(3)
    told = []
    for _ in range(50):
        times = poisson(rng, before, 0.0, 300.0) + poisson(rng, after, 300.0, 400.0)
        told.append(rate_at(times, 305.0))
    assert statistics.median(told) == pytest.approx(after, rel=0.25)


@pytest.mark.parametrize("after", [0.0, 1.0])
def test_a_step_down_is_followed_within_seconds(after: float) -> None:
    rng = random.Random(5)
    told = []
    for _ in range(50):
        times = poisson(rng, 6.0, 0.0, 300.0) + poisson(rng, after, 300.0, 400.0)
        told.append(rate_at(times, 305.0))
    assert statistics.median(told) == pytest.approx(after, abs=0.25 * max(1.0, after))


def test_a_few_jobs_at_once_are_no_stream() -> None:
    """Five jobs sent together after a quiet minute: they wait in the queue, where they
    count already; the rate stays the window's."""
    sent = [100.0] * 5
    assert rate_at(sent, 100.5) == pytest.approx(5 / WINDOW)
    assert rate_at([*sent, *[100.0] * 5], 100.5) == pytest.approx(10 / 2.0)  # ten: a burst


def test_each_tier_is_weighed_by_the_kinds_of_its_recent_span() -> None:
    """A tier that turned from a lookup every 2 s to 4 evaluations a second passes work at
    the evaluations' mean (10 s against the pool's 2 s), not at the minute's mix."""
    counter = ArrivalCounter(WINDOW)
    for i in range(25):
        counter.arrived("premium", 2.0 * i, "lookup")
    for i in range(40):
        counter.arrived("premium", 50.0 + i / 4, "eval")
    found = arrivals_from(counter.counts(60.0), {"lookup": 1.0, "eval": 10.0}, 2.0,
                          spans(WINDOW))
    assert found["premium"].rate_per_s == pytest.approx(4.0, rel=0.25)
    assert found["premium"].weight == pytest.approx(10.0 / 2.0)


def test_the_spans_end_at_the_window() -> None:
    assert spans(60.0) == (2.0, 3.0, 4.5, 6.8, 10.0, 15.0, 23.0, 34.0, 51.0, 60.0)
    assert spans(5.0) == (2.0, 3.0, 4.5, 5.0)
