"""The one Celery task: ``tierq.run_job(job_id, attempt)``. Thin: it calls ``jobs.execution``.

The message carries ids, never objects; running it twice is harmless (the compare-and-set
on ``(status, attempt)`` turns every copy but the first into a no-op).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from jobs.config import Settings
from jobs.execution import execute
from jobs.runtime import Runtime
from workers.handlers import HandlerRegistry, default_registry

TASK_NAME = "tierq.run_job"


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
    resources = resources_of(task.app)
    return execute(
        resources.runtime(),
        resources.registry(),
        str(job_id),
        int(attempt),
        worker_id=str(task.request.hostname or f"pid-{os.getpid()}"),
    )


def register_tasks(app: Any, resources: WorkerResources) -> None:
    """Attach ``resources`` to ``app`` and register ``tierq.run_job`` on it."""
    app.tierq_resources = resources
    app.task(name=TASK_NAME, bind=True, ignore_result=True, acks_late=False)(run_job)
