"""The API's decision on a submit: admit, persist and settle, or refuse with a typed reason.

Submitting is admit-then-persist: one call to the index checks the tenant's request rate,
the tier's bound, the tenant's quota and the job's own deadline against the pool's live
figures and indexes the job, atomically (``jobs.admission.limits``); then the row is committed (one
INSERT, one transaction), and only then does a free slot take the best runnable job
(``offer``: its message pushed by the index, no dispatcher round), or the dispatcher is
rung: before the COMMIT, the start would find no row yet and put the job off. A refusal
leaves nothing behind; a failed commit takes the job back out of the index (best effort: the
dispatcher also drops indexed jobs whose row never appears). A keyed submit takes the same
two steps, its key read only once it is found used (its INSERT did nothing) or the submit is
refused, so that a retry of accepted work gets that job. The tier always comes from the
tenant's record, never from the request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from jobs.admission import limits
from jobs.admission.estimates import Progress, progress
from jobs.admission.webhooks import checked_webhook
from jobs.core.domain import Job, NewJob, Tenant
from jobs.core.errors import (
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    TierqError,
    Unavailable,
)
from jobs.core.ids import new_job_id
from jobs.core.webhooks import JOB_EVENTS, Webhook
from jobs.index import wake
from jobs.process.outage import REDIS_OUTAGE, SQL_OUTAGE, is_backend_outage
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store import pipeline
from jobs.store.direct import DirectConnection

logger = logging.getLogger(__name__)


# Deepest nesting accepted in a payload: deeper JSON is abuse, and would strain encoders.
MAX_PAYLOAD_DEPTH = 64


# What a submit's admission may end in before its INSERT: a keyed one then reads its key.
_REFUSED: tuple[type[Exception], ...] = (TierqError, *REDIS_OUTAGE)

# Pauses before each read-back of a job whose COMMIT lost its answer.
_SETTLE_DELAYS_S = (0.25, 1.0)


class PayloadValidator(Protocol):
    """What submission needs of the handler registry (``workers.handlers``)."""

    def validate(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]: ...


def timeout_of(runtime: Runtime, validator: PayloadValidator, kind: str,
               asked: float | None) -> float:
    """One attempt's run-time limit: the one asked for, else the kind's own (a validator
    that knows kinds' limits, as the registry does: ``timeout_s(kind)``), else the policy's."""
    if asked is not None:
        return asked
    of_kind = getattr(validator, "timeout_s", None)
    own = of_kind(kind) if callable(of_kind) else None
    return float(own) if own is not None else runtime.policy.default_timeout_s


@runtime_checkable
class KindCatalog(Protocol):
    """A validator that can also list its kinds (the registry can): the API publishes them."""

    def kinds(self) -> list[str]: ...


@dataclass(frozen=True, kw_only=True)
class Submission:
    kind: str
    payload: dict[str, Any]
    idempotency_key: str | None = None
    max_wait_s: float | None = None
    max_attempts: int | None = None
    blob: str | None = None  # the stored document the job reads (``jobs.blobs.records``)
    timeout_s: float | None = None  # None: the kind's, else the policy's
    retry_of: str | None = None  # the ended job this one retries (``POST .../retry``)
    webhook: Webhook | None = None  # as the client named it: checked by ``submit``


@dataclass(frozen=True, kw_only=True)
class Submitted:
    progress: Progress
    created: bool  # False: an earlier job with the same idempotency key


def submit(
    runtime: Runtime, validator: PayloadValidator, tenant: Tenant, submission: Submission
) -> Submitted:
    """Admit, persist and announce a job; the earlier job when its idempotency key was used
    for the same kind and payload. Raises ``InvalidRequest``, ``IdempotencyConflict`` (the
    key was used for other work), ``Refused`` (429) or ``Unavailable``; a refusal leaves
    nothing."""
    tier = _tier_of(runtime, tenant)
    payload = validator.validate(submission.kind, check_json(submission.payload))
    runtime = runtime.for_kind(submission.kind)  # its pool's queue, figures and bounds
    if submission.idempotency_key is not None:
        check_text(submission.idempotency_key, ("idempotency_key",))
    try:
        new = _new_job(runtime, validator, tenant, submission, tier, payload)
        place = limits.admit(runtime, tenant, new)
    except _REFUSED:
        if submission.idempotency_key is None:
            raise
        # A retry of work already accepted is answered with that job, whatever the queue's
        # state or the index's health now: the key is looked up only when the submit that
        # names it is refused (or its INSERT finds the key held), so a fresh keyed submit
        # costs what a plain one does.
        earlier = _earlier_holder(runtime, tenant.id, submission.idempotency_key)
        if earlier is None:
            raise
        return _resubmitted(runtime, tenant, earlier, submission.kind, payload,
                            retry_of=submission.retry_of)
    # A slot is free: on PostgreSQL the job is offered before its COMMIT, under its commit
    # lock, so that the worker wakes while the row commits (its start waits on the lock).
    early = place.slot_free and new.idempotency_key is None and runtime.direct is not None
    job = _persist(runtime, new, offer_first=early)
    if job.id != new.id:
        return _resubmitted(runtime, tenant, job, new.kind, new.payload,
                            retry_of=new.retry_of)
    if place.slot_free and not early:
        offer(runtime)
    logger.info("job.submitted", extra={"event": "job.submitted", "job_id": job.id,
                                        "tenant": tenant.id, "tier": tier, "attempt": 1})
    return Submitted(
        progress=Progress(job=job, queue_position=place.position,
                          estimated_wait_s=place.estimated_wait_s),
        created=True,
    )


def _new_job(runtime: Runtime, validator: PayloadValidator, tenant: Tenant,
             submission: Submission, tier: str, payload: dict[str, Any]) -> NewJob:
    """The job a submission makes, not yet admitted."""
    webhook = None if submission.webhook is None else checked_webhook(
        runtime, submission.webhook.url, submission.webhook.events, known=JOB_EVENTS,
        tenant=tenant.id)
    now = runtime.clock()
    return NewJob(
        id=new_job_id(now),
        tenant_id=tenant.id,
        tier=tier,
        kind=submission.kind,
        payload=payload,
        order_key=runtime.policy.order_key(tier, now),
        enqueued_at=now,
        created_at=now,
        max_attempts=submission.max_attempts or runtime.policy.max_attempts,
        max_wait_s=submission.max_wait_s,
        idempotency_key=submission.idempotency_key,
        blob=submission.blob,
        timeout_s=timeout_of(runtime, validator, submission.kind, submission.timeout_s),
        retry_of=submission.retry_of,
        webhook_url=None if webhook is None else webhook.url,
        webhook_events=None if webhook is None else webhook.column,
    )


def _resubmitted(
    runtime: Runtime, tenant: Tenant, existing: Job, kind: str, payload: dict[str, Any],
    *, retry_of: str | None = None,
) -> Submitted:
    """The job already holding the key, when it is the same work; else a conflict. Only a
    used key gets here, so a fresh submit never pays for the comparison. Payloads compare
    as stored: validated, then through JSON (``{"seconds": 2}`` and ``{"seconds": 2.0}`` are
    the same sleep; a handler's tuple is the list it is stored as). A retry's key is the
    same work only for a retry of the same job (``retry_of``)."""
    if (existing.kind != kind or existing.retry_of != retry_of
            or existing.payload != json.loads(json.dumps(payload))):
        raise IdempotencyConflict(
            "this idempotency_key was used for a job of another kind or payload (or the "
            "retry of another job); use a new key for new work",
            job_id=existing.id, idempotency_key=existing.idempotency_key,
        )
    return Submitted(progress=progress(runtime, tenant, existing), created=False)


def _tier_of(runtime: Runtime, tenant: Tenant) -> str:
    if tenant.tier not in runtime.policy.tiers:
        raise Forbidden(
            f"this tenant's tier {tenant.tier!r} is not served by this deployment; "
            "ask the operator to move the tenant to a configured tier",
            tier=tenant.tier,
        )
    return tenant.tier


def _persist(runtime: Runtime, new: NewJob, *, offer_first: bool = False) -> Job:
    """Commit the job's row; on a lost idempotency race, the job that won (as stored).
    ``offer_first`` (PostgreSQL, no idempotency key): ``offer`` inside the INSERT's
    transaction, which holds the job's commit lock from before the offer until the COMMIT
    (``DirectPool.locked``), so a start of the job waits for the row
    (``jobs.store.moves.once_committed``)."""
    inserted = False
    statement: Any = None
    try:
        # One statement, its own transaction (``jobs.store.direct``), keyed or not.
        with _insert_transaction(runtime, new, offer_first=offer_first) as session:
            statement = session
            if offer_first:
                offer(runtime)
            job = jobs_sql.insert_job(session, new)
            inserted = True  # only the COMMIT is left
    except Exception as exc:
        # A statement that commits itself (a direct connection's) and was cut off may have
        # committed, as a COMMIT whose answer was lost may have.
        sent = isinstance(statement, DirectConnection) and statement.sent
        if (inserted or sent) and is_backend_outage(exc):
            return _settle_commit(runtime, new, exc)
        _forget(runtime, new.id, new.tenant_id)
        if is_backend_outage(exc):
            raise Unavailable("the database cannot be reached; nothing was accepted") from exc
        raise
    if job is not None:
        return job
    _forget(runtime, new.id, new.tenant_id)  # an earlier job holds its key
    assert new.idempotency_key is not None  # only a keyed insert inserts nothing
    holder = _earlier_holder(runtime, new.tenant_id, new.idempotency_key)
    if holder is None:  # pruned since the INSERT, or the database went
        raise Unavailable("the job that holds this idempotency key cannot be read now; retry")
    return holder


def _insert_transaction(
    runtime: Runtime, new: NewJob, *, offer_first: bool
) -> contextlib.AbstractContextManager[Any]:
    if offer_first and runtime.direct is not None:
        return pipeline.locked(runtime.direct, new.id)
    return runtime.one_statement()


def _settle_commit(runtime: Runtime, new: NewJob, exc: Exception) -> Job:
    """The connection died during COMMIT: the row may or may not have landed. Read it back
    (briefly): there, it is accepted; absent, it is forgotten and the answer is 503. Still
    unknown, the index entry stays: the dispatcher runs the job if the row shows up and drops
    the entry if it never does (see ``UNCOMMITTED_GRACE_S`` in ``jobs.dispatch.dispatcher``)."""
    for delay in _SETTLE_DELAYS_S:
        time.sleep(delay)
        try:
            with runtime.sessions() as session:
                job = jobs_sql.get_job(session, new.id)
        except SQL_OUTAGE:
            continue
        if job is not None:
            return job
        _forget(runtime, new.id, new.tenant_id)
        raise Unavailable("the database cannot be reached; nothing was accepted") from exc
    logger.warning("job.commit_unknown", extra={"event": "job.commit_unknown",
                                                "job_id": new.id, "tier": new.tier})
    raise Unavailable(
        "the database cannot be reached and the job's commit is unconfirmed; retry with an "
        "idempotency_key so that a job that did land is not made twice"
    ) from exc


def _forget(runtime: Runtime, job_id: str, tenant: str) -> None:
    """Take a job that will not be committed back out of the index (best effort)."""
    try:
        runtime.index.cancel(job_id, tenant=tenant)
    except REDIS_OUTAGE:
        logger.warning("job.unindex_failed", extra={"event": "job.unindex_failed",
                                                    "job_id": job_id})


def offer(runtime: Runtime) -> None:
    """After a COMMIT: a free slot takes the best runnable job at once, its message pushed
    to its tier's queue by the index (``DispatchIndex.offer``), with no dispatcher round
    between; where submits cannot push (no worker published how: another broker than the
    index's Redis) the dispatcher is rung instead. Best effort: a job left queued is
    dispatched by the next slot to free, or the dispatcher's next round."""
    try:
        push = runtime.index.tier_push()
        if push is not None and not push.covers(runtime.policy.tiers):
            push = None  # a worker of another configuration published it
        runtime.index.offer(lease_ttl_s=runtime.policy.lease_ttl_s, push=push,
                            capacity=runtime.policy.pool_concurrency)
    except REDIS_OUTAGE:
        logger.warning("dispatcher.ring_failed", extra={"event": "dispatcher.ring_failed"})


def ring_dispatcher(runtime: Runtime) -> None:
    """Wake the dispatcher; a missed ring only costs one of its maintenance periods."""
    try:
        wake.ring(runtime.redis, runtime.prefix)
    except REDIS_OUTAGE:
        logger.warning("dispatcher.ring_failed", extra={"event": "dispatcher.ring_failed"})


def _earlier_holder(runtime: Runtime, tenant_id: str, key: str) -> Job | None:
    """The job that holds the tenant's idempotency key; None when there is none, or when the
    database cannot say (the caller's own answer stands then)."""
    try:
        with runtime.sessions() as session:
            return jobs_sql.job_by_idempotency_key(session, tenant_id, key)
    except SQL_OUTAGE:
        return None


def check_json(payload: dict[str, Any]) -> dict[str, Any]:
    """Refuse what JSON parsers accept but the stores cannot keep: NUL characters and lone
    surrogates in text (PostgreSQL refuses both), non-finite numbers (not JSON), and nesting
    deeper than ``MAX_PAYLOAD_DEPTH``. Iterative, so hostile depth cannot exhaust the stack."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(payload, ("payload",))]
    while stack:
        value, loc = stack.pop()
        if len(loc) > MAX_PAYLOAD_DEPTH + 1:
            raise _bad_value(loc, f"nested deeper than {MAX_PAYLOAD_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                check_text(str(key), loc)
                stack.append((item, (*loc, str(key))))
        elif isinstance(value, list):
            stack.extend((item, (*loc, i)) for i, item in enumerate(value))
        elif isinstance(value, str):
            check_text(value, loc)
        elif isinstance(value, float) and not math.isfinite(value):
            raise _bad_value(loc, "numbers must be finite")
    return payload


def check_text(text: str, loc: tuple[str | int, ...]) -> str:
    if "\x00" in text:
        raise _bad_value(loc, "text may not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad_value(loc, "text must be valid Unicode (no lone surrogates)") from None
    return text


def _bad_value(loc: tuple[str | int, ...], msg: str) -> InvalidRequest:
    return InvalidRequest(
        f"{'.'.join(str(part) for part in loc)}: {msg}",
        details=[{"loc": list(loc), "msg": msg}],
    )
