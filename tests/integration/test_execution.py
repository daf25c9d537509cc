"""The worker side of a job (``jobs.execution.attempt.execute``) against real SQL and a real Redis
index: each test does the dispatcher's part by hand (admit, dispatch, CAS queued →
dispatched), then calls ``execute`` as the Celery task would."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from jobs.core.domain import Job, NewJob, Tenant
from jobs.core.states import Status
from jobs.execution.attempt import Heartbeat, execute
from jobs.index import wake
from jobs.index.base import IndexedJob
from jobs.index.keys import IndexKeys
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.direct import direct_pool
from jobs.store.engine import make_engine, make_sessionmaker
from jobs.store.models import JobRow
from tests.handlers_for_tests import (
    BlockingHandler,
    FlakyHandler,
    GateHandler,
    RecordingHandler,
    UnserialisableHandler,
)
from workers.handlers import HandlerRegistry, JobContext, default_registry

pytestmark = pytest.mark.integration

LEASE_TTL_S = 1.5
BACKOFF_S = 2.0
WORKER = "worker-test@host"


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(
        database_url=db_url,
        key_prefix=key_prefix,
        policy={"lease_ttl_s": LEASE_TTL_S, "retry_backoff_s": BACKOFF_S},
    )
    engine = make_engine(db_url)
    index = RedisIndex(redis_client, key_prefix)
    index.set_caps({name: 10 for name in settings.tiers})
    rt = Runtime(
        settings=settings,
        policy=settings.build_policy(),
        engine=engine,
        sessions=make_sessionmaker(engine),
        redis=redis_client,
        index=index,
        direct=direct_pool(engine, size=4),
    )
    yield rt
    if rt.direct is not None:
        rt.direct.close()
    engine.dispose()


@pytest.fixture
def tenant(runtime: Runtime) -> Tenant:
    with runtime.sessions.begin() as session:
        return tenants_sql.create_tenant(
            session, name="acme", tier="standard", api_key_hash="hash", now=time.time()
        )


@pytest.fixture
def registry() -> HandlerRegistry:
    return default_registry("")


def submit(runtime: Runtime, tenant: Tenant, kind: str, payload: dict[str, Any], **kw: Any) -> Job:
    """What the API does: insert the job, then index it."""
    now = time.time()
    new = NewJob(
        tenant_id=tenant.id, tier=tenant.tier, kind=kind, payload=payload,
        order_key=runtime.policy.order_key(tenant.tier, now), enqueued_at=now, **kw,
    )
    with runtime.sessions.begin() as session:
        job = jobs_sql.insert_job(session, new)
    indexed = IndexedJob(
        job_id=job.id, tenant=tenant.id, tier=job.tier, order_key=job.order_key,
        start_by=job.start_by,
    )
    assert runtime.index.admit(indexed, bound=1000).accepted
    return job


def dispatch(runtime: Runtime, job: Job, *, now: float | None = None) -> Job:
    """What the dispatcher does: lease the job, then CAS queued → dispatched."""
    now = time.time() if now is None else now
    leases = runtime.index.dispatch(1, now=now, lease_ttl_s=LEASE_TTL_S)
    assert [lease.job_id for lease in leases] == [job.id]
    with runtime.sessions.begin() as session:
        current = jobs_sql.get_job(session, job.id)
        assert current is not None
        assert jobs_sql.transition(
            session, job.id, src=Status.QUEUED, attempt=current.attempt,
            dst=Status.DISPATCHED, now=now,
        )
    return load(runtime, job.id)


def load(runtime: Runtime, job_id: str) -> Job:
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None
    return job


def request_cancel(runtime: Runtime, job_id: str, *, flag: bool = True) -> None:
    """As the API does: the request in SQL (the commit point), then the flag on the lease,
    which is how a running job learns of it. ``flag=False``: the API stopped in between."""
    with runtime.sessions.begin() as session:
        assert jobs_sql.request_cancel(session, job_id)
    if flag:
        runtime.index.flag_cancel(job_id)


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


class Background:
    """``execute`` in a thread, as a worker slot runs it."""

    def __init__(self, call: Callable[[], str]) -> None:
        self.outcome: str | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], str]) -> None:
        try:
            self.outcome = call()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 30.0) -> str | None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "execute did not return"
        if self.error is not None:
            raise self.error
        return self.outcome


def rung(runtime: Runtime) -> bool:
    return bool(runtime.redis.llen(wake.doorbell_key(runtime.settings.key_prefix)))


def assert_released(runtime: Runtime, job: Job) -> None:
    assert runtime.index.inflight() == 0
    assert runtime.index.tenant_inflight(job.tenant_id) == 0
    assert rung(runtime)


# -- ending well or badly --------------------------------------------------------------------


def test_echo_succeeds_with_its_result_stored(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    job = dispatch(runtime, submit(runtime, tenant, "echo", {"hello": ["world", 1]}))

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "succeeded"

    done = load(runtime, job.id)
    assert done.status is Status.SUCCEEDED
    assert done.result == {"hello": ["world", 1]}
    assert done.error is None
    assert done.started_at is not None and done.finished_at is not None
    assert_released(runtime, job)


def test_the_start_commits_without_waiting_for_the_disk_and_the_ending_waits(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start promises nothing to a client (a crash that loses it runs the job again and
    records one completion); an ending does. On PostgreSQL the start's connection says
    ``synchronous_commit = off``, the ending's the server's default."""
    if runtime.direct is None:
        pytest.skip("SQLite: no direct connections, every commit is the engine's")
    seen: list[tuple[str, str]] = []
    connection = type(runtime.direct).connection

    def recording(pool: Any, *, durable: bool = True) -> Any:
        context = connection(pool, durable=durable)

        class Recorded:
            def __enter__(self) -> Any:
                direct = context.__enter__()
                mode = direct._raw.execute("SHOW synchronous_commit").fetchone()[0]
                seen.append(("durable" if durable else "quick", mode))
                return direct

            def __exit__(self, *exc: Any) -> Any:
                return context.__exit__(*exc)

        return Recorded()

    job = dispatch(runtime, submit(runtime, tenant, "echo", {"n": 1}))
    monkeypatch.setattr(type(runtime.direct), "connection", recording)

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "succeeded"

    assert seen[0] == ("quick", "off")  # the start
    assert seen[-1] == ("durable", "on")  # the ending
    assert load(runtime, job.id).status is Status.SUCCEEDED


def test_an_ended_attempt_leaves_no_cycle_for_the_garbage_collector(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    """Each attempt's objects (its context, heartbeat, events, locks) are freed when it ends,
    by reference counting: none is left for the cyclic collector, whose full passes over a
    worker's heap stall every slot."""
    jobs = [dispatch(runtime, submit(runtime, tenant, "echo", {"n": n})) for n in range(3)]
    assert execute(runtime, registry, jobs[0].id, 1, worker_id=WORKER) == "succeeded"  # warm
    gc.collect()
    gc.disable()
    try:
        for job in jobs[1:]:
            assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "succeeded"
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(thing).__qualname__ for thing in gc.garbage
                if type(thing).__module__.startswith("jobs.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []


def test_a_failing_handler_ends_failed_with_the_error_text(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    job = dispatch(runtime, submit(runtime, tenant, "sleep", {"seconds": 0, "fail": True}))

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "failed"

    done = load(runtime, job.id)
    assert done.status is Status.FAILED
    assert done.error is not None and done.error.startswith("RuntimeError: ")
    assert "Traceback" not in done.error
    assert done.result is None
    assert_released(runtime, job)


def test_a_result_json_cannot_hold_fails_the_job(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    registry.register(UnserialisableHandler())
    job = dispatch(runtime, submit(runtime, tenant, "unserialisable", {}))

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "failed"

    done = load(runtime, job.id)
    assert done.status is Status.FAILED
    assert done.error is not None and "not JSON-serialisable" in done.error
    assert_released(runtime, job)


class NulHandler:
    """Ends with a U+0000 in what the worker must store: the result, or the error text."""

    kind = "nul"

    def __init__(self) -> None:
        self.calls = 0

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        self.calls += 1
        if payload.get("raise"):
            raise ValueError("bad byte \x00 here")
        return {"text": "page one\x00page two"}


@pytest.mark.parametrize("raises", [False, True], ids=["result", "error"])
def test_an_outcome_holding_a_nul_ends_the_attempt_once_recorded(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, raises: bool
) -> None:
    """PostgreSQL cannot store U+0000 in text or JSON: the job still ends, once, with what
    could be stored, and is never run again by the reaper."""
    handler = NulHandler()
    registry.register(handler)
    job = dispatch(runtime, submit(runtime, tenant, "nul", {"raise": raises}))

    outcome = execute(runtime, registry, job.id, 1, worker_id=WORKER)

    done = load(runtime, job.id)
    assert outcome == done.status.value and done.terminal
    assert (done.starts, handler.calls) == (1, 1)
    if done.status is Status.FAILED:
        assert done.error is not None and "\x00" not in done.error
        assert ("ValueError: bad byte" in done.error) if raises else (
            "could not be stored" in done.error)
    else:
        assert not raises and done.result == {"text": "page one\x00page two"}
    assert_released(runtime, job)


class NulProgressHandler:
    """Reports progress with a U+0000 in its message, then succeeds."""

    kind = "nul.progress"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        ctx.progress(0.5, "page one\x00page two")
        return {"pages": 2}


def test_a_nul_in_a_progress_message_keeps_the_result(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    """The last progress report is stored with the ending: its text is cleaned where it
    enters, so the result it travels with is kept (PostgreSQL holds no U+0000)."""
    registry.register(NulProgressHandler())
    job = dispatch(runtime, submit(runtime, tenant, "nul.progress", {}))

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "succeeded"

    done = load(runtime, job.id)
    assert (done.status, done.result, done.error_type) == (Status.SUCCEEDED, {"pages": 2}, None)
    assert done.progress is not None and done.progress["message"] == "page one\\x00page two"
    assert_released(runtime, job)


def test_a_kind_this_worker_does_not_know_goes_back_uncharged_and_routes_the_pool(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    """A worker without the kind's handler (a rolling deploy, a host without the package):
    nothing ran, so the job goes back to its place uncharged, never failed, and the pool is
    routed by kind from then on: its next attempt reaches only a worker that runs the kind
    (``jobs.dispatch.routing``)."""
    job = dispatch(runtime, submit(runtime, tenant, "transcode", {}))

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "handed_back"

    again = load(runtime, job.id)
    assert (again.status, again.attempt, again.starts, again.error) == (
        Status.QUEUED, 2, 0, None)
    assert again.order_key == job.order_key and runtime.index.position(job.id) == 0
    assert runtime.index.kinds_waiting() == {"transcode"}
    leases, routed = runtime.index.dispatch_routed(1, now=time.time(), lease_ttl_s=LEASE_TTL_S)
    assert routed and [(lease.job_id, lease.attempt) for lease in leases] == [(job.id, 2)]


# -- stale and duplicate messages ------------------------------------------------------------


def test_a_duplicate_message_is_a_no_op(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    recorder = RecordingHandler()
    registry.register(recorder)
    job = dispatch(runtime, submit(runtime, tenant, "record", {}))
    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "succeeded"
    done = load(runtime, job.id)

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "stale"

    assert load(runtime, job.id) == done
    assert len(recorder.calls) == 1


def test_a_duplicated_message_never_takes_another_workers_start_for_its_own(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 1 starts the attempt and runs it; a copy of the same message reaches worker 2,
    whose first start fails on an SQL blip. Its retry's "did my start land?" read-back must
    not find worker 1's start: the attempt runs once."""
    gate = CopyGateHandler()
    registry.register(gate)
    job = dispatch(runtime, submit(runtime, tenant, "gate", {}))
    first = Background(lambda: execute(runtime, registry, job.id, 1, worker_id="w1@host"))
    assert gate.started.wait(10)
    start, blips = jobs_sql.start, [1]

    def blip_once(*args: Any, **kwargs: Any) -> Any:
        if blips:
            blips.pop()
            raise sa.exc.OperationalError("UPDATE jobs", {}, ConnectionError("connection reset"))
        return start(*args, **kwargs)

    monkeypatch.setattr(jobs_sql, "start", blip_once)
    second = Background(lambda: execute(runtime, registry, job.id, 1, worker_id="w2@host"))
    try:
        assert second.join() == "stale"
        assert not blips, "the copy's start met the blip"
        assert load(runtime, job.id).status is Status.RUNNING  # still worker 1's
    finally:
        gate.gate.set()
    assert first.join() == "succeeded"

    done = load(runtime, job.id)
    assert (done.status, done.starts, done.result) == (Status.SUCCEEDED, 1, {"late": True})
    assert gate.calls == 1
    assert_released(runtime, job)


class CopyGateHandler(GateHandler):
    """The first call waits for the gate; any later one (a second run) returns at once."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        self.calls += 1
        return super().run(ctx, payload) if self.calls == 1 else {"copy": True}


def test_a_message_for_an_older_attempt_leaves_the_current_one_alone(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    recorder = RecordingHandler()
    registry.register(recorder)
    job = dispatch(runtime, submit(runtime, tenant, "record", {}))
    # The reaper gave up on attempt 1; attempt 2 is dispatched and holds the lease.
    runtime.index.reap(now=time.time() + 3600)
    with runtime.sessions.begin() as session:
        assert jobs_sql.transition(
            session, job.id, src=Status.DISPATCHED, attempt=1, dst=Status.QUEUED, now=time.time()
        )
    runtime.index.requeue(
        IndexedJob(job_id=job.id, tenant=tenant.id, tier=job.tier, order_key=job.order_key)
    )
    second = dispatch(runtime, job)
    assert second.attempt == 2

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "stale"

    assert load(runtime, job.id) == second
    assert runtime.index.tenant_inflight(tenant.id) == 1  # attempt 2's lease is untouched
    assert recorder.calls == []


def test_a_message_for_an_unknown_job_is_a_no_op(
    runtime: Runtime, registry: HandlerRegistry
) -> None:
    assert execute(runtime, registry, "no-such-job", 1, worker_id=WORKER) == "stale"


# -- retries ---------------------------------------------------------------------------------


def test_a_retryable_error_requeues_with_backoff_until_attempts_are_spent(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    flaky = FlakyHandler()
    registry.register(flaky)
    job = dispatch(runtime, submit(runtime, tenant, "flaky", {}, max_attempts=2))
    now = time.time()

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER, clock=lambda: now) == "requeued"

    queued = load(runtime, job.id)
    assert queued.status is Status.QUEUED
    assert queued.attempt == 2
    assert queued.not_before == pytest.approx(now + BACKOFF_S)
    assert queued.enqueued_at == job.enqueued_at and queued.order_key == job.order_key
    # Held back in the index until its backoff has passed, no longer leased.
    assert runtime.index.inflight() == 0
    assert runtime.index.tenant_queued(tenant.id) == 1
    assert runtime.index.dispatch(1, now=now + BACKOFF_S - 0.1, lease_ttl_s=LEASE_TTL_S) == []
    second = dispatch(runtime, job, now=now + BACKOFF_S + 0.1)
    assert second.attempt == 2

    assert execute(runtime, registry, job.id, 2, worker_id=WORKER) == "failed"

    done = load(runtime, job.id)
    assert done.status is Status.FAILED
    assert done.error is not None and done.error.startswith("RetryableError: ")
    assert [attempt for _, attempt, _ in flaky.calls] == [1, 2]
    assert_released(runtime, job)


def test_a_retry_that_succeeds_stores_the_result(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    registry.register(FlakyHandler())
    job = dispatch(runtime, submit(runtime, tenant, "flaky", {"succeed_on": 2}))
    now = time.time()
    assert execute(runtime, registry, job.id, 1, worker_id=WORKER, clock=lambda: now) == "requeued"
    dispatch(runtime, job, now=now + BACKOFF_S + 0.1)

    assert execute(runtime, registry, job.id, 2, worker_id=WORKER) == "succeeded"

    assert load(runtime, job.id).result == {"attempt": 2}


# -- cancellation and expiry -----------------------------------------------------------------


def test_cancel_requested_before_start_cancels_without_running(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    recorder = RecordingHandler()
    registry.register(recorder)
    job = dispatch(runtime, submit(runtime, tenant, "record", {}))
    request_cancel(runtime, job.id)

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "cancelled"

    done = load(runtime, job.id)
    assert done.status is Status.CANCELLED
    assert done.started_at is None
    assert recorder.calls == []
    assert_released(runtime, job)


def test_a_cancel_the_start_renewal_reports_runs_no_handler(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start commits, the client cancels, and the renewal right after the start is the
    first to tell: the handler is not called, and the job ends cancelled."""
    recorder = RecordingHandler()
    registry.register(recorder)
    job = dispatch(runtime, submit(runtime, tenant, "record", {}))
    renew = runtime.index.renew_checked

    def cancel_then_renew(job_id: str, **kwargs: Any) -> Any:
        if kwargs.get("announce"):  # the start's own renewal: the start has committed
            assert load(runtime, job_id).status is Status.RUNNING
            request_cancel(runtime, job_id)
        return renew(job_id, **kwargs)

    monkeypatch.setattr(runtime.index, "renew_checked", cancel_then_renew)

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "cancelled"

    assert recorder.calls == []
    assert load(runtime, job.id).status is Status.CANCELLED
    assert_released(runtime, job)


@pytest.mark.parametrize(
    ("kind", "payload"),
    [("block", {}), ("block", {"then": "retry"}), ("sleep", {"seconds": 3600})],
    ids=["returns", "raises-retryable", "raises-cancelled"],
)
def test_cancel_while_running_stops_the_handler(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry, kind: str,
    payload: dict[str, Any],
) -> None:
    """However the handler stops once cancelled (returning, raising ``RetryableError``,
    raising ``JobCancelled`` as ``sleep`` does), the job ends cancelled, not retried."""
    registry.register(BlockingHandler())
    job = dispatch(runtime, submit(runtime, tenant, kind, payload))
    run = Background(lambda: execute(runtime, registry, job.id, 1, worker_id=WORKER))
    wait_for(lambda: load(runtime, job.id).status is Status.RUNNING)

    request_cancel(runtime, job.id)

    assert run.join() == "cancelled"
    done = load(runtime, job.id)
    assert done.status is Status.CANCELLED
    assert done.started_at is not None
    assert_released(runtime, job)


def test_a_job_past_its_start_by_expires_without_running(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    recorder = RecordingHandler()
    registry.register(recorder)
    job = dispatch(runtime, submit(runtime, tenant, "record", {}, max_wait_s=60))
    assert job.start_by is not None
    late = job.start_by + 1

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER, clock=lambda: late) == "expired"

    done = load(runtime, job.id)
    assert done.status is Status.EXPIRED
    assert done.started_at is None
    assert recorder.calls == []
    assert_released(runtime, job)


def test_a_job_within_its_start_by_runs(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    job = dispatch(runtime, submit(runtime, tenant, "echo", {}, max_wait_s=3600))
    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "succeeded"


# -- leases ----------------------------------------------------------------------------------


def test_a_late_result_after_the_lease_was_reaped_is_rejected(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    gate = GateHandler()
    registry.register(gate)
    job = dispatch(runtime, submit(runtime, tenant, "gate", {}))
    run = Background(lambda: execute(runtime, registry, job.id, 1, worker_id=WORKER))
    assert gate.started.wait(20)
    # The reaper's part: the lease expired, the job goes back to the queue as attempt 2.
    reaped = runtime.index.reap(now=time.time() + 3600)
    assert [lease.job_id for lease in reaped] == [job.id]
    with runtime.sessions.begin() as session:
        assert jobs_sql.transition(
            session, job.id, src=Status.RUNNING, attempt=1, dst=Status.QUEUED, now=time.time()
        )
    runtime.index.requeue(
        IndexedJob(job_id=job.id, tenant=tenant.id, tier=job.tier, order_key=job.order_key)
    )
    requeued = load(runtime, job.id)

    gate.gate.set()

    assert run.join() == "stale"
    assert load(runtime, job.id) == requeued
    assert requeued.status is Status.QUEUED and requeued.attempt == 2
    assert runtime.index.position(job.id) == 0  # still queued for attempt 2


def lose_the_start(runtime: Runtime, job_id: str) -> Job:
    """What a crash of the database does to a start whose commit had not reached the disk
    (a start is not durable): the row as it was before it, queued at the same attempt."""
    with runtime.sessions.begin() as session:
        session.execute(sa.update(JobRow).where(JobRow.id == job_id).values(
            status=Status.QUEUED.value, starts=0, started_at=None, start_token=None))
    return load(runtime, job_id)


class LosesItsStart(RecordingHandler):
    """Loses its own start while it runs (``lose_the_start``) and returns a result;
    ``reaped``: its lease is taken by the reaper too, as the handler ends."""

    kind = "loses"

    def __init__(self, runtime: Runtime, *, reaped: bool = False) -> None:
        super().__init__()
        self.runtime, self.reaped = runtime, reaped
        self.started_at: float | None = None
        self.lost: Job | None = None

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        self.started_at = load(self.runtime, ctx.job_id).started_at
        self.lost = lose_the_start(self.runtime, ctx.job_id)
        if self.reaped:
            (lapsed,) = self.runtime.index.reap(now=time.time() + 3600)
            assert lapsed.job_id == ctx.job_id
        super().run(ctx, payload)
        return {"late": True}


def test_a_start_lost_while_its_handler_ran_is_made_again_with_the_ending(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    handler = LosesItsStart(runtime)
    registry.register(handler)
    job = dispatch(runtime, submit(runtime, tenant, "loses", {}))

    # The result in hand is recorded, not thrown away.
    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "succeeded"

    assert handler.lost is not None and handler.lost.status is Status.QUEUED
    done = load(runtime, job.id)
    assert (done.status, done.attempt, done.starts) == (Status.SUCCEEDED, 1, 1)
    assert done.result == {"late": True}
    assert done.started_at == handler.started_at  # the start as it was made
    assert runtime.index.inflight() == 0


def test_a_lost_start_whose_lease_is_gone_is_not_made_again(
    runtime: Runtime, tenant: Tenant, registry: HandlerRegistry
) -> None:
    """Without its lease the attempt cannot tell that nobody else takes the queued row: the
    ending asks Redis before it makes the start again, records nothing, and leaves the row to
    whoever holds the job now (the heartbeat has not seen the loss yet)."""
    handler = LosesItsStart(runtime, reaped=True)
    registry.register(handler)
    job = dispatch(runtime, submit(runtime, tenant, "loses", {}))

    assert execute(runtime, registry, job.id, 1, worker_id=WORKER) == "stale"

    assert load(runtime, job.id) == handler.lost


def test_the_heartbeat_renews_the_lease_and_notices_a_cancel(
    runtime: Runtime, tenant: Tenant
) -> None:
    dispatched_at = time.time()
    job = dispatch(runtime, submit(runtime, tenant, "echo", {}), now=dispatched_at)
    with runtime.sessions.begin() as session:
        assert jobs_sql.transition(
            session, job.id, src=Status.DISPATCHED, attempt=1, dst=Status.RUNNING, now=time.time()
        )
    ctx = JobContext(job_id=job.id, attempt=1, tenant_id=tenant.id, kind="echo")
    later = dispatched_at + 100
    heartbeat = Heartbeat(runtime, ctx, clock=lambda: later)

    heartbeat.renew_now()

    assert runtime.index.reap(now=later + LEASE_TTL_S - 0.01) == []  # renewed from `later`
    assert not ctx.stopped()
    request_cancel(runtime, job.id)
    heartbeat.renew_now()
    assert ctx.cancelled() and not ctx.lease_lost()


def test_the_heartbeat_marks_a_reaped_lease_lost(runtime: Runtime, tenant: Tenant) -> None:
    job = dispatch(runtime, submit(runtime, tenant, "echo", {}))
    with runtime.sessions.begin() as session:
        assert jobs_sql.transition(
            session, job.id, src=Status.DISPATCHED, attempt=1, dst=Status.RUNNING, now=time.time()
        )
    ctx = JobContext(job_id=job.id, attempt=1, tenant_id=tenant.id, kind="echo")
    runtime.index.reap(now=time.time() + 3600)

    Heartbeat(runtime, ctx, clock=time.time).renew_now()

    assert ctx.lease_lost() and not ctx.cancelled()
    assert not ctx.sleep(3600)


def test_a_running_job_costs_the_database_nothing(runtime: Runtime, tenant: Tenant) -> None:
    """The heartbeat renews on Redis only, and learns of a cancel from the renewal: no SQL
    statement runs while the handler does (a hung database cannot cost the job its lease)."""
    job = dispatch(runtime, submit(runtime, tenant, "echo", {}))
    with runtime.sessions.begin() as session:
        assert jobs_sql.transition(
            session, job.id, src=Status.DISPATCHED, attempt=1, dst=Status.RUNNING, now=time.time()
        )
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    ctx = JobContext(job_id=job.id, attempt=1, tenant_id=tenant.id, kind="echo")
    heartbeat = Heartbeat(runtime, ctx)
    sa.event.listen(runtime.engine, "before_cursor_execute", count)
    leases = IndexKeys(runtime.settings.key_prefix).leases
    first_expiry = float(runtime.redis.zscore(leases, job.id) or 0)
    heartbeat.start()
    try:
        # Held past the end of the lease it started with: the thread renewed it, with no SQL.
        wait_for(lambda: float(runtime.redis.zscore(leases, job.id) or 0)
                 >= first_expiry + LEASE_TTL_S)
        assert runtime.index.reap() == []  # on Redis's clock: still held
        assert heartbeat.holds_lease() and not ctx.lease_lost()
        assert runtime.index.flag_cancel(job.id, attempt=1)  # what the API's cancel does
        deadline = time.monotonic() + 5
        while not ctx.cancelled():
            assert time.monotonic() < deadline, "the cancel flag was not seen"
            time.sleep(0.02)
    finally:
        heartbeat.stop()
        sa.event.remove(runtime.engine, "before_cursor_execute", count)
    assert statements == []
