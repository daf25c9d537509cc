"""The SQL of a packed run (``jobs.execution.packing``): the queued jobs of a kind that may
fill it, and its riders' start in one statement.

A run's first item starts as any job does (``jobs.store.moves.start``); its riders, leased
by the index's ``fill_run``, start together in one ``UPDATE`` that is their claim, under the
same conditions as a lone start (queued at the leased attempt, no cancel asked, its deadline
not passed). Functions take a ``Session`` or a Core ``Connection`` and never commit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa

from jobs.core.domain import Job
from jobs.core.states import Status
from jobs.store.direct import Runner
from jobs.store.models import JobRow
from jobs.store.rows import JOBS, dt, job_from_row


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A queued job of the run's kind: what the index needs to place it, what the handler's
    cost needs, and the bound a failed run left it."""

    id: str
    tenant_id: str
    payload: dict[str, Any]
    run_cap: int | None


def candidates(session: Runner, kind: str, *, lead: str, now: float,
               limit: int) -> list[Candidate]:
    """Up to ``limit`` queued jobs of ``kind`` but ``lead``, in dispatch order (order key;
    the index orders ties by id itself), that may start now: no cancel asked, deadline not
    passed. The index leases those of them that it holds queued and whose tenants' caps let
    them run (``fill_run``)."""
    rows = session.execute(_CANDIDATES, {"kind": kind, "lead": lead, "now": dt(now),
                                         "limit": limit})
    return [Candidate(id=id_, tenant_id=tenant, payload=payload, run_cap=run_cap)
            for id_, tenant, payload, run_cap in rows]


_CANDIDATES = (
    sa.select(JOBS.c.id, JOBS.c.tenant_id, JOBS.c.payload, JOBS.c.run_cap)
    .where(JOBS.c.kind == sa.bindparam("kind"), JOBS.c.status == Status.QUEUED.value,
           JOBS.c.id != sa.bindparam("lead"), JOBS.c.cancel_requested.is_(False),
           sa.or_(JOBS.c.start_by.is_(None),
                  JOBS.c.start_by > sa.bindparam("now", type_=JOBS.c.start_by.type)))
    .order_by(JOBS.c.order_key)
    .limit(sa.bindparam("limit"))
)


def start_riders(
    session: Runner,
    riders: Sequence[tuple[str, int]],
    *,
    lead: str,
    now: float,
    token: str,
    dispatched_at: float | None,
    again: bool = False,
) -> list[Job]:
    """Start the riders ``(job id, attempt)`` of the run ``lead`` leads and note the run's
    size on every item (the lead's row too): one statement for the riders, one for the lead,
    in the caller's transaction. Returns the riders that started (a rider cancelled, late or
    moved since its lease did not). ``again``: a start retried after its COMMIT's answer was
    lost, which finds its own starts by ``token``."""
    if not riders:
        return []
    at = dt(now)
    size = len(riders) + 1
    stmt = (
        sa.update(JOBS)
        .where(sa.tuple_(JOBS.c.id, JOBS.c.attempt).in_([(j, a) for j, a in riders]),
               JOBS.c.status == Status.QUEUED.value, JOBS.c.cancel_requested.is_(False),
               sa.or_(JOBS.c.start_by.is_(None), JOBS.c.start_by > at))
        .values(status=Status.RUNNING.value, started_at=at, starts=JOBS.c.starts + 1,
                updated_at=at, start_token=token, run_items=size,
                dispatched_at=sa.func.coalesce(JOBS.c.dispatched_at,
                                               at if dispatched_at is None
                                               else dt(dispatched_at)))
        .returning(*JOBS.c)
    )
    started = [job_from_row(cast(JobRow, row)) for row in session.execute(stmt)]
    if again:
        mine = sa.select(JOBS).where(JOBS.c.start_token == token,
                                     JOBS.c.status == Status.RUNNING.value,
                                     JOBS.c.id.in_([j for j, _ in riders]))
        seen = {job.id for job in started}
        started += [job for job in (job_from_row(cast(JobRow, row))
                                    for row in session.execute(mine)) if job.id not in seen]
    held = len(started) + 1
    ids = [lead] if held == size else [lead, *(job.id for job in started)]
    session.execute(sa.update(JOBS).where(JOBS.c.id.in_(ids)).values(run_items=held))
    if held != size:
        started = [dataclasses.replace(job, run_items=held) for job in started]
    return started
