"""The Python client of tierq's HTTP API (``docs/client.md``)."""

from jobs.client.core import RetryNotice
from jobs.client.http import (
    ApiError,
    AsyncClient,
    Client,
    Event,
    NotFound,
    Refused,
    RetryPolicy,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from jobs.client.webhooks import Webhook, WebhookVerificationError, verify_webhook

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "Event",
    "NotFound",
    "Refused",
    "RetryNotice",
    "RetryPolicy",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "Webhook",
    "WebhookVerificationError",
    "verify_webhook",
]
