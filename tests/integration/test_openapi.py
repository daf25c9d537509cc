"""The OpenAPI document served at /openapi.json agrees with API.md: every route and method,
the statuses each documents, the error body on every error status, the 429 headers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jobs.api.app import create_app
from jobs.process.settings import load_settings
from tests.integration.api_harness import api_client

pytestmark = pytest.mark.integration

# API.md, route by route: the statuses it names for each (errors from its table included).
DOCUMENTED: dict[tuple[str, str], set[int]] = {
    ("post", "/v1/jobs"): {200, 202, 400, 401, 403, 409, 413, 422, 429, 503},
    ("get", "/v1/jobs"): {200, 401, 403, 422},
    ("get", "/v1/jobs/{job_id}"): {200, 401, 403, 404, 422},
    ("get", "/v1/jobs/{job_id}/result"): {200, 202, 401, 404, 409, 410},
    ("post", "/v1/jobs/{job_id}/cancel"): {200, 202, 401, 404},
    ("get", "/v1/queues"): {200, 401},
    ("get", "/healthz"): {200},
    ("get", "/readyz"): {200, 503},
    ("get", "/metrics"): {200},
    ("post", "/v1/admin/tenants"): {201, 401, 403, 422},
    ("get", "/v1/admin/tenants"): {200, 401, 403},
    ("patch", "/v1/admin/tenants/{tenant_id}"): {200, 401, 403, 404, 422},
    ("post", "/v1/admin/tenants/{tenant_id}/rotate-key"): {200, 401, 403, 404},
}
ERROR_REF = "#/components/schemas/ErrorResponse"


@pytest.fixture(scope="module")
def document() -> Iterator[dict[str, Any]]:
    # Nothing is connected before a request needs it, so no server is needed behind these.
    settings = load_settings(database_url="sqlite:///:memory:", redis_url="redis://127.0.0.1:1",
                             admin_key="openapi-admin-key-0123")
    with api_client(create_app(settings)) as client:
        answer = client.get("/openapi.json")
        assert answer.status_code == 200
        body: dict[str, Any] = answer.json()
        yield body


def _operation(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    operation: dict[str, Any] = document["paths"][path][method]
    return operation


def test_every_route_of_the_contract_is_present(document: dict[str, Any]) -> None:
    served = {
        (method, path)
        for path, item in document["paths"].items()
        for method in item
        if method in {"get", "post", "put", "patch", "delete"}
    }
    assert set(DOCUMENTED) <= served


@pytest.mark.parametrize(("method", "path"), sorted(DOCUMENTED))
def test_each_route_documents_its_statuses(
    document: dict[str, Any], method: str, path: str
) -> None:
    responses = _operation(document, method, path)["responses"]
    listed = {int(status) for status in responses}
    assert DOCUMENTED[(method, path)] <= listed
    for status, response in responses.items():
        if int(status) >= 400:
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": ERROR_REF}, (method, path, status)


def test_the_error_body_and_the_refusal_headers(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    error = schemas["ErrorResponse"]
    assert error["required"] == ["error"]
    detail = schemas["ErrorDetail"]
    assert {"type", "message"} <= set(detail["required"])
    assert {"retry_after_seconds", "tier", "queue_position", "details"} <= set(
        detail["properties"])

    submit = _operation(document, "post", "/v1/jobs")["responses"]
    assert set(submit["429"]["headers"]) == {"Retry-After", "X-Queue-Position", "X-Tier"}
    assert "Retry-After" in submit["503"]["headers"]
    assert "Location" in submit["202"]["headers"]
    accepted = submit["202"]["content"]["application/json"]["schema"]
    assert accepted == submit["200"]["content"]["application/json"]["schema"]
    result = _operation(document, "get", "/v1/jobs/{job_id}/result")["responses"]
    assert "Retry-After" in result["202"]["headers"]


def test_requests_are_strict_and_keys_are_bearer_tokens(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    assert schemas["SubmitRequest"]["additionalProperties"] is False
    assert schemas["SubmitRequest"]["required"] == ["kind"]
    assert set(schemas["SubmitResponse"]["properties"]) >= {
        "id", "status", "tier", "queue_position", "estimated_wait_s", "links"}
    assert set(schemas["JobResponse"]["properties"]) >= {
        "id", "kind", "tier", "status", "attempt", "queue_position", "estimated_wait_s",
        "created_at", "enqueued_at", "dispatched_at", "started_at", "finished_at", "error"}
    assert "self" in schemas["JobLinks"]["properties"]
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert {"security"} <= set(_operation(document, "post", "/v1/jobs"))
