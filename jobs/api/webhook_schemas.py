"""The webhook parts of the API's bodies: a subscription as a request names it, a tenant's
signing secret, and the deliveries of a job or batch."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from jobs.core.errors import InvalidRequest
from jobs.core.webhooks import MAX_URL_LENGTH, Webhook

TIMESTAMP = "RFC 3339, UTC, milliseconds"


class WebhookRequest(BaseModel):
    """Where to POST each event, and which events (Standard Webhooks, signed with the
    tenant's secret: GET /v1/webhooks/secret)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: Annotated[str, Field(min_length=1, max_length=MAX_URL_LENGTH,
                              examples=["https://example.com/hooks/tierq"],
                              description="an http(s) URL; loopback, link-local and private "
                              "addresses are refused unless the operator allows them")]
    events: list[Annotated[str, Field(max_length=40)]] | None = Field(
        default=None, max_length=4, examples=[["started", "completed"]],
        description="a job's: started, completed (default: completed); a batch's: completed, "
                    "item.completed (default: completed)")

    def webhook(self) -> Webhook:
        """As named, unchecked: the submit checks it (``jobs.admission.webhooks``)."""
        return Webhook(url=self.url, events=tuple(self.events or ()))


def webhook_of_fields(url: str | None, events: str | None, *, where: str) -> Webhook | None:
    """A webhook named by two plain fields (NDJSON batches' query, an upload's form):
    ``webhook_url`` and ``webhook_events``, comma-separated; unchecked, as ``webhook()``."""
    if url is None:
        if events is not None:
            raise InvalidRequest("webhook_events names the events of a webhook_url",
                                 details=[{"loc": [where, "webhook_url"], "msg": "required"}])
        return None
    named = tuple(part.strip() for part in (events or "").split(",") if part.strip())
    return Webhook(url=url, events=named)


class WebhookSecretResponse(BaseModel):
    """The tenant's webhook signing secret."""

    secret: str = Field(description="whsec_ followed by base64: the key of every signature "
                        "(Standard Webhooks); made on first use")
    previous_valid_until: str | None = Field(
        default=None, description=f"until when the secret it replaced still signs beside it "
        f"({TIMESTAMP}); null when none does")


class DeliveryAttemptView(BaseModel):
    """One try of a delivery."""

    at: str = Field(description=f"when it was made ({TIMESTAMP})")
    status_code: int | None = Field(description="the receiver's answer; null when none came")
    error: str | None = Field(description="why the try failed (no answer, not 2xx); null when "
                              "it was delivered")
    duration_ms: float = Field(description="how long the try took")


class DeliveryView(BaseModel):
    """An event for a webhook, and its tries."""

    webhook_id: str = Field(description="the webhook-id header: the same on every try")
    type: str = Field(description="job.started, job.completed, batch.item.completed or "
                      "batch.completed")
    url: str = Field(description="where it is posted")
    status: str = Field(description="pending (tried again at next_attempt_at), delivered or "
                        "failed (given up a day after the event)")
    created_at: str = Field(description=f"when the change it reports happened ({TIMESTAMP})")
    next_attempt_at: str | None = Field(description="its next try while pending; null after")
    attempts: list[DeliveryAttemptView] = Field(description="each try, oldest first")


class DeliveriesResponse(BaseModel):
    """A job's (or a batch's) webhook deliveries, oldest first."""

    deliveries: list[DeliveryView] = Field(description="each event recorded for it")

    @classmethod
    def of(cls, rows: list[Any], rfc3339: Any) -> DeliveriesResponse:
        return cls(deliveries=[DeliveryView(
            webhook_id=row.id, type=row.type, url=row.url, status=row.status,
            created_at=rfc3339(row.created_at) or "",
            next_attempt_at=rfc3339(row.next_attempt_at) if row.status == "pending" else None,
            attempts=[DeliveryAttemptView(at=rfc3339(a.at) or "", status_code=a.status_code,
                                          error=a.error, duration_ms=a.duration_ms)
                      for a in row.attempts],
        ) for row in rows])
