"""A submit indexes its job before its INSERT commits, and a dispatch reads no row: a job popped
in between reaches a worker whose start finds no row. That start puts the job back in the
queue, its place kept, and it runs once the row is there, a moment later: it is neither
dropped (it would wait for the reconciler's grace, ~10 s) nor left leased (it would wait for
its lease to lapse).

Each race is made deterministic by committing the row, in another real transaction, at the
point where the API's commit would land."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from jobs.core.cadence import UNCOMMITTED_RETRY_S
from jobs.core.domain import Job, NewJob
from jobs.core.ids import new_job_id
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.execution.attempt import execute
from jobs.execution.registry import HandlerRegistry
from jobs.index.base import IndexedJob
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.direct import direct_pool
from jobs.store.engine import make_engine, make_sessionmaker
from tests.handlers_for_tests import RecordingHandler
from tests.integration.stand_in import stand_ins_for

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


WORKER = "worker-test@host"


@dataclass
class RecordingPublisher:
    sent: list[tuple[str, int]] = field(default_factory=list)

    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        self.sent.append((job_id, attempt))


@pytest.fixture
def runtime(pg_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(database_url=pg_url, key_prefix=key_prefix,
                             policy={"pool_concurrency": 2})
    engine = make_engine(pg_url)
    rt = Runtime(settings=settings, policy=settings.build_policy(), engine=engine,
                 sessions=make_sessionmaker(engine), redis=redis_client,
                 index=RedisIndex(redis_client, key_prefix), direct=direct_pool(engine, size=4))
    yield rt
    if rt.direct is not None:
        rt.direct.close()
    engine.dispose()


@dataclass
class Race:
    """A submit caught between its index entry and its INSERT, a dispatcher and a worker."""

    runtime: Runtime
    new: NewJob
    now: float
    publisher: RecordingPublisher = field(default_factory=RecordingPublisher)
    handler: RecordingHandler = field(default_factory=RecordingHandler)

    def __post_init__(self) -> None:
        self.dispatcher = Dispatcher(self.runtime, self.publisher)
        self.registry = HandlerRegistry([self.handler])

    def commit(self) -> None:
        """The API's INSERT lands."""
        with self.runtime.sessions.begin() as other:
            jobs_sql.insert_job(other, self.new)

    def work(self, at: float) -> str:
        """The worker's handling of the last message published, its clock at ``at``."""
        job_id, attempt = self.publisher.sent[-1]
        return execute(self.runtime, self.registry, job_id, attempt, worker_id=WORKER,
                       clock=lambda: at)

    def row(self) -> Job:
        with self.runtime.sessions() as session:
            job = jobs_sql.get_job(session, self.new.id)
        assert job is not None
        return job


@pytest.fixture
def race(runtime: Runtime) -> Race:
    now = runtime.index.now()
    with runtime.sessions.begin() as session:
        tenant = tenants_sql.create_tenant(session, name="racer", tier="standard",
                                           api_key_hash="racer", now=now)
    new = NewJob(id=new_job_id(now), tenant_id=tenant.id, tier="standard", kind="record",
                 payload={}, order_key=runtime.policy.order_key("standard", now),
                 enqueued_at=now)
    assert runtime.index.admit(IndexedJob(job_id=new.id, tenant=tenant.id, tier="standard",
                                          order_key=new.order_key), bound=1000).accepted
    return Race(runtime, new, now)


def assert_runs_at_the_next_offer(race: Race) -> None:
    """Put back, not leased: offered again shortly, it runs once, this attempt's."""
    runtime = race.runtime
    assert runtime.index.inflight() == 0
    entry = runtime.index.entries_of([race.new.id]).get(race.new.id)
    assert entry is not None and not entry.leased and entry.attempt == 1
    retry_at = race.now + UNCOMMITTED_RETRY_S
    assert race.dispatcher.run_once(retry_at, maintain=False).dispatched == 1
    assert race.publisher.sent[-1] == (race.new.id, 1)

    assert race.work(retry_at) == "succeeded"

    assert race.handler.calls == [(race.new.id, 1, {})]
    job = race.row()
    assert job.status is Status.SUCCEEDED and job.attempt == 1 and job.starts == 1
    assert runtime.index.inflight() == 0


def test_a_row_committed_after_the_start_is_offered_again(race: Race) -> None:
    assert race.dispatcher.run_once(race.now).dispatched == 1  # popped: no row yet

    assert race.work(race.now) == "stale"  # the start finds no row
    race.commit()

    assert race.handler.calls == []
    assert_runs_at_the_next_offer(race)


def test_a_row_committed_between_the_start_and_its_read_starts_at_once(
    race: Race, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start's statement sees no row, the read after it does (READ COMMITTED): the job
    is queued and may start, so it is started again then and there, once: neither left
    leased (it would wait for its lease to lapse) nor put back."""
    real_start = jobs_sql.start
    starts: list[Job | None] = []

    def start_then_commit(session: Any, job_id: str, **kw: Any) -> Job | None:
        started = real_start(session, job_id, **kw)
        if not starts:
            race.commit()
        starts.append(started)
        return started

    assert race.dispatcher.run_once(race.now).dispatched == 1
    monkeypatch.setattr(jobs_sql, "start", start_then_commit)

    outcome = race.work(race.now)

    assert outcome == "succeeded"
    assert starts[0] is None and starts[1] is not None and len(starts) == 2
    assert race.handler.calls == [(race.new.id, 1, {})]
    job = race.row()
    assert job.status is Status.SUCCEEDED and job.attempt == 1 and job.starts == 1
    assert race.runtime.index.inflight() == 0
    assert race.runtime.index.entries_of([race.new.id]) == {}
