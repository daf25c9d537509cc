"""The one Celery task: ``tierq.run_job(job_id, attempt)``. Thin: it calls
``jobs.execution.attempt``.

The message carries ids (and when its lease was taken), never objects; running it twice is
harmless (the compare-and-set on ``(status, attempt)`` turns every copy but the first into a
no-op). A slot that frees takes its next job in the step that releases the last one
(``jobs.index.hand_over``), and its message goes to this worker's own queue
(``workers.app.own_queue``): no dispatcher round sits between two jobs.

How the task ends is what Flower shows. A job recorded ``failed`` raises ``JobFailedError``
after SQL has it, so the task ends FAILURE. The exception is declared in ``throws``: Celery
logs it in one INFO line, without a traceback (the handler's own traceback is logged once, as
``job.handler_error``). Nothing runs the job again: the message was acked on receipt, and the
task has no autoretry. A job that led a packed run (``jobs.execution.packing``: one message
per run) says so in its result, with the run's size. Every other outcome ends SUCCESS with
the outcome as its result:
``succeeded``; ``cancelled`` and ``expired``, which are what was asked for (a client's cancel,
a deadline nobody could meet), not faults of the work; ``requeued``, a retryable error whose
next attempt is a new message; ``stale``, a copy of a message with nothing left to do.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import sqlalchemy.exc
from celery.utils.nodenames import anon_nodename

from jobs.core.errors import TierqError
from jobs.execution.attempt import Handover, execute
from jobs.execution.running import FAILED
from jobs.index.base import Lease, MessagePush, TierPush, TierQueue
from jobs.process.runtime import Runtime
from jobs.process.settings import Settings
from jobs.store import jobs as jobs_sql
from workers import stopping
from workers.broker import broker_names
from workers.handlers import HandlerRegistry, default_registry
from workers.handover import InProcess, lease_args

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
        # This worker's own queue (``workers.app.own_queue``), set by the worker that consumes
        # it: a slot that frees passes its next job there. None: not consumed, not used.
        self.own_queue: str | None = None
        # The kinds this worker runs, as it registers them (None: not said, every kind).
        self.kinds: list[str] | None = None
        self._push: MessagePush | None = None
        # The thread pool: a freed slot's next job is handed to this process's own consumer
        # (``workers.handover``), and its start made ahead here (``jobs.execution.prestart``).
        self.in_process: InProcess | None = None

    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None or self._pid != os.getpid():
                self._runtime = Runtime.from_settings(self.settings)
                self._pid = os.getpid()
            return self._runtime

    def push(self, app: Any, queue: str) -> MessagePush | None:
        """The message the index pushes for this worker's next job, on a broker that is the
        index's own Redis (kombu's keys carry the key prefix there); else None."""
        settings = self.settings
        if settings.broker_url and settings.broker_url != settings.resolved_redis_url():
            return None
        with self._lock:
            if self._push is None or self._push.key != settings.key_prefix + queue:
                self._push = MessagePush(key=settings.key_prefix + queue,
                                         envelope=message_envelope(app, queue))
            return self._push

    def tier_push(self, app: Any) -> TierPush | None:
        """How a submit pushes a job's message to its tier's queue itself (``offer``), on a
        broker that is the index's own Redis; else None."""
        settings = self.settings
        if settings.broker_url and settings.broker_url != settings.resolved_redis_url():
            return None
        names = broker_names(settings.resolved_broker_url(), settings.key_prefix, settings.pool)
        tiers = list(settings.tiers)
        return TierPush(
            envelope=message_envelope(app, names.queue(tiers[0])),
            queues=tuple(TierQueue(tier=tier, name=names.queue(tier),
                                   key=settings.key_prefix + names.queue(tier))
                         for tier in tiers))

    def registry(self) -> HandlerRegistry:
        with self._lock:
            if self._registry is None:
                self._registry = default_registry()
                self._registry.configure_packing(self.settings.kinds)
            return self._registry

    def close(self) -> None:
        with self._lock:
            if self._runtime is not None and self._pid == os.getpid():
                self._runtime.close()
            self._runtime = None


def resources_of(app: Any) -> WorkerResources:
    resources: WorkerResources = app.tierq_resources
    return resources


def run_job(task: Any, job_id: str, attempt: int, dispatched_at: float | None = None,
            token: str | None = None) -> str:
    """Run the attempt; its outcome is the task's result, or ``JobFailedError`` (FAILURE)."""
    resources = resources_of(task.app)
    runtime = resources.runtime()
    runs: list[int] = []
    outcome = execute(
        runtime,
        resources.registry(),
        str(job_id),
        int(attempt),
        worker_id=str(task.request.hostname or f"pid-{os.getpid()}"),
        dispatched_at=None if dispatched_at is None else float(dispatched_at),
        handover=_handover(task.app, resources, runtime),
        token=None if token is None else str(token),
        runs=runs,
    )
    if outcome == FAILED:
        raise JobFailedError(str(job_id), _recorded_error(runtime, str(job_id)))
    if runs and runs[0] > 1:  # what Flower shows of a packed run: the lead's, and its size
        return f"{outcome} (led a run of {runs[0]} items)"
    return outcome


def _handover(app: Any, resources: WorkerResources, runtime: Runtime) -> Handover | None:
    """How the slot this task frees gets its next job: the message goes to this worker's own
    queue, so it is the next this worker takes, with no dispatcher round between the two.
    On a broker that is the index's own Redis the index pushes it in the step that leases
    the job (``MessagePush``); elsewhere it is published after. None while the worker stops
    (it would wait there unconsumed) or consumes no such queue."""
    queue = resources.own_queue
    if queue is None or stopping.stop_requested():
        return None
    ttl = runtime.policy.lease_ttl_s
    in_process = resources.in_process
    if in_process is not None:
        return Handover(publish=lambda lease, token: in_process.deliver(
            lease_args(lease, token, ttl)), prestart=True)

    def publish(lease: Lease, token: str) -> None:
        app.send_task(TASK_NAME, args=[lease.job_id, lease.attempt, lease.expires_at - ttl,
                                       token], queue=queue, routing_key=queue)

    return Handover(publish=publish, push=resources.push(app, queue))


def message_envelope(app: Any, queue: str) -> str:
    """A ``tierq.run_job`` message to ``queue`` as kombu's Redis transport stores it, less
    what differs per message (``jobs.index.values.MessagePush``): Celery's protocol 2
    headers, the body as plain JSON (no ``body_encoding``), the embed where the body goes."""
    headers: dict[str, Any] = {
        "lang": "py", "task": TASK_NAME, "id": "", "shadow": None, "eta": None,
        "expires": None, "group": None, "group_index": None, "retries": 0,
        "timelimit": [None, None], "root_id": "", "parent_id": None, "argsrepr": "",
        "kwargsrepr": "{}", "origin": anon_nodename(),
        "ignore_result": None, "replaced_task_nesting": 0, "stamped_headers": None,
        "stamps": {},
    }
    return json.dumps({
        "body": {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": "", "reply_to": str(app.thread_oid), "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
            "delivery_tag": "",
        },
    })


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
