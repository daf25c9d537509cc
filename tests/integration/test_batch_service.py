"""The batch service and the feeder on both SQL engines (SQLite, the embedded default, and
PostgreSQL), without HTTP: one transaction per batch, nothing left by a bad item, the
idempotency key, and the feeder's waiting → queued move."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs.core.domain import Tenant
from jobs.core.errors import IdempotencyConflict, InvalidRequest
from jobs.core.states import Status
from jobs.dispatch.feeder import BatchFeeder
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.service import batches
from jobs.store import batches as batch_repository
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql
from jobs.store import tenants as tenants_sql
from jobs.store.engine import make_engine, make_sessionmaker
from workers.handlers import default_registry

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(database_url=db_url, key_prefix=key_prefix,
                             policy={"pool_concurrency": 4})
    engine = make_engine(db_url)
    index = RedisIndex(redis_client, key_prefix)
    rt = Runtime(settings=settings, policy=settings.build_policy(), engine=engine,
                 sessions=make_sessionmaker(engine), redis=redis_client, index=index,
                 clock=index.now)
    yield rt
    engine.dispose()


@pytest.fixture
def tenant(runtime: Runtime) -> Tenant:
    with runtime.sessions.begin() as session:
        return tenants_sql.create_tenant(session, name="evals", tier="standard",
                                        api_key_hash="evals", now=runtime.clock())


def _items(n: int) -> Iterator[dict[str, Any]]:
    return ({"text": f"item {i}"} for i in range(n))


def test_a_batch_is_one_transaction_and_a_bad_item_leaves_nothing(
    runtime: Runtime, tenant: Tenant
) -> None:
    spec = batches.BatchSpec(kind="echo", idempotency_key="run-1")
    done = batches.submit(runtime, default_registry(), tenant, spec, _items(2500))
    assert done.created and done.batch.total == 2500
    with runtime.sessions() as session:
        assert batch_repository.counts(session, done.batch.id) == {Status.WAITING: 2500}
    again = batches.submit(runtime, default_registry(), tenant, spec, _items(2500))
    assert not again.created and again.batch.id == done.batch.id
    with pytest.raises(IdempotencyConflict):
        batches.submit(runtime, default_registry(), tenant, spec, _items(2499))

    def poisoned() -> Iterator[Any]:
        yield from _items(1500)  # past the first insert chunk: rows were written
        yield ["not an object"]

    with pytest.raises(InvalidRequest, match=r"items\[1500\]"):
        batches.submit(runtime, default_registry(), tenant,
                       batches.BatchSpec(kind="echo"), poisoned())
    with runtime.sessions() as session:
        assert len(batch_repository.list_batches(session, tenant.id, limit=10)) == 1
        assert stats_sql.count_by_status(session)[Status.WAITING] == 2500


def test_the_feeder_admits_up_to_the_quota_and_ages_items_from_then(
    runtime: Runtime, tenant: Tenant
) -> None:
    done = batches.submit(runtime, default_registry(), tenant,
                          batches.BatchSpec(kind="echo"), _items(50))
    with runtime.sessions.begin() as session:
        tenants_sql.update_tenant(session, tenant.id, max_queued=7)
    feeder = BatchFeeder(runtime)
    later = runtime.clock() + 30
    assert feeder.run_once(later).admitted == 7 and feeder.pending
    assert feeder.run_once(later + 1).admitted == 0  # the quota is full
    with runtime.sessions() as session:
        counts = batch_repository.counts(session, done.batch.id)
        queued = jobs_sql.jobs_in_status(session, [Status.QUEUED])
    assert counts == {Status.WAITING: 43, Status.QUEUED: 7}
    assert sorted(job.batch_index for job in queued) == list(range(7))
    assert all(job.enqueued_at == pytest.approx(later) for job in queued)
    assert all(job.order_key == pytest.approx(runtime.policy.order_key("standard", later))
               for job in queued)
    assert runtime.index.entries_of([job.id for job in queued]).keys() == {
        job.id for job in queued}
