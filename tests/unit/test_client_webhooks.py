"""verify_webhook against deliveries signed here by hand as the Standard Webhooks
specification says, and the calls that name a webhook or read the secret and deliveries."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest
from standardwebhooks.webhooks import WebhookVerificationError as PackageError

from jobs.client import Webhook, WebhookVerificationError, verify_webhook
from jobs.client.core import (
    batch_deliveries_call,
    deliveries_call,
    rotate_webhook_secret_call,
    webhook_form,
    webhook_secret_call,
    with_webhook,
)
from jobs.client.protocol import submit_batch_call, submit_call
from jobs.core.errors import TierqError

pytestmark = pytest.mark.unit

SECRET = "whsec_" + base64.b64encode(b"the tenant's secret, 24 b").decode()
OTHER = "whsec_" + base64.b64encode(b"some other tenant's secret").decode()
MSG_ID = "msg_2mKf1yq2hT6V0aYbXcDeFgHiJkL"
EVENT = {"type": "job.completed", "timestamp": "2025-01-01T00:00:00.000Z",
         "data": {"id": "0190b3a0-0000-7000-8000-000000000001", "status": "succeeded"}}
BODY = json.dumps(EVENT, separators=(",", ":"))


def signature(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(*secrets: str, timestamp: int | None = None, body: str = BODY) -> dict[str, str]:
    at = int(time.time()) if timestamp is None else timestamp
    return {"webhook-id": MSG_ID, "webhook-timestamp": str(at),
            "webhook-signature": " ".join(signature(s, MSG_ID, at, body) for s in secrets)}


def test_a_signed_delivery_answers_its_event() -> None:
    assert verify_webhook(BODY.encode(), headers(SECRET), SECRET) == EVENT
    assert verify_webhook(BODY, headers(SECRET), SECRET) == EVENT


def test_header_names_are_read_in_any_case() -> None:
    named = {name.title(): value for name, value in headers(SECRET).items()}
    assert verify_webhook(BODY, named, SECRET) == EVENT


def test_a_wrong_secret_is_refused() -> None:
    with pytest.raises(WebhookVerificationError):
        verify_webhook(BODY, headers(OTHER), SECRET)


def test_a_tampered_body_is_refused() -> None:
    tampered = BODY.replace("succeeded", "failed")
    with pytest.raises(WebhookVerificationError):
        verify_webhook(tampered, headers(SECRET), SECRET)


@pytest.mark.parametrize("shift_s", [-600, 600])
def test_a_timestamp_outside_the_tolerance_is_refused(shift_s: int) -> None:
    at = int(time.time()) + shift_s
    with pytest.raises(WebhookVerificationError, match=r"too (old|new)"):
        verify_webhook(BODY, headers(SECRET, timestamp=at), SECRET)


def test_a_timestamp_within_the_tolerance_passes() -> None:
    at = int(time.time()) - 120
    assert verify_webhook(BODY, headers(SECRET, timestamp=at), SECRET) == EVENT


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_header_is_refused(missing: str) -> None:
    given = headers(SECRET)
    del given[missing]
    with pytest.raises(WebhookVerificationError):
        verify_webhook(BODY, given, SECRET)


@pytest.mark.parametrize("malformed", ["v1", "v1,not base64!", "", "v1,a,b"])
def test_a_malformed_signature_is_refused(malformed: str) -> None:
    given = {**headers(SECRET), "webhook-signature": malformed}
    with pytest.raises(WebhookVerificationError):
        verify_webhook(BODY, given, SECRET)


def test_a_malformed_timestamp_is_refused() -> None:
    given = {**headers(SECRET), "webhook-timestamp": "yesterday"}
    with pytest.raises(WebhookVerificationError):
        verify_webhook(BODY, given, SECRET)


def test_one_of_two_signatures_matching_is_enough() -> None:
    # During a rotation tierq signs with both secrets; a receiver knows either one.
    both = headers(OTHER, SECRET)
    assert len(both["webhook-signature"].split(" ")) == 2
    assert verify_webhook(BODY, both, SECRET) == EVENT
    assert verify_webhook(BODY, both, OTHER) == EVENT


def test_a_list_of_secrets_passes_when_any_one_signed() -> None:
    assert verify_webhook(BODY, headers(SECRET), [OTHER, SECRET]) == EVENT
    assert verify_webhook(BODY, headers(SECRET), (SECRET, OTHER)) == EVENT
    third = "whsec_" + base64.b64encode(b"a third secret").decode()
    with pytest.raises(WebhookVerificationError):
        verify_webhook(BODY, headers(SECRET), [OTHER, third])


def test_a_signed_body_that_is_not_a_json_object_is_refused() -> None:
    for body in ("[1, 2]", "not json"):
        with pytest.raises(WebhookVerificationError):
            verify_webhook(body, headers(SECRET, body=body), SECRET)


def test_the_error_is_tierqs_and_the_packages() -> None:
    with pytest.raises(WebhookVerificationError) as caught:
        verify_webhook(BODY, headers(OTHER), SECRET)
    assert isinstance(caught.value, PackageError)
    assert isinstance(caught.value, TierqError)
    assert caught.value.message


@pytest.mark.parametrize("secret", [[], "whsec_", "whsec_not base64!"])
def test_no_usable_secret_is_the_receivers_mistake(secret: str | list[str]) -> None:
    with pytest.raises(ValueError):
        verify_webhook(BODY, headers(SECRET), secret)


def test_a_submit_names_its_webhook_in_its_body() -> None:
    call = submit_call("echo", {}, idempotency_key="k")
    assert with_webhook(call, None) is call
    named = with_webhook(call, Webhook(url="https://h.example/x", events=("started",)))
    assert named.json is not None
    assert named.json["webhook"] == {"url": "https://h.example/x", "events": ["started"]}
    assert named.json["kind"] == "echo"
    as_mapping = with_webhook(call, {"url": "https://h.example/x"})
    assert as_mapping.json is not None
    assert as_mapping.json["webhook"] == {"url": "https://h.example/x"}  # server default


def test_an_ndjson_batch_names_its_webhook_in_the_query() -> None:
    call = submit_batch_call("echo", [{}], idempotency_key="k")
    named = with_webhook(call, {"url": "https://h.example/x",
                                "events": ["completed", "item.completed"]})
    assert named.params is not None
    assert named.params["webhook_url"] == "https://h.example/x"
    assert named.params["webhook_events"] == "completed,item.completed"
    assert named.params["kind"] == "echo"
    assert named.content == call.content and named.json is None


def test_a_document_names_its_webhook_in_its_form() -> None:
    assert webhook_form(None) == {}
    assert webhook_form(Webhook(url="https://h.example/x")) == {"webhook_url":
                                                                 "https://h.example/x"}


def test_the_secret_and_deliveries_calls() -> None:
    assert (webhook_secret_call().method, webhook_secret_call().path) == (
        "GET", "/v1/webhooks/secret")
    assert (rotate_webhook_secret_call().method, rotate_webhook_secret_call().path) == (
        "POST", "/v1/webhooks/secret/rotate")
    assert deliveries_call("a/b").path == "/v1/jobs/a%2Fb/deliveries"
    assert batch_deliveries_call("b1").path == "/v1/batches/b1/deliveries"
