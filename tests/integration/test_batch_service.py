"""The batch service and the feeder on both SQL engines (SQLite, the embedded default, and
PostgreSQL), without HTTP: one transaction per batch, nothing left by a bad item, the
idempotency key, and the feeder's waiting → queued move."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from jobs.core.domain import Tenant
from jobs.core.errors import IdempotencyConflict, InvalidRequest
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher, DispatchStats
from jobs.dispatch.feeder import BatchFeeder
from jobs.dispatch.leadership import Leadership
from jobs.dispatch.loop import lead_once
from jobs.index.base import IndexedJob, NotLeader
from jobs.index.keys import IndexKeys
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.service import batches
from jobs.store import batches as batch_repository
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql
from jobs.store import tenants as tenants_sql
from jobs.store.direct import direct_pool
from jobs.store.engine import make_engine, make_sessionmaker
from tests.integration.stand_in import stand_ins_for
from workers.handlers import default_registry

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(database_url=db_url, key_prefix=key_prefix,
                             policy={"pool_concurrency": 4})
    engine = make_engine(db_url)
    index = RedisIndex(redis_client, key_prefix)
    rt = Runtime(settings=settings, policy=settings.build_policy(), engine=engine,
                 sessions=make_sessionmaker(engine), redis=redis_client, index=index,
                 clock=index.now, direct=direct_pool(engine, size=4))
    yield rt
    if rt.direct is not None:
        rt.direct.close()
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


# -- the feeder is fenced as every other leader write --


class NoPublisher:
    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        raise AssertionError("nothing is dispatched here")


@dataclass
class Contender:
    dispatcher: Dispatcher
    lead: Leadership

    def take_the_lead(self, runtime: Runtime) -> str:
        """Take the lock and, in the first round, name itself in SQL (``_claim_lead``)."""
        assert lead_once(self.dispatcher, self.lead, runtime.clock()) is not None
        assert self.dispatcher.fence is not None
        return self.dispatcher.fence


def contender(runtime: Runtime, owner: str) -> Contender:
    return Contender(Dispatcher(runtime, NoPublisher()),
                     Leadership(runtime.index, ttl_s=60, owner=owner))


def deposed(runtime: Runtime, key_prefix: str) -> tuple[Contender, Contender]:
    """A leader whose lock lapsed (a pause it has not noticed: it still holds its fence),
    and the dispatcher that took the lead in Redis and in SQL since."""
    old = contender(runtime, "old")
    stale = old.take_the_lead(runtime)
    runtime.redis.delete(IndexKeys(key_prefix).leader)
    successor = contender(runtime, "new")
    assert successor.take_the_lead(runtime) != stale
    assert old.dispatcher.fence == stale
    return old, successor


def waiting_ids(runtime: Runtime, batch_id: str) -> list[str]:
    """The batch's waiting items; its tenant's quota made room for all of them."""
    with runtime.sessions.begin() as session:
        batch = batch_repository.get_batch(session, batch_id)
        assert batch is not None
        tenants_sql.update_tenant(session, batch.tenant_id, max_queued=100)
    with runtime.sessions() as session:
        return [item.job_id for item in batch_repository.next_waiting(session, batch_id,
                                                                       limit=100)]


def test_a_deposed_leaders_feeder_admits_nothing(
    runtime: Runtime, tenant: Tenant, key_prefix: str
) -> None:
    done = batches.submit(runtime, default_registry(), tenant,
                          batches.BatchSpec(kind="echo"), _items(5))
    items = waiting_ids(runtime, done.batch.id)
    old, successor = deposed(runtime, key_prefix)

    with pytest.raises(NotLeader):  # its Feed chore passes the dispatcher's fence
        old.dispatcher.feed.run(runtime.clock() + 1, DispatchStats())

    assert runtime.index.entries_of(items) == {}
    with runtime.sessions() as session:
        assert batch_repository.counts(session, done.batch.id) == {Status.WAITING: 5}
    stats = DispatchStats()
    successor.dispatcher.feed.run(runtime.clock() + 2, stats)
    assert stats.fed == 5  # the leader's own feeder admits them, once
    assert runtime.index.entries_of(items).keys() == set(items)
    with runtime.sessions() as session:
        assert batch_repository.counts(session, done.batch.id) == {Status.QUEUED: 5}


def test_a_feeder_deposed_between_its_admits_and_its_update_moves_no_row(
    runtime: Runtime, tenant: Tenant, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lead is lost after the index admitted the items and before the UPDATE: the
    UPDATE's transaction checks the lead in SQL first, and moves nothing. The entries left
    in the index are of rows still waiting, which the dispatcher drops when it pops them."""
    done = batches.submit(runtime, default_registry(), tenant,
                          batches.BatchSpec(kind="echo"), _items(3))
    items = waiting_ids(runtime, done.batch.id)
    stale = contender(runtime, "old").take_the_lead(runtime)
    real_admit = runtime.index.admit
    admitted: list[str] = []
    successor: list[str] = []

    def admit_then_lose_the_lead(job: IndexedJob, **terms: Any) -> Any:
        outcome = real_admit(job, **terms)
        admitted.append(job.job_id)
        if len(admitted) == len(items):  # a successor takes over in Redis and SQL just now
            runtime.redis.delete(IndexKeys(key_prefix).leader)
            successor.append(contender(runtime, "new").take_the_lead(runtime))
        return outcome

    monkeypatch.setattr(runtime.index, "admit", admit_then_lose_the_lead)
    with pytest.raises(NotLeader):
        BatchFeeder(runtime).run_once(runtime.clock() + 1, fence=stale)
    monkeypatch.undo()

    assert admitted == items
    with runtime.sessions() as session:
        assert batch_repository.counts(session, done.batch.id) == {Status.WAITING: 3}
    # The successor feeds them: the entries the deposed feeder left take the successor's
    # order key, the one SQL holds, instead of keeping the deposed feeder's.
    assert BatchFeeder(runtime).run_once(runtime.clock() + 5, fence=successor[0]).admitted == 3
    runtime.index.set_caps({tier: 10 for tier in runtime.settings.tiers}, fence=successor[0])
    leases = runtime.index.dispatch(3, lease_ttl_s=60, fence=successor[0])
    with runtime.sessions() as session:
        rows = jobs_sql.get_jobs(session, items)
    assert sorted(lease.job_id for lease in leases) == sorted(items)
    assert {lease.job_id: lease.order_key for lease in leases} == {
        job_id: row.order_key for job_id, row in rows.items()}

