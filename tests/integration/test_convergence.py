"""Interrupted two-step changes converge: each test leaves SQL and the Redis index in a state
an interruption between two steps leaves (a reaped lease, a lost index entry, a Redis from an
older snapshot, a zombie attempt) and checks that the worker, the reaper or the reconciler
brings the job back to a state that finishes. Real PostgreSQL and Redis; time is virtual
where the dispatcher is driven by hand (``run_once``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from jobs.core.cadence import QUEUED_GRACE_S
from jobs.core.domain import Job, NewJob
from jobs.core.histograms import StartFigures
from jobs.core.ids import new_job_id
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.dispatch.rebuild import rebuild
from jobs.dispatch.reconciler import Reconciler
from jobs.dispatch.recovery import indexed
from jobs.execution.attempt import execute
from jobs.execution.leases import Heartbeat
from jobs.index.base import IndexedJob, NotLeader, Renewal
from jobs.index.keys import IndexKeys
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.direct import direct_pool
from jobs.store.engine import make_engine, make_sessionmaker
from jobs.store.rows import JOBS
from tests.integration.stand_in import stand_ins_for
from workers.handlers import JobContext, RetryableError, default_registry

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


TTL = 10.0


@dataclass
class RecordingPublisher:
    sent: list[tuple[str, int, str]] = field(default_factory=list)

    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        self.sent.append((job_id, attempt, tier))


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(
        database_url=db_url, key_prefix=key_prefix,
        policy={"pool_concurrency": 4, "lease_ttl_s": TTL, "max_attempts": 2,
                "retry_backoff_s": 5.0},
    )
    engine = make_engine(db_url)
    rt = Runtime(
        settings=settings, policy=settings.build_policy(), engine=engine,
        sessions=make_sessionmaker(engine), redis=redis_client,
        index=RedisIndex(redis_client, key_prefix),
        direct=direct_pool(engine, size=4),
    )
    yield rt
    if rt.direct is not None:
        rt.direct.close()
    engine.dispose()


@pytest.fixture
def dispatcher(runtime: Runtime) -> Dispatcher:
    return Dispatcher(runtime, RecordingPublisher())


@pytest.fixture
def tenant_id(runtime: Runtime) -> str:
    return new_tenant(runtime, "acme")


def new_tenant(runtime: Runtime, name: str) -> str:
    with runtime.sessions.begin() as s:
        return tenants_sql.create_tenant(
            s, name=name, tier="standard", api_key_hash=name, now=time.time()
        ).id


def queue_job(
    runtime: Runtime, tenant_id: str, *, at: float, index: bool = True, **kw: Any
) -> Job:
    new = NewJob(
        id=new_job_id(at), tenant_id=tenant_id, tier="standard", kind="echo", payload={},
        order_key=runtime.policy.order_key("standard", at), enqueued_at=at, **kw,
    )
    with runtime.sessions.begin() as s:
        job = jobs_sql.insert_job(s, new)
    if index:
        assert runtime.index.admit(indexed(job), bound=1000).accepted
    return job


def load(runtime: Runtime, job_id: str) -> Job:
    with runtime.sessions() as s:
        job = jobs_sql.get_job(s, job_id)
    assert job is not None
    return job


def move(runtime: Runtime, job: Job, dst: Status, now: float) -> Job:
    with runtime.sessions.begin() as s:
        assert jobs_sql.transition(
            s, job.id, src=job.status, attempt=job.attempt, dst=dst, now=now
        )
    return load(runtime, job.id)


def run(runtime: Runtime, job: Job, **kw: Any) -> str:
    registry = default_registry("")
    return execute(runtime, registry, job.id, job.attempt, worker_id="w@test", **kw)


# -- a worker that finds its lease gone hands the job back --------------------------------------


def test_a_start_after_the_lease_was_reaped_hands_the_job_back_uncharged(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    """The message waited in the broker past the lease: reap.lua took the lease, and the
    worker's start must not leave the row running with nobody accounting for it."""
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now)
    assert dispatcher.run_once(now).dispatched == 1
    runtime.index.reap(now=now + TTL + 1)  # the reaper's first step; its SQL step not yet

    assert run(runtime, load(runtime, job.id)) == "handed_back"

    back = load(runtime, job.id)
    assert (back.status, back.attempt, back.starts, back.started_at) == (
        Status.QUEUED, 2, 0, None)
    assert runtime.index.entries_of([job.id])[job.id].attempt == 2
    assert runtime.index.position(job.id) is not None
    dispatcher.run_once(now + 0.5)
    assert run(runtime, load(runtime, job.id)) == "succeeded"
    assert load(runtime, job.id).starts == 1


def test_the_reaper_never_charges_a_start_made_after_its_lease_was_taken(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reap.lua takes the lapsed lease; the worker's start (its message waited in the broker)
    commits before the reaper's SQL step reads the row. The handler never ran, and never
    will under that lease: the job goes back uncharged, and with ``max_attempts: 1`` it
    still runs, instead of ending failed uncomputed."""
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now, max_attempts=1)
    assert dispatcher.run_once(now).dispatched == 1
    reap = runtime.index.reap

    def reap_then_start(**kwargs: Any) -> Any:
        leases = reap(**kwargs)
        worker_start(runtime, job, now + TTL + 0.5)
        return leases

    monkeypatch.setattr(runtime.index, "reap", reap_then_start)
    assert_reaped_uncharged(runtime, dispatcher, job, now, monkeypatch)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # SQLite serialises writers
def test_the_reaper_never_charges_a_start_that_lands_between_its_read_and_its_cas(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same start, committed after the reaper's SQL step read the row (queued: a
    dispatch writes nothing to SQL) and before it wrote its decision, a new entry for the
    attempt it read; the worker's renewal right after its start found the lease gone and
    handed the job back as attempt 2. The reaper's entry for attempt 1, older than the
    hand-back's, must neither replace it nor run the job a second time."""
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now, max_attempts=1)
    assert dispatcher.run_once(now).dispatched == 1
    get_jobs = jobs_sql.get_jobs

    def read_then_start(*args: Any) -> Any:
        rows = get_jobs(*args)
        monkeypatch.setattr(jobs_sql, "get_jobs", get_jobs)
        assert (rows[job.id].status, rows[job.id].attempt) == (Status.QUEUED, 1)
        assert run(runtime, job, clock=lambda: now + TTL + 0.5) == "handed_back"
        return rows

    monkeypatch.setattr(jobs_sql, "get_jobs", read_then_start)
    assert_reaped_uncharged(runtime, dispatcher, job, now, monkeypatch)


def worker_start(runtime: Runtime, job: Job, at: float) -> None:
    """The worker's start of attempt 1 (queued → running), as it commits it."""
    with runtime.sessions.begin() as s:
        assert jobs_sql.start(s, job.id, attempt=1, now=at) is not None


def sent(dispatcher: Dispatcher) -> list[tuple[str, int, str]]:
    """What the dispatcher published: (job, attempt, tier), oldest first."""
    publisher = dispatcher.publisher
    assert isinstance(publisher, RecordingPublisher)
    return publisher.sent


def assert_reaped_uncharged(
    runtime: Runtime, dispatcher: Dispatcher, job: Job, now: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reaper's round (with the start landing inside it) sends the job back uncharged as
    attempt 2, which the same round leases and publishes; the first worker's own hand-back
    finds it moved on, and attempt 2 runs, once."""
    stats = dispatcher.run_once(now + TTL + 1)
    monkeypatch.undo()

    assert (stats.reaped, stats.failed) == (1, 0)
    back = load(runtime, job.id)
    assert back.status is Status.QUEUED, back.error
    assert (back.attempt, back.starts, back.started_at) == (2, 0, None)
    held = runtime.index.entries_of([job.id])[job.id]
    assert (held.attempt, held.leased) == (2, True)
    assert sent(dispatcher)[-1] == (job.id, 2, job.tier)
    with runtime.sessions.begin() as s:  # the first worker's hand-back, after its renewal
        assert not runtime.index.renew(job.id, attempt=1, ttl_s=TTL)
        assert not jobs_sql.transition(s, job.id, src=Status.RUNNING, attempt=1,
                                       dst=Status.QUEUED, now=now + TTL + 1)
    assert run(runtime, back) == "succeeded"
    assert load(runtime, job.id).starts == 1


def test_a_running_row_whose_lease_is_gone_is_recovered_by_the_reconciler(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    """The worker's start (queued → running) landed between reap.lua and the reaper's SQL
    read, and the worker died before its renewal could hand it back: nobody holds it. The
    reconciler decides it once it is no longer just started (until then its worker may be
    handing it back, and charging it would spend a start nobody ran)."""
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now)
    dispatcher.run_once(now)
    runtime.index.reap(now=now + TTL + 1)
    move(runtime, load(runtime, job.id), Status.RUNNING, now + 1)
    reconciler = Reconciler(runtime)
    if reconciler.run_once(now + 1.5).full:  # a fresh epoch's first round: a full pass,
        runtime.index.reap(now=now + 3 * TTL)  # which restores the lease; it lapses again

    # Just started: its worker may be handing it back uncharged; left for a later round.
    assert reconciler.run_once(now + 2).orphans_recovered == 0
    assert load(runtime, job.id).status is Status.RUNNING
    stats = reconciler.run_once(now + 1 + TTL)  # the worker died: decided now
    assert stats.orphans_recovered == 1

    back = load(runtime, job.id)
    assert (back.status, back.attempt, back.starts) == (Status.QUEUED, 2, 1)
    assert back.started_at is not None  # it ran: the client can tell
    assert runtime.index.position(job.id) is not None


# -- the index converges to SQL ---------------------------------------------------------------


def converge(runtime: Runtime, now: float) -> Reconciler:
    """A reconciler past its first (full) pass, so later rounds are incremental."""
    reconciler = Reconciler(runtime)
    assert reconciler.run_once(now).full
    assert not reconciler.run_once(now).full
    return reconciler


def test_a_queued_row_missing_from_the_index_is_indexed_again(
    runtime: Runtime, tenant_id: str
) -> None:
    """SQL committed, the Redis step after it failed (a requeue whose counter raised, an
    entry expire_due dropped before its row was visible, a retry's requeue)."""
    now = time.time()
    reconciler = converge(runtime, now)
    job = queue_job(runtime, tenant_id, at=now, index=False)

    assert reconciler.run_once(now + 1).reindexed == 0  # within the grace: its writer may
    stats = reconciler.run_once(now + QUEUED_GRACE_S + 1)

    assert stats.reindexed == 1 and not stats.full
    assert runtime.index.position(job.id) == 0


def test_an_entry_of_a_finished_or_unknown_job_is_removed(
    runtime: Runtime, tenant_id: str
) -> None:
    """A cancel whose SQL committed and whose index step did not; a failed submit's entry."""
    now = time.time()
    reconciler = converge(runtime, now)
    job = queue_job(runtime, tenant_id, at=now)
    move(runtime, job, Status.CANCELLED, now)
    ghost = replace(indexed(job), job_id=new_job_id(now - 3600))
    runtime.index.requeue(ghost)

    stats = reconciler.run_once(now + 1)

    assert stats.removed == 2
    assert list(runtime.index.job_ids()) == []


def test_an_entry_of_an_earlier_attempt_of_a_queued_row_is_replaced_by_the_rows(
    runtime: Runtime, tenant_id: str
) -> None:
    """A retry's row committed (attempt 2, queued), its requeue did not land: the index
    still holds attempt 1. The entry walk finds it before the walk of queued rows would."""
    now = time.time()
    reconciler = converge(runtime, now)
    job = queue_job(runtime, tenant_id, at=now)
    with runtime.sessions.begin() as session:
        session.execute(sa.update(JOBS).where(JOBS.c.id == job.id).values(attempt=2))

    stats = reconciler.run_once(now + 1)  # within the queued walk's grace

    assert stats.reindexed == 1
    assert runtime.index.entries_of([job.id])[job.id].attempt == 2


def test_an_index_restored_from_an_older_snapshot_is_rebuilt(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    """Redis came back from an older RDB/AOF (or a lagging replica): its epoch is SQL's of
    some rounds ago, so the next round passes in full and puts back what the snapshot lacks:
    the lease of the job that started since, and the entry of the one leased but not
    started (its row is queued, so it is indexed again as it is, the same attempt). The
    dispatch that follows cannot run the second one twice: its two messages carry the same
    attempt, and only one start lands."""
    now = time.time()
    reconciler = converge(runtime, now)
    old_epoch = runtime.index.generation()
    job = queue_job(runtime, tenant_id, at=now)
    waiting = queue_job(runtime, new_tenant(runtime, "globex"), at=now)
    reconciler.run_once(now + 1)
    assert dispatcher.run_once(now + 1).dispatched == 2  # leased after the snapshot
    worker_start(runtime, job, now + 1)  # ... and one of them started
    # The snapshot: the old epoch, without the leases taken since.
    runtime.index.set_generation(str(old_epoch))
    runtime.index.release(job.id)
    runtime.index.release(waiting.id)
    assert runtime.index.inflight() == 0

    assert reconciler.run_once(now + 2).full

    assert runtime.index.entries_of([job.id])[job.id].leased
    assert runtime.index.tenant_inflight(tenant_id) == 1
    entry = runtime.index.entries_of([waiting.id])[waiting.id]
    assert (entry.attempt, entry.leased) == (1, False)
    assert runtime.index.position(waiting.id) == 0
    assert not reconciler.run_once(now + 3).full

    assert dispatcher.run_once(now + 3).dispatched == 1  # published again, same attempt
    assert sent(dispatcher).count((waiting.id, 1, waiting.tier)) == 2
    assert run(runtime, load(runtime, waiting.id)) == "succeeded"
    assert run(runtime, waiting) == "stale"  # the first message, late
    done = load(runtime, waiting.id)
    assert (done.status, done.attempt, done.starts) == (Status.SUCCEEDED, 1, 1)


def test_a_rebuild_of_an_index_from_an_older_snapshot_stops_the_fast_paths_while_it_runs(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    """Until the pass has put back the leases the snapshot lacks, a worker's hand-over or a
    submit's offer would lease on an index where a running job's tenant looks under its
    cap: the sentinel is cleared first, and set again at the end."""
    now = time.time()
    dispatcher.rebuild(now)
    old_epoch = runtime.index.generation()
    dispatcher.reconciler.run_once(now)  # the epoch moves on: old_epoch is a past one
    runtime.index.set_generation(str(old_epoch))
    seen: list[str | None] = []

    dispatcher.reconciler.full_pass(
        now + 1, keep_lead=lambda: seen.append(runtime.index.generation()))

    assert seen and set(seen) == {None}
    assert runtime.index.generation() not in (None, old_epoch)


def test_the_leader_rebuilds_before_dispatching_on_an_index_from_an_older_snapshot(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    """Without waiting for the reconciler's round: the very next round must not dispatch on
    an index that lacks the leases of jobs still running (a tenant would go over its cap)."""
    now = time.time()
    dispatcher.rebuild(now)
    old_epoch = runtime.index.generation()
    dispatcher.reconciler.run_once(now)  # the epoch moves on: old_epoch is a past one
    job = queue_job(runtime, tenant_id, at=now)
    dispatcher.run_once(now, maintain=False)
    assert runtime.index.entries_of([job.id])[job.id].leased
    worker_start(runtime, job, now)
    assert not dispatcher.needs_rebuild()
    runtime.index.set_generation(str(old_epoch))  # the snapshot, taken before the dispatch
    runtime.index.release(job.id)

    assert dispatcher.needs_rebuild()
    dispatcher.rebuild(now + 1)
    assert runtime.index.entries_of([job.id])[job.id].leased
    assert runtime.index.tenant_inflight(tenant_id) == 1
    assert not dispatcher.needs_rebuild()


# -- leases belong to an attempt ----------------------------------------------------------------


def test_a_zombie_attempt_cannot_keep_the_next_attempts_lease_alive(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now)
    dispatcher.run_once(now)
    first = move(runtime, load(runtime, job.id), Status.RUNNING, now)
    ctx = JobContext(job_id=job.id, attempt=1, tenant_id=tenant_id, kind="echo")
    zombie = Heartbeat(runtime, ctx, clock=lambda: now + 100)
    # Attempt 1 was reaped and re-queued; attempt 2 is dispatched with a fresh lease.
    dispatcher.run_once(now + TTL + 1)
    assert load(runtime, job.id).attempt == 2
    dispatcher.run_once(now + TTL + 2)
    assert runtime.index.entries_of([job.id])[job.id].attempt == 2

    zombie.renew_now()

    assert ctx.lease_lost()
    assert [lease.job_id for lease in runtime.index.reap(now=now + 2 * TTL + 2)] == [job.id]
    assert first.attempt == 1


# -- attempts count starts; deadlines do not eat retries ---------------------------------------


def test_a_lease_that_lapses_before_the_start_is_not_charged(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    """No worker claimed it (or the broker lost the message), again and again: each lapsed
    lease finds the row queued, and the job is indexed again as it is (the same attempt, no
    start spent) and leased anew."""
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now, max_attempts=1)
    for round_ in range(3):
        at = now + round_ * (TTL + 1)
        stats = dispatcher.run_once(at)
        assert (stats.reaped, stats.requeued, stats.failed) == (min(round_, 1), 0, 0)
        assert load(runtime, job.id).status is Status.QUEUED
        held = runtime.index.entries_of([job.id])[job.id]
        assert (held.attempt, held.leased) == (1, True)
    assert sent(dispatcher) == [(job.id, 1, job.tier)] * 3
    after = load(runtime, job.id)
    assert (after.attempt, after.starts, after.max_attempts) == (1, 0, 1)
    assert run(runtime, after) == "succeeded"


def test_a_retry_due_after_start_by_fails_and_keeps_started_at(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now, max_wait_s=3.0, max_attempts=3)
    registry = default_registry("")

    class Flaky:
        kind = "echo"

        def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
            return payload

        def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
            raise RetryableError("try later")

    registry.register(Flaky(), replace=True)
    dispatcher.run_once(now)
    outcome = execute(runtime, registry, job.id, 1, worker_id="w@test", clock=lambda: now + 1)

    done = load(runtime, job.id)
    assert outcome == "failed" and done.status is Status.FAILED
    assert done.started_at is not None and done.starts == 1
    assert done.error is not None and "deadline" in done.error


def test_a_reaped_running_job_past_its_start_by_fails_it_does_not_expire(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now, max_wait_s=5.0)
    dispatcher.run_once(now)
    move(runtime, load(runtime, job.id), Status.RUNNING, now + 1)

    stats = dispatcher.run_once(now + TTL + 2)  # the worker died; start_by has passed

    done = load(runtime, job.id)
    assert stats.failed == 1 and done.status is Status.FAILED
    assert done.started_at is not None
    assert done.error is not None and "deadline" in done.error


# -- fencing ----------------------------------------------------------------------------------


def test_a_deposed_leader_changes_no_caps_and_rebuilds_nothing(
    runtime: Runtime, tenant_id: str
) -> None:
    now = time.time()
    index = runtime.index
    old = index.acquire_leadership("old", ttl_s=60, now=now)
    assert old is not None and index.resign_leadership(old, now=now)
    assert index.acquire_leadership("new", ttl_s=60, now=now) is not None
    job = queue_job(runtime, tenant_id, at=now, index=False)

    with pytest.raises(NotLeader):
        index.set_caps({"standard": 99}, fence=old)
    with pytest.raises(NotLeader):
        rebuild(runtime, now, fence=old)
    assert index.position(job.id) is None


def test_a_long_full_pass_renews_the_lead_between_batches(
    runtime: Runtime, tenant_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("jobs.dispatch.rebuild.BATCH", 2)
    now = time.time()
    for i in range(5):
        queue_job(runtime, tenant_id, at=now + i, index=False)
    calls = []

    rebuild(runtime, now, keep_lead=lambda: calls.append(1))

    assert len(calls) >= 3  # a check per batch of 2 queued rows, and before the strays
    assert runtime.index.tenant_queued(tenant_id) == 5


# -- every two-step change is safe to interrupt ----------------------------------------------


def break_counters(runtime: Runtime) -> None:
    """Make every metric's Redis write fail for real: each counter key holds a value of the
    wrong type, so its INCRBY, HINCRBY or ZADD answers an error (WRONGTYPE, not an integer)."""
    keys = IndexKeys(runtime.settings.key_prefix)
    runtime.redis.set(keys.leases_reclaimed, "not a number")
    for key in (keys.job_counts, keys.rejections, keys.repairs, keys.live_jobs):
        runtime.redis.set(key, "not a hash")
    for tier in runtime.policy.tiers:
        for key in (keys.wait_histogram(tier), keys.dispatch_histogram(tier),
                    keys.recent_waits(tier)):
            runtime.redis.set(key, "wrong type")


def test_failing_counters_strand_no_reaped_job(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    """Both kinds of lapsed lease go back and are leased again: one never started (its row
    queued: indexed again at the same attempt) and one whose worker died (running: a new
    attempt)."""
    now = time.time()
    unstarted = queue_job(runtime, tenant_id, at=now)
    died = queue_job(runtime, new_tenant(runtime, "globex"), at=now)
    assert dispatcher.run_once(now).dispatched == 2
    worker_start(runtime, died, now)
    break_counters(runtime)

    stats = dispatcher.run_once(now + TTL + 1)

    assert (stats.reaped, stats.requeued, stats.dispatched) == (2, 1, 2)
    for job, attempt in ((unstarted, 1), (died, 2)):
        back = load(runtime, job.id)
        assert (back.status, back.attempt) == (Status.QUEUED, attempt)  # and leased again
        held = runtime.index.entries_of([job.id])[job.id]
        assert (held.attempt, held.leased) == (attempt, True)


def test_failing_counters_stop_no_start_and_no_release(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    """The start renewal and the release count in the same script as they renew and release:
    a counter that cannot be written changes neither."""
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now)
    dispatcher.run_once(now)
    job = move(runtime, load(runtime, job.id), Status.RUNNING, now)
    break_counters(runtime)

    started = StartFigures(wait_s=1.0, dispatch_s=0.1)
    assert runtime.index.renew_checked(job.id, attempt=1, ttl_s=TTL, announce=True,
                                       start=started) is Renewal.HELD
    assert runtime.index.release(job.id, attempt=1, ring=True, outcome="succeeded") is False
    assert job.id not in runtime.index.entries_of([job.id])  # released all the same
    assert runtime.index.inflight() == 0


def test_a_cancel_request_whose_flag_was_lost_reaches_the_running_job(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    """The API recorded a cancel request in SQL and stopped before flagging the lease: the
    reconciler flags it, and the worker's next renewal tells the handler to stop."""
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now)
    dispatcher.run_once(now)
    job = move(runtime, load(runtime, job.id), Status.RUNNING, now)
    reconciler = dispatcher.reconciler  # its first round (a full pass) ran with the dispatch
    with runtime.sessions.begin() as s:
        assert jobs_sql.request_cancel(s, job.id)  # ... and no flag_cancel
    assert runtime.index.renew_checked(job.id, attempt=1, ttl_s=TTL) is Renewal.HELD

    reconciler.run_once(now + 1)

    assert runtime.index.renew_checked(job.id, attempt=1, ttl_s=TTL) is (
        Renewal.CANCEL_REQUESTED)


def test_a_cancel_whose_sql_fails_leaves_the_job_queued_and_indexed(
    runtime: Runtime, tenant_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlalchemy.exc

    from jobs.service import jobs as job_service

    now = time.time()
    job = queue_job(runtime, tenant_id, at=now)
    with runtime.sessions() as s:
        tenant = tenants_sql.get_tenant(s, tenant_id)
    assert tenant is not None

    def unreachable(*_: Any, **__: Any) -> bool:
        raise sqlalchemy.exc.OperationalError("UPDATE", {}, Exception("server closed"))

    monkeypatch.setattr("jobs.store.jobs.transition", unreachable)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        job_service.cancel(runtime, tenant, job.id)

    assert load(runtime, job.id).status is Status.QUEUED
    assert runtime.index.position(job.id) == 0  # still indexed: no orphan


def test_an_entry_expired_before_its_row_was_visible_is_found_and_expired(
    runtime: Runtime, dispatcher: Dispatcher, tenant_id: str
) -> None:
    """A submit whose commit is slower than its max_wait_s: expire_due drops the entry
    before the row can be read; the row then commits queued, and must still end."""
    now = time.time()
    dispatcher.run_once(now)  # the reconciler's first, full pass
    new = NewJob(
        id=new_job_id(now), tenant_id=tenant_id, tier="standard", kind="echo", payload={},
        order_key=runtime.policy.order_key("standard", now), enqueued_at=now, max_wait_s=1.0,
    )
    row = IndexedJob(job_id=new.id, tenant=new.tenant_id, tier=new.tier,
                     order_key=new.order_key, start_by=new.start_by)  # as the API indexes it
    assert runtime.index.admit(row, bound=1000).accepted
    dispatcher.run_once(now + 2)  # due: dropped, no row yet (the pool is free, too)
    assert runtime.index.position(new.id) is None
    with runtime.sessions.begin() as s:  # the slow commit lands
        jobs_sql.insert_job(s, new)

    dispatcher.run_once(now + 2 + QUEUED_GRACE_S + 1)  # reconciled: indexed again
    dispatcher.run_once(now + 2 + QUEUED_GRACE_S + 2)

    assert load(runtime, new.id).status is Status.EXPIRED


# -- a deposed leader's decision on a lease its successor restored ---------------------------


def test_a_deposed_leaders_reap_cannot_requeue_a_job_its_successor_gave_back_its_lease(
    runtime: Runtime, tenant_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's reap.lua took a lapsed lease, then its SQL step stalled (the database
    paused); meanwhile its lock lapsed, the worker's start landed (its message waited in the
    broker), the next leader's full pass restored the lease from the running row, and the
    worker's renewal found it held. The stalled step must not re-queue the job under the
    running worker (it would run to completion twice)."""
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now)
    old = Dispatcher(runtime, RecordingPublisher())
    old.fence = runtime.index.acquire_leadership("old", ttl_s=60, now=now)
    assert old.run_once(now).dispatched == 1
    reap = runtime.index.reap

    def reap_then_stall(**kw: Any) -> list[Any]:
        leases = reap(**kw)
        monkeypatch.setattr(runtime.index, "reap", reap)
        assert [lease.job_id for lease in leases] == [job.id]
        assert old.fence is not None and runtime.index.resign_leadership(old.fence, now=now)
        new = Dispatcher(runtime, RecordingPublisher())
        new.fence = runtime.index.acquire_leadership("new", ttl_s=60, now=now)
        worker_start(runtime, job, now + TTL + 1)
        new.rebuild(now + TTL + 1)  # restores the lease of the running row
        assert runtime.index.renew(job.id, attempt=1, ttl_s=TTL)
        return leases

    monkeypatch.setattr(runtime.index, "reap", reap_then_stall)
    with pytest.raises(NotLeader):
        old.run_once(now + TTL + 1)

    row = load(runtime, job.id)
    assert (row.status, row.attempt) == (Status.RUNNING, 1)
    assert runtime.index.renew(job.id, attempt=1, ttl_s=TTL)  # the worker keeps its lease


def test_a_deposed_leaders_reconciler_cannot_recover_an_orphan_its_successor_restored(
    runtime: Runtime, tenant_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race through the reconciler: it read a running row and found no lease, then
    stalled; the successor restored the lease and the worker renewed it."""
    now = time.time()
    job = queue_job(runtime, tenant_id, at=now)
    old = Dispatcher(runtime, RecordingPublisher())
    old.fence = runtime.index.acquire_leadership("old", ttl_s=60, now=now)
    old.rebuild(now)
    assert old.run_once(now).dispatched == 1
    running = move(runtime, load(runtime, job.id), Status.RUNNING, now)
    runtime.index.release(job.id, attempt=running.attempt)  # the lease is lost with Redis
    entries_of = runtime.index.entries_of

    def read_then_stall(job_ids: Any) -> Any:
        held = entries_of(job_ids)
        monkeypatch.setattr(runtime.index, "entries_of", entries_of)
        assert old.fence is not None and runtime.index.resign_leadership(old.fence, now=now)
        new = Dispatcher(runtime, RecordingPublisher())
        new.fence = runtime.index.acquire_leadership("new", ttl_s=60, now=now)
        new.rebuild(now + 1)
        assert runtime.index.renew(job.id, attempt=running.attempt, ttl_s=TTL)
        return held

    monkeypatch.setattr(runtime.index, "entries_of", read_then_stall)
    with pytest.raises(NotLeader):  # past the start's settling time: an orphan to decide
        old.reconciler.run_once(now + TTL, fence=old.fence)

    row = load(runtime, job.id)
    assert (row.status, row.attempt) == (Status.RUNNING, 1)
    assert runtime.index.renew(job.id, attempt=1, ttl_s=TTL)
