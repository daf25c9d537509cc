"""The estimate that counts later arrivals and kinds: who passes a queued job, for how long,
and the fixed point of its wait (``policy.overtakers``, ``overtaken_wait_s``, ``passing_jobs``
and the deadline's ``latest_useful_position``), the arrival counter the simulator uses, and
each kind's mean (``jobs.core.service_times``) in the pool's and a tenant's wait."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core import policy
from jobs.core.arrivals import ArrivalCounter, rate_of, steady_rate
from jobs.core.policy import Overtaker
from jobs.core.service_times import ending_mean, kind_means, mix_mean, usable
from jobs.process.settings import load_settings

pytestmark = pytest.mark.unit

AGEING = 6.0  # the default: a point of priority is 6 s of waiting


@pytest.fixture
def tiers() -> dict[str, policy.Tier]:
    return dict(load_settings().build_policy().tiers)  # premium 0, standard 10, free 20


def right_side(wait: float, behind: float, mu: float, later: list[Overtaker]) -> float:
    return (behind + sum(o.rate_per_s * min(o.window_s, wait) for o in later)) / mu


def test_a_new_job_is_passed_by_each_better_tier_for_their_distance_in_ageing(
    tiers: dict[str, policy.Tier],
) -> None:
    now = 1000.0
    free = policy.order_key(now, tiers["free"].base_priority, AGEING)
    later = policy.overtakers(tiers, AGEING, order_key=free, now=now,
                              arrivals={"premium": 6.0, "standard": 0.5, "free": 9.0})
    assert sorted((o.window_s, o.rate_per_s) for o in later) == [(60.0, 0.5), (120.0, 6.0)]
    premium = policy.order_key(now, 0, AGEING)
    assert policy.overtakers(tiers, AGEING, order_key=premium, now=now,
                             arrivals={"premium": 6.0, "free": 9.0}) == []


def test_a_job_that_has_waited_is_passed_for_less(tiers: dict[str, policy.Tier]) -> None:
    """A free job queued 100 s ago ranks as a premium one queued 20 s from now: premium
    arriving within 20 s still passes it, nothing else does."""
    free = policy.order_key(900.0, tiers["free"].base_priority, AGEING)
    later = policy.overtakers(tiers, AGEING, order_key=free, now=1000.0,
                              arrivals={"premium": 6.0, "standard": 0.5, "unknown": 3.0})
    assert [(o.window_s, o.rate_per_s) for o in later] == [(20.0, 6.0)]


def test_nothing_passing_leaves_the_drain_time_of_the_jobs_ahead() -> None:
    assert policy.overtaken_wait_s(8, 4.0, []) == policy.estimated_wait_s(7, 0, 4.0) == 2.0
    assert policy.overtaken_wait_s(0, 4.0, [Overtaker(rate_per_s=9.0, window_s=60.0)]) == 0.0
    assert policy.overtaken_wait_s(3, 0.0, []) == math.inf


def test_a_stream_that_alone_fills_the_pool_holds_a_job_for_its_whole_window() -> None:
    """Premium at 5 jobs/s on a pool serving 4: a free job behind 20 jobs waits out the
    premium that arrives in its 120 s window (600 jobs) and the 20, at 4 jobs/s."""
    wait = policy.overtaken_wait_s(20, 4.0, [Overtaker(rate_per_s=5.0, window_s=120.0)])
    assert wait == pytest.approx((20 + 5.0 * 120.0) / 4.0)
    # Premium at half the pool's rate passes it only while it waits: W = (20 + 2W) / 4.
    half = policy.overtaken_wait_s(20, 4.0, [Overtaker(rate_per_s=2.0, window_s=120.0)])
    assert half == pytest.approx(10.0)


overtaker = st.builds(Overtaker, rate_per_s=st.floats(0.0, 50.0),
                      window_s=st.floats(0.001, 10_000.0))


@given(behind=st.floats(0.001, 10_000.0), mu=st.floats(0.01, 100.0),
       later=st.lists(overtaker, max_size=4))
def test_the_wait_is_the_least_fixed_point(
    behind: float, mu: float, later: list[Overtaker]
) -> None:
    wait = policy.overtaken_wait_s(behind, mu, later)
    assert math.isfinite(wait) and wait >= behind / mu * (1 - 1e-9)
    assert right_side(wait, behind, mu, later) == pytest.approx(wait, rel=1e-6, abs=1e-9)
    # Below it the right side is still above: no earlier wait is consistent.
    below = wait * (1 - 1e-4)
    assert right_side(below, behind, mu, later) > below


@given(free=st.integers(0, 8), mu=st.floats(0.05, 20.0), max_wait=st.floats(0.5, 600.0),
       later=st.lists(overtaker, max_size=3), position=st.integers(0, 5_000))
def test_the_deadline_refuses_exactly_the_positions_whose_wait_exceeds_it(
    free: int, mu: float, max_wait: float, later: list[Overtaker], position: int
) -> None:
    """``latest_useful_position`` with ``passing_jobs`` is the estimate's own answer: a job
    ``position`` jobs ahead is expected in time exactly when it is no later than that."""
    wait = policy.overtaken_wait_s(position + 1 - free, mu, later)
    if abs(wait - max_wait) < 1e-6 * max(1.0, max_wait):
        return  # on the boundary the float rounding of either side decides
    last = policy.latest_useful_position(max_wait, free, mu,
                                         passing=policy.passing_jobs(later, max_wait))
    assert last is not None and last >= -1
    assert (wait <= max_wait) == (position <= last)


def test_the_counter_keeps_its_window_only() -> None:
    counter = ArrivalCounter(60.0)
    for at in range(0, 120, 2):  # one every 2 s for two minutes, a free one at 10 s
        counter.arrived("premium", float(at), "eval")
        if at == 10:
            counter.arrived("free", 10.0, "lookup")
    # free's and premium's first 29 are out of the window; each span counts its own
    counts = counter.counts(119.0)
    assert list(counts) == [("premium", "eval")]
    assert dict(zip(counter.spans, counts[("premium", "eval")], strict=True))[60.0] == 30
    assert dict(zip(counter.spans, counts[("premium", "eval")], strict=True))[10.0] == 5
    assert rate_of(30, 60.0) == 0.5
    assert steady_rate(counts[("premium", "eval")], counter.spans) == (0.5, 9)
    assert counter.counts(150.0)[("premium", "eval")][-1] == 15


def test_each_kind_has_its_own_mean_and_spread_from_its_newest_runs() -> None:
    runs = [("eval", 60.0), ("echo", 0.02), ("eval", 40.0), ("echo", 0.04), ("eval", 99.0)]
    means = kind_means(runs, window=2)  # each kind's two newest runs
    assert means["eval"].samples == means["echo"].samples == 2
    assert means["eval"].mean_s == pytest.approx(policy.weighted_mean([60.0, 40.0]))
    assert means["eval"].spread_s == pytest.approx(10.0)
    assert usable(means, samples_min=2) == {"eval": means["eval"].mean_s,
                                            "echo": means["echo"].mean_s}
    assert usable(means, samples_min=3) == {}


def test_the_pools_mean_is_that_of_the_work_it_holds() -> None:
    means = {"eval": 60.0, "echo": 0.02}
    assert mix_mean({"eval": 1, "echo": 3}, means, 6.0) == pytest.approx(15.015)
    assert mix_mean({"echo": 4, "sleep": 0}, means, 6.0) == 0.02  # one kind: its own, exactly
    assert mix_mean({"new": 2, "echo": 2}, means, 6.0) == pytest.approx(3.01)  # unmeasured: 6 s
    assert mix_mean({}, means, 6.0) == 6.0


def test_running_jobs_free_a_slot_at_the_sum_of_their_rates() -> None:
    """Fifteen one-minute jobs and one of 20 ms running: the next slot frees in about 20 ms,
    so the sixteen free slots at a mean of 0.32 s each, not at their plain mean of 56 s."""
    means = {"eval": 60.0, "echo": 0.02}
    assert ending_mean({"eval": 15, "echo": 1}, means, 6.0) == pytest.approx(16 / 50.25)
    assert mix_mean({"eval": 15, "echo": 1}, means, 6.0) == pytest.approx(56.25125)
    assert ending_mean({"eval": 3, "sleep": 0}, means, 6.0) == 60.0  # one kind: its own
    assert ending_mean({"new": 1, "eval": 1}, means, 6.0) == pytest.approx(2 / (1 / 6 + 1 / 60))
    assert ending_mean({}, means, 6.0) == 6.0


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 50), max_size=4),
       st.dictionaries(st.sampled_from(["a", "b", "c"]),
                       st.floats(0.001, 3600, allow_nan=False), max_size=3))
def test_slots_free_no_later_than_the_plain_mean_says(
    counts: dict[str, int], means: dict[str, float]
) -> None:
    """The harmonic mean of the running jobs' means is at most their plain mean, equal when
    they are of one mean."""
    ending, plain = ending_mean(counts, means, 6.0), mix_mean(counts, means, 6.0)
    assert ending <= plain * (1 + 1e-9)
    if len({means.get(kind, 6.0) for kind, n in counts.items() if n > 0}) <= 1:
        assert ending == pytest.approx(plain)


def test_short_jobs_queued_ahead_of_long_running_ones_wait_for_one_slot() -> None:
    """Sixteen slots busy with one-minute jobs, twenty 20 ms jobs queued ahead: the job waits
    for one slot to free (60 s / 16) and the twenty to pass through it, not for twenty-one
    slots' worth of the queued mean, nor of the running one."""
    queued, running = 0.02, 60.0
    load = policy.TenantLoad(cap=16, inflight=0, ahead=0)
    wait = policy.expected_wait_s(20, 0, 16 / queued, tenant=load, capacity=16,
                                  mean_service_s=queued, running_mean_s=running)
    assert wait == pytest.approx((20 * queued + running) / 16)
    alone = policy.expected_wait_s(20, 0, 16 / queued, tenant=load, capacity=16,
                                   mean_service_s=queued)
    assert alone == pytest.approx(21 * queued / 16)  # the queued mean alone: far too little
    same = policy.expected_wait_s(20, 0, 16 / 6.0, tenant=load, capacity=16,
                                  mean_service_s=6.0, running_mean_s=6.0)
    assert same == policy.expected_wait_s(20, 0, 16 / 6.0, tenant=load, capacity=16,
                                          mean_service_s=6.0)  # one kind: as before


def test_a_tenant_at_its_cap_waits_for_its_own_kinds() -> None:
    load = policy.TenantLoad(cap=1, inflight=1, ahead=0)  # a 20 ms job of its own running
    wait = policy.expected_wait_s(0, 3, 16 / 55.0, tenant=load, capacity=16,
                                  mean_service_s=55.0, tenant_mean_s=0.02)
    assert wait == pytest.approx(0.02)
