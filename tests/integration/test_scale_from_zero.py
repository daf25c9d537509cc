"""A pool whose configured capacity admits work before any of its workers is live (scale from
zero, or a worker still loading its models), on real SQL and a real Redis index.

Admission keeps accepting against the configured ``pool_concurrency``, but no lease is taken
into slots that are not there: neither a submit's own ``offer`` nor the dispatcher leases
while the pool has no live worker, so every job keeps its place, and once a worker
registers they start in order, premium before free. A lease whose job no worker started
(its worker gone) is back at its place as soon as it lapses: same attempt, nothing charged,
no backoff. The publisher is the one seam replaced (a recorder).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from jobs.admission.submit import Submission, submit
from jobs.core.domain import Tenant
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.execution.registry import HandlerRegistry
from jobs.index.base import TierPush, TierQueue
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.engine import make_engine, make_sessionmaker
from tests.handlers_for_tests import RecordingHandler
from tests.integration.test_dispatcher import RecordingPublisher

pytestmark = pytest.mark.integration

TTL_S = 10.0
# A message as kombu's Redis transport stores it, less its own fields (``push.lua``).
ENVELOPE = json.dumps({
    "body": {"callbacks": None}, "content-type": "application/json",
    "headers": {"task": "tierq.run_job", "id": "", "root_id": "", "argsrepr": ""},
    "properties": {"correlation_id": "", "delivery_tag": "",
                   "delivery_info": {"exchange": "", "routing_key": "tier.free"}},
})


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(database_url=db_url, key_prefix=key_prefix,
                             policy={"pool_concurrency": 2, "lease_ttl_s": TTL_S})
    engine = make_engine(db_url)
    rt = Runtime(settings=settings, policy=settings.pool_policy("default"), engine=engine,
                 sessions=make_sessionmaker(engine), redis=redis_client,
                 index=RedisIndex(redis_client, key_prefix))
    # Rebuilt by a leader, and a worker of an earlier run left how a submit pushes its job's
    # message itself: the submit's own offer could lease, were a slot free.
    rt.index.set_generation("1")
    rt.index.set_tier_push(TierPush(envelope=ENVELOPE, queues=tuple(
        TierQueue(tier=tier, name=f"tier.{tier}", key=f"{key_prefix}tier.{tier}")
        for tier in settings.tiers)))
    yield rt
    engine.dispose()


def tenant(runtime: Runtime, name: str, tier: str) -> Tenant:
    with runtime.sessions.begin() as s:
        made = tenants_sql.create_tenant(s, name=name, tier=tier, api_key_hash=name,
                                         now=runtime.clock())
        updated = tenants_sql.update_tenant(s, made.id, cap=2, max_queued=10)
        assert updated is not None
        return updated


def test_nothing_is_leased_to_a_pool_with_no_live_worker_and_its_jobs_start_in_order(
    runtime: Runtime,
) -> None:
    registry = HandlerRegistry([RecordingHandler()])
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    free, premium = tenant(runtime, "thrifty", "free"), tenant(runtime, "paying", "premium")

    def post(who: Tenant) -> str:
        done = submit(runtime, registry, who, Submission(kind="record", payload={}))
        return done.progress.job.id

    frees = [post(free) for _ in range(2)]  # accepted: the configured capacity admits them
    premiums = [post(premium) for _ in range(2)]
    now = runtime.clock()
    dispatcher.run_once(now)

    # No live worker: nothing leased, by the submits or the dispatcher; all wait in order.
    assert runtime.index.inflight() == 0 and publisher.sent == []
    assert [runtime.index.position(j) for j in [*premiums, *frees]] == [0, 1, 2, 3]

    runtime.index.register_worker("w1@host", slots=2, ttl_s=60.0, now=now)
    dispatcher.run_once(now + 0.1)
    assert [m[0] for m in publisher.sent] == premiums  # premium first, into live slots only
    assert runtime.index.inflight() == 2

    # Its worker goes before starting them: the leases lapse, and the jobs are back at their
    # places at once, the same attempt, nothing charged, no backoff; still nothing leased.
    runtime.index.unregister_worker("w1@host")
    stats = dispatcher.run_once(now + 0.2 + TTL_S)
    assert stats.reaped == 2 and runtime.index.inflight() == 0
    assert [runtime.index.position(j) for j in [*premiums, *frees]] == [0, 1, 2, 3]
    with runtime.sessions() as s:
        rows = [jobs_sql.get_job(s, j) for j in premiums]
    assert [(r.status, r.attempt, r.starts, r.not_before) for r in rows if r is not None] == [
        (Status.QUEUED, 1, 0, None)] * 2

    runtime.index.register_worker("w2@host", slots=2, ttl_s=60.0, now=now + 0.3 + TTL_S)
    dispatcher.run_once(now + 0.3 + TTL_S)
    assert [m[0] for m in publisher.sent[2:]] == premiums
