"""What running jobs have left (``jobs.core.remaining``), and what that makes of the wait for
a slot: a job's elapsed time against its kind's mean and spread, the expected first end of
several, a tenant's own slot, and the pool's running mean (``service_times.running_mean_s``)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.core import policy
from jobs.core.remaining import first_end_s, fresh, own_slot_s, remaining
from jobs.core.service_times import KindMean, ending_mean, running_mean_s

pytestmark = pytest.mark.unit

DRAWS = 10_000


def test_a_job_of_a_steady_kind_has_its_mean_less_what_it_has_run() -> None:
    assert remaining(25.0, 0.5, 0.0) == (24.5, 0.5)
    assert remaining(25.0, 0.5, 20.0) == (4.5, 0.5)
    assert sum(remaining(25.0, 0.5, 24.9)) == 0.5  # at least one spread more


def test_a_job_past_its_kinds_time_is_neither_nearly_done_nor_fresh() -> None:
    """5 s over a kind of 25 ± 0.5 s: it is expected to run on as long as it has overrun."""
    assert remaining(25.0, 0.5, 30.0) == (0.0, 5.0)
    assert remaining(25.0, 0.0, 25.0) == (0.0, 0.0)  # a kind exact to the ms: done now


@given(mean=st.floats(0.01, 3600.0), elapsed=st.floats(0.0, 7200.0),
       spread=st.floats(1.0, 10.0))
def test_a_kind_as_variable_as_an_exponential_is_memoryless_until_twice_its_mean(
    mean: float, elapsed: float, spread: float
) -> None:
    """Spread at least the mean (unmeasured kinds too): elapsed time tells nothing, as the
    estimates had it before, until the job has run twice its mean."""
    for rest in (remaining(mean, mean * spread, elapsed), remaining(mean, None, elapsed)):
        if elapsed <= 2 * mean:
            assert rest == (0.0, mean)
        else:
            assert rest == (0.0, elapsed - mean)


def test_the_first_end_of_memoryless_jobs_is_their_rates_sum() -> None:
    assert first_end_s([fresh(6.0)] * 4) == pytest.approx(1.5)
    assert first_end_s([fresh(60.0), fresh(0.02)]) == pytest.approx(1 / (1 / 60 + 1 / 0.02))
    assert first_end_s([]) == math.inf


def test_the_first_end_of_exact_jobs_is_the_least_of_them() -> None:
    assert first_end_s([(5.0, 0.0), (5.0, 0.0)]) == 5.0  # not 2.5: they end together
    assert first_end_s([(9.0, 0.0), (1.0, 0.0), (4.0, 0.0)]) == 1.0


@settings(max_examples=20)
@given(st.lists(st.tuples(st.floats(0.0, 100.0), st.floats(0.01, 100.0)), min_size=1,
                max_size=5))
def test_the_first_end_is_the_expected_least_of_the_rests(
    rests: list[tuple[float, float]]
) -> None:
    """Against draws of each rest: its certain part, then an exponential tail."""
    rng = random.Random(11)
    draws = [min(c + rng.expovariate(1 / t) for c, t in rests) for _ in range(DRAWS)]
    expected = sum(draws) / DRAWS
    spread = math.sqrt(sum((d - expected) ** 2 for d in draws) / DRAWS)
    assert first_end_s(rests) == pytest.approx(expected, abs=5 * spread / math.sqrt(DRAWS))


def test_a_tenant_at_its_cap_waits_for_the_first_of_its_own_to_end() -> None:
    running = [remaining(25.0, 0.5, 20.0), remaining(25.0, 0.5, 2.0)]
    assert own_slot_s(running, holds=2, cap=2, fresh_mean_s=10.0) == pytest.approx(5.0)
    # Read a second ago, one has ended since (the index holds one): the longer one is left.
    assert own_slot_s(running, holds=1, cap=1, fresh_mean_s=10.0) == pytest.approx(23.0)
    # Below its cap the own queued job ahead starts at once, on a fresh place of 10 s.
    assert own_slot_s([(4.5, 0.0)], holds=1, cap=2, fresh_mean_s=10.0) == pytest.approx(
        first_end_s([(4.5, 0.0), fresh(10.0)]))
    # A job leased since it was read counts fresh.
    assert own_slot_s([], holds=1, cap=1, fresh_mean_s=10.0) == 10.0


def test_the_tenants_wait_is_its_first_end_then_its_rate() -> None:
    load = policy.TenantLoad(cap=1, inflight=1, ahead=2)  # three must end, its own first
    assert policy.tenant_wait_s(load, 1 / 25.0, first_end_s=5.0) == pytest.approx(55.0)
    assert policy.tenant_wait_s(load, 1 / 25.0) == pytest.approx(75.0)  # as fresh jobs
    under = policy.TenantLoad(cap=2, inflight=1, ahead=0)
    assert policy.tenant_wait_s(under, 1 / 25.0, first_end_s=5.0) == 0.0


@given(st.lists(st.tuples(st.sampled_from(["eval", "echo", "new"]),
                          st.floats(0.0, 10.0)), min_size=1, max_size=20))
def test_memoryless_kinds_free_slots_at_their_ending_mean(
    running: list[tuple[str, float]]
) -> None:
    """Kinds whose spread is their mean, none run past twice it: what they have run
    changes nothing, and the running mean is ``ending_mean``'s."""
    kinds = {"eval": KindMean(mean_s=60.0, spread_s=60.0, samples=50),
             "echo": KindMean(mean_s=20.0, spread_s=25.0, samples=50),
             "new": KindMean(mean_s=1.0, spread_s=0.0, samples=3)}  # too few: at 6 s
    now = 100.0
    counts: dict[str, int] = {}
    for kind, _ in running:
        counts[kind] = counts.get(kind, 0) + 1
    means = {"eval": 60.0, "echo": 20.0}
    starts = [(kind, now - ran) for kind, ran in running]
    assert running_mean_s(starts, kinds, 20, 6.0, now) == pytest.approx(
        ending_mean(counts, means, 6.0))


def test_jobs_of_an_exact_kind_free_a_slot_when_the_first_of_them_ends() -> None:
    """Two slots of 25 s jobs, 20 s and 5 s in: a slot frees in 5 s, and the running mean
    is two slots' worth of that (a blanket mean said 25 s)."""
    kinds = {"sleep": KindMean(mean_s=25.0, spread_s=0.0, samples=50)}
    starts: list[tuple[str, float | None]] = [("sleep", 80.0), ("sleep", 95.0)]
    assert running_mean_s(starts, kinds, 20, 6.0, now=100.0) == pytest.approx(10.0)
    assert running_mean_s([("sleep", None)], kinds, 20, 6.0, now=100.0) == 25.0  # not started
