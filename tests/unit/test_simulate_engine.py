"""The engine's moving parts on a scenario that uses them all: workers crashing, leaving and
joining, failing attempts retried with backoff, clients' own deadlines, a batch."""

from __future__ import annotations

import pytest

from jobs.core.policy import Policy
from jobs.simulate import Comparison, compare, scenario
from jobs.simulate.engine import EXPIRED, FAILED, HELD, REFUSED, SERVED, WAITING
from tests.unit.defaults import default_policy

pytestmark = pytest.mark.unit

EVERYTHING = {
    "pool": {"workers": 3, "slots": 8, "changes": [
        {"at_s": 300, "workers": -1, "crash": True},
        {"at_s": 600, "workers": 2},
        {"at_s": 900, "workers": -2},
    ]},
    "service": {"distribution": "lognormal", "mean_s": 6.0, "sigma": 1.5, "failure_rate": 0.2},
    "streams": [
        {"tier": "premium", "tenants": 3, "rate_per_s": 1.0, "max_wait_s": 3},
        {"tier": "standard", "tenants": 5, "rate_per_s": 0.1},
        {"tier": "standard", "name": "eval", "pattern": "burst", "at_s": 100, "size": 300,
         "batch": True},
        {"tier": "free", "tenants": 10, "rate_per_s": 0.05, "max_wait_s": 90},
    ],
}


@pytest.fixture(scope="module")
def pol() -> Policy:
    return default_policy()


@pytest.fixture(scope="module")
def everything(pol: Policy) -> Comparison:
    return compare(pol, scenario.parse(EVERYTHING, "everything", None), jobs=6_000, seed=1)


def test_every_job_ends_in_one_outcome(everything: Comparison) -> None:
    for run in everything.runs:
        outcomes = {SERVED, REFUSED, EXPIRED, FAILED, WAITING, HELD}
        assert set(run.status) <= outcomes
        for job, status in enumerate(run.status):
            started = run.start[job] == run.start[job]
            assert started == (status in (SERVED, FAILED) or (status == EXPIRED and started))
            if started:
                assert run.start[job] >= run.enqueued[job]


def test_the_pool_follows_its_changes(everything: Comparison) -> None:
    for run in everything.runs:
        capacities = [s.capacity for s in run.samples]
        assert sorted(set(capacities)) == [16, 24, 32]
        assert capacities.index(16) < capacities.index(32)
        # Workers that leave finish what they run: busy may exceed a shrunk pool a while.
        assert all(s.busy <= 32 for s in run.samples)
        assert run.samples[-1].busy <= 16


def test_retries_and_reaped_jobs_start_again(everything: Comparison, pol: Policy) -> None:
    for run in everything.runs:
        assert run.restarts > 50
        assert FAILED in run.status  # max_attempts reached by some
    crash_only = {**EVERYTHING, "service": {"mean_s": 6.0}}
    run = compare(pol, scenario.parse(crash_only, "crash", None), jobs=2_000, seed=1,
                  policies=["tierq"]).runs[0]
    assert 0 < run.restarts <= 8  # the jobs running on the crashed worker, reaped
    assert FAILED not in run.status


def test_deadlines_refuse_and_expire_under_tierq(everything: Comparison) -> None:
    run = next(r for r in everything.runs if r.policy == "tierq")
    kinds = {kind for kind in run.refusal if kind is not None}
    assert "capacity/deadline" in kinds
    traffic = everything.traffic
    for job, status in enumerate(run.status):
        if status == REFUSED and run.refusal[job] == "capacity/deadline":
            assert traffic.max_wait_s[job] is not None  # only a job's own deadline
    assert EXPIRED in run.status
    assert run.cap_exceeded == 0


def test_the_batch_is_fed_within_its_tenants_quota(everything: Comparison) -> None:
    traffic = everything.traffic
    eval_tenant = traffic.tenants.index("eval-0")
    items = [j for j in range(len(traffic)) if traffic.tenant[j] == eval_tenant]
    assert len(items) == 300 and all(traffic.batch[j] for j in items)
    for run in everything.runs:
        assert not any(run.status[j] == REFUSED for j in items)  # held, never refused
        fed = sorted(run.enqueued[j] for j in items if run.status[j] != HELD)
        assert fed and fed[0] >= 100.0
        if run.policy != "strict":  # a bounded queue takes the batch in as room frees
            assert fed[-1] > fed[0]
            assert run.peak[eval_tenant] <= (run.caps[eval_tenant] or 0)
            assert run.cap_exceeded == 0


def test_a_tenants_own_cap_and_quota_apply(pol: Policy) -> None:
    own = scenario.parse({
        "pool": {"workers": 2, "slots": 8},
        "streams": [
            {"tier": "free", "name": "big", "rate_per_s": 2.0, "cap": 5},
            {"tier": "free", "name": "small", "rate_per_s": 2.0, "max_queued": 3},
        ]}, "own", None)
    comparison = compare(pol, own, jobs=3_000, seed=1, policies=["rescore", "tierq"])
    traffic = comparison.traffic
    big, small = traffic.tenants.index("big-0"), traffic.tenants.index("small-0")
    for run in comparison.runs:
        assert run.caps[big] == 5 and run.peak[big] == 5  # free's own cap would be 1
        assert run.caps[small] == 1 and run.peak[small] == 1
        assert run.cap_exceeded == 0
        quota = {run.refusal_figures[j] for j in range(len(traffic))
                 if traffic.tenant[j] == small and run.refusal[j] == "tenant_limit/quota"}
        assert quota == {(3, 3)}, run.policy


def test_a_configured_pool_size_sets_the_caps_not_the_slots(pol: Policy) -> None:
    """``pool_concurrency = 48`` on a pool of 24 slots: caps and bounds follow the 48, as in
    the real system, but no more than 24 jobs run at once."""
    configured = Policy(tiers=pol.tiers, pool_concurrency=48)
    run = compare(configured, scenario.load("seed"), jobs=5_000, seed=1,
                  policies=["tierq"]).runs[0]
    assert all(s.busy <= 24 and s.capacity == 24 for s in run.samples)
    assert max(s.busy for s in run.samples) == 24
    assert max(c for c in run.caps if c is not None) == 12  # premium: 48 × 0.25
