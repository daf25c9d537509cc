"""The reconciler's full pass: make the dispatch index agree with SQL, the source of truth,
while the system runs.

Redis holds no job SQL does not know, so losing it (a flush, a restart without its data, a
restore from an older snapshot) loses none: ``rebuild`` puts the index back. It reconciles
instead of clearing, so there is no window in which a job that an API admits meanwhile
disappears, and it walks SQL in bounded batches, checking the caller's lead between them:

0. an index an earlier version wrote is brought to this layout (``upgrade_layout``);
1. leases first, so tenant caps hold before anything more is dispatched: every running
   attempt (or dispatched one, of an earlier version) holds its lease until at least
   ``now + lease_ttl_s`` (a live worker keeps renewing it; a dead one's lapses and the
   reaper decides); a job that finished while this ran gives its lease back;
2. every queued job is indexed again with its original order key, ``start_by``,
   ``not_before`` and attempt (it keeps its place and its ageing). An entry newer than the
   SQL read (a later attempt, or a lease taken since) is kept: nothing dispatched after the
   read is undone. A dispatch writes nothing to SQL, so a lease the index lost with its
   message on the way cannot come back: the job is indexed as queued, and that message's
   start finds no lease at its renewal and hands the job back uncharged, unless a new
   dispatch leased it first (two copies of one attempt: the start's compare-and-set lets
   only one run it);
3. index entries of jobs that SQL has neither queued nor in flight are removed, except those
   younger than ``UNCOMMITTED_GRACE_S``: an API indexes a job before its SQL commit lands;
4. tier caps and per-tenant overrides are pushed.

Every write carries the caller's fencing token (``fence``): a leader deposed mid-pass changes
nothing more (``NotLeader``). ``keep_lead`` is called between batches: the leader renews its
lock there, so a long pass never lets it lapse. It never deletes keys wholesale: the Celery
broker's queues share the key prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from jobs.core.cadence import REBUILD_BATCH as BATCH
from jobs.core.cadence import UNCOMMITTED_GRACE_S
from jobs.core.domain import Job
from jobs.core.ids import may_be_uncommitted
from jobs.core.states import Status
from jobs.dispatch.recovery import indexed
from jobs.fleet import pool
from jobs.index.base import DispatchIndex
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql

logger = logging.getLogger("tierq.rebuild")

IN_FLIGHT = (Status.DISPATCHED, Status.RUNNING)

__all__ = ["IN_FLIGHT", "UNCOMMITTED_GRACE_S", "RebuildStats", "indexed", "may_be_uncommitted",
           "rebuild"]


@dataclass(frozen=True, kw_only=True)
class RebuildStats:
    # Queued jobs indexed with their original order keys.
    queued: int
    # In-flight (dispatched or running) jobs that hold a lease now.
    leased: int
    # Leases given back: their jobs finished while the rebuild ran.
    released: int
    # Index entries of jobs that are neither queued nor in flight in SQL.
    removed: int
    # Entries of jobs not in SQL yet, young enough to be a submit whose commit is on its way.
    kept_uncommitted: int


def _no_lead_check() -> None:
    return None


def rebuild(
    runtime: Runtime,
    now: float,
    *,
    fence: str | None = None,
    keep_lead: Callable[[], None] = _no_lead_check,
) -> RebuildStats:
    """Reconcile the index with SQL (see the module docstring); safe while the system runs."""
    index, ttl = runtime.index, runtime.policy.lease_ttl_s
    if index.upgrade_layout(fence=fence):
        logger.warning("index.layout_upgraded", extra={"event": "index.layout_upgraded"})
    live: set[str] = set()
    leased = released = 0
    for batch in _walk(runtime, IN_FLIGHT):
        keep_lead()
        live.update(job.id for job in batch)
        leased += sum(
            index.restore_lease(indexed(job), ttl_s=ttl, now=now, fence=fence) for job in batch
        )
        released += _release_finished(runtime, [job.id for job in batch], fence)
    queued = 0
    for batch in _walk(runtime, (Status.QUEUED,)):
        keep_lead()
        live.update(job.id for job in batch)
        queued += index.requeue_many((indexed(job) for job in batch), fence=fence)
    keep_lead()
    removed, kept = _remove_strays(index, live, now, fence)
    push_caps(runtime, now, fence)
    return RebuildStats(
        queued=queued, leased=leased, released=released, removed=removed, kept_uncommitted=kept
    )


def _walk(runtime: Runtime, statuses: tuple[Status, ...]) -> Iterator[list[Job]]:
    """The jobs in these states, in batches of ``BATCH``, each read in a short transaction."""
    after = ""
    while True:
        with runtime.sessions() as session:
            batch = jobs_sql.jobs_after(session, statuses, after=after, limit=BATCH,
                                        scope=runtime.scope)
        if batch:
            yield batch
        if len(batch) < BATCH:
            return
        after = batch[-1].id


def _release_finished(runtime: Runtime, job_ids: list[str], fence: str | None) -> int:
    """Give back the leases of jobs that finished after SQL was read (their worker released
    before the lease was restored); a lease left behind would hold a slot for a TTL."""
    with runtime.sessions() as session:
        jobs = jobs_sql.get_jobs(session, job_ids)
    finished = [job for job in jobs.values() if job.terminal]
    for job in finished:
        runtime.index.release(job.id, attempt=job.attempt, fence=fence)
    return len(finished)


def _remove_strays(
    index: DispatchIndex, live: set[str], now: float, fence: str | None
) -> tuple[int, int]:
    """Remove entries of jobs SQL has neither queued nor in flight (finished, or a failed
    submit's leftover); keep young ones whose commit may be on its way. Jobs only leave
    those states for terminal ones, so an entry absent from ``live`` stays stale."""
    strays = {job_id for job_id in index.job_ids() if job_id not in live}
    kept = {job_id for job_id in strays if may_be_uncommitted(job_id, now)}
    for job_id in strays - kept:
        if not index.cancel(job_id, fence=fence):
            index.release(job_id, fence=fence)
    return len(strays) - len(kept), len(kept)


def push_caps(runtime: Runtime, now: float, fence: str | None = None) -> None:
    """Push the tier caps (from the live pool) and per-tenant overrides (from SQL)."""
    figures = pool.read_pool(runtime.policy, runtime.index, now=now)
    with runtime.sessions() as session:
        tenants = tenants_sql.list_tenants(session)
    overrides = {tenant.id: tenant.cap for tenant in tenants if tenant.cap is not None}
    runtime.index.set_caps(figures.caps, overrides, fence=fence)
