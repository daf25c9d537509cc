"""Request and response bodies of ``/v1/batches`` (``docs/api.md``, "Batches")."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from jobs.api.schemas import MAX_ATTEMPTS_LIMIT, TIMEOUT, TimeoutS, rfc3339
from jobs.api.webhook_schemas import WebhookRequest
from jobs.service.batch_items import MAX_BATCH_ITEMS
from jobs.service.batches import BatchProgress
from jobs.store.batches import Batch

BATCH_ID = "the batch's id (a UUID)"
ENVELOPE = ('each item is {"custom_id": "<1 to 200 characters, unique in the batch>", '
            '"payload": {...}}; its result line carries the custom_id back')
WINDOW = ("seconds: items not started this long after the batch was stored end expired "
          "(never computed)")
# A batch may give its items up to a week to start.
MAX_WINDOW_S = 7 * 86400.0
WindowS = Annotated[float, Field(gt=0, le=MAX_WINDOW_S, allow_inf_nan=False)]


class BatchRequest(BaseModel):
    """A batch as one JSON document; the same items as NDJSON (one per line, ``?kind=``)
    are read as they stream."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"kind": "sleep", "items": [{"seconds": 1}, {"seconds": 2}], "idempotency_key": "run-8"},
    ]})

    kind: Annotated[str, Field(min_length=1, max_length=100,
                               description="the handler that runs every item")]
    items: list[Any] = Field(max_length=MAX_BATCH_ITEMS,
                             description="the items' payloads, JSON objects the kind's handler "
                                         "validates; a bad one is a 422 naming its index")
    idempotency_key: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, description="unique per tenant: the same key with the same kind and "
                                  "items answers 200 with the first batch; other content, 409")
    max_attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS_LIMIT)] | None = Field(
        default=None, description="starts allowed per item before it fails")
    timeout_s: TimeoutS | None = Field(default=None, description=f"each item: {TIMEOUT}")
    envelope: bool = Field(default=False, description=ENVELOPE)
    completion_window_s: WindowS | None = Field(default=None, description=WINDOW)
    webhook: WebhookRequest | None = Field(
        default=None, description="POST batch.completed there when every item has ended, "
        "and batch.item.completed as each one does if its events name item.completed "
        "(docs/api.md, Webhooks)")


class BatchLinks(BaseModel):
    """Where a batch's state and results are."""

    self: str = Field(description="/v1/batches/<id>")
    results: str = Field(description="/v1/batches/<id>/results")


class BatchSubmitResponse(BaseModel):
    """A stored batch: its items wait for room in the tier's live queue."""

    id: str = Field(description=BATCH_ID)
    kind: str = Field(description="the handler that runs every item")
    tier: str = Field(description="the tenant's tier")
    status: str = Field(description="accepted | running | finished | cancelled")
    total: int = Field(description="items in the batch")
    links: BatchLinks = Field(description="where its state and results are")

    @classmethod
    def of(cls, batch: Batch) -> BatchSubmitResponse:
        return cls(id=batch.id, kind=batch.kind, tier=batch.tier, status="accepted",
                   total=batch.total, links=links(batch.id))


class BatchResponse(BaseModel):
    """A batch as it is now."""

    id: str = Field(description=BATCH_ID)
    kind: str = Field(description="the handler that runs every item")
    tier: str = Field(description="the tenant's tier")
    status: str = Field(description="accepted (nothing started yet) | running | finished | "
                                    "cancelled")
    total: int = Field(description="items in the batch")
    completion_window_s: float | None = Field(default=None, description=WINDOW)
    counts: dict[str, int] = Field(description="items by state: waiting, queued, running, "
                                               "succeeded, failed, cancelled, expired")
    created_at: str | None = Field(description="when it was stored (RFC 3339, UTC)")
    finished_at: str | None = Field(description="when its last item finished (null: not yet)")
    estimated_finish_s: float | None = Field(
        description="seconds until every item is finished, at the rate the batch has been "
                    "served so far; before an item finished, at its kind's mean service time "
                    "over the slots its tier's cap allows (null: nothing is served)")
    links: BatchLinks = Field(description="where its state and results are")

    @classmethod
    def of(cls, progress: BatchProgress) -> BatchResponse:
        batch = progress.batch
        return cls(id=batch.id, kind=batch.kind, tier=batch.tier, status=progress.status,
                   total=batch.total, counts=progress.counts,
                   completion_window_s=batch.completion_window_s,
                   created_at=rfc3339(batch.created_at),
                   finished_at=rfc3339(progress.finished_at),
                   estimated_finish_s=progress.estimated_finish_s, links=links(batch.id))


class BatchListResponse(BaseModel):
    """The tenant's batches, newest first."""

    batches: list[BatchResponse] = Field(description="this tenant's batches, newest first")


def links(batch_id: str) -> BatchLinks:
    return BatchLinks(self=f"/v1/batches/{batch_id}", results=f"/v1/batches/{batch_id}/results")
