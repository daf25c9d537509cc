"""What becomes of a job whose lease is gone: the one decision the reaper and the
reconciler share.

A lease lapses when its worker died, its message was lost, or Redis lost it; either way the
job's SQL row says where it was, and the row decides (each move a compare-and-set, so a
worker finishing meanwhile wins and this changes nothing):

- ``queued``: a dispatch (or a worker's hand-over) whose message never started: the lease
  was the only trace of it (a dispatch writes nothing to SQL), so the row is indexed again
  as it is, same attempt, its place and deadline kept; a message of it still to come is a
  copy of that attempt, and the start's compare-and-set lets only one run it;
- ``dispatched`` (written by earlier versions only): it never started, so nothing is
  charged: back to the queue as a new attempt (``expired`` instead when its ``start_by`` has
  passed: it truly never started);
- ``running``: a start was spent. With starts left and its deadline not passed, back to the
  queue as a new attempt; else ``failed``, saying why, with ``started_at`` kept (its
  ``error_type``: ``timed_out`` when the attempt had run past its ``timeout_s``, as a worker
  hung whole does once nothing in it renews, ``deadline`` when only the deadline stopped a
  retry, else ``lease_lost``);
- terminal, or a batch item still ``waiting``: nothing (only the lease's release was lost,
  e.g. a hand-over interrupted after its ending's commit).

A ``running`` row is a start spent only if its handler may have run, and a handler runs
only after the renewal that follows its start succeeded, which extends the lease to a full
TTL past the start. So when the reaper finds a lease that lapsed sooner than that after the
row's start, the start landed after its lease was taken (the message waited in the broker
past it): that worker finds the lease gone and hands the job back uncharged, without
running it. The reaper does the same, uncharged: whichever compare-and-set
lands first moves the row, to the same place, and the other changes nothing. Charging it
would spend a start nobody computed, and with ``max_attempts: 1`` fail the job.

A compare-and-set that fails because the row moved under it is decided again on the row as
it is now. The reconciler knows no lease expiry: a row it read as ``dispatched`` that
started under its decision is left to the worker that started it (the renewal after that
start finds no lease, and the worker hands it back); a running row it finds without a
lease later is decided then.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from jobs.core.domain import Job
from jobs.core.error_types import ErrorType
from jobs.core.packing import split_cap
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


@dataclass(frozen=True)
class Lapsed:
    """The lease the reaper took for a job: when it expired, and the TTL a renewal gives."""

    expires_at: float
    ttl_s: float

    def before_renewal(self, job: Job) -> bool:
        """The lease lapsed before the renewal that follows the job's start landed (that
        renewal ends at least a TTL after the start; half a TTL allows for the clocks)."""
        return job.started_at is not None and self.expires_at < job.started_at + self.ttl_s / 2


def recover(session: Session, job: Job, now: float, lapsed: Lapsed | None = None) -> Recovered:
    """Decide (and write, in the caller's transaction) what happens to ``job``, whose lease
    is gone (``lapsed``: the reaper's lease; None: the reconciler found none); see the
    module docstring."""
    for _ in range(_ROUNDS):
        outcome = _recover_once(session, job, now, lapsed)
        if outcome is not None:
            return outcome
        fresh = jobs_sql.get_job(session, job.id)
        if fresh is None or (lapsed is None and _started_under(job, fresh)):
            return Recovered()
        job = fresh
    return Recovered()


def _started_under(seen: Job, fresh: Job) -> bool:
    """The attempt read as dispatched has started since the read."""
    return (seen.status is Status.DISPATCHED and fresh.status is Status.RUNNING
            and fresh.attempt == seen.attempt)


def _recover_once(
    session: Session, job: Job, now: float, lapsed: Lapsed | None
) -> Recovered | None:
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
    if lapsed is not None and lapsed.before_renewal(job):
        outcome = _move(session, job, Status.QUEUED, now,
                        Recovered(requeued=True, entry=indexed(job, attempt=job.attempt + 1)),
                        **jobs_sql.unstart_fields(job))
        if outcome is not None:
            logger.info("lease.expired.unstarted",
                        extra={"event": "lease.expired.unstarted", **log})
        return outcome
    if job.run_items is not None and job.run_items > 1:
        # Its run failed as a whole (its process died, or hung past its limit): not this
        # item's fault alone. Back uncharged, in runs of half the size (jobs.core.packing).
        outcome = _move(session, job, Status.QUEUED, now,
                        Recovered(requeued=True, entry=indexed(job, attempt=job.attempt + 1)),
                        **jobs_sql.unstart_fields(job), run_cap=split_cap(job.run_items))
        if outcome is not None:
            logger.warning("lease.expired.split", extra={
                "event": "lease.expired.split", "run_items": job.run_items, **log})
        return outcome
    spent = job.starts >= job.max_attempts
    late = job.start_by is not None and now >= job.start_by
    if spent or late:
        why = (f"start {job.starts} of {job.max_attempts}" if spent
               else f"start {job.starts}; no retry: the job's deadline (max_wait_s) has passed")
        overran = (job.timeout_s is not None and job.started_at is not None
                   and now >= job.started_at + job.timeout_s)
        after = f" after its run-time limit of {job.timeout_s:g} s" if overran else ""
        kind = (ErrorType.TIMED_OUT if overran else ErrorType.LEASE_LOST if spent
                else ErrorType.DEADLINE)
        outcome = _move(session, job, Status.FAILED, now, Recovered(failed=True),
                        error=f"the worker stopped renewing its lease{after} ({why})",
                        error_type=kind.value)
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
                     "deadline (max_wait_s)", "error_type": ErrorType.DEADLINE.value}


def _move(
    session: Session, job: Job, dst: Status, now: float, outcome: Recovered, **fields: Any
) -> Recovered | None:
    moved = jobs_sql.transition(
        session, job.id, src=job.status, attempt=job.attempt, dst=dst, now=now, **fields
    )
    return outcome if moved else None
