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
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
import sqlalchemy.exc

from jobs import wake
from jobs.db import repository
from jobs.domain import Job
from jobs.index.base import IndexedJob
from jobs.policy import retry_backoff_s
from jobs.runtime import Runtime
from jobs.states import Status
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

# How often a running job's cancel flag is read from SQL, at most.
CANCEL_POLL_S = 1.0
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
    with runtime.sessions() as session:
        job = repository.get_job(session, job_id)
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
    return _Attempt(runtime=runtime, job=job, worker_id=worker_id, clock=clock).run(registry)


@dataclass(frozen=True, kw_only=True)
class _Ending:
    """How the handler ended: one of SUCCEEDED, FAILED, CANCELLED, "retry", "lease_lost"."""

    kind: str
    result: Any = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class _Attempt:
    """One attempt of one job, dispatched to this worker."""

    runtime: Runtime
    job: Job
    worker_id: str
    clock: Clock

    def run(self, registry: HandlerRegistry) -> str:
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
        try:
            ending = _call_handler(registry, ctx, self.job) if not ctx.lease_lost() else None
        finally:
            heartbeat.stop()
        return self._finish(ending or _Ending(kind="lease_lost"))

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

    def _finish(self, ending: _Ending) -> str:
        if ending.kind == "lease_lost":
            self._log(logging.WARNING, "job.stale", reason="lease lost")
            return STALE
        if ending.kind == "retry":
            return self._retry(ending.error or "RetryableError")
        if ending.kind == SUCCEEDED:
            try:
                result = json.loads(json.dumps(ending.result, allow_nan=False))
            except (TypeError, ValueError) as exc:
                error = f"result is not JSON-serialisable: {describe_error(exc)}"
                return self._end(Status.FAILED, error=_cut(error))
            return self._end(Status.SUCCEEDED, result=result)
        if ending.kind == FAILED:
            return self._end(Status.FAILED, error=ending.error)
        return self._end(Status.CANCELLED)

    def _end(self, dst: Status, **fields: Any) -> str:
        if not self._transition(Status.RUNNING, dst, **fields):
            self._log(logging.WARNING, "job.stale", reason="late result rejected")
            return STALE
        self._release()
        level = logging.WARNING if dst is Status.FAILED else logging.INFO
        self._log(level, f"job.{dst.value}", error=fields.get("error"))
        return dst.value

    def _retry(self, error: str) -> str:
        job, policy = self.job, self.runtime.policy
        if job.attempt >= job.max_attempts:
            return self._end(
                Status.FAILED, error=_cut(f"{error} (attempt {job.attempt} of {job.max_attempts})")
            )
        delay = retry_backoff_s(job.attempt, policy.retry_backoff_s, policy.retry_backoff_max_s)
        not_before = self.clock() + delay
        if not self._transition(Status.RUNNING, Status.QUEUED, not_before=not_before):
            self._log(logging.WARNING, "job.stale", reason="late retry rejected")
            return STALE
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
        with self.runtime.sessions.begin() as session:
            return repository.transition(
                session, self.job.id, src=src, attempt=self.job.attempt, dst=dst,
                now=self.clock(), **fields,
            )

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


class Heartbeat:
    """Keeps a running job's lease alive and notices a cancel request.

    ``tick`` renews the lease when ``lease_ttl_s / 3`` has passed since the last renewal
    and reads the job's row; ``start`` runs ticks in a thread every ``min(CANCEL_POLL_S,
    lease_ttl_s / 3)`` until ``stop``. A lease that cannot be renewed, or a row that is no
    longer this attempt running, marks the lease lost.
    """

    def __init__(
        self, runtime: Runtime, ctx: JobContext, *, clock: Clock, poll_s: float = CANCEL_POLL_S
    ) -> None:
        self._runtime = runtime
        self._ctx = ctx
        self._clock = clock
        self._ttl = runtime.policy.lease_ttl_s
        self._renew_every = self._ttl / 3
        self._tick_every = min(poll_s, self._renew_every)
        self._renewed_at = -math.inf
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"heartbeat-{ctx.job_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def tick(self) -> None:
        now = self._clock()
        if now - self._renewed_at >= self._renew_every:
            self._renew(now)
        if not self._ctx.stopped():
            self._poll()

    def _loop(self) -> None:
        while not self._stopping.wait(self._tick_every):
            try:
                self.tick()
            except Exception:  # the heartbeat must outlive any one failed tick
                logger.exception(
                    "job.heartbeat_error",
                    extra={"event": "job.heartbeat_error", "job_id": self._ctx.job_id},
                )

    def _renew(self, now: float) -> None:
        try:
            renewed = self._runtime.index.renew(self._ctx.job_id, expires_at=now + self._ttl)
        except redis.RedisError:
            self._warn("job.renew_failed", exc_info=True)
            return
        self._renewed_at = now
        if not renewed:
            self._ctx.mark_lease_lost()
            self._warn("job.lease_lost")

    def _poll(self) -> None:
        try:
            with self._runtime.sessions() as session:
                job = repository.get_job(session, self._ctx.job_id)
        except sqlalchemy.exc.SQLAlchemyError:
            self._warn("job.poll_failed", exc_info=True)
            return
        if job is None or job.status is not Status.RUNNING or job.attempt != self._ctx.attempt:
            self._ctx.mark_lease_lost()
            self._warn("job.lease_lost", status=None if job is None else job.status.value)
        elif job.cancel_requested and not self._ctx.cancelled():
            self._ctx.mark_cancelled()
            logger.info(
                "job.cancel_seen",
                extra={"event": "job.cancel_seen", "job_id": job.id, "attempt": job.attempt},
            )

    def _warn(self, event: str, *, exc_info: bool = False, **fields: Any) -> None:
        extra = {"event": event, "job_id": self._ctx.job_id, "attempt": self._ctx.attempt}
        logger.warning(event, extra={**extra, **fields}, exc_info=exc_info)
