"""Pools on real SQL and a real Redis: each pool an index of its own, one leader for all.

A job's kind decides its pool: its admission is against that pool's bound, its lease is that
pool's, and only that pool's dispatcher publishes it, within that pool's free slots and its
tenants' caps there. The fleet's keys (the leader lock, a tenant's request rate) are shared.
The publisher is the one seam replaced (a recorder per pool): tests/e2e/test_pools.py runs
real workers of two pools.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from jobs.admission.submit import Submission, submit
from jobs.core.domain import Tenant
from jobs.core.errors import CapacityExceeded, TenantLimitExceeded
from jobs.dispatch.dispatcher import Dispatcher
from jobs.dispatch.leadership import Leadership
from jobs.dispatch.loop import lead_once
from jobs.dispatch.pools import PoolDispatchers
from jobs.dispatch.reconciler import Reconciler
from jobs.execution.registry import HandlerRegistry
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import tenants as tenants_sql
from jobs.store.engine import make_engine, make_sessionmaker
from tests.handlers_for_tests import RecordingHandler
from tests.integration.stand_in import stand_ins_for
from tests.integration.test_dispatcher import RecordingPublisher

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


T0 = 1_800_000_000.0


class GpuHandler(RecordingHandler):
    kind = "gpu.job"


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(
        database_url=db_url, key_prefix=key_prefix,
        # Default pool: 4 slots, 1 s jobs; a standard tenant's cap there is floor(4 × 0.5) = 2.
        policy={"pool_concurrency": 4, "mean_service_s": 1.0, "lease_ttl_s": 10},
        tiers={"standard": {"base_priority": 10, "max_wait_s": 20, "tenant_share": 0.5,
                            "queued_share": 1.0, "rate_per_s": 0.001, "rate_burst": 8}},
        # The gpu pool: 1 slot of 10 s jobs: μ = 0.1/s, bound floor(0.1 × 20) = 2, cap 1.
        pools={"gpu": {"kinds": ["gpu.job"], "concurrency": 1, "mean_service_s": 10.0}},
    )
    engine = make_engine(db_url)
    yield Runtime(settings=settings, policy=settings.pool_policy("default"), engine=engine,
                  sessions=make_sessionmaker(engine), redis=redis_client,
                  index=RedisIndex(redis_client, key_prefix))
    engine.dispose()


@pytest.fixture
def registry() -> HandlerRegistry:
    return HandlerRegistry([RecordingHandler(), GpuHandler()])


def tenant(runtime: Runtime, name: str) -> Tenant:
    with runtime.sessions.begin() as s:
        return tenants_sql.create_tenant(s, name=name, tier="standard", api_key_hash=name,
                                         now=T0)


def post(runtime: Runtime, registry: HandlerRegistry, who: Tenant, kind: str) -> str:
    done = submit(runtime, registry, who, Submission(kind=kind, payload={}))
    return done.progress.job.id


def dispatchers(runtime: Runtime) -> tuple[PoolDispatchers, dict[str, RecordingPublisher]]:
    sent = {name: RecordingPublisher() for name in runtime.pools.names}
    fleet = PoolDispatchers([Dispatcher(runtime.for_pool(name), sent[name])
                             for name in runtime.pools.names])
    return fleet, sent


def test_a_kinds_pool_admits_leases_and_publishes_it_alone(
    runtime: Runtime, registry: HandlerRegistry
) -> None:
    gpu = runtime.for_pool("gpu")
    acme = tenant(runtime, "acme")
    cpu_jobs = [post(runtime, registry, acme, "record") for _ in range(3)]
    gpu_jobs = [post(runtime, registry, acme, "gpu.job") for _ in range(2)]

    # Each job is indexed in its pool's index only.
    assert all(runtime.index.position(j) is not None for j in cpu_jobs)
    assert all(gpu.index.position(j) is None for j in cpu_jobs)
    assert all(gpu.index.position(j) is not None for j in gpu_jobs)
    assert all(runtime.index.position(j) is None for j in gpu_jobs)

    fleet, sent = dispatchers(runtime)
    leadership = Leadership(runtime.index, ttl_s=runtime.policy.leader_ttl_s)
    stats = lead_once(fleet, leadership, runtime.clock())
    assert stats is not None and stats.rebuilt  # the first turn of a leader: full passes
    stats = lead_once(fleet, leadership, runtime.clock())
    assert stats is not None

    # default: 4 slots, the tenant's cap there 2; gpu: 1 slot, its cap there 1.
    assert [m[0] for m in sent["default"].sent] == cpu_jobs[:2]
    assert [m[0] for m in sent["gpu"].sent] == gpu_jobs[:1]
    assert runtime.index.tenant_inflight(acme.id) == 2
    assert gpu.index.tenant_inflight(acme.id) == 1


def test_a_full_pool_refuses_while_the_other_admits(
    runtime: Runtime, registry: HandlerRegistry
) -> None:
    crowd = tenant(runtime, "crowd")
    accepted = 0
    with pytest.raises(CapacityExceeded) as refused:
        for _ in range(10):
            post(runtime, registry, crowd, "gpu.job")
            accepted += 1
    assert accepted == 2  # the gpu pool's bound, floor(0.1/s × 20 s)
    assert refused.value.tier == "standard"
    # The default pool's queue is untouched: its bound is floor(4 × 20) = 80.
    for _ in range(3):
        post(runtime, registry, crowd, "record")
    assert runtime.index.tier_depths(["standard"])["standard"].queued == 3
    assert runtime.for_pool("gpu").index.tier_depths(["standard"])["standard"].queued == 2


def test_the_leader_lock_and_a_tenants_rate_are_the_fleets(
    runtime: Runtime, registry: HandlerRegistry
) -> None:
    gpu = runtime.for_pool("gpu")
    token = runtime.index.acquire_leadership("one", ttl_s=5, now=T0)
    assert token is not None
    assert gpu.index.acquire_leadership("two", ttl_s=5, now=T0) is None
    assert gpu.index.leader(now=T0) == runtime.index.leader(now=T0)
    # A burst of 8 submits per tenant, whatever the pools they go to.
    rated = tenant(runtime, "rated")
    for kind in ["record", "gpu.job", "record", "gpu.job", "record", "record", "record",
                 "record"]:
        post(runtime, registry, rated, kind)
    with pytest.raises(TenantLimitExceeded) as refused:
        post(runtime, registry, rated, "record")
    assert refused.value.details["limit"] == "rate"


def test_each_pool_keeps_its_own_epoch_so_no_pool_passes_in_full_for_ever(
    runtime: Runtime,
) -> None:
    reconcilers = [Reconciler(pool) for pool in runtime.every_pool()]
    first = [r.run_once(T0).full for r in reconcilers]
    again = [r.run_once(T0 + 1).full for r in reconcilers]
    assert first == [True, True]  # a first round ever: a full pass each
    assert again == [False, False]  # then the epochs agree, pool by pool
    runtime.redis.delete(runtime.settings.pool_prefix("gpu") + "generation")
    assert [r.run_once(T0 + 2).full for r in reconcilers] == [False, True]
