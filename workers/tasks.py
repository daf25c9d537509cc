"""The one Celery task: ``tierq.run_job(job_id, attempt)``. Thin: it calls
``jobs.execution.attempt``.

The message carries ids, never objects; running it twice is harmless (the compare-and-set
on ``(status, attempt)`` turns every copy but the first into a no-op).

How the task ends is what Flower shows. A job recorded ``failed`` raises ``JobFailedError``
after SQL has it, so the task ends FAILURE. The exception is declared in ``throws``: Celery
logs it in one INFO line, without a traceback (the handler's own traceback is logged once, as
``job.handler_error``). Nothing runs the job again: the message was acked on receipt, and the
task has no autoretry. Every other outcome ends SUCCESS with the outcome as its result:
``succeeded``; ``cancelled`` and ``expired``, which are what was asked for (a client's cancel,
a deadline nobody could meet), not faults of the work; ``requeued``, a retryable error whose
next attempt is a new message; ``stale``, a copy of a message with nothing left to do.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import sqlalchemy.exc

from jobs.core.errors import TierqError
from jobs.execution.attempt import execute
from jobs.execution.running import FAILED
from jobs.process.runtime import Runtime
from jobs.process.settings import Settings
from jobs.store import jobs as jobs_sql
from workers.handlers import HandlerRegistry, default_registry

TASK_NAME = "tierq.run_job"


class JobFailedError(TierqError):
    """Ends the Celery task of a job recorded ``failed`` in state FAILURE."""

    def __init__(self, job_id: str, error: str | None) -> None:
        super().__init__(f"job {job_id} failed: {error or 'no error recorded'}",
                         job_id=job_id, job_error=error)
        self.job_id = job_id
        self.error = error

    def __reduce__(self) -> tuple[type[JobFailedError], tuple[str, str | None]]:
        # Pickled by the prefork pool: rebuild from the fields, not from ``args``.
        return (type(self), (self.job_id, self.error))


class WorkerResources:
    """The Runtime and handler registry of one worker process, built on first use.

    Never at import time, and never shared across a fork: a child process (prefork pool)
    builds its own connections the first time it runs a task.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._runtime: Runtime | None = None
        self._registry: HandlerRegistry | None = None

    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None or self._pid != os.getpid():
                self._runtime = Runtime.from_settings(self.settings)
                self._pid = os.getpid()
            return self._runtime

    def registry(self) -> HandlerRegistry:
        with self._lock:
            if self._registry is None:
                self._registry = default_registry()
            return self._registry

    def close(self) -> None:
        with self._lock:
            if self._runtime is not None and self._pid == os.getpid():
                self._runtime.close()
            self._runtime = None


def resources_of(app: Any) -> WorkerResources:
    resources: WorkerResources = app.tierq_resources
    return resources


def run_job(task: Any, job_id: str, attempt: int) -> str:
    """Run the attempt; its outcome is the task's result, or ``JobFailedError`` (FAILURE)."""
    resources = resources_of(task.app)
    runtime = resources.runtime()
    outcome = execute(
        runtime,
        resources.registry(),
        str(job_id),
        int(attempt),
        worker_id=str(task.request.hostname or f"pid-{os.getpid()}"),
    )
    if outcome == FAILED:
        raise JobFailedError(str(job_id), _recorded_error(runtime, str(job_id)))
    return outcome


def _recorded_error(runtime: Runtime, job_id: str) -> str | None:
    """The error the job was failed with: it is in SQL already (best effort, failures only)."""
    try:
        with runtime.sessions() as session:
            job = jobs_sql.get_job(session, job_id)
    except sqlalchemy.exc.SQLAlchemyError:
        return None
    return None if job is None else job.error


def register_tasks(app: Any, resources: WorkerResources) -> None:
    """Attach ``resources`` to ``app`` and register ``tierq.run_job`` on it."""
    app.tierq_resources = resources
    app.task(
        name=TASK_NAME, bind=True, ignore_result=True, acks_late=False,
        throws=(JobFailedError,), max_retries=0,
    )(run_job)
