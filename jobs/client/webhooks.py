"""Webhooks on the client's side: the subscription a submit names (``Webhook``), and the
check a receiver makes of each delivery (``verify_webhook``).

tierq posts each event as the Standard Webhooks specification says: a JSON body ``{"type",
"timestamp", "data"}`` with the headers ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature`` (``v1,<base64>`` HMAC-SHA256s of ``"<id>.<timestamp>.<body>"``, one per
secret that signs: two for a day after ``rotate_webhook_secret``). The check itself is the
``standardwebhooks`` package's; this module adds several secrets and one typed error.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from standardwebhooks.webhooks import EmptyWebhookSecretError
from standardwebhooks.webhooks import Webhook as _Signer
from standardwebhooks.webhooks import WebhookVerificationError as _PackageError

from jobs.core.errors import TierqError

# A delivery whose ``webhook-timestamp`` is further than this from now is refused (the
# package's fixed tolerance, which stops a captured delivery being replayed later).
TOLERANCE_S = 300.0


class WebhookVerificationError(TierqError, _PackageError):
    """A delivery that cannot be trusted: a header missing or malformed, no signature made
    with any secret given, a timestamp outside ``TOLERANCE_S``, or a body that is not a
    JSON object. A receiver answers it with a ``400`` (and does not act on the body)."""

    type = "webhook_verification"
    status = 400


@dataclass(frozen=True, kw_only=True)
class Webhook:
    """Where tierq posts a job's (or a batch's) events, and which: a job's ``started``,
    ``completed``; a batch's ``completed``, ``item.completed``. ``events=None``: the
    server's default (``completed``)."""

    url: str
    events: tuple[str, ...] | None = None

    @classmethod
    def of(cls, value: Webhook | Mapping[str, Any]) -> Webhook:
        """``value`` itself, or a mapping of the same keys (``{"url", "events"}``)."""
        if isinstance(value, Webhook):
            return value
        events = value.get("events")
        return cls(url=str(value["url"]),
                   events=None if events is None else tuple(str(e) for e in events))

    def body(self) -> dict[str, Any]:
        """As a JSON request names it (``POST /v1/jobs``)."""
        named: dict[str, Any] = {"url": self.url}
        if self.events is not None:
            named["events"] = list(self.events)
        return named

    def fields(self) -> dict[str, str]:
        """As query parameters (an NDJSON batch) or form fields (a document) name it."""
        named = {"webhook_url": self.url}
        if self.events is not None:
            named["webhook_events"] = ",".join(self.events)
        return named


def verify_webhook(
    body: bytes | str, headers: Mapping[str, str], secret: str | Sequence[str]
) -> dict[str, Any]:
    """The event of a delivery (``{"type", "timestamp", "data"}``) once its signature is
    found to be made with ``secret`` (or with one of several: while a rotation is under
    way a receiver may know both) within ``TOLERANCE_S`` of now; else
    ``WebhookVerificationError``. ``body``: the request's body exactly as received;
    ``headers``: its headers, in any case. A secret that is not ``whsec_``-base64 is the
    receiver's own mistake: ``ValueError``."""
    secrets = [secret] if isinstance(secret, str) else list(secret)
    if not secrets:
        raise ValueError("verify_webhook needs at least one secret")
    signers = [_signer(one) for one in secrets]
    plain = {str(name): str(value) for name, value in headers.items()}
    refusal: WebhookVerificationError | None = None
    for signer in signers:
        try:
            event = signer.verify(body, plain)
        except (_PackageError, ValueError) as exc:  # ValueError: a malformed header or body
            refusal = refusal or WebhookVerificationError(_reason(exc))
            continue
        if not isinstance(event, dict):
            raise WebhookVerificationError("the body is not a JSON object")
        return event
    assert refusal is not None
    raise refusal


def _signer(secret: str) -> _Signer:
    try:
        return _Signer(secret)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not a webhook secret (whsec_ followed by base64): {exc}") from exc
    except EmptyWebhookSecretError as exc:
        raise ValueError("a webhook secret may not be empty") from exc


def _reason(exc: Exception) -> str:
    if isinstance(exc, _PackageError):
        return str(exc) or "no signature matches"
    return f"malformed webhook headers or body: {exc}"
