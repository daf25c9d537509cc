"""Rebuild the dispatch index from SQL, the source of truth, while the system runs.

Redis holds nothing SQL does not know, so losing it (a flush, a restart without its data)
loses no job: ``rebuild`` puts the index back. It reconciles instead of clearing, so there
is no window in which a job that an API admits meanwhile disappears:

1. the generation sentinel is set (if absent): a flush removes it, and the leading
   dispatcher, seeing it gone, rebuilds again;
2. leases first, so tenant caps hold before anything more is dispatched: every dispatched or
   running job holds a lease until at least ``now + lease_ttl_s`` (a live worker keeps
   renewing it; a dead one's lapses and the reaper re-queues the job); a job that finished
   while this ran gives its lease back;
3. every queued job is indexed again with its original order key, ``start_by`` and
   ``not_before`` (it keeps its place and its ageing);
4. index entries of jobs that SQL has neither queued nor in flight are removed, except those
   younger than ``UNCOMMITTED_GRACE_S``: an API indexes a job before its SQL commit lands;
5. tier caps and per-tenant overrides are pushed.

It never deletes keys wholesale: the Celery broker's queues share the key prefix.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from jobs import capacity
from jobs.db import repository
from jobs.domain import Job
from jobs.index.base import DispatchIndex, IndexedJob
from jobs.runtime import Runtime
from jobs.states import Status

logger = logging.getLogger("tierq.rebuild")

# A job indexed by an API process whose SQL commit has not landed yet is left alone this
# long (its id carries its creation time); after that it is a leftover of a failed submit.
UNCOMMITTED_GRACE_S = 30.0
IN_FLIGHT = (Status.DISPATCHED, Status.RUNNING)


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
    # The generation sentinel in force afterwards.
    generation: str | None


def created_at(job_id: str) -> float:
    """Seconds since the epoch at which a (UUIDv7) job id was made; 0 for other ids."""
    try:
        return (uuid.UUID(job_id).int >> 80) / 1000
    except ValueError:
        return 0.0


def may_be_uncommitted(job_id: str, now: float) -> bool:
    """A job SQL does not show may still be a submit whose commit is on its way."""
    return now - created_at(job_id) < UNCOMMITTED_GRACE_S


def indexed(job: Job, not_before: float | None = None) -> IndexedJob:
    """The index's entry for a queued job (``not_before`` overrides the job's)."""
    return IndexedJob(
        job_id=job.id,
        tenant=job.tenant_id,
        tier=job.tier,
        order_key=job.order_key,
        start_by=job.start_by,
        not_before=not_before if not_before is not None else job.not_before,
    )


def rebuild(runtime: Runtime, now: float) -> RebuildStats:
    """Reconcile the index with SQL (see the module docstring); safe while the system runs."""
    index = runtime.index
    index.mark_generation(f"{now:.3f}-{uuid.uuid4().hex[:12]}")
    with runtime.sessions() as session:
        live = repository.jobs_in_status(session, (Status.QUEUED, *IN_FLIGHT))
    in_flight = [job for job in live if job.status in IN_FLIGHT]
    expires_at = now + runtime.policy.lease_ttl_s
    leased = sum(index.restore_lease(indexed(job), expires_at=expires_at) for job in in_flight)
    released = _release_finished(runtime, (job.id for job in in_flight))
    queued = index.requeue_many(indexed(job) for job in live if job.status is Status.QUEUED)
    removed, kept = _remove_strays(index, {job.id for job in live}, now)
    _push_caps(runtime, now)
    stats = RebuildStats(
        queued=queued,
        leased=leased,
        released=released,
        removed=removed,
        kept_uncommitted=kept,
        generation=index.generation(),
    )
    logger.info("index.rebuilt", extra={"event": "index.rebuilt", **asdict(stats)})
    return stats


def _release_finished(runtime: Runtime, job_ids: Iterable[str]) -> int:
    """Give back the leases of jobs that finished after SQL was read (their worker released
    before the lease was restored); a lease left behind would hold a slot for a TTL."""
    with runtime.sessions() as session:
        jobs = repository.get_jobs(session, job_ids)
    finished = [job.id for job in jobs.values() if job.terminal]
    for job_id in finished:
        runtime.index.release(job_id)
    return len(finished)


def _remove_strays(index: DispatchIndex, live: set[str], now: float) -> tuple[int, int]:
    """Remove entries of jobs SQL has neither queued nor in flight (finished, or a failed
    submit's leftover); keep young ones whose commit may be on its way. Jobs only leave
    those states for terminal ones, so an entry absent from ``live`` stays stale."""
    strays = {job_id for job_id in index.job_ids() if job_id not in live}
    kept = {job_id for job_id in strays if may_be_uncommitted(job_id, now)}
    for job_id in strays - kept:
        if not index.cancel(job_id):
            index.release(job_id)
    return len(strays) - len(kept), len(kept)


def _push_caps(runtime: Runtime, now: float) -> None:
    figures = capacity.read_pool(runtime.policy, runtime.index, now=now)
    with runtime.sessions() as session:
        tenants = repository.list_tenants(session)
    overrides = {tenant.id: tenant.cap for tenant in tenants if tenant.cap is not None}
    runtime.index.set_caps(figures.caps, overrides)
