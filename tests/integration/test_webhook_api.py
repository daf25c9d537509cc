"""Webhooks through the HTTP API: a subscription is checked before anything is stored (an
address inside a network is refused unless the operator allows it, and so is a URL that is
not http(s) or an unknown event), shown in the job's body and kept by its retry; the
tenant's secret and its rotation; deliveries are a tenant's own."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.core.states import Status
from jobs.store import batches as batches_sql
from tests.integration.api_harness import (
    ADMIN_KEY,
    ApiClient,
    auth,
    make_settings,
    move,
    rt,
    running_api,
)
from tests.services import RedisServer

pytestmark = pytest.mark.integration

PUBLIC = "https://receiver.example/hook"  # .example never resolves: accepted, checked later


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9/hook", "http://localhost/hook", "http://[::1]/hook",
    "http://169.254.169.254/latest/meta-data", "http://10.1.2.3/", "http://192.168.0.1/",
    "http://[::ffff:127.0.0.1]/", "http://0.0.0.0/",
])
def test_an_address_inside_a_network_is_refused(client: ApiClient, url: str) -> None:
    key = client.tenant_key("acme")
    answer = client.submit(key, {"kind": "echo", "webhook": {"url": url}})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request" and "webhook_allow_private" in error["message"]
    assert error["details"][0]["loc"][-2:] == ["webhook", "url"]
    assert client.get("/v1/jobs", headers=auth(key)).json()["jobs"] == []


@pytest.mark.parametrize(("webhook", "field"), [
    ({"url": "ftp://receiver.example/"}, "url"),
    ({"url": "https://user:pw@receiver.example/"}, "url"),
    ({"url": "not a url"}, "url"),
    ({"url": PUBLIC, "events": ["finished"]}, "events"),
    ({"url": PUBLIC, "events": ["item.completed"]}, "events"),  # a batch's, not a job's
])
def test_a_subscription_that_cannot_work_is_refused(
    client: ApiClient, webhook: dict[str, Any], field: str
) -> None:
    answer = client.submit(client.tenant_key("acme"), {"kind": "echo", "webhook": webhook})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["details"][0]["loc"][-1] == field


UNSENDABLE = "https://\u2603.receiver.example/hook"  # a snowman: no IDNA name has one


@pytest.mark.parametrize("route", ["job", "batch", "ndjson batch", "document"])
def test_a_url_the_http_client_cannot_send_is_refused_at_submit(
    client: ApiClient, route: str
) -> None:
    """It passes the URL's own checks (http(s), a host), but no request can be made to it:
    it would only fail at every try."""
    key = client.tenant_key("acme")
    if route == "job":
        answer = client.submit(key, {"kind": "echo", "webhook": {"url": UNSENDABLE}})
    elif route == "batch":
        answer = client.post("/v1/batches", headers=auth(key), json={
            "kind": "echo", "items": [{}], "webhook": {"url": UNSENDABLE}})
    elif route == "ndjson batch":
        answer = client.post("/v1/batches", params={"kind": "echo", "webhook_url": UNSENDABLE},
                             headers={**auth(key), "content-type": "application/x-ndjson"},
                             content=b"{}\n")
    else:
        answer = client.post("/v1/documents", headers=auth(key), data={
            "webhook_url": UNSENDABLE}, files={"file": ("notes.txt", b"words", "text/plain")})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request" and error["message"].startswith("webhook.url")
    assert error["details"][0]["loc"][-2:] == ["webhook", "url"]
    assert client.get("/v1/jobs", headers=auth(key)).json()["jobs"] == []


def test_unknown_fields_of_a_subscription_are_refused(client: ApiClient) -> None:
    answer = client.submit(client.tenant_key("acme"), {
        "kind": "echo", "webhook": {"url": PUBLIC, "secret": "mine"}})
    assert answer.status_code == 422


def test_the_job_shows_its_subscription_and_its_retry_keeps_it(
    client: ApiClient,
) -> None:
    key = client.tenant_key("acme", "premium")
    job_id = client.submit(key, {"kind": "echo", "webhook": {
        "url": PUBLIC, "events": ["started", "completed", "started"]}}).json()["id"]
    body = client.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
    assert body["webhook"] == {"url": PUBLIC, "events": ["completed", "started"]}
    client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
    plain = client.submit(key, {"kind": "echo"}).json()["id"]
    assert client.get(f"/v1/jobs/{plain}", headers=auth(key)).json()["webhook"] is None
    client.post(f"/v1/jobs/{plain}/cancel", headers=auth(key))
    retried = client.post(f"/v1/jobs/{job_id}/retry", headers=auth(key)).json()
    assert client.get(f"/v1/jobs/{retried['id']}", headers=auth(key)).json()["webhook"] == (
        body["webhook"])


def test_a_cancel_records_the_completed_event_and_deliveries_are_the_tenants_own(
    client: ApiClient,
) -> None:
    key, other = client.tenant_key("acme"), client.tenant_key("other")
    job_id = client.submit(key, {"kind": "echo", "webhook": {"url": PUBLIC}}).json()["id"]
    assert client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth(key)).json() == {
        "deliveries": []}
    client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
    shown = client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth(key)).json()
    (delivery,) = shown["deliveries"]
    assert delivery["type"] == "job.completed" and delivery["status"] == "pending"
    assert delivery["webhook_id"].startswith("msg_") and delivery["attempts"] == []
    assert delivery["url"] == PUBLIC and delivery["next_attempt_at"].endswith("Z")
    assert client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth(other)).status_code == 404
    admin = client.get(f"/v1/admin/jobs/{job_id}/deliveries",
                       headers=auth(ADMIN_KEY)).json()
    assert admin == shown


def test_the_secret_is_made_once_and_a_rotation_signs_beside_the_old_one(
    client: ApiClient,
) -> None:
    key, other = client.tenant_key("acme"), client.tenant_key("other")
    first = client.get("/v1/webhooks/secret", headers=auth(key)).json()
    assert first["secret"].startswith("whsec_") and first["previous_valid_until"] is None
    assert client.get("/v1/webhooks/secret", headers=auth(key)).json() == first
    assert client.get("/v1/webhooks/secret", headers=auth(other)).json() != first
    rotated = client.post("/v1/webhooks/secret/rotate", headers=auth(key)).json()
    assert rotated["secret"] != first["secret"] and rotated["previous_valid_until"]
    assert client.get("/v1/webhooks/secret", headers=auth(key)).json() == rotated


def test_a_batch_takes_a_subscription_in_its_body_or_its_query(client: ApiClient) -> None:
    key = client.tenant_key("acme")
    answer = client.post("/v1/batches", headers=auth(key), json={
        "kind": "echo", "items": [{}], "webhook": {"url": PUBLIC, "events": ["started"]}})
    assert answer.status_code == 422 and answer.json()["error"]["details"][0]["loc"][-1] == (
        "events")
    answer = client.post("/v1/batches", headers=auth(key), json={
        "kind": "echo", "items": [{}, {}], "webhook": {"url": PUBLIC,
                                                       "events": ["item.completed"]}})
    assert answer.status_code == 202, answer.text
    ndjson = {**auth(key), "content-type": "application/x-ndjson"}
    refused = client.post("/v1/batches?kind=echo&webhook_url=http://127.0.0.1/",
                          headers=ndjson, content=b"{}\n")
    assert refused.status_code == 422
    accepted = client.post(f"/v1/batches?kind=echo&webhook_url={PUBLIC}"
                           "&webhook_events=completed,item.completed",
                           headers=ndjson, content=b"{}\n")
    assert accepted.status_code == 202, accepted.text
    batch_id = accepted.json()["id"]
    assert client.get(f"/v1/batches/{batch_id}/deliveries", headers=auth(key)).json() == {
        "deliveries": []}


@pytest.fixture
def private_client(
    pg_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> Iterator[ApiClient]:
    settings = make_settings(pg_url, redis_server.url, key_prefix).model_copy(
        update={"webhook_allow_private": True})
    with running_api(settings) as api:
        yield api


def test_the_operator_may_allow_private_addresses(private_client: ApiClient) -> None:
    key = private_client.tenant_key("acme")
    answer = private_client.submit(key, {"kind": "echo", "webhook": {
        "url": "http://127.0.0.1:9/hook", "events": ["started"]}})
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]
    move(private_client, job_id, Status.RUNNING)
    shown = private_client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth(key)).json()
    assert [d["type"] for d in shown["deliveries"]] == ["job.started"]


@pytest.fixture
def one_network_client(
    pg_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> Iterator[ApiClient]:
    settings = make_settings(pg_url, redis_server.url, key_prefix).model_copy(
        update={"webhook_allow_networks": [ipaddress.ip_network("127.0.0.2/32")]})
    with running_api(settings) as api:
        yield api


def test_the_operator_may_allow_one_network_and_no_other(
    one_network_client: ApiClient,
) -> None:
    client = one_network_client
    key = client.tenant_key("acme")
    allowed = client.submit(key, {"kind": "echo", "webhook": {"url": "http://127.0.0.2:9/"}})
    assert allowed.status_code == 202, allowed.text
    for url in ("http://127.0.0.1:9/", "http://10.1.2.3/", "http://localhost/"):
        refused = client.submit(key, {"kind": "echo", "webhook": {"url": url}})
        assert refused.status_code == 422, url
        assert "webhook_allow_networks" in refused.json()["error"]["message"]


def _cli(client: ApiClient, key: str, *args: str) -> Any:
    from typer.testing import CliRunner

    from jobs.cli.main import build_app

    env = {"TIERQ_API_URL": str(client.base_url), "TIERQ_API_KEY": key, "COLUMNS": "200"}
    return CliRunner().invoke(build_app(), list(args), env=env)


def test_the_command_line_submits_with_a_webhook_and_shows_secret_and_deliveries(
    client: ApiClient,
) -> None:
    key = client.tenant_key("acme", "premium")
    done = _cli(client, key, "submit", "echo", "--webhook", PUBLIC,
                "--webhook-event", "started", "--webhook-event", "completed")
    assert done.exit_code == 0, done.output
    job_id = done.stdout.split()[1]
    assert client.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()["webhook"] == {
        "url": PUBLIC, "events": ["completed", "started"]}
    lonely = _cli(client, key, "submit", "echo", "--webhook-event", "started")
    assert lonely.exit_code == 2 and "--webhook" in lonely.output

    secret = _cli(client, key, "webhooks", "secret")
    assert secret.exit_code == 0 and secret.stdout.strip() == client.get(
        "/v1/webhooks/secret", headers=auth(key)).json()["secret"]
    rotated = _cli(client, key, "webhooks", "rotate")
    assert rotated.exit_code == 0 and rotated.stdout.split()[0] != secret.stdout.strip()
    assert "the previous secret also signs until" in rotated.stdout

    empty = _cli(client, key, "webhooks", "deliveries", job_id)
    assert empty.exit_code == 0 and "no webhook event recorded" in empty.stdout
    client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
    shown = _cli(client, key, "webhooks", "deliveries", job_id)
    assert shown.exit_code == 0, shown.output
    assert "job.completed" in shown.stdout and "pending" in shown.stdout


def test_the_command_line_submits_a_batch_with_a_webhook(client: ApiClient,
                                                         tmp_path: Any) -> None:
    key = client.tenant_key("acme", "premium")
    items = tmp_path / "items.ndjson"
    items.write_text("{}\n{}\n")
    done = _cli(client, key, "batch", "submit", str(items), "--kind", "echo", "--webhook",
                PUBLIC, "--webhook-event", "item.completed")
    assert done.exit_code == 0, done.output
    batch_id = done.stdout.split()[1]
    with rt(client).sessions() as session:
        batch = batches_sql.get_batch(session, batch_id)
    assert batch is not None and batch.webhook_url == PUBLIC
    assert batch.item_webhook == (PUBLIC, ",item.completed,")
