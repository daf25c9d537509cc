"""The batch service: submit, look up, list, stream the results of, and cancel batches.

A batch's items are ``jobs`` rows stored ``waiting`` in the batch's one transaction, then fed
into the tier's live queue as room allows (``jobs.dispatch.feeder``), so a batch is never
refused by the tier's bound and its items age from their admission, not from the upload.
Items are validated (the kind's handler) as they are read, before anything is written: a bad
item is a 422 naming its index with nothing stored. The validated items are held as compact
JSON (``ValidatedItems``; the batch body limit bounds them) and written in one short
transaction, so no write lock is ever held while a client is still sending: on SQLite that
lock is the whole database's.

An idempotency key names one batch per tenant: the same key with the same kind and items
(compared by a sha256 of the validated items) is the same batch; other content is a 409.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from jobs.admission import estimates
from jobs.admission import submit as submission
from jobs.admission.submit import PayloadValidator
from jobs.admission.webhooks import checked_webhook
from jobs.core.domain import Job, Tenant
from jobs.core.errors import (
    Forbidden,
    IdempotencyConflict,
    NotFound,
    TenantLimitExceeded,
    Unavailable,
)
from jobs.core.ids import new_job_id
from jobs.core.states import Status
from jobs.core.webhooks import BATCH_EVENTS, Webhook
from jobs.index import notify, wake
from jobs.process import outage
from jobs.process.runtime import Runtime
from jobs.service import jobs as job_service
from jobs.service.batch_items import ValidatedItems
from jobs.store import batches as repo
from jobs.store import blobs as blobs_sql
from jobs.store.batches import Batch

logger = logging.getLogger(__name__)

# The most items one batch may hold; bigger runs are split by the client.
# Batches a tenant may have with items still waiting: one more is ``429 tenant_limit``
# (``limit: "batches"``), so no tenant can park an unbounded backlog in SQL.
MAX_OPEN_BATCHES = 20
# Retry-After of that refusal: a batch's waiting items take a while to be fed.
OPEN_BATCHES_RETRY_S = 30
RESULTS_CHUNK = 500
MAX_LIST = 200


@dataclass(frozen=True, kw_only=True)
class BatchSpec:
    kind: str
    idempotency_key: str | None = None
    max_attempts: int | None = None
    timeout_s: float | None = None  # each item's run-time limit; None: the kind's or policy's
    # Items are ``{"custom_id", "payload"}`` envelopes, the id handed back on its result line.
    envelope: bool = False
    # Items not started this long after the batch is stored end expired.
    completion_window_s: float | None = None
    webhook: Webhook | None = None  # as the client named it: checked by ``store``


@dataclass(frozen=True, kw_only=True)
class SubmittedBatch:
    batch: Batch
    created: bool  # False: an earlier batch with the same idempotency key and content


@dataclass(frozen=True, kw_only=True)
class BatchProgress:
    batch: Batch
    status: str  # accepted | running | finished | cancelled
    counts: dict[str, int]
    finished_at: float | None
    estimated_finish_s: float | None


# -- submit ----------------------------------------------------------------------------------


def submit(
    runtime: Runtime, validator: PayloadValidator, tenant: Tenant, spec: BatchSpec,
    items: Iterable[Any],
) -> SubmittedBatch:
    """Validate every item, then store them (``store``). Raises ``InvalidRequest`` (naming
    the bad item), ``IdempotencyConflict`` or ``Forbidden``; on any of them nothing is
    stored."""
    _check_tier(runtime, tenant)
    validated = ValidatedItems(validator, spec.kind, envelope=spec.envelope)
    validated.extend(items)
    return store(runtime, tenant, spec, validated)


def check_submittable(runtime: Runtime, tenant: Tenant, spec: BatchSpec) -> None:
    """Refuse, before its body is read, a batch that ``store`` would refuse whatever its
    items: a tier not served, a malformed key, a tenant at its open batches (unless the key
    names an earlier batch, which a resubmission is answered with)."""
    _check_tier(runtime, tenant)
    if spec.idempotency_key is not None:
        submission.check_text(spec.idempotency_key, ("idempotency_key",))
        with runtime.sessions() as session:
            if repo.batch_by_idempotency_key(session, tenant.id, spec.idempotency_key):
                return
    _check_open_batches(runtime, tenant)


def store(
    runtime: Runtime, tenant: Tenant, spec: BatchSpec, items: ValidatedItems
) -> SubmittedBatch:
    """Store validated items in one short transaction (nothing is read or validated inside
    it, so the write lock is held for the inserts alone), then ring the dispatcher (its
    feeder admits the items). Raises ``InvalidRequest`` (no items), ``IdempotencyConflict``
    or ``TenantLimitExceeded``; on any of them nothing is stored."""
    _check_tier(runtime, tenant)
    items.check_complete()
    content_hash = items.hexdigest()
    if spec.idempotency_key is not None:
        submission.check_text(spec.idempotency_key, ("idempotency_key",))
        with runtime.sessions() as session:
            existing = repo.batch_by_idempotency_key(session, tenant.id, spec.idempotency_key)
        if existing is not None:
            return _resubmitted(existing, spec, content_hash)
    _check_open_batches(runtime, tenant)
    webhook = None if spec.webhook is None else checked_webhook(
        runtime, spec.webhook.url, spec.webhook.events, known=BATCH_EVENTS, tenant=tenant.id)
    now = runtime.clock()
    batch = Batch(
        id=new_job_id(now), tenant_id=tenant.id, tier=tenant.tier, kind=spec.kind,
        total=len(items), max_attempts=spec.max_attempts or runtime.policy.max_attempts,
        idempotency_key=spec.idempotency_key, content_hash=content_hash, cancelled=False,
        created_at=now, timeout_s=items.timeout_s(runtime, spec.timeout_s),
        completion_window_s=spec.completion_window_s,
        webhook_url=None if webhook is None else webhook.url,
        webhook_events=None if webhook is None else webhook.column,
    )
    try:
        with runtime.sessions.begin() as session:
            if not repo.insert_batch(session, batch):
                raise _KeyTaken
            index = 0
            ids = items.custom_ids
            for payloads in items.chunks(repo.INSERT_CHUNK):
                repo.insert_items(session, [
                    repo.item_values(job_id=new_job_id(now), batch=batch, index=index + i,
                                     payload=payload, now=now,
                                     custom_id=ids[index + i] if ids else None)
                    for i, payload in enumerate(payloads)])
                index += len(payloads)
    except _KeyTaken:  # a concurrent submit with the same key won: compare with it
        return _lost_race(runtime, tenant, spec, content_hash)
    try:  # the dispatcher of the kind's pool feeds it
        wake.ring(runtime.redis, runtime.for_kind(spec.kind).prefix)
    except outage.REDIS_OUTAGE:
        logger.warning("dispatcher.ring_failed", extra={"event": "dispatcher.ring_failed"})
    logger.info("batch.submitted", extra={"event": "batch.submitted", "batch_id": batch.id,
                                          "tenant": tenant.id, "tier": tenant.tier,
                                          "total": batch.total})
    return SubmittedBatch(batch=batch, created=True)


class _KeyTaken(Exception):
    """The batch's idempotency key was taken between the look-up and the insert."""


def _check_open_batches(runtime: Runtime, tenant: Tenant) -> None:
    with runtime.sessions() as session:
        open_batches = repo.open_batches(session, tenant.id)
    if open_batches >= MAX_OPEN_BATCHES:
        raise TenantLimitExceeded(
            f"tenant {tenant.name!r} has {open_batches} batches with items still waiting, "
            f"the most it may have; submit more once they have entered the queue",
            tier=tenant.tier, retry_after_s=OPEN_BATCHES_RETRY_S, queue_position=0,
            limit="batches", open_batches=open_batches, max_open_batches=MAX_OPEN_BATCHES,
        )


def _resubmitted(existing: Batch, spec: BatchSpec, content_hash: str) -> SubmittedBatch:
    if existing.kind != spec.kind or existing.content_hash != content_hash:
        raise IdempotencyConflict(
            "this idempotency_key was used for a batch of another kind or items; use a new "
            "key for new work", batch_id=existing.id, idempotency_key=existing.idempotency_key)
    return SubmittedBatch(batch=existing, created=False)


def _lost_race(runtime: Runtime, tenant: Tenant, spec: BatchSpec, content_hash: str
               ) -> SubmittedBatch:
    assert spec.idempotency_key is not None
    with runtime.sessions() as session:
        existing = repo.batch_by_idempotency_key(session, tenant.id, spec.idempotency_key)
    if existing is None:
        raise Unavailable("the batch with this idempotency key moved; retry")
    return _resubmitted(existing, spec, content_hash)


def _check_tier(runtime: Runtime, tenant: Tenant) -> None:
    if tenant.tier not in runtime.policy.tiers:
        raise Forbidden(f"this tenant's tier {tenant.tier!r} is not served by this deployment",
                        tier=tenant.tier)


# -- read ------------------------------------------------------------------------------------


def load(runtime: Runtime, tenant: Tenant, batch_id: str) -> Batch:
    """The tenant's batch; another tenant's is "not found" too."""
    try:
        canonical = job_service.parse_job_id(batch_id)
    except NotFound:
        raise NotFound("no such batch", batch_id=batch_id) from None
    with runtime.sessions() as session:
        batch = repo.get_batch(session, canonical, tenant_id=tenant.id)
    if batch is None:
        raise NotFound("no such batch", batch_id=batch_id)
    return batch


def progress(runtime: Runtime, batch: Batch) -> BatchProgress:
    with runtime.sessions() as session:
        by_status = repo.counts(session, batch.id)
        first_start, last_finish = repo.finished_span(session, batch.id)
    counts = {status.value: by_status.get(status, 0) for status in Status
              if status is not Status.DISPATCHED}
    counts["running"] += by_status.get(Status.DISPATCHED, 0)
    remaining = sum(n for status, n in by_status.items() if not status.terminal)
    done = batch.total - remaining
    if remaining == 0:
        status = "cancelled" if batch.cancelled else "finished"
    elif batch.cancelled:
        status = "cancelled"
    else:
        status = "running" if first_start is not None or done else "accepted"
    estimate = _estimate(runtime.clock(), first_start, done, remaining)
    if estimate is None and not batch.cancelled:
        estimate = estimates.batch_finish_s(runtime, batch.kind, batch.tier, remaining)
    return BatchProgress(
        batch=batch, status=status, counts=counts,
        finished_at=last_finish if remaining == 0 else None,
        estimated_finish_s=estimate,
    )


def _estimate(now: float, first_start: float | None, done: int, remaining: int
              ) -> float | None:
    """Remaining items at the rate the batch has been served since its first start."""
    if remaining == 0:
        return 0.0
    if first_start is None or done == 0 or now <= first_start:
        return None
    return round(remaining * (now - first_start) / done, 3)


def list_batches(runtime: Runtime, tenant: Tenant, *, limit: int) -> list[BatchProgress]:
    with runtime.sessions() as session:
        batches = repo.list_batches(session, tenant.id, limit=min(limit, MAX_LIST))
    return [progress(runtime, batch) for batch in batches]


def results(
    runtime: Runtime, batch: Batch, *, after: int, failed_only: bool = False
) -> Iterator[bytes]:
    """NDJSON lines of the finished items past ``after``, in index order, read in chunks;
    ``failed_only``: those that did not succeed (an error file)."""
    while True:
        with runtime.sessions() as session:
            jobs = repo.finished_items(session, batch.id, after=after, limit=RESULTS_CHUNK,
                                       failed_only=failed_only)
            sizes = {job.result_blob: blobs_sql.blob_size(session, job.result_blob)
                     for job in jobs if job.result_blob is not None}
        for job in jobs:
            line = result_line(job, sizes.get(job.result_blob) if job.result_blob else None)
            yield (json.dumps(line, separators=(",", ":")) + "\n").encode()
        if len(jobs) < RESULTS_CHUNK:
            return
        after = jobs[-1].batch_index if jobs[-1].batch_index is not None else after + 1


def result_line(job: Job, result_bytes: int | None = None) -> dict[str, Any]:
    """One item's line; a result kept in the blob store is linked, as ``/result`` links it."""
    line: dict[str, Any] = {"index": job.batch_index, "job_id": job.id,
                            "status": job.status.value}
    if job.custom_id is not None:
        line["custom_id"] = job.custom_id
    if job.status is Status.SUCCEEDED:
        line["result"] = job.result
        if job.result_blob is not None:
            line["result_url"] = f"/v1/jobs/{job.id}/result/blob"
            line["result_bytes"] = result_bytes
    else:
        line["error"] = job.error or {"cancelled": "the item was cancelled",
                                      "expired": "the item expired before it started"
                                      }.get(job.status.value, job.status.value)
    return line


# -- cancel ----------------------------------------------------------------------------------


def cancel(runtime: Runtime, tenant: Tenant, batch: Batch) -> BatchProgress:
    """Cancel every item not yet started: waiting ones in one statement, queued and
    dispatched ones as single jobs are; running ones are asked to stop."""
    with runtime.sessions.begin() as session:
        repo.cancel_waiting(session, batch.id, now=runtime.clock())
    with runtime.sessions() as session:
        live = repo.live_items(session, batch.id)
    for job in live:
        job_service.cancel(runtime, tenant, job.id)
    notify.announce_batches(runtime.redis, runtime.for_kind(batch.kind).prefix, [batch.id])
    logger.info("batch.cancelled", extra={"event": "batch.cancelled", "batch_id": batch.id,
                                          "tenant": tenant.id})
    return progress(runtime, Batch(**{**batch.__dict__, "cancelled": True}))
