"""The dashboard's figures from what was read: refusal buckets summed (over pools too), the
tenants nearest their cap, a tenant's cap and quota use with its overrides, its waits and
jobs by status, and every pool with its kinds and live workers."""

from __future__ import annotations

import pytest

from jobs.core import policy
from jobs.core.domain import JobSummary, Tenant
from jobs.core.pools import Pools, PoolSpec
from jobs.core.states import Status
from jobs.dashboard import figures
from jobs.dashboard.refusals import RefusalCount, tally, window_minutes
from jobs.fleet import pool as capacity
from jobs.fleet.metrics import IndexView, TierFigures
from jobs.index.base import LiveWorker
from jobs.process.settings import load_settings

pytestmark = pytest.mark.unit


@pytest.fixture
def pol() -> policy.Policy:
    return load_settings(policy={"pool_concurrency": 24}).build_policy()


@pytest.fixture
def pool(pol: policy.Policy) -> capacity.PoolFigures:
    return capacity.figures(pol, capacity=24, inflight=7)


def tenant(name: str, tier: str, **overrides: int) -> Tenant:
    return Tenant(id=f"id-{name}", name=name, tier=tier, api_key_hash="x", created_at=0.0,
                  **overrides)


def test_counts_sum_by_tier_and_by_tenant_named_as_the_429s() -> None:
    recent = tally({
        ("tier", "free", "capacity"): 2, ("tier", "free", "rate"): 5,
        ("tier", "free", "deadline"): 1, ("tenant", "t1", "rate"): 5,
        ("tenant", "t1", "tenant_limit"): 5,
    })
    assert recent.of_tier("free") == [
        RefusalCount(cause="tenant_limit", limit="rate", count=5),
        RefusalCount(cause="capacity", limit="bound", count=2),
        RefusalCount(cause="capacity", limit="deadline", count=1),
    ]
    assert recent.of_tenant("t1") == [RefusalCount(cause="tenant_limit", limit="quota", count=5),
                                      RefusalCount(cause="tenant_limit", limit="rate", count=5)]
    assert recent.of_tier("premium") == [] and recent.of_tenant("t2") == []


def test_every_pools_refusals_are_summed() -> None:
    default = {("tier", "free", "capacity"): 2, ("tenant", "t1", "rate"): 1}
    gpu = {("tier", "free", "capacity"): 3, ("tier", "premium", "deadline"): 1}
    recent = tally(default, gpu)
    assert recent.of_tier("free") == [RefusalCount(cause="capacity", limit="bound", count=5)]
    assert recent.of_tier("premium") == [
        RefusalCount(cause="capacity", limit="deadline", count=1)]
    assert recent.of_tenant("t1") == [RefusalCount(cause="tenant_limit", limit="rate", count=1)]
    assert tally() == tally({})


def test_the_window_is_its_last_five_minutes() -> None:
    assert window_minutes(600.0) == [6, 7, 8, 9, 10]
    assert window_minutes(659.9, 120.0) == [9, 10]


def test_tenants_nearest_their_cap_by_share_then_slots(pool: capacity.PoolFigures) -> None:
    # At 24 slots: premium cap 6, free cap max(1, floor(0.96)) = 1.
    tenants = {t.id: t for t in (tenant("big", "premium"), tenant("small", "free"),
                                 tenant("half", "premium"), tenant("own", "premium", cap=12))}
    inflight = {"id-big": 6, "id-small": 1, "id-half": 3, "id-own": 12}
    assert figures.nearest_cap(tenants, inflight, pool) == ["id-own", "id-big", "id-small",
                                                            "id-half"]
    assert figures.nearest_cap(tenants, inflight, pool, limit=2) == ["id-own", "id-big"]


def test_a_tenants_use_counts_its_own_overrides(pool: capacity.PoolFigures) -> None:
    plain = figures.tenant_use(tenant("a", "premium"), pool, inflight=3, queued=2)
    assert (plain.cap, plain.cap_use) == (pool.caps["premium"], 0.5)
    assert plain.quota == pool.quotas["premium"]
    own = figures.tenant_use(tenant("b", "free", cap=4, max_queued=10), pool, inflight=1,
                             queued=5)
    assert (own.cap, own.cap_use, own.quota, own.quota_use) == (4, 0.25, 10, 0.5)
    assert plain.pool == own.pool == "default"


def test_a_tenants_cap_follows_the_pool_it_is_counted_in(pol: policy.Policy) -> None:
    # The same premium tenant: cap 6 of the default pool's 24 slots, 1 of a 4-slot pool's.
    big = capacity.figures(pol, capacity=24, inflight=0)
    small = capacity.figures(pol, capacity=4, inflight=0)
    acme = tenant("acme", "premium")
    here = figures.tenant_use(acme, big, inflight=1, queued=0)
    there = figures.tenant_use(acme, small, inflight=1, queued=0, pool="gpu")
    assert (here.pool, here.cap, there.pool, there.cap) == ("default", 6, "gpu", 1)
    assert there.cap_use == 1.0


def test_the_default_pools_kinds_are_every_other_kind() -> None:
    pools = Pools({"gpu": PoolSpec(name="gpu", kinds=frozenset({"embed", "echo"}))})
    assert figures.pool_kinds(pools, "default") is None
    assert figures.pool_kinds(pools, "gpu") == ["echo", "embed"]
    assert figures.pool_kinds(Pools(), "default") is None


def test_the_fleet_lists_every_pool_and_each_workers_pool(
    pol: policy.Policy, pool: capacity.PoolFigures
) -> None:
    def worker(worker_id: str, device: str) -> LiveWorker:
        return LiveWorker(worker_id=worker_id, slots=1, device=device, expires_at=60.0)

    gpu = capacity.figures(pol, capacity=1, inflight=1)
    lines = [figures.PoolLine(name="default", kinds=None, figures=pool,
                              workers=[worker("a@h", "cpu"), worker("b@h", "cpu")]),
             figures.PoolLine(name="gpu", kinds=["echo"], figures=gpu,
                              workers=[worker("g@h", "cuda:0")]),
             figures.PoolLine(name="idle", kinds=["sleep"], figures=gpu)]
    view = figures.fleet_view(pol, at=0.0, window_s=300.0, view=IndexView(pool=pool, tiers=[]),
                              waits={}, refusals={}, tenants=[], pools=lines)
    assert view.pool is lines[0] and view.pools == lines
    assert [(name, w.worker_id) for name, w in view.workers] == [
        ("default", "a@h"), ("default", "b@h"), ("gpu", "g@h")]
    assert lines[2].workers == []


def test_a_tenants_waits_statuses_and_latest_jobs(pol: policy.Policy) -> None:
    def job(n: int, status: Status, started: float | None) -> JobSummary:
        return JobSummary(id=f"j{n}", kind="sleep", tier="free", status=status,
                          created_at=90.0 + n, enqueued_at=100.0, started_at=started)

    jobs = [job(3, Status.QUEUED, None), job(2, Status.RUNNING, 1000.0),
            job(1, Status.SUCCEEDED, 104.0)]  # started before the window
    free = TierFigures(name="free", queued=1, bound=10, oldest_age_s=3.0, tenant_cap=1)
    card = figures.tier_card(pol, free, [1.0, 3.0], [])
    assert card.ageing_guarantee_s == 120.0 and card.max_wait_s == 60.0
    assert (card.waits.p50_s, card.waits.count) == (2.0, 2)
    use = figures.TenantUse(name="a", tier="free", inflight=1, cap=1, queued=1, quota=4)
    view = figures.tenant_view(at=1100.0, window_s=300.0, tier=card, use=use, jobs=jobs)
    assert view.pools == [use]  # one pool: its use of the default pool
    assert view.waits == figures.Waits(p50_s=900.0, p95_s=900.0, count=1)
    assert view.by_status[Status.QUEUED] == view.by_status[Status.RUNNING] == 1
    assert view.by_status[Status.FAILED] == 0 and view.counted == 3
    assert [(line.id, line.wait_s) for line in view.recent] == [
        ("j3", None), ("j2", 900.0), ("j1", 4.0)]
