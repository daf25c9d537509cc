"""SQLite under concurrent writers, on a real database file: a transaction that reads then
updates (a dispatch round's claim) waits for the write lock instead of failing with
"database is locked", and reads neither wait for writers nor hold them up."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from jobs.core.domain import Job, NewJob, Tenant
from jobs.core.states import Status
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql
from jobs.store import tenants as tenants_sql
from jobs.store.engine import SQLITE_BUSY_TIMEOUT_MS, make_engine, make_sessionmaker

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0
Q, D = Status.QUEUED, Status.DISPATCHED
HOLD_S = 0.4
# Well under the busy timeout a blocked statement would wait out (SQLITE_BUSY_TIMEOUT_MS):
# an answer sooner did not wait for the lock, however loaded the machine.
NOT_WAITING_S = SQLITE_BUSY_TIMEOUT_MS / 1000 / 2


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[sa.Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(engine: sa.Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


@pytest.fixture
def tenant(sessions: sessionmaker[Session]) -> Tenant:
    with sessions.begin() as session:
        return tenants_sql.create_tenant(session, name="acme", tier="free", api_key_hash="h",
                                         now=T0)


def _new(tenant: Tenant) -> NewJob:
    return NewJob(tenant_id=tenant.id, tier=tenant.tier, kind="echo", payload={},
                  order_key=T0 + 120.0, enqueued_at=T0)


def _insert(sessions: sessionmaker[Session], tenant: Tenant) -> Job:
    with sessions.begin() as session:
        return jobs_sql.insert_job(session, _new(tenant))


def _claim(sessions: sessionmaker[Session], job_ids: list[str]) -> list[str]:
    """What a dispatch round does in SQL: read the leased jobs, CAS each queued → dispatched."""
    with sessions.begin() as session:
        jobs = jobs_sql.get_jobs(session, job_ids)
        return [
            job.id for job in jobs.values()
            if jobs_sql.transition(session, job.id, src=Q, attempt=job.attempt, dst=D, now=T0 + 1)
        ]


class _Writer:
    """Holds SQLite's write lock (an uncommitted insert) in another thread until released."""

    def __init__(self, sessions: sessionmaker[Session], tenant: Tenant) -> None:
        self._held = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sessions, tenant))

    def _run(self, sessions: sessionmaker[Session], tenant: Tenant) -> None:
        with sessions.begin() as session:
            jobs_sql.insert_job(session, _new(tenant))
            self._held.set()
            self._release.wait(10)

    def __enter__(self) -> _Writer:
        self._thread.start()
        assert self._held.wait(5)
        return self

    def release_after(self, delay_s: float) -> None:
        threading.Timer(delay_s, self._release.set).start()

    def __exit__(self, *_: object) -> None:
        self._release.set()
        self._thread.join(10)


def test_read_then_update_waits_for_the_writer(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    """A deferred BEGIN that has read fails at once ("database is locked") when it tries to
    write while another connection holds the lock; BEGIN IMMEDIATE waits for the lock."""
    job = _insert(sessions, tenant)
    with _Writer(sessions, tenant) as writer:
        writer.release_after(HOLD_S)
        started = time.monotonic()
        claimed = _claim(sessions, [job.id])
        waited = time.monotonic() - started
    assert claimed == [job.id]
    assert waited >= HOLD_S * 0.75  # it waited for the writer's commit
    with sessions() as session:
        landed = jobs_sql.get_job(session, job.id)
    assert landed is not None and landed.status is D


def test_reads_neither_wait_for_writers_nor_hold_them_up(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    job = _insert(sessions, tenant)
    with _Writer(sessions, tenant), sessions() as reader:
        started = time.monotonic()
        assert jobs_sql.get_job(reader, job.id) is not None  # the writer holds the lock meanwhile
        assert time.monotonic() - started < NOT_WAITING_S
    with sessions() as reader:
        assert jobs_sql.get_job(reader, job.id) is not None  # an open read snapshot...
        started = time.monotonic()
        assert _claim(sessions, [job.id]) == [job.id]  # ...and a writer goes ahead at once
        assert time.monotonic() - started < NOT_WAITING_S


def test_no_dispatch_round_lost_under_concurrent_submits(
    sessions: sessionmaker[Session], tenant: Tenant
) -> None:
    """Submitters insert jobs one transaction each while a dispatcher claims them in rounds:
    no round fails, and every job ends dispatched."""
    submitters, per_submitter = 4, 40
    submitted: queue.Queue[str] = queue.Queue()
    errors: list[BaseException] = []
    done = threading.Event()
    claimed: list[str] = []

    def submit() -> None:
        try:
            for _ in range(per_submitter):
                submitted.put(_insert(sessions, tenant).id)
        except BaseException as exc:
            errors.append(exc)

    def dispatch() -> None:
        while not (done.is_set() and submitted.empty()):
            batch = _drain(submitted)
            if not batch:
                time.sleep(0.001)
                continue
            try:
                claimed.extend(_claim(sessions, batch))
            except BaseException as exc:
                errors.append(exc)
                return

    dispatcher = threading.Thread(target=dispatch)
    threads = [threading.Thread(target=submit) for _ in range(submitters)]
    dispatcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    done.set()
    dispatcher.join(30)
    assert errors == []
    assert len(claimed) == submitters * per_submitter
    with sessions() as session:
        counts = stats_sql.count_by_status(session)
    assert counts[D] == submitters * per_submitter
    assert counts[Q] == 0


def _drain(items: queue.Queue[str], limit: int = 16) -> list[str]:
    batch: list[str] = []
    while len(batch) < limit:
        try:
            batch.append(items.get_nowait())
        except queue.Empty:
            break
    return batch
