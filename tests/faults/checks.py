"""What must hold after every fault: nothing lost, nothing run twice, no cap overshot.

``check_invariants`` is the one check every fault test ends with. It reads the SQL store
directly (the source of truth), waits (bounded) for the jobs to finish, collects every
violation, and fails once with a report of them all (``tests.faults.report``):

- every job answered 202 exists, and every job in the database, accepted or not (a submit
  answered 503 whose commit landed after all), ends in a terminal state, with its attempt
  at least 1 (``starts``, below, is what ``max_attempts`` limits) and its finish time recorded;
- with the ``tracked`` handler's trace (``tests.faults.handlers``): each succeeded job
  completed exactly once, in the attempt SQL recorded, and no other job completed (a
  finished result was never thrown away), a ``done`` lost with its SIGKILLed worker aside,
  and one of a worker frozen (SIGSTOP) past its lease: a zombie, its lease lapsed while it
  was frozen, whose result its worker could not record;
- no attempt was charged without a start: ``Job.starts`` (dispatched → running moves) is
  within ``0..max_attempts``, ``started_at`` is set iff ``starts > 0``, a job failed for its
  spent starts ("start N of M") started each of them, and the trace shows no more started
  attempts than ``starts``;
- per tenant, the most jobs running at one instant stays within the tenant's cap (its
  override, else its tier's): from the trace's runs for ``tracked`` jobs, else from SQL's
  ``[started_at, finished_at]``.
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from jobs.core.domain import Job
from jobs.core.states import Status
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.engine import make_engine, make_sessionmaker
from jobs.store.models import JobRow
from tests.faults.handlers import TRACKED_KINDS, Run, read_runs
from tests.faults.report import Violation, clock_text, render

FINISH_TIMEOUT_S = 90.0
# A failure for spent starts (the reaper's and the retry path's wording: "start 3 of 3").
# A run known only from SQL is timed by its worker's estimate of the fleet's clock (Redis's
# TIME, read over a round trip: jobs.index.clock), a traced one by the kernel's: the two
# may disagree by a few milliseconds on a loaded host. An overlap that short, with a run
# timed by SQL in it, is that disagreement, not a second lease.
SQL_CLOCK_SLACK_S = 0.025

SPENT = re.compile(r"\b(?:start|attempt) (\d+) of \1\b", re.IGNORECASE)


def check_invariants(
    database_url: str,
    accepted: Iterable[str],
    *,
    tier_caps: Mapping[str, int],
    pool_caps: Mapping[str, Mapping[str, int]] | None = None,
    kind_pools: Mapping[str, str] | None = None,
    run_log: Path | None = None,
    timeout: float = FINISH_TIMEOUT_S,
    killed: Mapping[int, float] | None = None,
    frozen: Mapping[int, Sequence[tuple[float, float]]] | None = None,
    found: Iterable[Violation] = (),
    context: str = "",
) -> dict[str, Job]:
    """Wait up to ``timeout`` for every job to finish, then check the invariants; the jobs
    by id. ``killed``: pid → when the test SIGKILLed that process (its runs end then);
    ``frozen``: pid → the (SIGSTOP, SIGCONT) times of each freeze of that process longer than
    a lease (a run open across one is a zombie from its freeze on); ``found``: violations
    the caller saw itself, reported with these. ``tier_caps`` are the default pool's;
    ``pool_caps`` another pool's by name, ``kind_pools`` the pool of each kind not the
    default's: a tenant's cap holds in each pool on its own."""
    ids = list(accepted)
    violations = list(found)
    if len(set(ids)) != len(ids):
        violations.append(Violation(invariant="accepted once", detail="an id was answered twice"))
    engine = make_engine(database_url)
    try:
        sessions = make_sessionmaker(engine)
        jobs = _wait_terminal(sessions, ids, timeout)
        with sessions() as session:
            tenants = {job.tenant_id: tenants_sql.get_tenant(session, job.tenant_id)
                       for job in jobs.values()}
    finally:
        engine.dispose()
    runs = read_runs(run_log) if run_log is not None else {}
    violations += check_rows(ids, jobs, timeout)
    if run_log is not None:
        violations += check_runs(jobs, runs, killed or {}, frozen or {})
    violations += check_starts(jobs, runs if run_log is not None else None)
    every_pool = {"default": tier_caps, **(pool_caps or {})}
    caps = {(t.id, pool): t.cap if t.cap is not None else of_pool.get(t.tier)
            for t in tenants.values() if t is not None
            for pool, of_pool in every_pool.items()}
    names = {(t.id, pool): f"{t.name} ({t.tier}, pool {pool}, cap {caps[(t.id, pool)]})"
             for t in tenants.values() if t is not None for pool in every_pool}
    spans = run_spans(jobs, runs, killed or {}, traced=run_log is not None, frozen=frozen or {},
                      kind_pools=kind_pools or {})
    violations += check_caps(spans, caps, names)
    if violations:
        raise AssertionError(
            render(violations, jobs=jobs, runs=runs, context=context,
                   tenants={t.id: f"{t.name} ({t.tier})" for t in tenants.values()
                            if t is not None})
        )
    return jobs


def _wait_terminal(
    sessions: sessionmaker[Session], ids: Sequence[str], timeout: float
) -> dict[str, Job]:
    """The accepted jobs and every other row, once all are terminal or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while True:
        with sessions() as session:
            every = set(ids) | set(session.scalars(sa.select(JobRow.id)))
            jobs = jobs_sql.get_jobs(session, every)
        if all(job.terminal for job in jobs.values()) or time.monotonic() > deadline:
            return jobs
        time.sleep(0.25)


def check_rows(ids: Sequence[str], jobs: Mapping[str, Job], timeout: float) -> list[Violation]:
    found = [Violation(invariant="accepted job exists", detail=f"{i}: answered 202, no row",
                       job_ids=(i,)) for i in ids if i not in jobs]
    accepted = set(ids)
    for job in jobs.values():
        if not job.terminal:
            whose = "accepted" if job.id in accepted else "not answered 202, yet committed"
            found.append(Violation(
                invariant="terminal", job_ids=(job.id,),
                detail=f"{job.id} ({whose}): {job.status.value} after {timeout:g} s",
            ))
            continue
        problems = []
        if job.attempt < 1:  # attempts handed back before a start are free: no upper bound
            problems.append(f"attempt {job.attempt} below 1")
        if job.finished_at is None:
            problems.append("no finished_at")
        elif job.status is Status.SUCCEEDED and (
            job.started_at is None or job.started_at > job.finished_at
        ):
            problems.append("succeeded without a start before its finish")
        found += [Violation(invariant="terminal row", detail=f"{job.id}: {p}", job_ids=(job.id,))
                  for p in problems]
    return found


def check_runs(
    jobs: Mapping[str, Job], runs: Mapping[str, Sequence[Run]], killed: Mapping[int, float],
    frozen: Mapping[int, Sequence[tuple[float, float]]] | None = None,
) -> list[Violation]:
    """One completed run per succeeded ``tracked`` job, of its recorded attempt; none for
    the others (one is allowed for a job cancelled as its handler returned)."""
    found = []
    for job in jobs.values():
        if job.kind not in TRACKED_KINDS or not job.terminal:
            continue
        starts = {(r.attempt, r.pid): r.at for r in runs.get(job.id, []) if r.what == "start"}
        done = [r for r in runs.get(job.id, []) if r.what == "done"
                and not _lost_with_worker(r, job, killed)
                and not _zombie(r, job, starts.get((r.attempt, r.pid), r.at), frozen or {})]
        attempts = [r.attempt for r in done]
        if job.status is Status.SUCCEEDED:
            if attempts != [job.attempt]:
                found.append(Violation(
                    invariant="completed exactly once", job_ids=(job.id,),
                    detail=f"{job.id}: succeeded in attempt {job.attempt}, completed runs "
                           f"{attempts or 'none'}",
                ))
        elif done and not (job.status is Status.CANCELLED and job.cancel_requested
                           and len(done) == 1):
            found.append(Violation(
                invariant="no result thrown away", job_ids=(job.id,),
                detail=f"{job.id}: {job.status.value}, yet completed runs {attempts}",
            ))
    return found


def _lost_with_worker(run: Run, job: Job, killed: Mapping[int, float]) -> bool:
    """A ``done`` whose process was SIGKILLed before recording it (not this attempt's
    outcome): the result died with the worker, nothing was thrown away."""
    death = killed.get(run.pid)
    recorded = job.status is Status.SUCCEEDED and run.attempt == job.attempt
    return death is not None and death >= run.at and not recorded


def _zombie(run: Run, job: Job, began: float,
            frozen: Mapping[int, Sequence[tuple[float, float]]]) -> bool:
    """A ``done`` of a run whose process was frozen past its lease while it ran, and whose
    result was not recorded: its lease lapsed, another attempt took the job, and the
    worker's compare-and-set refused the late result."""
    recorded = job.status is Status.SUCCEEDED and run.attempt == job.attempt
    return not recorded and freeze_within(frozen, run.pid, began, run.at) is not None


def freeze_within(frozen: Mapping[int, Sequence[tuple[float, float]]], pid: int | None,
                  start: float, end: float) -> float | None:
    """When ``pid`` was first frozen between ``start`` and ``end``, or None."""
    if pid is None:
        return None
    return min((stop for stop, _ in frozen.get(pid, ()) if start <= stop <= end), default=None)


def check_starts(
    jobs: Mapping[str, Job], runs: Mapping[str, Sequence[Run]] | None
) -> list[Violation]:
    found = []
    for job in jobs.values():
        problems = []
        if not 0 <= job.starts <= job.max_attempts:
            problems.append(f"starts={job.starts} outside 0..{job.max_attempts}")
        if (job.started_at is None) != (job.starts == 0):
            problems.append(f"starts={job.starts} but started_at={clock_text(job.started_at)}")
        spent = job.status is Status.FAILED and bool(SPENT.search(job.error or ""))
        if spent and job.starts != job.max_attempts:
            problems.append(f"failed ({job.error}) after {job.starts} of {job.max_attempts} "
                            "starts")
        if runs is not None and job.kind in TRACKED_KINDS:
            traced = len({r.attempt for r in runs.get(job.id, []) if r.what == "start"})
            if traced > job.starts:
                problems.append(f"{traced} attempts started in the trace, starts={job.starts}")
        found += [Violation(invariant="charged only for a start", detail=f"{job.id}: {p}",
                            job_ids=(job.id,)) for p in problems]
    return found


@dataclass(frozen=True, kw_only=True)
class Span:
    """A run of a job: from the trace (``tracked``) or from SQL's row."""

    job_id: str
    tenant_id: str
    attempt: int
    pid: int | None
    start: float
    end: float
    how: str  # how its end is known: done, stop, killed, next start, finished, running
    pool: str = "default"  # the pool of its job's kind: a tenant's cap holds per pool

    def __str__(self) -> str:
        who = f" pid {self.pid}" if self.pid is not None else " (SQL)"
        return (f"{self.job_id} attempt {self.attempt}{who} {clock_text(self.start)}"
                f"–{clock_text(self.end)} ({self.how})")


def run_spans(
    jobs: Mapping[str, Job], runs: Mapping[str, Sequence[Run]], killed: Mapping[int, float],
    *, traced: bool, frozen: Mapping[int, Sequence[tuple[float, float]]] | None = None,
    kind_pools: Mapping[str, str] | None = None,
) -> list[Span]:
    """Every run's span. A traced run without an end line ended when its process was
    killed; failing that (a kill the test did not make), by the next start of its job (its
    lease had lapsed by then), by its job's finish, or, its process alive, it still runs. A
    run whose process was frozen past its lease ends, as far as its tenant's cap goes, at
    the freeze: its lease lapsed meanwhile, and what it does on waking is a zombie's."""
    spans = []
    for job in jobs.values():
        pool = (kind_pools or {}).get(job.kind, "default")
        if traced and job.kind in TRACKED_KINDS:
            for span in _traced_spans(job, runs.get(job.id, []), killed):
                stop = freeze_within(frozen or {}, span.pid, span.start, span.end)
                span = replace(span, pool=pool)
                spans.append(span if stop is None else replace(span, end=stop, how="frozen"))
        elif job.started_at is not None and job.finished_at is not None:
            spans.append(Span(job_id=job.id, tenant_id=job.tenant_id, attempt=job.attempt,
                              pid=None, start=job.started_at, end=job.finished_at, how="SQL",
                              pool=pool))
    return spans


def _traced_spans(job: Job, lines: Sequence[Run], killed: Mapping[int, float]) -> list[Span]:
    ordered = sorted(lines, key=lambda r: r.at)
    open_runs: dict[tuple[int, int], list[Run]] = defaultdict(list)
    spans = []

    def span(start: Run, end: float, how: str) -> Span:
        return Span(job_id=job.id, tenant_id=job.tenant_id, attempt=start.attempt,
                    pid=start.pid, start=start.at, end=max(start.at, end), how=how)

    for line in ordered:
        key = (line.attempt, line.pid)
        if line.what == "start":
            open_runs[key].append(line)
        elif open_runs[key]:
            spans.append(span(open_runs[key].pop(0), line.at, line.what))
    for start in (s for pending in open_runs.values() for s in pending):
        later = [r.at for r in ordered if r.what == "start" and r.at > start.at]
        death = killed.get(start.pid)
        if death is not None and death >= start.at:
            spans.append(span(start, death, "killed"))
        elif _alive(start.pid):
            spans.append(span(start, time.time(), "running"))
        elif later:
            spans.append(span(start, later[0], "next start"))
        else:
            spans.append(span(start, job.finished_at or time.time(), "finished"))
    return spans


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_caps(
    spans: Sequence[Span], caps: Mapping[tuple[str, str], int | None],
    names: Mapping[tuple[str, str], str],
) -> list[Violation]:
    """No tenant ran more jobs at once than its cap, in any pool: ``caps`` and ``names`` by
    ``(tenant id, pool)``. A cap counts slots: the traced items of one packed run (one
    process, one start instant) count once."""
    by_tenant: dict[tuple[str, str], list[Span]] = defaultdict(list)
    runs: set[tuple[str, str, int, float]] = set()
    for span in spans:
        if span.pid is not None:  # a tenant's items of one packed run hold one slot
            run = (span.tenant_id, span.pool, span.pid, span.start)
            if run in runs:
                continue
            runs.add(run)
        by_tenant[(span.tenant_id, span.pool)].append(span)
    found = []
    for tenant_id, tenant_spans in by_tenant.items():
        cap = caps.get(tenant_id)
        if cap is None:
            continue
        episodes = [e for e in overshoots(tenant_spans, cap) if not e.within_clock_slack]
        if not episodes:
            continue
        worst = max(episodes, key=lambda e: len(e.spans))
        found.append(Violation(
            invariant="tenant cap", job_ids=tuple(dict.fromkeys(s.job_id for s in worst.spans)),
            detail=f"{names.get(tenant_id, str(tenant_id))} went over its cap {len(episodes)} "
                   f"time(s), first at {clock_text(episodes[0].began)}; the most at once, "
                   f"{len(worst.spans)}, at {clock_text(worst.peak_at)}:\n    "
                   + "\n    ".join(str(s) for s in worst.spans),
        ))
    return found


@dataclass(frozen=True, kw_only=True)
class Episode:
    """A stretch of time with more spans open than the cap: when it began and ended, and
    its peak."""

    began: float
    peak_at: float
    spans: list[Span]
    ended: float = float("inf")

    @property
    def within_clock_slack(self) -> bool:
        """Short enough, with a run timed by SQL in it, to be the clocks' disagreement."""
        return (self.ended - self.began < SQL_CLOCK_SLACK_S
                and any(s.pid is None for s in self.spans))


def overshoots(spans: Sequence[Span], cap: int) -> list[Episode]:
    """Each stretch in which more than ``cap`` spans are open at once (an end at the same
    instant as a start comes first), with the spans open at its peak."""
    events = sorted(
        [(s.start, 1, i) for i, s in enumerate(spans)]
        + [(s.end, -1, i) for i, s in enumerate(spans)],
        key=lambda e: (e[0], e[1]),
    )
    running: dict[int, Span] = {}
    found: list[Episode] = []
    over = False
    for at, delta, i in events:
        if delta > 0:
            running[i] = spans[i]
        else:
            running.pop(i, None)
        if len(running) > cap and (not over or len(running) > len(found[-1].spans)):
            began = found.pop().began if over else at
            open_now = sorted(running.values(), key=lambda s: s.start)
            found.append(Episode(began=began, peak_at=at, spans=open_now))
        elif over and len(running) <= cap:
            found[-1] = replace(found[-1], ended=at)
        over = len(running) > cap
    return found
