"""Rebuilding the Redis index from SQL after it lost its data, against real SQL and Redis.

The index keys of this test's own prefix are deleted (a flush, as far as this test can see),
then ``rebuild`` must put back what SQL says: queued jobs in their places (a leased one whose
lease went with Redis among them: its row is still queued), leases of the jobs dispatched or
running in SQL (so caps hold), nothing of finished jobs, and a job an API indexed whose
commit has not landed yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from jobs.cli.main import build_app
from jobs.core.cadence import UNCOMMITTED_GRACE_S
from jobs.core.domain import Job, NewJob
from jobs.core.ids import new_job_id
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.dispatch.rebuild import indexed, rebuild
from jobs.index.base import Entry, IndexedJob
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.engine import make_engine, make_sessionmaker
from tests.integration.stand_in import register_stand_ins, stand_ins_for
from tests.services import RedisServer, delete_prefixed

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


T0 = 1_800_000_000.0
NOW = T0 + 2 * UNCOMMITTED_GRACE_S  # every job made at T0 is long committed by now
LEASE_TTL_S = 10.0


@dataclass
class RecordingPublisher:
    sent: list[str] = field(default_factory=list)

    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        self.sent.append(job_id)


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(
        database_url=db_url,
        key_prefix=key_prefix,
        policy={"pool_concurrency": 50, "lease_ttl_s": LEASE_TTL_S},  # standard cap: 5
    )
    engine = make_engine(db_url)
    yield Runtime(
        settings=settings,
        policy=settings.build_policy(),
        engine=engine,
        sessions=make_sessionmaker(engine),
        redis=redis_client,
        index=RedisIndex(redis_client, key_prefix),
    )
    engine.dispose()


def tenant(runtime: Runtime, name: str, cap: int | None = None) -> str:
    with runtime.sessions.begin() as s:
        t = tenants_sql.create_tenant(s, name=name, tier="standard", api_key_hash=name, now=T0)
        if cap is not None:
            tenants_sql.update_tenant(s, t.id, cap=cap)
        return t.id


def make_job(runtime: Runtime, tenant_id: str, at: float, **fields: Any) -> Job:
    """A job committed to SQL and admitted to the index, as the API leaves it."""
    new = NewJob(
        id=new_job_id(at), tenant_id=tenant_id, tier="standard", kind="echo", payload={},
        order_key=runtime.policy.order_key("standard", at), enqueued_at=at, **fields,
    )
    with runtime.sessions.begin() as s:
        job = jobs_sql.insert_job(s, new)
    assert runtime.index.admit(indexed(job), bound=1000).accepted
    return job


def move(runtime: Runtime, job: Job, src: Status, *steps: Status, **fields: Any) -> None:
    """Walk a job from ``src`` through ``steps`` in SQL (the index is not told)."""
    with runtime.sessions.begin() as s:
        for dst in steps:
            assert jobs_sql.transition(
                s, job.id, src=src, attempt=job.attempt, dst=dst, now=T0, **fields
            )
            src = dst


@dataclass(frozen=True)
class Scene:
    queued: list[Job]
    # Leased by a round, not started by any worker yet: its row is queued.
    leased: Job
    delayed: Job
    running: list[Job]
    finished: list[Job]
    capped_tenant: str
    capped_waiting: Job
    uncommitted: IndexedJob
    leftover: IndexedJob


def build_scene(runtime: Runtime) -> Scene:
    index = runtime.index
    a, b, capped = tenant(runtime, "a"), tenant(runtime, "b"), tenant(runtime, "capped", cap=2)
    queued = [make_job(runtime, (a, b)[i % 2], T0 + i) for i in range(5)]
    queued.append(make_job(runtime, b, T0 - 100, max_wait_s=3600))  # first, with a deadline
    leased = make_job(runtime, b, T0 + 2.5)
    delayed = make_job(runtime, a, T0 + 1.5)
    move(runtime, delayed, Status.QUEUED, Status.DISPATCHED, Status.QUEUED, not_before=NOW + 5)
    index.requeue(indexed(delayed, not_before=NOW + 5))  # a retry, waiting out its backoff
    running = [make_job(runtime, capped, T0 - 50 + i) for i in range(2)]
    capped_waiting = make_job(runtime, capped, T0 - 200)  # ahead of all: it must still wait
    move(runtime, running[0], Status.QUEUED, Status.DISPATCHED)
    move(runtime, running[1], Status.QUEUED, Status.DISPATCHED, Status.RUNNING)
    finished = [make_job(runtime, a, T0 + 10), make_job(runtime, b, T0 + 11)]
    move(runtime, finished[0], Status.QUEUED, Status.DISPATCHED, Status.RUNNING,
         Status.SUCCEEDED)  # its release was lost: its lease stayed
    move(runtime, finished[1], Status.QUEUED, Status.CANCELLED)  # its index entry stayed
    for job in (leased, *running, finished[0]):
        index.cancel(job.id)
        assert index.restore_lease(indexed(job), ttl_s=60, now=T0)
    uncommitted = IndexedJob(job_id=new_job_id(NOW - 1), tenant=b, tier="standard",
                             order_key=NOW + 100)
    leftover = IndexedJob(job_id=new_job_id(T0), tenant=b, tier="standard", order_key=T0 + 0.5)
    for entry in (uncommitted, leftover):
        assert index.admit(entry, bound=1000).accepted
    return Scene(queued=queued, leased=leased, delayed=delayed, running=running, finished=finished,
                 capped_tenant=capped, capped_waiting=capped_waiting,
                 uncommitted=uncommitted, leftover=leftover)


def lose_redis(runtime: Runtime) -> None:
    """Every key of this test's prefix goes, the index's and all (a flush, for this test)."""
    delete_prefixed(runtime.redis, runtime.settings.key_prefix)
    assert runtime.index.generation() is None
    assert list(runtime.index.job_ids()) == []
    register_stand_ins(runtime)  # the workers' next beat registers them again


def test_rebuild_restores_queue_order_leases_and_caps(runtime: Runtime) -> None:
    scene = build_scene(runtime)
    index = runtime.index
    waiting = [*scene.queued, scene.leased, scene.capped_waiting]
    lose_redis(runtime)
    # The API admits the uncommitted job again after the flush (it is retrying its commit).
    assert index.admit(scene.uncommitted, bound=1000).accepted

    stats = rebuild(runtime, NOW)

    assert (stats.queued, stats.leased, stats.released) == (len(waiting) + 1, 2, 0)
    assert (stats.removed, stats.kept_uncommitted) == (0, 1)
    by_key = sorted(waiting, key=lambda job: (job.order_key, job.id))
    assert [index.position(job.id) for job in by_key] == list(range(len(by_key)))
    assert index.position(scene.delayed.id) is None  # waiting out its backoff
    assert index.tenant_queued(scene.delayed.tenant_id) == 4  # 3 queued + the delayed one
    assert index.position(scene.uncommitted.job_id) == len(by_key)
    assert index.tenant_inflight(scene.capped_tenant) == 2
    assert index.inflight() == 2  # the running ones: the queued row's lost lease is not back
    assert index.entries_of([scene.leased.id]) == {
        scene.leased.id: Entry(job_id=scene.leased.id, attempt=1, leased=False)
    }
    assert index.expire_due(now=T0 - 100 + 3600) == [indexed(scene.queued[-1])]

    publisher = RecordingPublisher()
    Dispatcher(runtime, publisher).run_once(NOW)

    # The capped tenant is at its cap of 2: its job stays queued although it is first. The
    # uncommitted job goes too, last: its worker's start finds no row and puts it back.
    assert scene.capped_waiting.id not in publisher.sent
    assert publisher.sent == [job.id for job in sorted(
        [*scene.queued[:-1], scene.leased], key=lambda job: job.order_key)
    ] + [scene.uncommitted.job_id]
    assert index.position(scene.capped_waiting.id) == 0


def test_rebuild_removes_entries_of_finished_jobs_and_old_leftovers(runtime: Runtime) -> None:
    scene = build_scene(runtime)
    index = runtime.index

    stats = rebuild(runtime, NOW)  # Redis kept its data: only the stale entries go

    assert stats.removed == 3  # the succeeded job's lease, the cancelled job, the leftover
    assert stats.kept_uncommitted == 1
    ids = set(index.job_ids())
    assert {job.id for job in scene.finished} & ids == set()
    assert scene.leftover.job_id not in ids
    assert scene.uncommitted.job_id in ids
    assert index.tenant_inflight(scene.finished[0].tenant_id) == 0
    # A lease of a queued row is kept: its worker may be starting it right now.
    assert index.entries_of([scene.leased.id]) == {
        scene.leased.id: Entry(job_id=scene.leased.id, attempt=1, leased=True)
    }


def test_a_lease_of_a_live_worker_keeps_its_later_expiry(runtime: Runtime) -> None:
    scene = build_scene(runtime)
    index = runtime.index
    lose_redis(runtime)
    rebuild(runtime, NOW)
    assert index.renew(scene.running[1].id, attempt=1, ttl_s=100, now=NOW)  # its worker renews

    rebuild(runtime, NOW + 1)

    assert [lease.job_id for lease in index.reap(now=NOW + 1 + LEASE_TTL_S)] == [
        scene.running[0].id  # nobody renewed it: a dead worker's job comes back
    ]
    assert index.tenant_inflight(scene.capped_tenant) == 1


def test_a_job_that_finished_after_the_loss_gets_no_lease(runtime: Runtime) -> None:
    scene = build_scene(runtime)
    lose_redis(runtime)
    move(runtime, scene.running[1], Status.RUNNING, Status.SUCCEEDED)  # its release found none

    stats = rebuild(runtime, NOW)

    assert (stats.leased, stats.released) == (1, 0)
    assert runtime.index.tenant_inflight(scene.capped_tenant) == 1


def test_rebuild_twice_is_idempotent(runtime: Runtime) -> None:
    scene = build_scene(runtime)
    index = runtime.index
    lose_redis(runtime)
    first = rebuild(runtime, NOW)
    everything = [*scene.queued, scene.leased, scene.delayed, scene.capped_waiting, *scene.running]
    before = snapshot(index, everything, scene)

    second = rebuild(runtime, NOW)

    assert second == first
    assert snapshot(index, everything, scene) == before


def snapshot(index: Any, jobs: list[Job], scene: Scene) -> dict[str, Any]:
    return {
        "positions": [index.position(job.id) for job in jobs],
        "ids": sorted(index.job_ids()),
        "inflight": index.inflight(),
        "capped": index.tenant_inflight(scene.capped_tenant),
        "depth": index.tier_depths(["standard"]),
    }


def test_tierq_repair_rebuilds_and_prints_what_it_did(
    runtime: Runtime, redis_server: RedisServer, key_prefix: str
) -> None:
    scene = build_scene(runtime)
    lose_redis(runtime)
    env = {
        "TIERQ_DATABASE_URL": runtime.settings.resolved_database_url(),
        "TIERQ_REDIS_URL": redis_server.url,
        "TIERQ_KEY_PREFIX": key_prefix,
    }

    result = CliRunner().invoke(build_app(), ["repair"], env=env)

    assert result.exit_code == 0, result.output
    assert "index rebuilt from SQL" in result.output
    assert runtime.index.tenant_inflight(scene.capped_tenant) == 2
    assert runtime.index.position(scene.capped_waiting.id) == 0


def test_tierq_repair_refuses_while_a_dispatcher_leads_unless_forced(
    runtime: Runtime, redis_server: RedisServer, key_prefix: str
) -> None:
    scene = build_scene(runtime)
    runtime.index.release(scene.running[0].id)  # a lease lost: repair would restore it
    token = runtime.index.acquire_leadership("live-dispatcher", ttl_s=60, now=NOW)
    assert token is not None
    env = {
        "TIERQ_DATABASE_URL": runtime.settings.resolved_database_url(),
        "TIERQ_REDIS_URL": redis_server.url,
        "TIERQ_KEY_PREFIX": key_prefix,
    }

    refused = CliRunner().invoke(build_app(), ["repair"], env=env)

    assert refused.exit_code == 1
    assert "live-dispatcher" in refused.output and "--force" in refused.output
    assert runtime.index.tenant_inflight(scene.capped_tenant) == 1  # nothing was touched

    forced = CliRunner().invoke(build_app(), ["repair", "--force"], env=env)

    assert forced.exit_code == 0, forced.output
    assert runtime.index.tenant_inflight(scene.capped_tenant) == 2
    assert runtime.index.leader(now=NOW) == token  # the leader keeps its lock
