"""A thread-pool worker whose slots pass on to their next jobs, on real processes: each freed
slot takes its next job from the index in the step that ends the last (``hand_over``), that
job's task starts on a spare pool thread while the ending commits (``workers.pool``), and the
worker never runs more handlers at once than it has slots."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from jobs.core.domain import NewJob, Tenant
from jobs.core.states import Status
from jobs.index.base import IndexedJob
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from tests.integration.worker_procs import finished, wait_for, worker_env, worker_starter
from tests.services import RedisServer
from workers.publisher import CeleryPublisher

pytestmark = pytest.mark.integration

SLOTS = 2
JOBS = 12


@pytest.fixture
def env(pg_url: str, redis_server: RedisServer, key_prefix: str) -> dict[str, str]:
    return worker_env(pg_url, redis_server.url, key_prefix,
                      TIERQ_HANDLERS="tests.handlers_for_tests:SPAN_HANDLERS")


def queue(runtime: Runtime, tenant: Tenant, payload: dict[str, object]) -> str:
    """Insert and index one job, as a submit does; nothing dispatched."""
    now = time.time()
    new = NewJob(tenant_id=tenant.id, tier=tenant.tier, kind="span", payload=payload,
                 order_key=runtime.policy.order_key(tenant.tier, now), enqueued_at=now)
    with runtime.sessions.begin() as session:
        job = jobs_sql.insert_job(session, new)
    indexed = IndexedJob(job_id=job.id, tenant=tenant.id, tier=job.tier, order_key=job.order_key)
    assert runtime.index.admit(indexed, bound=1000).accepted
    return job.id


def test_a_thread_worker_passes_its_slots_on_and_never_runs_more_handlers_than_slots(
    env: dict[str, str], runtime: Runtime, publisher: CeleryPublisher, tenant: Tenant,
    tmp_path: Path,
) -> None:
    key = f"{runtime.settings.key_prefix}spans:{uuid.uuid4().hex}"
    runtime.index.set_caps({name: JOBS for name in runtime.settings.tiers})
    runtime.index.set_generation("1")  # whole, as a leader's rebuild leaves it: slots pass on
    with worker_starter(env, tmp_path) as start:
        worker = start(SLOTS, "threads")
        wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == SLOTS, worker)
        ids = [queue(runtime, tenant, {"key": key, "seconds": 0.05}) for _ in range(JOBS)]
        # Only the first SLOTS jobs are dispatched; every later one is a slot passing on.
        for lease in runtime.index.dispatch(SLOTS, now=time.time(),
                                            lease_ttl_s=runtime.policy.lease_ttl_s):
            publisher.publish(lease.job_id, lease.attempt, lease.tier)
        ended = [wait_for(lambda job_id=job_id: finished(runtime, job_id), worker)
                 for job_id in ids]

    assert [job.status for job in ended] == [Status.SUCCEEDED] * JOBS
    assert [job.starts for job in ended] == [1] * JOBS
    spans = sorted(tuple(float(x) for x in raw.split())
                   for raw in runtime.redis.lrange(key, 0, -1))
    assert len(spans) == JOBS  # each handler ran once
    # At each handler's start, how many ran: never more than the slots.
    most = max(sum(1 for start, end in spans if start <= at < end) for at, _ in spans)
    assert 1 <= most <= SLOTS
