"""Retention against real SQL (SQLite and PostgreSQL): finished jobs are pruned per tier in
bounded batches, oldest first; abandoned results are counted; tombstones answer 410
``job_gone`` to the owner only; and under a steady load the tables stay bounded, driven by
the dispatcher's own upkeep on a virtual clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobs.core.cadence import PRUNE_PERIOD_S
from jobs.core.domain import NewJob
from jobs.core.ids import new_job_id
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.dispatch.rebuild import indexed
from jobs.dispatch.retention import Retention
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql
from jobs.store import tenants as tenants_sql
from jobs.store import upkeep as upkeep_sql
from jobs.store import webhooks as webhooks_sql
from jobs.store.engine import make_engine, make_sessionmaker
from jobs.store.models import JobRow, JobTombstoneRow, WebhookAttemptRow, WebhookEventRow
from tests.integration.api_harness import ApiClient, Clock, auth, dispatch_one, move, rt
from tests.integration.stand_in import stand_ins_for

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


T0 = 1_800_000_000.0
TIERS = {
    "premium": {"base_priority": 0, "max_wait_s": 5, "tenant_share": 0.25, "retention_s": 1000},
    "standard": {"base_priority": 10, "max_wait_s": 20, "tenant_share": 0.1, "retention_s": 0},
    "free": {"base_priority": 20, "max_wait_s": 60, "tenant_share": 0.04, "retention_s": 100},
}
# The way to each finished state, as the dispatcher and a worker would walk it.
PATHS = {
    Status.SUCCEEDED: (Status.DISPATCHED, Status.RUNNING, Status.SUCCEEDED),
    Status.FAILED: (Status.DISPATCHED, Status.RUNNING, Status.FAILED),
    Status.CANCELLED: (Status.CANCELLED,),
    Status.EXPIRED: (Status.EXPIRED,),
    Status.RUNNING: (Status.DISPATCHED, Status.RUNNING),
    Status.QUEUED: (),
}


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[Runtime]:
    settings = load_settings(database_url=db_url, key_prefix=key_prefix, tiers=TIERS,
                             policy={"pool_concurrency": 2})
    engine = make_engine(db_url)
    yield Runtime(settings=settings, policy=settings.build_policy(), engine=engine,
                  sessions=make_sessionmaker(engine), redis=redis_client,
                  index=RedisIndex(redis_client, key_prefix))
    engine.dispose()


def tenant(runtime: Runtime, name: str, tier: str) -> str:
    with runtime.sessions.begin() as s:
        return tenants_sql.create_tenant(s, name=name, tier=tier, api_key_hash=name, now=T0).id


def job(session: Session, tenant_id: str, tier: str, *, at: float,
        status: Status = Status.SUCCEEDED) -> str:
    """A job submitted and taken to ``status`` at ``at``."""
    new = NewJob(id=new_job_id(at), tenant_id=tenant_id, tier=tier, kind="echo", payload={},
                 order_key=at, enqueued_at=at)
    jobs_sql.insert_job(session, new)
    src, attempt = Status.QUEUED, 1
    for step in PATHS[status]:
        extra: dict[str, Any] = {"result": {"ok": True}} if step is Status.SUCCEEDED else {}
        assert jobs_sql.transition(session, new.id, src=src, attempt=attempt, dst=step,
                                     now=at, **extra)
        src = step
    return new.id


def ids_left(runtime: Runtime, table: type[Any] = JobRow) -> set[str]:
    with runtime.sessions() as s:
        return set(s.scalars(sa.select(table.id)))


def count(runtime: Runtime, table: type[Any]) -> int:
    with runtime.sessions() as s:
        return int(s.scalar(sa.select(sa.func.count()).select_from(table)) or 0)


def totals(runtime: Runtime) -> dict[str, tuple[int, int]]:
    with runtime.sessions() as s:
        return stats_sql.retention_totals(s)


# -- batches, periods, abandoned ---------------------------------------------------------------


def test_prunes_in_bounded_batches_oldest_first(runtime: Runtime) -> None:
    owner = tenant(runtime, "a", "free")
    with runtime.sessions.begin() as s:
        due = [job(s, owner, "free", at=T0 + i, status=status)
               for i, status in enumerate([Status.SUCCEEDED, Status.FAILED, Status.CANCELLED,
                                           Status.EXPIRED] * 6)]
        recent = job(s, owner, "free", at=T0 + 150)
        # Old but not finished: never pruned, however old.
        live = [job(s, owner, "free", at=T0 - 1000, status=Status.QUEUED),
                job(s, owner, "free", at=T0 - 1000, status=Status.RUNNING)]
    retention = Retention(runtime.sessions, runtime.policy, batch_size=10)
    now = T0 + 200  # the free tier keeps 100 s: the first 24 are due, the 25th is not

    first = retention.run_once(now)
    assert (first.pruned, first.more) == ({"free": 10}, True)
    assert ids_left(runtime) == {*due[10:], recent, *live}  # the oldest ten went first
    second, third = retention.run_once(now), retention.run_once(now)
    assert (second.pruned, third.pruned, third.more) == ({"free": 10}, {"free": 4}, False)
    assert ids_left(runtime) == {recent, *live}
    assert retention.run_once(now).total == 0
    assert ids_left(runtime, JobTombstoneRow) == set(due)
    assert totals(runtime) == {"free": (24, 6)}  # 6 succeeded, none fetched


def test_each_tier_keeps_its_own_period(runtime: Runtime) -> None:
    owners = {tier: tenant(runtime, tier, tier) for tier in TIERS}
    with runtime.sessions.begin() as s:
        jobs = {tier: job(s, owners[tier], tier, at=T0) for tier in TIERS}
    retention = Retention(runtime.sessions, runtime.policy)

    assert retention.run_once(T0 + 100).total == 0  # free keeps exactly 100 s, not less
    assert retention.run_once(T0 + 101).pruned == {"free": 1}
    assert ids_left(runtime) == {jobs["premium"], jobs["standard"]}
    assert retention.run_once(T0 + 1001).pruned == {"premium": 1}
    assert retention.run_once(T0 + 10**9).total == 0  # retention_s 0: kept forever
    assert ids_left(runtime) == {jobs["standard"]}


def test_abandoned_counts_succeeded_jobs_whose_result_was_never_fetched(
    runtime: Runtime,
) -> None:
    owner = tenant(runtime, "a", "premium")
    with runtime.sessions.begin() as s:
        fetched = job(s, owner, "premium", at=T0)
        assert jobs_sql.mark_result_fetched(s, fetched, now=T0 + 1)
        assert not jobs_sql.mark_result_fetched(s, fetched, now=T0 + 2)  # the first only
        for status in (Status.SUCCEEDED, Status.SUCCEEDED, Status.FAILED, Status.CANCELLED):
            job(s, owner, "premium", at=T0, status=status)
    stats = Retention(runtime.sessions, runtime.policy).run_once(T0 + 2000)
    assert (stats.pruned, stats.abandoned) == ({"premium": 5}, {"premium": 2})
    with runtime.sessions.begin() as s:
        job(s, owner, "premium", at=T0 + 2000)
    Retention(runtime.sessions, runtime.policy).run_once(T0 + 4000)
    assert totals(runtime) == {"premium": (6, 3)}  # added to, not replaced


def test_tombstones_say_gone_to_the_owner_only_and_are_pruned_a_period_later(
    runtime: Runtime,
) -> None:
    owner, other = tenant(runtime, "a", "free"), tenant(runtime, "b", "free")
    with runtime.sessions.begin() as s:
        gone = job(s, owner, "free", at=T0)
    retention = Retention(runtime.sessions, runtime.policy)
    assert retention.run_once(T0 + 101).pruned == {"free": 1}
    with runtime.sessions() as s:
        assert upkeep_sql.was_pruned(s, gone, tenant_id=owner)
        assert not upkeep_sql.was_pruned(s, gone, tenant_id=other)
    assert retention.run_once(T0 + 201).tombstones == 0  # kept 100 s after the prune
    assert retention.run_once(T0 + 202).tombstones == 1
    with runtime.sessions() as s:
        assert not upkeep_sql.was_pruned(s, gone, tenant_id=owner)


# -- the dispatcher's upkeep ---------------------------------------------------------------------


def test_the_dispatcher_prunes_on_its_period_and_again_while_a_backlog_remains(
    runtime: Runtime,
) -> None:
    owner = tenant(runtime, "a", "free")
    with runtime.sessions.begin() as s:
        for i in range(5):
            job(s, owner, "free", at=T0 + i)
    dispatcher = Dispatcher(runtime, publisher=_NoPublish())
    dispatcher.retention.batch_size = 2

    first = dispatcher.run_once(T0 + 200)
    assert first.pruned is not None and first.pruned.pruned == {"free": 2}
    # A backlog: the next upkeep prunes again, without waiting for the period.
    again = dispatcher.run_once(T0 + 201)
    assert again.pruned is not None and again.pruned.pruned == {"free": 2}
    last = dispatcher.run_once(T0 + 202)
    assert last.pruned is not None and (last.pruned.pruned, last.pruned.more) == ({"free": 1},
                                                                                 False)
    # Nothing left behind: the next round waits for the period.
    assert dispatcher.run_once(T0 + 203).pruned is None
    assert dispatcher.run_once(T0 + 202 + PRUNE_PERIOD_S).pruned is not None
    # A doorbell's round (no upkeep) never prunes.
    assert dispatcher.run_once(T0 + 10**6, maintain=False).pruned is None
    assert ids_left(runtime) == set()


def test_a_failing_prune_never_stops_dispatching(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    owner = tenant(runtime, "a", "free")
    with runtime.sessions.begin() as s:
        job(s, owner, "free", at=T0)
        queued = job(s, owner, "free", at=T0 + 150, status=Status.QUEUED)
        waiting = jobs_sql.get_job(s, queued)
        assert waiting is not None
    assert runtime.index.admit(indexed(waiting), bound=10).accepted
    with runtime.engine.begin() as conn:  # the pruner's table is gone: every prune fails
        conn.exec_driver_sql("DROP TABLE job_tombstones")
    sent: list[str] = []
    dispatcher = Dispatcher(runtime, publisher=_Recording(sent))
    stats = dispatcher.run_once(T0 + 200)
    assert sent == [queued] and stats.dispatched == 1 and stats.pruned is None
    assert "retention.failed" in caplog.text
    assert len(ids_left(runtime)) == 2  # the delete was rolled back with the tombstones


def test_the_jobs_table_stays_bounded_under_a_steady_load(runtime: Runtime) -> None:
    """Jobs finish at a steady rate for 12 retention periods of a virtual clock while the
    dispatcher's upkeep runs; the rows held (jobs and tombstones) level off at about
    ``rate x (2 x retention + prune period)`` and do not grow with time. Without pruning the
    table would hold every job made (1,200)."""
    owner = tenant(runtime, "a", "free")
    retention_s, step_s, per_step = 100.0, 10.0, 10
    steps = int(12 * retention_s / step_s)
    rate = per_step / step_s
    bound = rate * (retention_s + PRUNE_PERIOD_S + 2 * step_s)
    dispatcher = Dispatcher(runtime, publisher=_NoPublish())
    held: list[tuple[int, int]] = []
    for n in range(steps):
        now = T0 + n * step_s
        with runtime.sessions.begin() as s:
            for i in range(per_step):
                job(s, owner, "free", at=now, status=(Status.SUCCEEDED, Status.CANCELLED)[i % 2])
        dispatcher.run_once(now)
        held.append((count(runtime, JobRow), count(runtime, JobTombstoneRow)))
    settled = held[int(3 * retention_s / step_s):]
    assert max(jobs for jobs, _ in settled) <= bound
    assert max(tombs for _, tombs in settled) <= bound
    # Level, not creeping up: the last period holds no more than the fourth.
    period = int(retention_s / step_s)
    assert max(map(sum, held[-period:])) <= max(map(sum, held[3 * period:4 * period]))
    pruned, abandoned = totals(runtime)["free"]
    assert pruned >= steps * per_step - bound and abandoned == pruned // 2


class _Recording:
    def __init__(self, sent: list[str]) -> None:
        self.sent = sent

    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        self.sent.append(job_id)


class _NoPublish:
    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        raise AssertionError("nothing is queued: nothing should be published")


# -- over HTTP -----------------------------------------------------------------------------------

WEEK = 7 * 86400


def test_a_pruned_job_is_gone_for_its_owner_and_not_found_for_others(
    client: ApiClient, clock: Clock
) -> None:
    owner, other = client.tenant_key("owner"), client.tenant_key("other")
    fetched = _succeeded(client, owner, {"n": 1})
    abandoned = _succeeded(client, owner, {"n": 2})
    assert client.get(f"/v1/jobs/{fetched}/result", headers=auth(owner)).json()["result"] == {
        "n": 1}
    assert client.get(f"/v1/jobs/{fetched}/result", headers=auth(owner)).status_code == 200
    before = _metrics(client)
    assert (before['tierq_jobs_pruned_total{tier="free"}'],
            before['tierq_jobs_abandoned_total{tier="free"}']) == (0, 0)

    clock.now += WEEK + 1
    stats = Retention(rt(client).sessions, rt(client).policy).run_once(clock.now)
    assert (stats.pruned, stats.abandoned) == ({"free": 2}, {"free": 1})

    for job_id in (fetched, abandoned):
        for method, path in (("GET", ""), ("GET", "/result"), ("POST", "/cancel")):
            answer = client.request(method, f"/v1/jobs/{job_id}{path}", headers=auth(owner))
            assert answer.status_code == 410, (method, path, answer.text)
            assert answer.json()["error"]["type"] == "job_gone"
            assert answer.json()["error"]["job_id"] == job_id
            # Another tenant learns nothing: the same 404 as for an id that never was.
            theirs = client.request(method, f"/v1/jobs/{job_id}{path}", headers=auth(other))
            never = client.request(method, f"/v1/jobs/{new_job_id(T0)}{path}",
                                   headers=auth(other))
            assert theirs.status_code == never.status_code == 404
            assert theirs.json()["error"]["type"] == never.json()["error"]["type"] == "not_found"
    listed = client.get("/v1/jobs", headers=auth(owner)).json()["jobs"]
    assert listed == []
    after = _metrics(client)
    assert (after['tierq_jobs_pruned_total{tier="free"}'],
            after['tierq_jobs_abandoned_total{tier="free"}']) == (2, 1)
    assert after['tierq_jobs_pruned_total{tier="premium"}'] == 0


def test_a_job_finished_within_its_retention_is_kept(client: ApiClient, clock: Clock) -> None:
    owner = client.tenant_key("owner")
    job_id = _succeeded(client, owner, {"n": 1})
    clock.now += WEEK - 1
    assert Retention(rt(client).sessions, rt(client).policy).run_once(clock.now).total == 0
    assert client.get(f"/v1/jobs/{job_id}/result", headers=auth(owner)).status_code == 200


def _succeeded(client: ApiClient, key: str, result: dict[str, Any]) -> str:
    job_id: str = client.submit(key, {"kind": "echo", "payload": result}).json()["id"]
    dispatch_one(client, job_id)
    move(client, job_id, Status.RUNNING, Status.SUCCEEDED, result=result)
    rt(client).index.release(job_id, attempt=1)  # as the worker does: the slot is free again
    return job_id


def _metrics(client: ApiClient) -> dict[str, float]:
    text = client.get("/metrics").text
    samples = (line.rsplit(" ", 1) for line in text.splitlines()
               if line.startswith("tierq_jobs_"))
    return {name: float(value) for name, value in samples}


def test_a_batch_goes_once_every_one_of_its_items_is_gone(runtime: Runtime) -> None:
    from jobs.store import batches
    from jobs.store.models import BatchRow

    owner = tenant(runtime, "evals", "free")
    batch = batches.Batch(
        id="01a00000-0000-7000-8000-0000000000b1", tenant_id=owner, tier="free", kind="echo",
        total=2, max_attempts=3, idempotency_key=None, content_hash="0" * 64, cancelled=False,
        created_at=T0)
    with runtime.sessions.begin() as s:
        assert batches.insert_batch(s, batch)
        items = [job(s, owner, "free", at=T0), job(s, owner, "free", at=T0 + 50)]
        for index, item in enumerate(items):
            s.execute(sa.update(JobRow).where(JobRow.id == item)
                      .values(batch_id=batch.id, batch_index=index))
    retention = Retention(runtime.sessions, runtime.policy)

    assert retention.run_once(T0 + 101).pruned == {"free": 1}  # the first item only
    assert ids_left(runtime, BatchRow) == {batch.id}  # one item left: the batch stays
    stats = retention.run_once(T0 + 151)
    assert (stats.pruned, stats.batches) == ({"free": 1}, 1)
    assert ids_left(runtime, BatchRow) == set() and ids_left(runtime) == set()


def test_a_pruned_jobs_webhook_deliveries_go_with_it(runtime: Runtime) -> None:
    owner = tenant(runtime, "a", "free")
    with runtime.sessions.begin() as s:
        old = NewJob(id=new_job_id(T0), tenant_id=owner, tier="free", kind="echo", payload={},
                     order_key=T0, enqueued_at=T0, webhook_url="https://receiver.example/",
                     webhook_events=",completed,")
        jobs_sql.insert_job(s, old)
        kept = NewJob(id=new_job_id(T0 + 150), tenant_id=owner, tier="free", kind="echo",
                      payload={}, order_key=T0, enqueued_at=T0 + 150,
                      webhook_url="https://receiver.example/", webhook_events=",completed,")
        jobs_sql.insert_job(s, kept)
        for new, at in ((old, T0), (kept, T0 + 150)):
            assert jobs_sql.transition(s, new.id, src=Status.QUEUED, attempt=1,
                                       dst=Status.CANCELLED, now=at)
        due = webhooks_sql.due(s, now=T0, limit=5, room={}, tenant_room=5)
        event = webhooks_sql.claim(s, [i for i, _ in due], now=T0, until=T0 + 30)[0]
        webhooks_sql.record_try(s, event, at=T0, status_code=500, error="HTTP 500",
                                duration_ms=1.0, next_at=T0 + 5)
    assert count(runtime, WebhookEventRow) == 2 and count(runtime, WebhookAttemptRow) == 1
    Retention(runtime.sessions, runtime.policy, batch_size=10).run_once(T0 + 200)
    assert ids_left(runtime) == {kept.id}
    assert ids_left(runtime, WebhookEventRow) == {e.id for e in _events_of(runtime, kept.id)}
    assert len(_events_of(runtime, kept.id)) == 1
    assert count(runtime, WebhookAttemptRow) == 0


def _events_of(runtime: Runtime, job_id: str) -> list[Any]:
    with runtime.sessions() as s:
        return list(s.execute(sa.select(WebhookEventRow.id).where(
            WebhookEventRow.job_id == job_id)))
