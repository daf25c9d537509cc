"""The dispatcher: fills free pool slots with the best runnable jobs, and keeps the index honest.

Each ``run_once(now)`` does, in order:

1. caps: recompute tier caps from the pool's capacity and push them to the index when they
   change (a tenant under its new cap becomes runnable);
2. reap: leases that expired (worker died, message lost) put their job back in the queue
   with ``attempt + 1`` and its original order key, or fail it when its attempts are spent;
3. expire: queued jobs past ``start_by`` end ``expired`` and are never computed, even while
   the pool is full;
4. dispatch: pop as many jobs as there are free slots (never more), mark each ``dispatched``
   by compare-and-set and publish it to its tier's broker queue.

``serve`` loops ``run_once`` and sleeps on the doorbell (``jobs.wake``) between rounds, so a
submit or a released slot is acted on at once, with no polling delay on the hot path.
"""

from __future__ import annotations

import logging
import signal
import threading
import uuid
from dataclasses import dataclass, field
from typing import Protocol

import redis
import sqlalchemy.exc
from sqlalchemy.orm import Session

from jobs import capacity, wake
from jobs.config import Settings
from jobs.db import repository
from jobs.domain import Job
from jobs.index.base import IndexedJob, Lease
from jobs.runtime import Runtime
from jobs.states import Status

logger = logging.getLogger("tierq.dispatcher")

# A job indexed by an API process whose SQL commit has not landed yet is retried this long
# (its id carries its creation time); after that it is a leftover of a failed submit.
UNCOMMITTED_GRACE_S = 30.0
UNCOMMITTED_RETRY_S = 0.2
# How often per-tenant cap overrides are re-read from SQL.
OVERRIDES_REFRESH_S = 10.0
MAINTENANCE_PERIOD_S = 1.0


class Publisher(Protocol):
    def publish(self, job_id: str, attempt: int, tier: str) -> None: ...


@dataclass
class DispatchStats:
    dispatched: int = 0
    expired: int = 0
    reaped: int = 0
    requeued: int = 0
    failed: int = 0
    dropped: int = 0
    free_slots: int = 0

    @property
    def saturated(self) -> bool:
        """Every free slot was filled: there may be more to do right away."""
        return self.dispatched > 0 and self.dispatched >= self.free_slots


@dataclass
class Dispatcher:
    runtime: Runtime
    publisher: Publisher
    batch_size: int = 200
    _caps: tuple[dict[str, int], dict[str, int]] | None = field(default=None, init=False)
    _overrides: dict[str, int] = field(default_factory=dict, init=False)
    _overrides_read_at: float = field(default=float("-inf"), init=False)

    def run_once(self, now: float) -> DispatchStats:
        stats = DispatchStats()
        figures = capacity.read_pool(self.runtime.policy, self.runtime.index, now=now)
        self._push_caps(figures.caps, now)
        self._reap(now, stats)
        self._expire(now, stats)
        stats.free_slots = max(0, figures.capacity - self.runtime.index.inflight())
        if stats.free_slots:
            self._dispatch(now, stats.free_slots, stats)
        return stats

    # -- caps ------------------------------------------------------------------------------

    def _push_caps(self, tier_caps: dict[str, int], now: float) -> None:
        if now - self._overrides_read_at >= OVERRIDES_REFRESH_S:
            with self.runtime.sessions() as session:
                tenants = repository.list_tenants(session)
            self._overrides = {t.id: t.cap for t in tenants if t.cap is not None}
            self._overrides_read_at = now
        caps = (tier_caps, self._overrides)
        if caps != self._caps:
            self.runtime.index.set_caps(tier_caps, self._overrides)
            self._caps = (dict(tier_caps), dict(self._overrides))

    # -- reap and expire -------------------------------------------------------------------

    def _reap(self, now: float, stats: DispatchStats) -> None:
        leases = self.runtime.index.reap(now=now, limit=self.batch_size)
        if not leases:
            return
        stats.reaped += len(leases)
        with self.runtime.sessions.begin() as session:
            jobs = repository.get_jobs(session, (lease.job_id for lease in leases))
            requeue = [
                self._recover(session, jobs.get(lease.job_id), now, stats) for lease in leases
            ]
        for job in requeue:
            if job is not None:
                self.runtime.index.requeue(_indexed(job))

    def _recover(
        self, session: Session, job: Job | None, now: float, stats: DispatchStats
    ) -> Job | None:
        """A lease expired: re-queue its job (same order key, attempt + 1) or fail it."""
        if job is None or job.status not in (Status.DISPATCHED, Status.RUNNING):
            return None  # finished (its release was lost) or never committed
        log = {"job_id": job.id, "tenant": job.tenant_id, "tier": job.tier, "attempt": job.attempt}
        if job.attempt >= job.max_attempts:
            error = f"lease expired on attempt {job.attempt} of {job.max_attempts}"
            if repository.transition(
                session,
                job.id,
                src=job.status,
                attempt=job.attempt,
                dst=Status.FAILED,
                now=now,
                error=error,
            ):
                stats.failed += 1
                logger.warning("lease.expired.failed", extra=log)
            return None
        if not repository.transition(
            session, job.id, src=job.status, attempt=job.attempt, dst=Status.QUEUED, now=now
        ):
            return None
        stats.requeued += 1
        logger.warning("lease.expired.requeued", extra=log)
        return job

    def _expire(self, now: float, stats: DispatchStats) -> None:
        due = self.runtime.index.expire_due(now=now, limit=self.batch_size)
        if not due:
            return
        with self.runtime.sessions.begin() as session:
            jobs = repository.get_jobs(session, (item.job_id for item in due))
            for job in jobs.values():
                if job.status is Status.QUEUED and repository.transition(
                    session,
                    job.id,
                    src=Status.QUEUED,
                    attempt=job.attempt,
                    dst=Status.EXPIRED,
                    now=now,
                ):
                    stats.expired += 1
                    logger.info("job.expired", extra={"job_id": job.id, "tier": job.tier})

    # -- dispatch --------------------------------------------------------------------------

    def _dispatch(self, now: float, n: int, stats: DispatchStats) -> None:
        ttl = self.runtime.policy.lease_ttl_s
        leases = self.runtime.index.dispatch(min(n, self.batch_size), now=now, lease_ttl_s=ttl)
        if not leases:
            return
        to_publish: list[Job] = []
        retry_later: list[str] = []
        drop: list[str] = []
        with self.runtime.sessions.begin() as session:
            jobs = repository.get_jobs(session, (lease.job_id for lease in leases))
            for lease in leases:
                job = jobs.get(lease.job_id)
                if job is None:
                    young = now - _created_at(lease.job_id) < UNCOMMITTED_GRACE_S
                    (retry_later if young else drop).append(lease.job_id)
                elif self._claim(session, job, now, stats):
                    to_publish.append(job)
                elif job.status is not Status.DISPATCHED and job.status is not Status.RUNNING:
                    drop.append(job.id)
        for job_id in drop:
            self.runtime.index.release(job_id)
            stats.dropped += 1
        for lease in leases:
            if lease.job_id in retry_later:
                self.runtime.index.release(lease.job_id)
                self.runtime.index.requeue(_retry_soon(lease, now))
        for job in to_publish:
            self._publish(job, stats)

    def _claim(self, session: Session, job: Job, now: float, stats: DispatchStats) -> bool:
        """CAS queued → dispatched; a job past its start_by expires instead."""
        if job.status is not Status.QUEUED:
            return False
        if job.start_by is not None and now >= job.start_by:
            if repository.transition(
                session, job.id, src=Status.QUEUED, attempt=job.attempt, dst=Status.EXPIRED, now=now
            ):
                stats.expired += 1
            return False
        return repository.transition(
            session, job.id, src=Status.QUEUED, attempt=job.attempt, dst=Status.DISPATCHED, now=now
        )

    def _publish(self, job: Job, stats: DispatchStats) -> None:
        try:
            self.publisher.publish(job.id, job.attempt, job.tier)
        except Exception:
            # The lease is held and will expire: the reaper re-queues the job then.
            logger.exception("job.publish_failed", extra={"job_id": job.id, "tier": job.tier})
            return
        stats.dispatched += 1
        logger.info(
            "job.dispatched",
            extra={
                "job_id": job.id,
                "tenant": job.tenant_id,
                "tier": job.tier,
                "attempt": job.attempt,
            },
        )


def _indexed(job: Job, not_before: float | None = None) -> IndexedJob:
    return IndexedJob(
        job_id=job.id,
        tenant=job.tenant_id,
        tier=job.tier,
        order_key=job.order_key,
        start_by=job.start_by,
        not_before=not_before if not_before is not None else job.not_before,
    )


def _retry_soon(lease: Lease, now: float) -> IndexedJob:
    return IndexedJob(
        job_id=lease.job_id,
        tenant=lease.tenant,
        tier=lease.tier,
        order_key=lease.order_key,
        not_before=now + UNCOMMITTED_RETRY_S,
    )


def _created_at(job_id: str) -> float:
    """Seconds since the epoch at which a (UUIDv7) job id was made."""
    try:
        return (uuid.UUID(job_id).int >> 80) / 1000
    except ValueError:
        return 0.0


# -- the loop ------------------------------------------------------------------------------

TRANSIENT = (redis.RedisError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)


def run_forever(dispatcher: Dispatcher, stop: threading.Event) -> None:
    """Loop ``run_once``; sleep on the doorbell between rounds; ride out outages."""
    runtime = dispatcher.runtime
    backoff = 0.5
    while not stop.is_set():
        try:
            stats = dispatcher.run_once(runtime.clock())
            backoff = 0.5
            if stats.saturated:
                continue
            wake.wait(runtime.redis, runtime.settings.key_prefix, MAINTENANCE_PERIOD_S)
        except TRANSIENT as exc:
            logger.warning("dispatcher.unavailable", extra={"error": str(exc), "retry_s": backoff})
            stop.wait(backoff)
            backoff = min(10.0, backoff * 2)


def serve(settings: Settings) -> None:
    """Run the dispatcher until SIGTERM or SIGINT."""
    from workers.publisher import CeleryPublisher  # the publishing adapter: Celery stays there

    runtime = Runtime.from_settings(settings)
    publisher = CeleryPublisher(settings)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logger.info("dispatcher.started")
    try:
        run_forever(Dispatcher(runtime, publisher), stop)
    finally:
        publisher.close()
        runtime.close()
        logger.info("dispatcher.stopped")
