"""What a worker does with the leases of its slot beside running the job: pass the slot on
to the next job when one ends, and settle a lease whose job could not start.

Apart from ``jobs.execution.attempt`` because none of it is the attempt's own state change:
each step here is one index call (and, for the start made ahead, one statement), best
effort, and a lease left behind by a failure lapses and is reaped.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis

from jobs.core.cadence import UNCOMMITTED_RETRY_S
from jobs.core.domain import Job
from jobs.core.ids import may_be_uncommitted
from jobs.execution.prestart import PRE_STARTS
from jobs.index import wake
from jobs.index.base import FirstRenewal, IndexedJob, Lease, MessagePush
from jobs.process.runtime import Runtime

logger = logging.getLogger("tierq.worker")


@dataclass(frozen=True, kw_only=True)
class Handover:
    """How the job a freed slot takes next reaches this worker: ``push``, its message, pushed
    by the index in the step that leases it (the broker is the index's Redis); else
    ``publish(lease, token)`` after that step. ``prestart``: the task that takes the message
    runs in this process (threads: ``publish`` hands it to the worker's own consumer), and
    the job's start is made by the handing slot, under the message's token
    (``jobs.execution.prestart``), while the consumer takes the message."""

    publish: Callable[[Lease, str], None]
    push: MessagePush | None = None
    prestart: bool = False


@dataclass(frozen=True, kw_only=True)
class Passed:
    """The job a freed slot took next: its lease, and the token its message carries."""

    lease: Lease
    token: str


def pass_slot(
    runtime: Runtime, handover: Handover, *, job_id: str, attempt: int, now: float | None,
    first: FirstRenewal | None = None,
) -> Passed | None:
    """Before an ending is committed: lease the best runnable job for the slot it frees
    (``hand_over`` with ``keep``: this attempt's lease stays until its ending is committed
    and the caller releases it), and send that job's message to this worker. None: nothing
    to take (the dispatcher is rung with the release), or the index or the broker failed (a
    job leased and not sent is put back at once). ``now``: a virtual clock's time for the
    index (None: Redis's). ``first``: this attempt's first renewal, made first in the same
    round trip (best effort, as every first renewal)."""
    token = uuid.uuid4().hex  # the next job's message's
    if handover.prestart:
        PRE_STARTS.expect(token)  # before its message can be taken
    policy = runtime.policy
    try:
        lease = runtime.index.hand_over(
            job_id, attempt=attempt, lease_ttl_s=policy.lease_ttl_s,
            capacity=policy.pool_concurrency, now=now, push=handover.push, token=token,
            keep=True, first=first,
        )
    except redis.RedisError:
        logger.warning("job.handover_failed", extra={
            "event": "job.handover_failed", "job_id": job_id, "attempt": attempt},
            exc_info=True)
        lease = None
    if lease is not None and (handover.push is not None
                              or _publish(runtime, handover, lease, token)):
        return Passed(lease=lease, token=token)
    if handover.prestart:
        PRE_STARTS.forget(token)
    return None


def _publish(runtime: Runtime, handover: Handover, lease: Lease, token: str) -> bool:
    """The next job's message, to this worker's own queue; a publish that fails puts the
    lease back in the queue at once (else the job would wait a lease TTL for the reaper)."""
    try:
        handover.publish(lease, token)
        return True
    except Exception:
        logger.warning("job.handover_failed", extra={
            "event": "job.handover_failed", "job_id": lease.job_id}, exc_info=True)
        try:
            runtime.index.put_back(lease.job_id, attempt=lease.attempt)
            ring(runtime)
        except redis.RedisError:
            logger.warning("job.put_back_failed", extra={
                "event": "job.put_back_failed", "job_id": lease.job_id}, exc_info=True)
    return False


def settle_uncommitted(runtime: Runtime, job_id: str, attempt: int, now: float) -> None:
    """A lease whose row is not there: a submit whose commit is still on its way (its index
    entry comes first) goes back to the queue, its place kept, offered again shortly; past
    the grace of an uncommitted submit, a failed submit's leftover is dropped."""
    try:
        if may_be_uncommitted(job_id, now):
            runtime.index.put_back(job_id, attempt=attempt, not_before=now + UNCOMMITTED_RETRY_S)
        else:
            runtime.index.release(job_id, attempt=attempt, ring=True)
    except redis.RedisError:  # the lease lapses, and the reaper decides
        logger.warning("job.put_back_failed", extra={
            "event": "job.put_back_failed", "job_id": job_id, "attempt": attempt},
            exc_info=True)


def put_back_soon(runtime: Runtime, job_id: str, attempt: int, now: float) -> None:
    """A lease whose row cannot start yet but will (a batch item whose feed has not
    committed): back to the queue, its place kept, offered again shortly."""
    try:
        runtime.index.put_back(job_id, attempt=attempt, not_before=now + UNCOMMITTED_RETRY_S)
    except redis.RedisError:  # the lease lapses, and the reaper decides
        logger.warning("job.put_back_failed", extra={
            "event": "job.put_back_failed", "job_id": job_id, "attempt": attempt},
            exc_info=True)


def free_lease(runtime: Runtime, job_id: str, attempt: int) -> None:
    """Release a lease nobody will run (its row ended, or went back to waiting)."""
    try:
        runtime.index.release(job_id, attempt=attempt, ring=True)
    except redis.RedisError:
        logger.warning("job.release_failed", extra={
            "event": "job.release_failed", "job_id": job_id, "attempt": attempt},
            exc_info=True)


def ring(runtime: Runtime) -> None:
    """Wake the dispatcher (best effort)."""
    try:
        wake.ring(runtime.redis, runtime.prefix)
    except redis.RedisError:
        logger.warning("dispatcher.ring_failed", extra={"event": "dispatcher.ring_failed"},
                       exc_info=True)


def entry_of(job: Job, *, attempt: int, not_before: float | None = None) -> IndexedJob:
    """The index entry of ``job`` queued again at ``attempt``."""
    return IndexedJob(
        job_id=job.id, tenant=job.tenant_id, tier=job.tier, order_key=job.order_key,
        start_by=job.start_by, not_before=not_before, attempt=attempt,
    )
