"""Counts and recent figures read from the jobs table: live counts, service times, waits,
and what retention has pruned (the metrics and the measured service rate read these)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobs.core.ids import first_id_at
from jobs.core.pools import KindScope
from jobs.core.states import Status
from jobs.store.models import (
    JobRow,
)
from jobs.store.rows import (
    TOTALS,
    dt,
    epoch_or_none,
)
from jobs.store.scope import EVERY_KIND, scoped

LIVE = (Status.WAITING, Status.QUEUED, Status.DISPATCHED, Status.RUNNING)


def count_live(session: Session, scope: KindScope = EVERY_KIND) -> dict[Status, int]:
    """Jobs in each live state (waiting, queued, dispatched, running; 0 included): a range of the
    index on ``(status, ...)``, as long as the live jobs, never the whole table."""
    counts = dict.fromkeys(LIVE, 0)
    stmt = (scoped(sa.select(JobRow.status, sa.func.count()), JobRow.kind, scope)
            .where(JobRow.status.in_([status.value for status in LIVE]))
            .group_by(JobRow.status))
    for status, count in session.execute(stmt):
        counts[Status(status)] = count
    return counts


def count_by_status(session: Session) -> dict[Status, int]:
    """Every state with its number of jobs (0 included)."""
    counts = dict.fromkeys(Status, 0)
    stmt = sa.select(JobRow.status, sa.func.count()).group_by(JobRow.status)
    for status, count in session.execute(stmt):
        counts[Status(status)] = count
    return counts


def recent_service_times(
    session: Session, *, limit: int, scope: KindScope = EVERY_KIND
) -> list[float]:
    """Run time (finished - started) of the last ``limit`` finished runs, newest first."""
    return [seconds for _, seconds in recent_runs(session, limit=limit, scope=scope)]


def arrival_counts(
    session: Session, *, now: float, spans: Sequence[float], scope: KindScope = EVERY_KIND
) -> dict[tuple[str, str], tuple[int, ...]]:
    """Jobs of each tier and kind that entered the queue within each of ``spans`` (seconds,
    ascending) before ``now``, among those created since the longest began: one range of the
    primary key, since ids are time-ordered (``jobs.core.ids``), counted once per span."""
    since = now - spans[-1]
    columns = [sa.func.sum(sa.case((JobRow.enqueued_at >= dt(now - span), 1), else_=0))
               for span in spans[:-1]]
    stmt = (
        scoped(sa.select(JobRow.tier, JobRow.kind, *columns, sa.func.count()), JobRow.kind,
               scope)
        .where(JobRow.id >= first_id_at(since), JobRow.enqueued_at >= dt(since))
        .group_by(JobRow.tier, JobRow.kind)
    )
    return {(tier, kind): tuple(int(n or 0) for n in counts)
            for tier, kind, *counts in session.execute(stmt)}


def in_flight_starts(
    session: Session, scope: KindScope = EVERY_KIND, *, tenant_id: str | None = None
) -> list[tuple[str, float | None]]:
    """``(kind, started_at)`` of the jobs in flight (None: dispatched, not started yet), of
    one tenant's with ``tenant_id``: what each has run, for the time it has left
    (``jobs.core.remaining``)."""
    inflight = [Status.DISPATCHED.value, Status.RUNNING.value]
    stmt = (scoped(sa.select(JobRow.kind, JobRow.started_at), JobRow.kind, scope)
            .where(JobRow.status.in_(inflight)))
    if tenant_id is not None:
        stmt = stmt.where(JobRow.tenant_id == tenant_id)
    return [(kind, epoch_or_none(started)) for kind, started in session.execute(stmt)]


def recent_runs(
    session: Session, *, limit: int, scope: KindScope = EVERY_KIND
) -> list[tuple[str, float]]:
    """``(kind, run time)`` of the last ``limit`` finished runs, newest first: an item of a
    packed run counts its share of the run (μ counts items)."""
    stmt = (
        scoped(sa.select(JobRow.kind, JobRow.started_at, JobRow.finished_at, JobRow.run_items),
               JobRow.kind, scope)
        .where(
            JobRow.status.in_([Status.SUCCEEDED.value, Status.FAILED.value]),
            JobRow.started_at.is_not(None),
            JobRow.finished_at.is_not(None),
        )
        .order_by(JobRow.finished_at.desc(), JobRow.id.desc())
        .limit(limit)
    )
    return [
        (kind, (finished - started).total_seconds() / max(1, items or 1))
        for kind, started, finished, items in session.execute(stmt)
        if started is not None and finished is not None
    ]


def tenant_work(session: Session, tenant_id: str,
                scope: KindScope = EVERY_KIND) -> dict[str, int]:
    """The tenant's jobs queued or in flight, by kind: its own work in the pool."""
    live = [Status.QUEUED.value, Status.DISPATCHED.value, Status.RUNNING.value]
    stmt = (scoped(sa.select(JobRow.kind, sa.func.count()), JobRow.kind, scope)
            .where(JobRow.tenant_id == tenant_id, JobRow.status.in_(live))
            .group_by(JobRow.kind))
    return {kind: count for kind, count in session.execute(stmt)}


def live_by_kind(
    session: Session, scope: KindScope = EVERY_KIND
) -> tuple[dict[str, int], dict[str, int]]:
    """The work a pool holds, by kind: jobs queued, and jobs in flight (dispatched, running)."""
    live = [Status.QUEUED.value, Status.DISPATCHED.value, Status.RUNNING.value]
    stmt = (scoped(sa.select(JobRow.status, JobRow.kind, sa.func.count()), JobRow.kind, scope)
            .where(JobRow.status.in_(live)).group_by(JobRow.status, JobRow.kind))
    queued: dict[str, int] = {}
    inflight: dict[str, int] = {}
    for status, kind, count in session.execute(stmt):
        held = queued if status == Status.QUEUED.value else inflight
        held[kind] = held.get(kind, 0) + count
    return queued, inflight


def recent_waits(session: Session, *, tier: str, since: float) -> list[float]:
    """Queue wait (started - enqueued) of the tier's jobs that started at or after ``since``."""
    stmt = (
        sa.select(JobRow.enqueued_at, JobRow.started_at)
        .where(JobRow.tier == tier, JobRow.started_at >= dt(since))
        .order_by(JobRow.started_at)
    )
    return [
        (started - enqueued).total_seconds()
        for enqueued, started in session.execute(stmt)
        if started is not None
    ]


def retention_totals(session: Session) -> dict[str, tuple[int, int]]:
    """Per tier, ``(pruned, abandoned)`` since the start (tiers never pruned are absent)."""
    stmt = sa.select(TOTALS.c.tier, TOTALS.c.pruned, TOTALS.c.abandoned)
    return {tier: (pruned, abandoned) for tier, pruned, abandoned in session.execute(stmt)}
