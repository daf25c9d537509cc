"""The job service behind the API's reads and cancels: look up, hand out results, cancel, retry.

Cancelling follows the job's state: a queued job leaves the index and becomes ``cancelled``;
a dispatched one is cancelled and its lease released; a running one is flagged for its
handler to stop cooperatively. Each SQL change is a compare-and-set, so a race with the
dispatcher or a worker is settled by reading the job again and acting on its new state.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from jobs.admission.submit import (
    PayloadValidator,
    Submission,
    Submitted,
    ring_dispatcher,
    submit,
)
from jobs.core.domain import Job, Tenant
from jobs.core.errors import (
    JobFailed,
    JobGone,
    JobNotEnded,
    NotFound,
    Unavailable,
)
from jobs.core.states import Status
from jobs.core.webhooks import Webhook, events_of
from jobs.index import counters, notify
from jobs.process.outage import REDIS_OUTAGE, SQL_OUTAGE
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store import upkeep as upkeep_sql

logger = logging.getLogger(__name__)


# Rounds of "read the job, act on its state" before a cancel gives up on a job that keeps
# moving under it (each round is one state change elsewhere).
_CANCEL_ROUNDS = 8


@dataclass(frozen=True, kw_only=True)
class CancelOutcome:
    job: Job
    pending: bool  # True: running, cancellation requested from its handler


def parse_job_id(job_id: str) -> str:
    """The canonical form of a job id; anything that is not a UUID names no job."""
    try:
        return str(uuid.UUID(job_id))
    except ValueError:
        raise NotFound("no such job", job_id=job_id) from None


def load_job(runtime: Runtime, tenant: Tenant, job_id: str) -> Job:
    """The tenant's job; another tenant's job is "not found" too, never "forbidden"."""
    canonical = parse_job_id(job_id)
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, canonical, tenant_id=tenant.id)
        pruned = job is None and upkeep_sql.was_pruned(session, canonical, tenant_id=tenant.id)
    if pruned:
        raise JobGone("the job was removed after its retention period", type="job_gone",
                      job_id=job_id)
    if job is None:
        raise NotFound("no such job", job_id=job_id)
    return job


def finished_result(job: Job) -> Any:
    """The result of a succeeded job; a typed error for the other terminal states."""
    if job.status is Status.FAILED:
        raise JobFailed("the job failed", job_id=job.id, job_error=job.error)
    if job.status is Status.CANCELLED:
        raise JobGone("the job was cancelled", type="job_cancelled", job_id=job.id)
    if job.status is Status.EXPIRED:
        message = "the job expired before it started"
        if job.starts:
            message = ("the job ran but did not finish, and its retry did not start before "
                       "its deadline (max_wait_s)")
        raise JobGone(message, type="job_expired", job_id=job.id)
    return job.result


def hand_out_result(runtime: Runtime, job: Job) -> Any:
    """The result of a finished job (as ``finished_result``), stamping the first hand-out:
    a succeeded job pruned without one counts as abandoned (``jobs.dispatch.retention``). Only the
    first fetch writes; a failed stamp is logged and the result still handed out."""
    result = finished_result(job)
    if job.result_fetched_at is None:
        try:
            with runtime.sessions.begin() as session:
                jobs_sql.mark_result_fetched(session, job.id, now=runtime.clock())
        except SQL_OUTAGE:
            logger.warning("job.fetch_mark_failed", extra={"event": "job.fetch_mark_failed",
                                                           "job_id": job.id})
    return result


def cancel(runtime: Runtime, tenant: Tenant, job_id: str) -> CancelOutcome:
    job = load_job(runtime, tenant, job_id)
    for _ in range(_CANCEL_ROUNDS):
        outcome = _cancel_step(runtime, job)
        if outcome is not None:
            return outcome
        job = load_job(runtime, tenant, job.id)  # it moved under us: act on its new state
    raise Unavailable("the job keeps changing state; retry the cancel", retry_after_s=1)


RETRYABLE = frozenset({Status.FAILED, Status.EXPIRED, Status.CANCELLED})


def retry(
    runtime: Runtime, validator: PayloadValidator, tenant: Tenant, job_id: str,
    idempotency_key: str | None = None,
) -> Submitted:
    """A new job with the ended job's kind, payload and limits, admitted as any submit is
    (``429`` included); the ended job is left as it was, named by the new one's ``retry_of``.
    ``JobNotEnded`` (409) for a job that has not ended, or that succeeded.

    ``idempotency_key`` is the tenant's, as a submit's is: the same retry again is answered
    with the job it made (``created`` False), a key used for other work (a submit, another
    job's retry) is ``IdempotencyConflict``."""
    job = load_job(runtime, tenant, job_id)
    if job.status not in RETRYABLE:
        raise JobNotEnded(
            f"job {job.id} is {job.status.value}: only a failed, expired or cancelled job is "
            "retried", job_status=job.status.value, job_id=job.id)
    return submit(runtime, validator, tenant, Submission(
        kind=job.kind, payload=job.payload, max_wait_s=job.max_wait_s,
        max_attempts=job.max_attempts, timeout_s=job.timeout_s, blob=job.blob,
        retry_of=job.id, webhook=_own_webhook(job), idempotency_key=idempotency_key))


def _own_webhook(job: Job) -> Webhook | None:
    """The job's own webhook, which its retry keeps (a batch item's is its batch's)."""
    if job.webhook_url is None or job.batch_id is not None:
        return None
    return Webhook(url=job.webhook_url, events=events_of(job.webhook_events))


def _cancel_step(runtime: Runtime, job: Job) -> CancelOutcome | None:
    runtime = runtime.for_kind(job.kind)
    if job.terminal:
        return CancelOutcome(job=job, pending=False)
    if job.status is Status.RUNNING:
        with runtime.sessions.begin() as session:
            flagged = jobs_sql.request_cancel(session, job.id)
        if not flagged:
            return None
        try:  # the worker learns of it with its next renewal; missed, the reconciler flags it
            runtime.index.flag_cancel(job.id, attempt=job.attempt)
        except REDIS_OUTAGE:
            logger.warning("job.cancel_flag_failed", extra={"event": "job.cancel_flag_failed",
                                                            "job_id": job.id})
        _log_cancel(job, "job.cancel_requested")
        return CancelOutcome(job=dataclasses.replace(job, cancel_requested=True), pending=True)
    # SQL first (the commit point): an interruption after it leaves an index entry of a
    # cancelled job: a dispatch that pops it publishes it, and the worker's start ends nothing
    # and frees the slot; the reconciler removes an entry nobody pops.
    with runtime.sessions.begin() as session:
        moved = jobs_sql.transition(
            session, job.id, src=job.status, attempt=job.attempt, dst=Status.CANCELLED,
            now=runtime.clock(),
        )
    if not moved:
        return None
    notify.announce(runtime.redis, runtime.prefix, [job.id])
    try:
        queued = job.status is Status.QUEUED
        removed = runtime.index.cancel(job.id, tenant=job.tenant_id) if queued else False
        if not removed:
            # Dispatched, or popped by a dispatcher that has not recorded it yet: free its slot.
            runtime.index.release(job.id, attempt=job.attempt)
            ring_dispatcher(runtime)
    except REDIS_OUTAGE:
        logger.warning("job.unindex_failed", extra={"event": "job.unindex_failed",
                                                    "job_id": job.id})
    counters.count(runtime.redis, runtime.prefix, jobs={"cancelled": 1})
    _log_cancel(job, "job.cancelled")
    return CancelOutcome(job=dataclasses.replace(job, status=Status.CANCELLED), pending=False)


def _log_cancel(job: Job, event: str) -> None:
    logger.info(event, extra={"event": event, "job_id": job.id, "tenant": job.tenant_id,
                              "tier": job.tier, "attempt": job.attempt})
