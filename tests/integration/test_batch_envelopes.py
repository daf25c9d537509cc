"""Batches as an evaluation run needs them: items with ids of the client's own, an error
file, a window to start in, and retrying an ended job. Real HTTP, SQL and Redis; the
dispatcher by ``run_once`` with a recording publisher, the worker's start by ``execute``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs.dispatch.dispatcher import Dispatcher
from jobs.execution.attempt import execute
from jobs.execution.handlers import JobContext
from jobs.execution.registry import HandlerRegistry
from tests.integration.api_harness import ApiClient, Clock, auth, rt
from tests.integration.stand_in import stand_ins_for
from tests.integration.test_batches import RecordingPublisher

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


class Judge:
    """The echo kind, failing the items whose payload says so."""

    kind = "echo"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        if payload.get("bad"):
            raise ValueError(f"item {payload['n']} is bad")
        return {"n": payload["n"]}


def run_batch(client: ApiClient, clock: Clock, count: int) -> None:
    """Feed, dispatch and run every item of the tenant's batches (as many as ``count``)."""
    runtime = rt(client)
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    registry = HandlerRegistry([Judge()])
    done: set[str] = set()
    for _ in range(60):
        clock.now += 1
        dispatcher.run_once(clock.now)
        for job_id, attempt, _ in publisher.sent:
            if job_id not in done:
                execute(runtime, registry, job_id, attempt, worker_id="w@host", clock=clock)
                done.add(job_id)
        if len(done) >= count:
            return
    raise AssertionError(f"{len(done)} of {count} items ran")


def envelopes(count: int, bad: set[int]) -> list[dict[str, Any]]:
    return [{"custom_id": f"q-{n}", "payload": {"n": n, "bad": n in bad}} for n in range(count)]


def lines(client: ApiClient, key: str, batch_id: str, **params: str) -> list[dict[str, Any]]:
    answer = client.get(f"/v1/batches/{batch_id}/results", params=params, headers=auth(key))
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines()]


def test_envelope_items_carry_their_custom_id_to_their_result_and_the_error_file(
    client: ApiClient, clock: Clock
) -> None:
    key = client.tenant_key("evals", "premium")
    answer = client.post("/v1/batches", headers=auth(key), json={
        "kind": "echo", "envelope": True, "items": envelopes(5, bad={1, 3})})
    assert answer.status_code == 202, answer.text
    batch_id = answer.json()["id"]
    run_batch(client, clock, 5)

    every = lines(client, key, batch_id)
    assert [(line["custom_id"], line["status"]) for line in every] == [
        ("q-0", "succeeded"), ("q-1", "failed"), ("q-2", "succeeded"), ("q-3", "failed"),
        ("q-4", "succeeded")]
    assert every[0]["result"] == {"n": 0}
    failed = lines(client, key, batch_id, status="failed")
    assert [line["custom_id"] for line in failed] == ["q-1", "q-3"]
    assert "item 1 is bad" in failed[0]["error"]
    job = client.get(f"/v1/jobs/{every[1]['job_id']}", headers=auth(key)).json()
    assert job["custom_id"] == "q-1"


def test_ndjson_envelopes_and_bad_envelopes(client: ApiClient) -> None:
    key = client.tenant_key("evals", "premium")
    body = "\n".join(json.dumps(e) for e in envelopes(3, bad=set()))
    answer = client.post("/v1/batches", params={"kind": "echo", "envelope": "true"},
                         content=body, headers={**auth(key),
                                                "Content-Type": "application/x-ndjson"})
    assert answer.status_code == 202, answer.text
    refused = {
        "a bare payload": [{"n": 1}],
        "a repeated id": [{"custom_id": "x", "payload": {}}, {"custom_id": "x", "payload": {}}],
        "an empty id": [{"custom_id": "", "payload": {}}],
        "an id too long": [{"custom_id": "x" * 201, "payload": {}}],
    }
    for what, items in refused.items():
        answer = client.post("/v1/batches", headers=auth(key),
                             json={"kind": "echo", "envelope": True, "items": items})
        assert answer.status_code == 422, what
        error = answer.json()["error"]
        assert error["type"] == "invalid_request" and "nothing was stored" in error["message"]
    batches = client.get("/v1/batches", headers=auth(key)).json()["batches"]
    assert len(batches) == 1


def test_items_not_started_within_the_window_expire_unrun(
    client: ApiClient, clock: Clock
) -> None:
    key = client.tenant_key("late", "free")
    answer = client.post("/v1/batches", headers=auth(key), json={
        "kind": "echo", "completion_window_s": 30,
        "items": [{"n": n} for n in range(3)]})
    assert answer.status_code == 202, answer.text
    batch_id = answer.json()["id"]
    assert client.get(f"/v1/batches/{batch_id}", headers=auth(key)).json()[
        "completion_window_s"] == 30
    clock.now += 31  # nothing ran: the window passed with every item still waiting
    Dispatcher(rt(client), RecordingPublisher()).run_once(clock.now)
    state = client.get(f"/v1/batches/{batch_id}", headers=auth(key)).json()
    assert state["counts"]["expired"] == 3 and state["status"] == "finished"
    assert {line["status"] for line in lines(client, key, batch_id)} == {"expired"}


def test_an_ended_job_is_retried_as_a_new_job_and_a_live_one_is_409(
    client: ApiClient, clock: Clock
) -> None:
    key = client.tenant_key("again", "premium")
    first = client.post("/v1/jobs", headers=auth(key), json={
        "kind": "echo", "payload": {"n": 7, "bad": True}, "max_attempts": 1,
        "timeout_s": 60}).json()
    live = client.post(f"/v1/jobs/{first['id']}/retry", headers=auth(key))
    assert live.status_code == 409
    assert live.json()["error"]["type"] == "job_not_ended"
    run_batch(client, clock, 1)
    assert client.get(f"/v1/jobs/{first['id']}", headers=auth(key)).json()["status"] == "failed"

    again = client.post(f"/v1/jobs/{first['id']}/retry", headers=auth(key))
    assert again.status_code == 202, again.text
    new = again.json()
    assert new["id"] != first["id"] and again.headers["Location"] == f"/v1/jobs/{new['id']}"
    body = client.get(f"/v1/jobs/{new['id']}", headers=auth(key)).json()
    assert (body["retry_of"], body["kind"], body["status"]) == (first["id"], "echo", "queued")
    assert (body["max_attempts"], body["timeout_s"]) == (1, 60)
    old = client.get(f"/v1/jobs/{first['id']}", headers=auth(key)).json()
    assert old["status"] == "failed" and old["retry_of"] is None
    other = client.tenant_key("stranger", "premium")
    assert client.post(f"/v1/jobs/{first['id']}/retry", headers=auth(other)).status_code == 404
