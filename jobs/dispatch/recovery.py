"""What becomes of a job whose lease is gone: the one decision the reaper and the
reconciler share.

A lease lapses when its worker died, its message was lost, or Redis lost it; either way the
job's SQL row says where it was, and the row decides (each move a compare-and-set, so a
worker finishing meanwhile wins and this changes nothing):

- ``queued``: a round leased it and never marked it dispatched: index it again as it is;
- ``dispatched``: it never started, so nothing is charged: back to the queue as a new
  attempt (``expired`` instead when its ``start_by`` has passed: it truly never started);
- ``running``: a start was spent. With starts left and its deadline not passed, back to the
  queue as a new attempt; else ``failed``, saying why, with ``started_at`` kept;
- terminal: nothing (only the lease's release was lost).

A compare-and-set that fails because the row moved under it (a worker's dispatched →
running landing just as the lease was reaped) is decided again on the row as it is now.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.orm import Session

from jobs.core.domain import Job
from jobs.core.states import Status
from jobs.index.base import IndexedJob, NotLeader
from jobs.store import jobs as jobs_sql
from jobs.store import upkeep as upkeep_sql

logger = logging.getLogger("tierq.dispatcher")

# A row that keeps moving under the decision is left to the next round after this many reads.
_ROUNDS = 3


@dataclass
class Recovered:
    """The outcome of one ``recover`` call, for the caller's stats."""

    requeued: bool = False
    failed: bool = False
    expired: bool = False
    # What to index (after the SQL transaction commits), if anything.
    entry: IndexedJob | None = None


def indexed(job: Job, not_before: float | None = None, attempt: int | None = None) -> IndexedJob:
    """The index's entry for a queued job (``not_before``, ``attempt`` override the job's)."""
    return IndexedJob(
        job_id=job.id,
        tenant=job.tenant_id,
        tier=job.tier,
        order_key=job.order_key,
        start_by=job.start_by,
        not_before=not_before if not_before is not None else job.not_before,
        attempt=job.attempt if attempt is None else attempt,
    )


def check_lead(session: Session, fence: str | None) -> None:
    """First in a transaction that decides jobs from leases found lapsed: refuse once another
    dispatcher has claimed the lead in SQL (it may have restored those leases since, and a
    worker started on one). ``fence`` None: unfenced (a lone dispatcher, ``tierq repair``)."""
    if fence is not None and not upkeep_sql.holds_lead(session, fence):
        raise NotLeader("another dispatcher has claimed the lead in SQL")


def recover(session: Session, job: Job, now: float) -> Recovered:
    """Decide (and write, in the caller's transaction) what happens to ``job``, whose lease
    is gone; see the module docstring."""
    for _ in range(_ROUNDS):
        outcome = _recover_once(session, job, now)
        if outcome is not None:
            return outcome
        fresh = jobs_sql.get_job(session, job.id)
        if fresh is None:
            return Recovered()
        job = fresh
    return Recovered()


def _recover_once(session: Session, job: Job, now: float) -> Recovered | None:
    """The outcome, or None when the compare-and-set found the row moved."""
    if job.status is Status.QUEUED:
        return Recovered(entry=indexed(job))
    if job.status is Status.DISPATCHED:
        if job.start_by is not None and now >= job.start_by:
            return _move(session, job, Status.EXPIRED, now, Recovered(expired=True),
                         **expiry_note(job))
        return _move(session, job, Status.QUEUED, now,
                     Recovered(requeued=True, entry=indexed(job, attempt=job.attempt + 1)))
    if job.status is not Status.RUNNING:
        return Recovered()  # finished: only its release was lost
    log = {"job_id": job.id, "tenant": job.tenant_id, "tier": job.tier, "attempt": job.attempt}
    spent = job.starts >= job.max_attempts
    late = job.start_by is not None and now >= job.start_by
    if spent or late:
        why = (f"start {job.starts} of {job.max_attempts}" if spent
               else f"start {job.starts}; no retry: the job's deadline (max_wait_s) has passed")
        outcome = _move(session, job, Status.FAILED, now, Recovered(failed=True),
                        error=f"the worker stopped renewing its lease ({why})")
        if outcome is not None and outcome.failed:
            logger.warning("lease.expired.failed", extra={"event": "lease.expired.failed", **log})
        return outcome
    outcome = _move(session, job, Status.QUEUED, now,
                    Recovered(requeued=True, entry=indexed(job, attempt=job.attempt + 1)))
    if outcome is not None:
        logger.warning("lease.expired.requeued", extra={"event": "lease.expired.requeued", **log})
    return outcome


def expiry_note(job: Job) -> dict[str, str]:
    """The error an expiring job keeps when an earlier start of it ran: its client can tell
    "never computed" from "ran, and its retry came too late"."""
    if job.starts == 0:
        return {}
    return {"error": f"start {job.starts} ran; the retry did not start before the job's "
                     "deadline (max_wait_s)"}


def _move(
    session: Session, job: Job, dst: Status, now: float, outcome: Recovered, **fields: str
) -> Recovered | None:
    moved = jobs_sql.transition(
        session, job.id, src=job.status, attempt=job.attempt, dst=dst, now=now, **fields
    )
    return outcome if moved else None
