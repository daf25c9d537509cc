"""The job explorer: search jobs by status, kind, tier, tenant and creation time, read one job
whole, and let the admin cancel or retry any tenant's job.

A tenant's search is always scoped to its own id, so no filter can reach another tenant's
jobs. The admin's cancel and retry act as the job's own tenant through ``jobs.service.jobs``
(a retry is admitted under that tenant's tier and limits, as if it had asked), so the two
keys share one code path and one set of answers. A job's payload is handed out cut at
``PAYLOAD_SHOWN_BYTES``: a page showing a job must not pull a megabyte of input to do it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

from jobs.admission.estimates import Progress, progress_many
from jobs.admission.submit import KindCatalog, PayloadValidator, Submitted
from jobs.core.domain import Job, Tenant
from jobs.core.errors import InvalidRequest, JobGone, NotFound
from jobs.core.states import Status
from jobs.process.runtime import Runtime
from jobs.service import jobs as job_service
from jobs.store import jobs as jobs_sql
from jobs.store import search as search_sql
from jobs.store import tenants as tenants_sql
from jobs.store.search import JobQuery

PAYLOAD_SHOWN_BYTES = 4096
# Times outside what a job can have been created at are clamped to these (a datetime cannot
# go past year 9999, and no job was made before 1970): the window means the same.
_EARLIEST, _LATEST = 0.0, 253_370_764_800.0  # 1970-01-01, 9999-01-01


@dataclass(frozen=True, kw_only=True)
class Filters:
    """A search as asked: each None matches every job; ``since`` inclusive, ``until``
    exclusive, on the creation time."""

    status: Status | None = None
    kind: str | None = None
    tier: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class Found:
    """A job of a search, with its live place in the queue and its tenant."""

    progress: Progress
    tenant: Tenant | None  # None: its tenant row is gone


@dataclass(frozen=True, kw_only=True)
class Payload:
    """A payload as shown: whole when its JSON is at most ``PAYLOAD_SHOWN_BYTES``, else its
    first bytes (``excerpt``, cut at a character boundary) and ``value`` None."""

    value: dict[str, Any] | None
    excerpt: str | None
    bytes: int
    truncated: bool


def query_of(
    runtime: Runtime, validator: PayloadValidator, filters: Filters, *,
    tenant_id: str | None,
) -> JobQuery:
    """The store's query for ``filters``; a kind or tier this deployment does not have, or
    an empty time window, is ``InvalidRequest`` naming the query parameter."""
    if filters.kind is not None and isinstance(validator, KindCatalog):
        known = validator.kinds()
        if filters.kind not in known:
            _refuse("kind", f"unknown kind {filters.kind!r}; this deployment has: "
                    + ", ".join(sorted(known)))
    if filters.tier is not None and filters.tier not in runtime.policy.tiers:
        _refuse("tier", f"unknown tier {filters.tier!r}; this deployment has: "
                + ", ".join(sorted(runtime.policy.tiers)))
    since = None if filters.since is None else _epoch(filters.since)
    until = None if filters.until is None else _epoch(filters.until)
    if since is not None and until is not None and since >= until:
        _refuse("until", "until must be later than since")
    return JobQuery(tenant_id=tenant_id, status=filters.status, kind=filters.kind,
                    tier=filters.tier, since=since, until=until)


def _epoch(moment: datetime) -> float:
    return min(max(moment.timestamp(), _EARLIEST), _LATEST)


def _refuse(name: str, message: str) -> NoReturn:
    raise InvalidRequest(f"query.{name}: {message}",
                         details=[{"loc": ["query", name], "msg": message}])


def search(
    runtime: Runtime, query: JobQuery, *, limit: int, cursor: str | None
) -> tuple[list[Found], str | None]:
    """One page of the jobs ``query`` matches, newest first, each with its live queue place
    (estimated as for its own tenant) and its tenant; and the next page's cursor."""
    with runtime.sessions() as session:
        jobs, next_cursor = search_sql.search_jobs(session, query, limit=limit, cursor=cursor)
        tenants = tenants_sql.tenants_by_ids(session, {job.tenant_id for job in jobs})
    places: dict[str, Progress] = {}
    for tenant_id, tenant in tenants.items():
        own = [job for job in jobs if job.tenant_id == tenant_id]
        places.update((p.job.id, p) for p in progress_many(runtime, tenant, own))
    found = [Found(progress=places.get(job.id, Progress(job=job)),
                   tenant=tenants.get(job.tenant_id)) for job in jobs]
    return found, next_cursor


def tenant_named(runtime: Runtime, name_or_id: str) -> Tenant:
    """The tenant of this id or name; none is ``InvalidRequest`` (a filter, not a path)."""
    with runtime.sessions() as session:
        tenant = None
        if _is_uuid(name_or_id):
            tenant = tenants_sql.get_tenant(session, str(uuid.UUID(name_or_id)))
        if tenant is None:
            tenant = tenants_sql.tenant_by_name(session, name_or_id)
    if tenant is None:
        _refuse("tenant", f"no tenant has the id or name {name_or_id!r}")
    return tenant


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def any_job(runtime: Runtime, job_id: str) -> tuple[Job, Tenant]:
    """Any tenant's job, with its tenant (the admin's read); pruned: ``JobGone``."""
    canonical = job_service.parse_job_id(job_id)
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, canonical)
        tenant = None if job is None else tenants_sql.get_tenant(session, job.tenant_id)
        pruned = job is None and search_sql.pruned_owner(session, canonical) is not None
    if pruned:
        raise JobGone("the job was removed after its retention period", type="job_gone",
                      job_id=job_id)
    if job is None or tenant is None:
        raise NotFound("no such job", job_id=job_id)
    return job, tenant


def shown_payload(payload: dict[str, Any]) -> Payload:
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    data = text.encode("utf-8")
    if len(data) <= PAYLOAD_SHOWN_BYTES:
        return Payload(value=payload, excerpt=None, bytes=len(data), truncated=False)
    excerpt = data[:PAYLOAD_SHOWN_BYTES].decode("utf-8", errors="ignore")
    return Payload(value=None, excerpt=excerpt, bytes=len(data), truncated=True)


def cancel_any(runtime: Runtime, job_id: str) -> job_service.CancelOutcome:
    """The admin's cancel: the tenant's own, on the job's tenant."""
    job, tenant = any_job(runtime, job_id)
    return job_service.cancel(runtime, tenant, job.id)


def retry_any(runtime: Runtime, validator: PayloadValidator, job_id: str,
              idempotency_key: str | None = None) -> Submitted:
    """The admin's retry: the tenant's own, on the job's tenant (its tier, its limits, its
    idempotency keys)."""
    job, tenant = any_job(runtime, job_id)
    return job_service.retry(runtime, validator, tenant, job.id, idempotency_key)
