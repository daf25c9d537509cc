"""The kinds a pool's jobs wait for: kinds met that no live worker of the pool runs, and how
many of their jobs are queued (``GET /v1/queues``). Nothing is read from SQL unless there is
such a kind (``jobs.index.worker_registry``)."""

from __future__ import annotations

from collections.abc import Sequence

from jobs.core.states import Status
from jobs.index.base import LiveWorker
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql


def kinds_without_worker(runtime: Runtime, live: Sequence[LiveWorker]) -> dict[str, int]:
    """Each kind of the pool's queued jobs that no live worker of it runs, with how many of
    them are queued (kinds with none left out), by kind."""
    unrun = sorted(kind for kind in runtime.index.kinds_waiting()
                   if not any(worker.runs(kind) for worker in live))
    if not unrun:
        return {}
    with runtime.sessions() as session:
        return jobs_sql.count_by_kind(session, unrun, [Status.QUEUED])
