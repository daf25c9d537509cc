"""Run-time limits over HTTP: ``timeout_s`` on a job, a batch and an upload, resolved at
submit (the job's, else its kind's, else the policy's) and shown in the job's body, refused
with a typed 422 when out of range; ``error_type`` beside ``error``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from jobs.api.app import create_app
from jobs.core.states import Status
from jobs.execution.registry import default_registry
from jobs.process.runtime import Runtime
from jobs.store import batches as batches_sql
from jobs.store.models import JobRow
from tests.integration.api_harness import ApiClient, api_client, auth, make_settings, move
from tests.services import RedisServer

pytestmark = pytest.mark.integration


def job_of(client: ApiClient, key: str, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
    return body


@pytest.fixture
def limited_client(pg_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
                   ) -> Iterator[ApiClient]:
    """An API whose registry has a kind with a limit of its own (``limited``: 0.5 s)."""
    settings = make_settings(pg_url, redis_server.url, key_prefix, default_timeout_s=900)
    runtime = Runtime.from_settings(settings)
    registry = default_registry("tests.handlers_for_tests:LimitedHandler", entry_points=False)
    try:
        with api_client(create_app(settings, runtime, validator=registry)) as client:
            client.runtime = runtime
            yield client
    finally:
        runtime.close()


def test_the_limit_is_the_job_s_else_the_kind_s_else_the_policy_s(
    limited_client: ApiClient,
) -> None:
    def limit_of(n: int, body: dict[str, Any]) -> Any:
        key = limited_client.tenant_key(f"tenant-{n}")  # one each: a free tenant queues one
        answer = limited_client.submit(key, body)
        assert answer.status_code == 202, answer.text
        job = job_of(limited_client, key, answer.json()["id"])
        assert job["error_type"] is None
        return job["timeout_s"]

    assert [limit_of(n, body) for n, body in enumerate([
        {"kind": "sleep", "payload": {"seconds": 1}, "timeout_s": 12.5},  # the job's own
        {"kind": "limited"},  # its kind's
        {"kind": "limited", "timeout_s": 3},  # the job's, over its kind's
        {"kind": "echo"},  # the policy's
    ])] == [12.5, 0.5, 3.0, 900.0]


@pytest.mark.parametrize("value", [0, -1, 86_400.5, "10", True, None])
def test_a_limit_out_of_range_is_a_typed_422_and_stores_nothing(
    client: ApiClient, value: Any
) -> None:
    key = client.tenant_key("acme")
    body = {"kind": "sleep", "payload": {"seconds": 1}, "timeout_s": value}
    answer = client.submit(key, body)
    if value is None:  # null is "not given"
        assert answer.status_code == 202
        return
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request"
    assert any(detail["loc"][-1] == "timeout_s" for detail in error["details"])
    assert client.get("/v1/jobs", headers=auth(key)).json()["jobs"] == []


def test_the_largest_limit_is_a_day(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    answer = client.submit(key, {"kind": "echo", "timeout_s": 86_400})
    assert answer.status_code == 202
    assert job_of(client, key, answer.json()["id"])["timeout_s"] == 86_400.0


def test_a_batch_gives_its_items_its_limit(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    stored = client.post("/v1/batches", headers=auth(key), json={
        "kind": "echo", "items": [{"a": 1}, {"a": 2}], "timeout_s": 42}).json()
    streamed = client.post(
        "/v1/batches", headers={**auth(key), "Content-Type": "application/x-ndjson"},
        params={"kind": "echo", "timeout_s": "7"}, content=b'{"a": 1}\n').json()
    defaulted = client.post("/v1/batches", headers=auth(key), json={
        "kind": "echo", "items": [{"a": 1}]}).json()
    with client.runtime.sessions() as session:
        for batch_id, limit in ((stored["id"], 42.0), (streamed["id"], 7.0),
                                (defaulted["id"], 3600.0)):
            batch = batches_sql.get_batch(session, batch_id)
            assert batch is not None and batch.timeout_s == limit
            items = session.scalars(sa.select(JobRow.timeout_s).where(
                JobRow.batch_id == batch_id)).all()
            assert items and set(items) == {limit}
    for refused in (
        client.post("/v1/batches", headers=auth(key),
                    json={"kind": "echo", "items": [{}], "timeout_s": 0}),
        client.post("/v1/batches", headers={**auth(key), "Content-Type": "application/x-ndjson"},
                    params={"kind": "echo", "timeout_s": "1e9"}, content=b'{}\n'),
    ):
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["type"] == "invalid_request"


def test_an_upload_takes_a_limit_as_a_form_field(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    answer = client.post("/v1/documents", headers=auth(key),
                         files={"file": ("notes.txt", b"plain words", "text/plain")},
                         data={"kind": "echo", "timeout_s": "30"})
    assert answer.status_code == 202, answer.text
    assert job_of(client, key, answer.json()["id"])["timeout_s"] == 30.0
    bad = client.post("/v1/documents", headers=auth(key),
                      files={"file": ("notes.txt", b"plain words", "text/plain")},
                      data={"kind": "echo", "timeout_s": "-3"})
    assert bad.status_code == 422
    assert bad.json()["error"]["type"] == "invalid_request"


def test_the_body_shows_why_a_job_ended_badly(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    job_id = client.submit(key).json()["id"]
    move(client, job_id, Status.RUNNING, Status.FAILED, error="timed out: …",
         error_type="timed_out")
    body = job_of(client, key, job_id)
    assert (body["status"], body["error_type"]) == ("failed", "timed_out")
