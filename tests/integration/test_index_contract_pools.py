"""The index contract across pools: each pool's index is its own (queues, leases, caps,
workers), while the leader lock and a tenant's request rate are the fleet's. The Redis index
(a pool's prefix beside the root's) and the twin (``MemoryIndex.pool``) pass the same."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from jobs.core import policy
from jobs.core.pools import pool_prefix
from jobs.index import DispatchIndex, NotLeader
from jobs.index.base import AdmissionTerms, IndexedJob
from jobs.index.memory import MemoryIndex
from jobs.index.redis_index import RedisIndex
from tests.integration.test_index_contract import TTL, fill, ids, job

pytestmark = pytest.mark.integration


@pytest.fixture(params=["memory", "redis"])
def pools(request: pytest.FixtureRequest) -> Iterator[tuple[DispatchIndex, DispatchIndex]]:
    """The default pool's index and the ``gpu`` pool's, of one fleet."""
    if request.param == "memory":
        root = MemoryIndex()
        yield root, root.pool()
        return
    client: redis.Redis = request.getfixturevalue("redis_client")
    prefix: str = request.getfixturevalue("key_prefix")
    yield (RedisIndex(client, prefix),
           RedisIndex(client, pool_prefix(prefix, "gpu"), root=prefix))


def test_a_pools_jobs_leases_and_slots_are_its_own(
    pools: tuple[DispatchIndex, DispatchIndex],
) -> None:
    default, gpu = pools
    now = time.time()
    fill(default, job("c1", key=1), job("c2", key=2))
    fill(gpu, job("g1", key=0))
    default.set_caps({"free": 5})
    gpu.set_caps({"free": 5})
    default.register_worker("cpu@host", slots=2, ttl_s=TTL, now=now)
    assert default.pool_capacity(now=now) == 2 and gpu.pool_capacity(now=now) == 0
    # No live worker of its own: its configured slot admits, but nothing is leased into it.
    assert gpu.dispatch(10, now=now, lease_ttl_s=TTL, capacity=1) == []
    gpu.register_worker("gpu@host", slots=1, ttl_s=TTL, now=now)
    assert ids(gpu.dispatch(10, now=now, lease_ttl_s=TTL, capacity=1)) == ["g1"]
    assert ids(default.dispatch(10, now=now, lease_ttl_s=TTL, capacity=2)) == ["c1", "c2"]
    assert (default.inflight(), gpu.inflight()) == (2, 1)
    assert default.tenant_inflight("t1") == 2 and gpu.tenant_inflight("t1") == 1
    assert default.entries_of(["g1"]) == {} and gpu.entries_of(["c1"]) == {}


def test_one_leader_lock_fences_every_pool(
    pools: tuple[DispatchIndex, DispatchIndex],
) -> None:
    default, gpu = pools
    now = time.time()
    token = gpu.acquire_leadership("one", ttl_s=60, now=now)
    assert token is not None
    assert default.acquire_leadership("two", ttl_s=60, now=now) is None
    assert default.leader(now=now) == token
    fill(default, job("c1"))
    default.set_caps({"free": 5})
    default.register_worker("cpu@host", slots=1, ttl_s=TTL, now=now)
    assert ids(default.dispatch(5, now=now, lease_ttl_s=TTL, fence=token, capacity=1)) == ["c1"]
    with pytest.raises(NotLeader):
        gpu.dispatch(5, now=now, lease_ttl_s=TTL, fence="9:stale", capacity=1)
    assert default.resign_leadership(token, now=now) is True
    assert gpu.leader(now=now) is None


def test_a_tenants_request_rate_is_one_budget_across_pools(
    pools: tuple[DispatchIndex, DispatchIndex],
) -> None:
    default, gpu = pools
    now = time.time()
    tier = policy.Tier(name="free", base_priority=0, max_wait_s=60, tenant_share=0.5)
    terms = AdmissionTerms(now=now, tier=tier, mean_service_s=1.0, service_samples_min=20,
                           pool_concurrency=4, rate=policy.RateLimit(rate_per_s=0.001, burst=2))
    first = default.admit_new(IndexedJob(job_id="a", tenant="t", tier="free", order_key=now),
                              terms)
    second = gpu.admit_new(IndexedJob(job_id="b", tenant="t", tier="free", order_key=now),
                           terms)
    third = gpu.admit_new(IndexedJob(job_id="c", tenant="t", tier="free", order_key=now),
                          terms)
    assert (first.accepted, second.accepted) == (True, True)
    assert (third.accepted, third.reason) == (False, "rate")
    assert gpu.tenant_queued("t") == 1 and default.tenant_queued("t") == 1
