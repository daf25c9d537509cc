"""A job popped before its row was visible, whose INSERT commits between the dispatcher's claim
(one UPDATE) and its read of the jobs it did not claim: it is offered again at once, not
dropped (a dropped entry would wait for the reconciler's grace, ~10 s).

The race is made deterministic by committing the row, in another real transaction, right
after the claim's statement ran."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from jobs.core.domain import NewJob
from jobs.core.ids import new_job_id
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.index.base import IndexedJob
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.engine import make_engine, make_sessionmaker

pytestmark = pytest.mark.integration


@dataclass
class RecordingPublisher:
    sent: list[str] = field(default_factory=list)

    def publish(self, job_id: str, attempt: int, tier: str) -> None:
        self.sent.append(job_id)


@pytest.fixture
def runtime(pg_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(database_url=pg_url, key_prefix=key_prefix,
                             policy={"pool_concurrency": 2})
    engine = make_engine(pg_url)
    rt = Runtime(settings=settings, policy=settings.build_policy(), engine=engine,
                 sessions=make_sessionmaker(engine), redis=redis_client,
                 index=RedisIndex(redis_client, key_prefix))
    yield rt
    engine.dispose()


def test_a_row_committed_after_the_claim_is_offered_again(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = runtime.index.now()
    with runtime.sessions.begin() as session:
        tenant = tenants_sql.create_tenant(session, name="racer", tier="standard",
                                          api_key_hash="racer", now=now)
    new = NewJob(id=new_job_id(now), tenant_id=tenant.id, tier="standard", kind="sleep",
                 payload={}, order_key=runtime.policy.order_key("standard", now),
                 enqueued_at=now)
    runtime.index.requeue(IndexedJob(job_id=new.id, tenant=tenant.id, tier="standard",
                                     order_key=new.order_key))
    real_claim = jobs_sql.claim

    def claim_then_commit(session: Any, job_ids: Any, *, now: float) -> Any:
        claimed = real_claim(session, job_ids, now=now)
        with runtime.sessions.begin() as other:  # the API's INSERT lands just now
            jobs_sql.insert_job(other, new)
        return claimed

    monkeypatch.setattr(jobs_sql, "claim", claim_then_commit)
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    first = dispatcher.run_once(now)
    assert first.dropped == 0 and publisher.sent == []
    monkeypatch.setattr(jobs_sql, "claim", real_claim)
    dispatcher.run_once(now + 1.0, maintain=False)
    assert publisher.sent == [new.id]
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, new.id)
    assert job is not None and job.status is Status.DISPATCHED
