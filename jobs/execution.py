"""The worker side of a job: start it, keep its lease, run its handler, record how it ended.

Celery-free: the ``tierq.run_job`` task only unpacks ``(job_id, attempt)`` and calls
``execute``. Every state change is a compare-and-set on ``(status, attempt)``, so a
duplicated or stale message, or a late result after the lease was reaped, changes nothing.

- At start, work nobody will collect is not computed: a cancel request or a passed
  ``start_by`` ends the job (``cancelled``/``expired``) before the handler runs.
- While the handler runs, a heartbeat thread renews the lease every ``lease_ttl_s / 3``
  and polls SQL for a cancel request; a failed renewal marks the lease lost.
- A lease is released only after a state change of *this* attempt succeeded; a stale call
  never touches it (it belongs to the current attempt). Each release rings the doorbell so
  the dispatcher fills the slot at once.
- SQL that cannot be reached is waited out, not given up on: every read and compare-and-set
  is retried with backoff while the lease is kept renewed (by hand before the job starts,
  by the heartbeat after), until SQL answers or the lease is lost. A result in hand is never
  thrown away because the database blinked; were the lease lost meanwhile, the CAS on
  ``attempt`` rejects the late write.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy.orm import Session

from jobs import wake
from jobs.db import repository
from jobs.domain import Job
from jobs.index.base import IndexedJob
from jobs.leases import CANCEL_POLL_S, Heartbeat, LeaseKeeper, SqlUnreachable, retry_sql
from jobs.policy import retry_backoff_s
from jobs.runtime import Runtime
from jobs.states import NEW_ATTEMPT, Status
from workers.handlers import (
    HandlerRegistry,
    JobCancelled,
    JobContext,
    LeaseLost,
    RetryableError,
)

logger = logging.getLogger("tierq.worker")

SUCCEEDED, FAILED, CANCELLED, EXPIRED = "succeeded", "failed", "cancelled", "expired"
REQUEUED, STALE = "requeued", "stale"

__all__ = ["CANCEL_POLL_S", "Heartbeat", "execute"]

# Stored error texts are cut to this length.
MAX_ERROR_CHARS = 4000
Clock = Callable[[], float]


def execute(
    runtime: Runtime,
    registry: HandlerRegistry,
    job_id: str,
    attempt: int,
    *,
    worker_id: str,
    clock: Clock = time.time,
) -> str:
    """Run attempt ``attempt`` of job ``job_id``; return the outcome (see module constants)."""
    keeper = LeaseKeeper(runtime, job_id, clock)

    def read() -> Job | None:
        with runtime.sessions() as session:
            return repository.get_job(session, job_id)

    try:
        job = retry_sql(read, keep_trying=keeper.renew, what="read", job_id=job_id)
    except SqlUnreachable:
        _log_unrecorded(job_id, attempt, "read")
        return STALE
    if job is None or job.status is not Status.DISPATCHED or job.attempt != attempt:
        logger.info(
            "job.stale",
            extra={
                "event": "job.stale", "job_id": job_id, "attempt": attempt,
                "worker_id": worker_id, "status": None if job is None else job.status.value,
                "current_attempt": None if job is None else job.attempt,
            },
        )
        return STALE
    return _Attempt(runtime, job, worker_id=worker_id, clock=clock, keeper=keeper).run(registry)


def _log_unrecorded(job_id: str, attempt: int, step: str) -> None:
    """Gave up on SQL: the lease lapses and the reaper runs the job again."""
    logger.error("job.sql_gave_up", extra={
        "event": "job.sql_gave_up", "job_id": job_id, "attempt": attempt, "step": step})


@dataclass(frozen=True, kw_only=True)
class _Ending:
    """How the handler ended: one of SUCCEEDED, FAILED, CANCELLED, "retry", "lease_lost"."""

    kind: str
    result: Any = None
    error: str | None = None


class _Attempt:
    """One attempt of one job, dispatched to this worker."""

    def __init__(
        self, runtime: Runtime, job: Job, *, worker_id: str, clock: Clock, keeper: LeaseKeeper
    ) -> None:
        self.runtime = runtime
        self.job = job
        self.worker_id = worker_id
        self.clock = clock
        # Says whether to keep waiting for SQL: the keeper before the start, the heartbeat
        # while the job runs and until its outcome is recorded.
        self._holds_lease: Callable[[], bool] = keeper.renew

    def run(self, registry: HandlerRegistry) -> str:
        try:
            return self._run(registry)
        except SqlUnreachable:
            _log_unrecorded(self.job.id, self.job.attempt, "record")
            return STALE

    def _run(self, registry: HandlerRegistry) -> str:
        early = self._before_start()
        if early is not None:
            return early
        if not self._transition(Status.DISPATCHED, Status.RUNNING):
            self._log(logging.INFO, "job.stale", reason="not dispatched any more")
            return STALE
        self._log(logging.INFO, "job.started", kind=self.job.kind)
        ctx = JobContext(
            job_id=self.job.id, attempt=self.job.attempt, tenant_id=self.job.tenant_id,
            kind=self.job.kind,
        )
        heartbeat = Heartbeat(self.runtime, ctx, clock=self.clock)
        heartbeat.tick()  # renew now: the message may have waited in the broker
        heartbeat.start()
        self._holds_lease = heartbeat.holds_lease
        try:
            ending = _call_handler(registry, ctx, self.job) if not ctx.lease_lost() else None
            # The outcome is this attempt's to record: stop watching the row, keep the lease.
            heartbeat.renew_only()
            return self._finish(ending or _Ending(kind="lease_lost"), heartbeat)
        finally:
            heartbeat.stop()

    def _before_start(self) -> str | None:
        """Cancelled or expired before it started: end it without computing anything."""
        if self.job.cancel_requested:
            dst = Status.CANCELLED
        elif self.job.start_by is not None and self.clock() > self.job.start_by:
            dst = Status.EXPIRED
        else:
            return None
        if not self._transition(Status.DISPATCHED, dst):
            self._log(logging.INFO, "job.stale", reason="not dispatched any more")
            return STALE
        self._release()
        self._log(logging.INFO, f"job.{dst.value}", before_start=True)
        return dst.value

    def _finish(self, ending: _Ending, heartbeat: Heartbeat) -> str:
        if ending.kind == "lease_lost":
            self._log(logging.WARNING, "job.stale", reason="lease lost")
            return STALE
        if ending.kind == "retry":
            return self._retry(ending.error or "RetryableError", heartbeat)
        if ending.kind == SUCCEEDED:
            try:
                result = json.loads(json.dumps(ending.result, allow_nan=False))
            except (TypeError, ValueError) as exc:
                error = f"result is not JSON-serialisable: {describe_error(exc)}"
                return self._end(Status.FAILED, heartbeat, error=_cut(error))
            return self._end(Status.SUCCEEDED, heartbeat, result=result)
        if ending.kind == FAILED:
            return self._end(Status.FAILED, heartbeat, error=ending.error)
        return self._end(Status.CANCELLED, heartbeat)

    def _end(self, dst: Status, heartbeat: Heartbeat, **fields: Any) -> str:
        if not self._transition(Status.RUNNING, dst, **fields):
            self._log(logging.WARNING, "job.stale", reason="late result rejected")
            return STALE
        heartbeat.stop()  # no renewal may follow the release
        self._release()
        level = logging.WARNING if dst is Status.FAILED else logging.INFO
        self._log(level, f"job.{dst.value}", error=fields.get("error"))
        return dst.value

    def _retry(self, error: str, heartbeat: Heartbeat) -> str:
        job, policy = self.job, self.runtime.policy
        if job.attempt >= job.max_attempts:
            return self._end(
                Status.FAILED, heartbeat,
                error=_cut(f"{error} (attempt {job.attempt} of {job.max_attempts})"),
            )
        delay = retry_backoff_s(job.attempt, policy.retry_backoff_s, policy.retry_backoff_max_s)
        not_before = self.clock() + delay
        if not self._transition(Status.RUNNING, Status.QUEUED, not_before=not_before):
            self._log(logging.WARNING, "job.stale", reason="late retry rejected")
            return STALE
        heartbeat.stop()
        indexed = IndexedJob(
            job_id=job.id, tenant=job.tenant_id, tier=job.tier, order_key=job.order_key,
            start_by=job.start_by, not_before=not_before,
        )
        try:
            # Replaces this attempt's lease atomically: no release afterwards, which could
            # drop the lease of the next attempt.
            self.runtime.index.requeue(indexed)
        except redis.RedisError:
            self._log(logging.ERROR, "job.requeue_failed", exc_info=True)
        self._ring()
        self._log(logging.INFO, "job.requeued", not_before=not_before, error=error)
        return REQUEUED

    def _transition(self, src: Status, dst: Status, **fields: Any) -> bool:
        """The CAS, waiting out a database outage while the lease is held. After a retry, a
        CAS that finds its own change already made (the commit landed, its answer was lost)
        counts as done."""
        job, retried = self.job, [False]

        def cas() -> bool:
            with self.runtime.sessions.begin() as session:
                if retried[0] and _landed(session, job, src, dst):
                    return True
                return repository.transition(
                    session, job.id, src=src, attempt=job.attempt, dst=dst,
                    now=self.clock(), **fields,
                )

        def keep_trying() -> bool:
            retried[0] = True
            return self._holds_lease()

        return retry_sql(cas, keep_trying=keep_trying, what=f"{src.value}->{dst.value}",
                         job_id=job.id)

    def _release(self) -> None:
        """Best effort: a lease that cannot be released now expires and is reaped."""
        try:
            self.runtime.index.release(self.job.id)
        except redis.RedisError:
            self._log(logging.WARNING, "job.release_failed", exc_info=True)
        self._ring()

    def _ring(self) -> None:
        try:
            wake.ring(self.runtime.redis, self.runtime.settings.key_prefix)
        except redis.RedisError:
            self._log(logging.WARNING, "dispatcher.ring_failed", exc_info=True)

    def _log(self, level: int, event: str, *, exc_info: bool = False, **fields: Any) -> None:
        _log_job(level, event, self.job, worker_id=self.worker_id, exc_info=exc_info, **fields)


def _landed(session: Session, job: Job, src: Status, dst: Status) -> bool:
    """This attempt's move to ``dst`` is already in the row (a new attempt for a requeue)."""
    current = repository.get_job(session, job.id)
    if current is None or current.status is not dst:
        return False
    expected = job.attempt + 1 if (src, dst) in NEW_ATTEMPT else job.attempt
    return current.attempt == expected


def _call_handler(registry: HandlerRegistry, ctx: JobContext, job: Job) -> _Ending:
    """Run the handler; turn every way it can end into an ``_Ending``."""
    try:
        payload = registry.validate(job.kind, job.payload)
        result = registry.get(job.kind).run(ctx, payload)
    except LeaseLost:
        return _Ending(kind="lease_lost")
    except JobCancelled:
        return _Ending(kind=CANCELLED)
    except Exception as exc:
        if ctx.cancelled():  # most likely interrupted by the cancel; a retry would be wasted
            return _Ending(kind=CANCELLED)
        if isinstance(exc, RetryableError):
            return _Ending(kind="retry", error=describe_error(exc))
        _log_job(logging.WARNING, "job.handler_error", job, exc_info=True)
        return _Ending(kind=FAILED, error=describe_error(exc))
    if ctx.cancelled():
        return _Ending(kind=CANCELLED)
    return _Ending(kind=SUCCEEDED, result=result)


def describe_error(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"``: what is stored and shown; the traceback is logged."""
    text = str(exc)
    return _cut(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _log_job(level: int, event: str, job: Job, *, exc_info: bool = False, **fields: Any) -> None:
    extra = {
        "event": event, "job_id": job.id, "tenant": job.tenant_id, "tier": job.tier,
        "attempt": job.attempt, **fields,
    }
    logger.log(level, event, extra=extra, exc_info=exc_info)
