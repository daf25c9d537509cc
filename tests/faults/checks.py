"""What must hold after every fault: nothing lost, nothing run twice, no cap overshot.

``check_invariants`` reads the SQL store directly (the source of truth), after waiting for
the accepted jobs to finish:

- every job answered 202 exists and is in one terminal state, with its attempt within
  ``1..max_attempts`` and its finish time recorded;
- no job succeeded twice: the ``tracked`` handler's trace (``tests.faults.handlers``) shows
  exactly one completed run for each succeeded job, of the attempt SQL recorded, and none
  for a job that did not succeed (a finished result was never thrown away);
- per tenant, the most jobs that ran at once (their ``[started_at, finished_at]``) stays
  within the tenant's cap.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from jobs.db import repository
from jobs.db.engine import make_engine, make_sessionmaker
from jobs.domain import Job
from jobs.states import Status
from tests.e2e.harness import max_overlap
from tests.faults.handlers import read_runs

FINISH_TIMEOUT_S = 90.0


def load_jobs(database_url: str, job_ids: Iterable[str]) -> dict[str, Job]:
    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            return repository.get_jobs(session, job_ids)
    finally:
        engine.dispose()


def wait_all_terminal(
    database_url: str, job_ids: Iterable[str], *, timeout: float = FINISH_TIMEOUT_S
) -> dict[str, Job]:
    """The jobs once every one is terminal; fails naming the stragglers after ``timeout``."""
    ids = list(job_ids)
    deadline = time.monotonic() + timeout
    while True:
        jobs = load_jobs(database_url, ids)
        waiting = {i: jobs[i].status.value if i in jobs else "missing" for i in ids
                   if i not in jobs or not jobs[i].terminal}
        if not waiting:
            return jobs
        if time.monotonic() > deadline:
            raise AssertionError(f"not terminal after {timeout:g} s: {waiting}")
        time.sleep(0.2)


def check_invariants(
    database_url: str,
    accepted: Iterable[str],
    *,
    tier_caps: Mapping[str, int],
    run_log: Path | None = None,
    timeout: float = FINISH_TIMEOUT_S,
) -> dict[str, Job]:
    """Wait for the accepted jobs to finish, then assert the invariants; the jobs by id."""
    ids = list(accepted)
    assert len(set(ids)) == len(ids), "a job id was answered 202 twice"
    jobs = wait_all_terminal(database_url, ids, timeout=timeout)
    for job in jobs.values():
        assert 1 <= job.attempt <= job.max_attempts, job
        assert job.finished_at is not None, job
        if job.status is Status.SUCCEEDED:
            assert job.started_at is not None and job.started_at <= job.finished_at, job
    if run_log is not None:
        check_runs(jobs, run_log)
    check_caps(database_url, jobs.values(), tier_caps)
    return jobs


def check_runs(jobs: Mapping[str, Job], run_log: Path) -> None:
    """Exactly one completed run per succeeded ``tracked`` job, of its recorded attempt."""
    runs = read_runs(run_log)
    for job in jobs.values():
        if job.kind != "tracked":
            continue
        done = [run for run in runs.get(job.id, []) if run.what == "done"]
        if job.status is Status.SUCCEEDED:
            assert [run.attempt for run in done] == [job.attempt], (job, runs.get(job.id))
        else:
            assert done == [], (job, runs.get(job.id))


def check_caps(database_url: str, jobs: Iterable[Job], tier_caps: Mapping[str, int]) -> None:
    """No tenant ran more jobs at once than its cap (its override, else its tier's)."""
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for job in jobs:
        if job.started_at is not None and job.finished_at is not None:
            intervals[job.tenant_id].append((job.started_at, job.finished_at))
    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            for tenant_id, spans in intervals.items():
                tenant = repository.get_tenant(session, tenant_id)
                assert tenant is not None, tenant_id
                cap = tenant.cap if tenant.cap is not None else tier_caps[tenant.tier]
                peak = max_overlap(spans)
                assert peak <= cap, f"tenant {tenant.name} ran {peak} jobs at once (cap {cap})"
    finally:
        engine.dispose()
