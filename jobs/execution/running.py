"""Running a job's handler: calling it, telling how it ended, and the handlers running now.

Apart from ``jobs.execution.attempt`` because none of it touches SQL or Redis: the attempt
records what the ``Ending`` returned here says. The handlers running in this process are kept
so that a worker told to stop can ask each to stop (``hand_back_running``) and hand its job
back to the queue, instead of being killed and leaving it to the reaper.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from jobs.core.domain import Job
from jobs.execution.handlers import (
    JobCancelled,
    JobContext,
    JobTimedOut,
    LeaseLost,
    RetryableError,
    WorkerStopping,
)
from jobs.execution.registry import HandlerRegistry

logger = logging.getLogger("tierq.worker")

# How a handler can end that is also an outcome of ``execute`` (``jobs.execution.attempt``).
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
# A handler that ran past its run-time limit (``jobs.execution.limits``).
TIMED_OUT = "timed_out"
# No handler for the job's kind in this process: nothing ran (``jobs.execution.unstarted``).
NOT_HERE = "not_here"

# Stored error texts are cut to this length.
MAX_ERROR_CHARS = 4000


class RunningHandlers:
    """The handlers running in this process, so that a stopping worker can reach them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contexts: dict[int, JobContext] = {}  # by identity: equal contexts may coexist

    def add(self, ctx: JobContext) -> None:
        with self._lock:
            self._contexts[id(ctx)] = ctx

    def discard(self, ctx: JobContext) -> None:
        with self._lock:
            self._contexts.pop(id(ctx), None)

    def count(self) -> int:
        with self._lock:
            return len(self._contexts)

    def hand_back_all(self) -> int:
        with self._lock:
            contexts = list(self._contexts.values())
        for ctx in contexts:
            ctx.mark_handed_back()
        return len(contexts)


RUNNING = RunningHandlers()


def hand_back_running() -> int:
    """Ask every job running in this process to stop and go back to the queue, uncharged;
    returns how many were asked."""
    return RUNNING.hand_back_all()


@dataclass(frozen=True, kw_only=True)
class Ending:
    """How the handler ended: one of SUCCEEDED, FAILED, CANCELLED, TIMED_OUT, "retry",
    "lease_lost", "handback", or NOT_HERE (it has none in this process)."""

    kind: str
    result: Any = None
    error: str | None = None


def call_handler(registry: HandlerRegistry, ctx: JobContext, job: Job) -> Ending:
    """Run the handler; turn every way it can end into an ``Ending``. A job whose cancel
    is already known (the renewal right after the start told of it) is not run at all."""
    if ctx.cancelled():
        return Ending(kind=CANCELLED)
    if not registry.runs(job.kind):  # a worker of other kinds: not the job's fault
        return Ending(kind=NOT_HERE)
    try:
        payload = registry.validate(job.kind, job.payload)
        registry.ready(job.kind)  # set up already, unless the worker sets up lazily
        result = registry.get(job.kind).run(ctx, payload)
    except LeaseLost:
        return Ending(kind="lease_lost")
    except WorkerStopping:
        return Ending(kind="handback")
    except JobCancelled:
        return Ending(kind=CANCELLED)
    except JobTimedOut:
        return Ending(kind=TIMED_OUT)
    except Exception as exc:
        if ctx.handed_back():  # most likely interrupted by the stop: another worker retries
            return Ending(kind="handback")
        if ctx.cancelled():  # most likely interrupted by the cancel; a retry would be wasted
            return Ending(kind=CANCELLED)
        if ctx.timed_out():  # most likely interrupted by its limit's stop
            return Ending(kind=TIMED_OUT)
        if isinstance(exc, RetryableError):
            return Ending(kind="retry", error=describe_error(exc))
        log_job(logging.WARNING, "job.handler_error", job, exc_info=True)
        return Ending(kind=FAILED, error=describe_error(exc))
    if ctx.cancelled():
        return Ending(kind=CANCELLED)
    if ctx.timed_out():  # a result past the limit is not kept: the limit is the contract
        return Ending(kind=TIMED_OUT)
    return Ending(kind=SUCCEEDED, result=result)


def describe_error(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"``: what is stored and shown; the traceback is logged."""
    text = str(exc)
    return cut_error(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def cut_error(text: str) -> str:
    """What is stored of an error: at most ``MAX_ERROR_CHARS``, with any U+0000 written out
    (``\\x00``), which PostgreSQL cannot store in text."""
    text = text.replace("\x00", "\\x00")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def log_job(level: int, event: str, job: Job, *, exc_info: bool = False, **fields: Any) -> None:
    extra = {
        "event": event, "job_id": job.id, "tenant": job.tenant_id, "tier": job.tier,
        "attempt": job.attempt, **fields,
    }
    logger.log(level, event, extra=extra, exc_info=exc_info)
