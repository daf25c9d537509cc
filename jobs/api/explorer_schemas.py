"""The job explorer's query and bodies: the filters of ``GET /v1/jobs`` and
``GET /v1/admin/jobs``, a job with its tenant (the admin's lists), and a job read whole (its
tenant and its payload, cut for display).

Times are RFC 3339 with a zone (``2026-12-04T10:00:00Z``): a time without one, or a bare
number (which pydantic would read as seconds since 1970), is refused rather than guessed at.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Query
from pydantic import AwareDatetime, BaseModel, BeforeValidator, Field

from jobs.admission.estimates import Progress
from jobs.api.schemas import JobResponse
from jobs.core.domain import Tenant
from jobs.core.states import Status
from jobs.service.explorer import PAYLOAD_SHOWN_BYTES, Filters, Found, Payload

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")


def _rfc3339(value: Any) -> Any:
    if isinstance(value, str) and not _RFC3339.fullmatch(value):
        raise ValueError("not an RFC 3339 time with its zone, such as 2026-12-04T10:00:00Z")
    return value


Moment = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]


def job_filters(
    status: Annotated[Status | None, Query(description="only jobs in this state")] = None,
    kind: Annotated[str | None, Query(
        min_length=1, max_length=100,
        description="only jobs of this kind (one this deployment has)")] = None,
    tier: Annotated[str | None, Query(
        min_length=1, max_length=64, description="only jobs of this tier (a configured "
        "one)")] = None,
    since: Annotated[Moment | None, Query(
        description="only jobs created at or after this time (RFC 3339 with its zone)")] = None,
    until: Annotated[Moment | None, Query(
        description="only jobs created before this time (RFC 3339 with its zone); later "
        "than since")] = None,
) -> Filters:
    return Filters(status=status, kind=kind, tier=tier, since=since, until=until)


TENANT_ID = "the id of the tenant whose job it is"
TENANT_NAME = "that tenant's name"


class AdminJobResponse(JobResponse):
    """A job of any tenant, as a tenant sees it, with whose it is."""

    tenant_id: str = Field(description=TENANT_ID)
    tenant: str | None = Field(description=TENANT_NAME)

    @classmethod
    def found(cls, found: Found) -> AdminJobResponse:
        return cls(**JobResponse.of(found.progress).model_dump(),
                   tenant_id=found.progress.job.tenant_id,
                   tenant=None if found.tenant is None else found.tenant.name)


class AdminJobListResponse(BaseModel):
    """One page of every tenant's jobs (or one tenant's), newest first."""

    jobs: list[AdminJobResponse] = Field(description="this page, newest first")
    next_cursor: str | None = Field(description="pass as cursor for the next page; null on "
                                    "the last")


class JobDetailResponse(JobResponse):
    """A job read whole: as ``GET /v1/jobs/{job_id}`` answers it, with its tenant and its
    payload (cut when its JSON is larger than the bytes shown)."""

    tenant_id: str = Field(description=TENANT_ID)
    tenant: str = Field(description=TENANT_NAME)
    payload: dict[str, Any] | None = Field(
        description=f"the job's input; null when its JSON is over {PAYLOAD_SHOWN_BYTES} "
        "bytes (payload_excerpt holds its start)")
    payload_excerpt: str | None = Field(
        description=f"the first {PAYLOAD_SHOWN_BYTES} bytes of the payload's JSON when it "
        "is cut; null otherwise")
    payload_bytes: int = Field(ge=0, description="the size of the payload's JSON (compact, "
                               "UTF-8)")
    payload_truncated: bool = Field(description="true when the payload is too large to "
                                    "show whole: payload is null, payload_excerpt its start")

    @classmethod
    def read(cls, progress: Progress, tenant: Tenant, payload: Payload) -> JobDetailResponse:
        return cls(**JobResponse.of(progress).model_dump(), tenant_id=tenant.id,
                   tenant=tenant.name, payload=payload.value,
                   payload_excerpt=payload.excerpt, payload_bytes=payload.bytes,
                   payload_truncated=payload.truncated)
