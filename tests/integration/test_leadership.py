"""Dispatcher leadership: one leader at a time, fenced out once deposed, handed over on resign.

The lock's TTL runs on Redis's own clock, so the Redis tests use short TTLs and poll with a
deadline; the in-memory twin runs on the ``now`` passed in, so its tests drive time exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import redis

from jobs.core.domain import NewJob
from jobs.core.ids import new_job_id
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher, DispatchStats
from jobs.dispatch.leadership import Leadership
from jobs.dispatch.loop import lead_once
from jobs.index import IndexedJob, MemoryIndex, NotLeader, RedisIndex
from jobs.index.base import Entry
from jobs.index.keys import IndexKeys
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.engine import make_engine, make_sessionmaker
from tests.integration.stand_in import register_stand_ins, stand_ins_for
from tests.services import delete_prefixed

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


T = TypeVar("T")
SHORT_TTL_S = 0.3


def poll(predicate: Callable[[], T | None], timeout: float = 10.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def index(redis_client: redis.Redis, key_prefix: str) -> RedisIndex:
    return RedisIndex(redis_client, key_prefix)


def contenders(index: Any, n: int, ttl_s: float) -> list[Leadership]:
    return [Leadership(index, ttl_s=ttl_s, owner=f"d{i}") for i in range(n)]


# -- the lock, on Redis --


def test_one_leader_among_three_contenders(index: RedisIndex) -> None:
    now = time.time()
    dispatchers = contenders(index, 3, ttl_s=60)
    tokens = [d.tick(now) for d in dispatchers]
    leaders = [d for d, token in zip(dispatchers, tokens, strict=True) if token]
    assert len(leaders) == 1
    assert index.leader(now=now) == leaders[0].token
    for _ in range(3):  # more turns change nothing
        assert [bool(d.tick(time.time())) for d in dispatchers] == [bool(t) for t in tokens]


def test_renew_extends_only_the_holders_lock(
    index: RedisIndex, redis_client: redis.Redis, key_prefix: str
) -> None:
    leader_key = IndexKeys(key_prefix).leader
    ttl_s = 30  # long enough never to lapse during the test, however slow the machine
    token = index.acquire_leadership("a", ttl_s=ttl_s, now=time.time())
    assert token is not None
    assert index.renew_leadership("0:intruder", ttl_s=600, now=time.time()) is False
    assert int(redis_client.pttl(leader_key)) <= ttl_s * 1000
    assert index.renew_leadership(token, ttl_s=600, now=time.time()) is True
    assert int(redis_client.pttl(leader_key)) > ttl_s * 1000


def test_the_leader_renews_in_time_and_keeps_the_lock(index: RedisIndex) -> None:
    # Real time against Redis's own expiry: a TTL long enough that a stall of this (shared)
    # machine shorter than two thirds of it cannot make the leader miss its renewal.
    ttl_s = 1.5
    leader, standby = contenders(index, 2, ttl_s=ttl_s)
    assert leader.tick(time.time()) is not None
    until = time.monotonic() + 2 * ttl_s
    while time.monotonic() < until:  # both take their turns, as their loops would
        assert leader.tick(time.time()) is not None
        assert standby.tick(time.time()) is None
        time.sleep(leader.wait_s)


def test_a_standby_takes_over_once_the_leader_stops_renewing(index: RedisIndex) -> None:
    leader, standby = contenders(index, 2, ttl_s=SHORT_TTL_S)
    old = leader.tick(time.time())
    assert old is not None and standby.tick(time.time()) is None

    new = poll(lambda: standby.tick(time.time()))  # the leader is silent: its lock lapses

    assert new != old
    assert leader.tick(time.time()) is None  # its renewal is refused: it stands by
    assert leader.token is None


def test_resign_hands_over_at_once(index: RedisIndex) -> None:
    leader, standby = contenders(index, 2, ttl_s=600)
    assert leader.tick(time.time()) is not None
    assert standby.tick(time.time()) is None
    assert leader.resign(time.time()) is True
    assert standby.tick(time.time()) is not None
    assert leader.resign(time.time()) is False  # no longer leading: nothing to give up


def test_a_deposed_leader_cannot_dispatch(index: RedisIndex) -> None:
    index.requeue(indexed_job("j1"))
    leader, standby = contenders(index, 2, ttl_s=SHORT_TTL_S)
    old = leader.tick(time.time())
    assert old is not None
    poll(lambda: standby.tick(time.time()))

    with pytest.raises(NotLeader):
        index.dispatch(1, now=time.time(), lease_ttl_s=30, fence=old)
    with pytest.raises(NotLeader):
        index.reap(now=time.time() + 60, fence=old)
    assert index.inflight() == 0
    assert [lease.job_id for lease in
            index.dispatch(1, now=time.time(), lease_ttl_s=30, fence=standby.token)] == ["j1"]


def indexed_job(job_id: str) -> IndexedJob:
    return IndexedJob(job_id=job_id, tenant="t", tier="standard", order_key=0.0)


# -- the lock, on the twin: time driven exactly --


def test_twin_renews_every_third_of_the_ttl_and_hands_over_at_expiry() -> None:
    index = MemoryIndex()
    leader, standby = contenders(index, 2, ttl_s=3.0)
    assert leader.tick(0.0) is not None
    assert leader.tick(0.9) is not None  # not due: no renewal, the lock ends at 3.0
    assert standby.tick(2.9) is None
    assert leader.tick(1.0) is not None  # due: renewed until 4.0
    assert standby.tick(3.5) is None
    assert standby.tick(4.0) is not None  # the leader fell silent at 1.0
    assert leader.tick(4.0) is None
    with pytest.raises(NotLeader):
        index.dispatch(1, now=4.0, lease_ttl_s=1, fence="1:d0")


# -- the dispatcher's turn: rebuild first, fenced afterwards --


@dataclass
class RecordingPublisher:
    sent: list[tuple[str, int]] = field(default_factory=list)

    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        self.sent.append((job_id, attempt))


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(
        database_url=db_url, key_prefix=key_prefix,
        policy={"pool_concurrency": 4, "lease_ttl_s": 30, "leader_ttl_s": SHORT_TTL_S},
    )
    engine = make_engine(db_url)
    yield Runtime(
        settings=settings, policy=settings.build_policy(), engine=engine,
        sessions=make_sessionmaker(engine), redis=redis_client,
        index=RedisIndex(redis_client, key_prefix),
    )
    engine.dispose()


def queue_jobs(runtime: Runtime, n: int) -> list[str]:
    """Jobs committed to SQL only: the index knows nothing of them (as after a flush)."""
    now = time.time()
    with runtime.sessions.begin() as s:
        tenants = [
            tenants_sql.create_tenant(s, name=f"t{i}", tier="standard", api_key_hash=f"h{i}",
                                     now=now)
            for i in range(n)
        ]
        jobs = [
            jobs_sql.insert_job(s, NewJob(
                id=new_job_id(now - 60), tenant_id=t.id, tier="standard", kind="echo",
                payload={}, order_key=now + i, enqueued_at=now + i,
            ))
            for i, t in enumerate(tenants)
        ]
    return [job.id for job in jobs]


def test_a_new_leader_rebuilds_before_its_first_round_and_after_a_loss(
    runtime: Runtime, redis_client: redis.Redis, key_prefix: str
) -> None:
    job_ids = queue_jobs(runtime, 2)
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    leadership = Leadership(runtime.index, ttl_s=60)

    assert lead_once(dispatcher, leadership, time.time()) == DispatchStats(rebuilt=True)
    assert publisher.sent == []
    stats = lead_once(dispatcher, leadership, time.time())
    assert stats is not None and stats.dispatched == 2
    assert sorted(publisher.sent) == sorted((job_id, 1) for job_id in job_ids)
    running, waiting = job_ids  # a worker starts the first; the other's message is in transit
    with runtime.sessions.begin() as s:
        assert jobs_sql.start(s, running, attempt=1, now=time.time()) is not None

    delete_prefixed(redis_client, key_prefix)  # Redis lost everything, the lock included
    register_stand_ins(runtime)  # the workers' next beat registers them again
    # Its lock went too: the rebuild's fenced writes are refused, and it steps down.
    assert lead_once(dispatcher, leadership, time.time()) is None
    assert runtime.index.inflight() == 0
    # It takes the lock again and rebuilds before anything else: the running job holds its
    # lease again; the one still queued in SQL, whose lease went with Redis, is queued again.
    assert lead_once(dispatcher, leadership, time.time()) == DispatchStats(rebuilt=True)
    assert runtime.index.inflight() == 1
    assert runtime.index.entries_of(job_ids) == {
        running: Entry(job_id=running, attempt=1, leased=True),
        waiting: Entry(job_id=waiting, attempt=1, leased=False),
    }
    stats = lead_once(dispatcher, leadership, time.time())
    assert stats is not None and stats.dispatched == 1
    # The running job is not dispatched again; the queued one is, as the same attempt.
    assert sorted(publisher.sent) == sorted([(running, 1), (waiting, 1), (waiting, 1)])
    # Two messages of one attempt: the first start runs it, the other finds it started.
    with runtime.sessions.begin() as s:
        assert jobs_sql.start(s, waiting, attempt=1, now=time.time()) is not None
        assert jobs_sql.start(s, waiting, attempt=1, now=time.time()) is None


def test_a_deposed_dispatcher_dispatches_nothing_and_stands_by(
    runtime: Runtime, redis_client: redis.Redis, key_prefix: str
) -> None:
    [job_id] = queue_jobs(runtime, 1)
    old_publisher, new_publisher = RecordingPublisher(), RecordingPublisher()
    old = Dispatcher(runtime, old_publisher)
    new = Dispatcher(runtime, new_publisher)
    old_lead, new_lead = contenders(runtime.index, 2, ttl_s=60)
    assert lead_once(old, old_lead, time.time()) == DispatchStats(rebuilt=True)
    assert lead_once(new, new_lead, time.time()) is None  # standing by
    # The old leader's lock is lost (it lapsed during a pause) and the standby takes it; the
    # old one has not noticed: its next renewal is not due for a while.
    redis_client.delete(IndexKeys(key_prefix).leader)
    assert new_lead.tick(time.time()) is not None

    assert lead_once(old, old_lead, time.time()) is None  # fenced out: it steps down

    assert old_lead.token is None
    assert old_publisher.sent == []
    assert runtime.index.inflight() == 0
    assert lead_once(new, new_lead, time.time()) == DispatchStats(rebuilt=True)
    stats = lead_once(new, new_lead, time.time())
    assert stats is not None and stats.dispatched == 1
    assert new_publisher.sent == [(job_id, 1)]
    # Leased once, by the new leader; the row stays queued until a worker starts it.
    assert runtime.index.entries_of([job_id]) == {
        job_id: Entry(job_id=job_id, attempt=1, leased=True)
    }
    with runtime.sessions() as s:
        job = jobs_sql.get_job(s, job_id)
    assert job is not None and (job.status, job.attempt) == (Status.QUEUED, 1)
