"""Batches over real HTTP on PostgreSQL + Redis: stored waiting in one transaction, validated
first, fed into the live queue by the dispatcher as room allows, read back, cancelled.

The dispatcher runs here by ``run_once`` with a recording publisher; a dispatch writes
nothing to SQL (a leased item stays ``queued`` until a worker starts it), so where a promise
is about what runs, a worker's start (``execute``) with a counting handler tells. Real workers
running a batch to completion are in tests/e2e/test_batches_system.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from jobs.core.arrivals import Work
from jobs.core.service_times import KindMean
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.execution.attempt import SUCCEEDED, execute
from jobs.execution.handlers import JobContext
from jobs.execution.registry import HandlerRegistry
from jobs.fleet import pool
from jobs.index.keys import IndexKeys
from jobs.store import blobs as blobs_sql
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql
from tests.integration.api_harness import ApiClient, Clock, auth, move, rt
from tests.integration.stand_in import stand_ins_for

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


@dataclass
class RecordingPublisher:
    sent: list[tuple[str, int, str]] = field(default_factory=list)

    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        self.sent.append((job_id, attempt, tier))


class CountingSleep:
    """The sleep kind for a worker's start: records each run instead of sleeping, so a test
    can tell whether (and how often) an item was computed."""

    kind = "sleep"

    def __init__(self) -> None:
        self.runs: list[str] = []

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        self.runs.append(ctx.job_id)
        return {"slept": 0}


def counting() -> tuple[HandlerRegistry, CountingSleep]:
    handler = CountingSleep()
    return HandlerRegistry([handler]), handler


def item_ids(client: ApiClient, key: str, batch_id: str) -> list[str]:
    lines = client.get(f"/v1/batches/{batch_id}/results", headers=auth(key)).text.splitlines()
    return [json.loads(line)["job_id"] for line in lines]


def items(n: int) -> list[dict[str, Any]]:
    return [{"seconds": 0.01 * (i % 5)} for i in range(n)]


def submit(client: ApiClient, key: str, body: dict[str, Any]) -> Any:
    return client.post("/v1/batches", json=body, headers=auth(key))


def counts(client: ApiClient, key: str, batch_id: str) -> dict[str, int]:
    response = client.get(f"/v1/batches/{batch_id}", headers=auth(key))
    assert response.status_code == 200, response.text
    found: dict[str, int] = response.json()["counts"]
    return found


def statuses(client: ApiClient, batch_id: str) -> dict[Status, int]:
    from jobs.store import batches

    with rt(client).sessions() as session:
        return batches.counts(session, batch_id)


def test_json_batch_is_stored_waiting_and_answered_at_once(client: ApiClient) -> None:
    key = client.tenant_key("bulk")
    response = submit(client, key, {"kind": "sleep", "items": items(30)})
    assert response.status_code == 202, response.text
    body = response.json()
    assert response.headers["Location"] == f"/v1/batches/{body['id']}"
    assert body["status"] == "accepted" and body["total"] == 30 and body["tier"] == "free"
    assert body["links"] == {"self": f"/v1/batches/{body['id']}",
                             "results": f"/v1/batches/{body['id']}/results"}
    state = client.get(f"/v1/batches/{body['id']}", headers=auth(key)).json()
    assert state["status"] == "accepted"
    assert state["counts"]["waiting"] == 30
    # No item finished yet: 30 items at the configured 6 s (sleep is not measured), one at a
    # time (a free tenant's cap on 4 slots is 1).
    assert state["estimated_finish_s"] == 180.0 and state["finished_at"] is None
    listed = client.get("/v1/batches", headers=auth(key)).json()["batches"]
    assert [b["id"] for b in listed] == [body["id"]]


def test_a_batch_not_yet_started_is_estimated_at_its_kinds_measured_mean(
    client: ApiClient, redis_client: Any
) -> None:
    """The leader measured sleep at 2 s (and another kind at a minute, which says nothing of
    this batch): 30 items, one at a time under a free tenant's cap, finish in about 60 s."""
    keys = IndexKeys(rt(client).prefix)
    redis_client.hset(keys.kind_means, mapping=Work.kind_fields({
        "sleep": KindMean(mean_s=2.0, spread_s=0.5, samples=200),
        "eval": KindMean(mean_s=60.0, spread_s=5.0, samples=200)}))
    key = client.tenant_key("measured")
    body = submit(client, key, {"kind": "sleep", "items": items(30)}).json()
    state = client.get(f"/v1/batches/{body['id']}", headers=auth(key)).json()
    assert state["status"] == "accepted" and state["estimated_finish_s"] == 60.0


def test_a_bad_item_is_named_and_nothing_is_stored(client: ApiClient) -> None:
    key = client.tenant_key("sloppy")
    bad = items(10)
    bad[7] = {"seconds": "soon"}
    response = submit(client, key, {"kind": "sleep", "items": bad})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["message"].startswith("items[7]")
    assert error["details"][0]["loc"][:2] == ["items", 7]
    not_object = submit(client, key, {"kind": "sleep", "items": [{"seconds": 0}, 5]})
    assert not_object.status_code == 422 and "items[1]" in not_object.json()["error"]["message"]
    empty = submit(client, key, {"kind": "sleep", "items": []})
    assert empty.status_code == 422
    unknown = submit(client, key, {"kind": "no.such.kind", "items": [{}]})
    assert unknown.status_code == 422
    assert client.get("/v1/batches", headers=auth(key)).json()["batches"] == []
    with rt(client).sessions() as session:
        assert stats_sql.count_by_status(session).get(Status.WAITING, 0) == 0


def test_ndjson_is_read_as_it_streams(client: ApiClient) -> None:
    key = client.tenant_key("streamer")
    lines = [json.dumps(item) for item in items(2500)]

    def body() -> Any:
        for start in range(0, len(lines), 100):
            yield ("\n".join(lines[start:start + 100]) + "\n").encode()

    response = client.post("/v1/batches?kind=sleep", content=body(),
                           headers={**auth(key), "Content-Type": "application/x-ndjson"})
    assert response.status_code == 202, response.text
    assert response.json()["total"] == 2500
    assert counts(client, key, response.json()["id"])["waiting"] == 2500
    broken = "\n".join([lines[0], lines[1], "{not json"])
    refused = client.post("/v1/batches?kind=sleep", content=broken.encode(),
                          headers={**auth(key), "Content-Type": "application/x-ndjson"})
    assert refused.status_code == 422 and "items[2]" in refused.json()["error"]["message"]
    no_kind = client.post("/v1/batches", content=lines[0].encode(),
                          headers={**auth(key), "Content-Type": "application/x-ndjson"})
    assert no_kind.status_code == 422
    assert len(client.get("/v1/batches", headers=auth(key)).json()["batches"]) == 1


def test_a_line_nested_too_deep_is_refused_and_stores_nothing(client: ApiClient) -> None:
    key = client.tenant_key("nester")
    deep = '{"payload": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    body = "\n".join([json.dumps(items(1)[0]), deep])
    refused = client.post("/v1/batches?kind=sleep", content=body.encode(),
                          headers={**auth(key), "Content-Type": "application/x-ndjson"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["type"] == "invalid_request"
    assert "items[1]" in refused.json()["error"]["message"]
    assert client.get("/v1/batches", headers=auth(key)).json()["batches"] == []


def test_idempotency_key_names_one_batch(client: ApiClient) -> None:
    key = client.tenant_key("careful")
    body = {"kind": "sleep", "items": items(5), "idempotency_key": "eval-1"}
    first = submit(client, key, body)
    again = submit(client, key, body)
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    other = submit(client, key, {**body, "items": items(6)})
    assert other.status_code == 409
    assert other.json()["error"]["type"] == "idempotency_conflict"
    assert len(client.get("/v1/batches", headers=auth(key)).json()["batches"]) == 1


def test_feeder_fills_the_tenants_quota_only_and_others_keep_their_room(
    client: ApiClient, clock: Clock
) -> None:
    """The feeder admits up to the tenant's queued quota in the index; the dispatch leases up
    to its cap out of that (rows stay ``queued`` in SQL until a worker starts them), and the
    quota holds round after round: what was leased is not refilled past quota + cap."""
    key = client.tenant_key("bulk")
    other = client.tenant_key("single")
    batch_id = submit(client, key, {"kind": "sleep", "items": items(400)}).json()["id"]
    runtime = rt(client)
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    for step in range(3):  # rounds a feed period apart: the quota holds round after round
        dispatcher.run_once(clock.now + step)
    figures = pool.live_pool(runtime, now=clock.now)
    found = statuses(client, batch_id)
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, publisher.sent[0][0])
    assert job is not None
    tenant = job.tenant_id
    assert len(publisher.sent) == figures.caps["free"]  # each leased item published once
    assert runtime.index.tenant_inflight(tenant) == figures.caps["free"]
    assert runtime.index.tenant_queued(tenant) == figures.quotas["free"]
    assert Status.DISPATCHED not in found  # a dispatch writes nothing to SQL
    assert found[Status.QUEUED] == figures.quotas["free"] + figures.caps["free"]
    assert found[Status.WAITING] == 400 - found[Status.QUEUED]
    # Another tenant of the same tier is not refused: the batch took only its own quota.
    assert client.submit(other).status_code == 202
    # The admitted items age from their admission, not from the upload.
    assert job.enqueued_at == clock.now and job.batch_id == batch_id
    assert job.created_at < job.enqueued_at or job.created_at == clock.now


def test_feeding_resumes_in_a_new_dispatcher_and_results_stream(
    client: ApiClient, clock: Clock
) -> None:
    key = client.tenant_key("bulk")
    batch_id = submit(client, key, {"kind": "sleep", "items": items(12)}).json()["id"]
    runtime = rt(client)
    publisher = RecordingPublisher()
    done: list[str] = []
    for _ in range(40):  # each round: finish what was dispatched; a new dispatcher each time
        clock.now += 1
        Dispatcher(runtime, publisher).run_once(clock.now)
        for job_id, _attempt, _tier in publisher.sent:
            if job_id not in done:
                move(client, job_id, Status.RUNNING, Status.SUCCEEDED, result={"ok": job_id})
                runtime.index.release(job_id, attempt=1)
                done.append(job_id)
        if len(done) == 12:
            break
    assert len(done) == 12 and len(set(done)) == 12
    state = client.get(f"/v1/batches/{batch_id}", headers=auth(key)).json()
    assert state["status"] == "finished" and state["counts"]["succeeded"] == 12
    assert state["finished_at"] is not None and state["estimated_finish_s"] == 0.0
    lines = client.get(f"/v1/batches/{batch_id}/results", headers=auth(key))
    assert lines.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(line) for line in lines.text.splitlines()]
    assert [row["index"] for row in rows] == list(range(12))
    assert all(row["status"] == "succeeded" and row["result"] == {"ok": row["job_id"]}
               for row in rows)
    after = client.get(f"/v1/batches/{batch_id}/results?after=9", headers=auth(key))
    assert [json.loads(line)["index"] for line in after.text.splitlines()] == [10, 11]


def test_an_item_whose_result_is_a_blob_links_to_it(client: ApiClient, clock: Clock) -> None:
    key = client.tenant_key("bulk")
    batch_id = submit(client, key, {"kind": "sleep", "items": items(2)}).json()["id"]
    runtime = rt(client)
    publisher = RecordingPublisher()
    sha = "ab" * 32
    with runtime.sessions.begin() as session:
        blobs_sql.record_blob(session, sha, size=5_000_000, now=clock.now)
    for _ in range(10):  # the first item finishes with a result kept as a blob
        clock.now += 1
        Dispatcher(runtime, publisher).run_once(clock.now)
        if len(publisher.sent) == 2:
            break
        first = publisher.sent[0][0]
        with runtime.sessions() as session:
            found = jobs_sql.get_job(session, first)
        if found is not None and found.status is Status.QUEUED:  # leased, not yet started
            move(client, first, Status.RUNNING, Status.SUCCEEDED, result=None, result_blob=sha)
            runtime.index.release(first, attempt=1)
    (large, _, _), (small, _, _) = publisher.sent
    move(client, small, Status.RUNNING, Status.SUCCEEDED, result={"ok": 1})

    lines = client.get(f"/v1/batches/{batch_id}/results", headers=auth(key))
    rows = {row["job_id"]: row for row in map(json.loads, lines.text.splitlines())}
    assert rows[large]["result"] is None
    assert rows[large]["result_url"] == f"/v1/jobs/{large}/result/blob"
    assert rows[large]["result_bytes"] == 5_000_000
    assert rows[small]["result"] == {"ok": 1} and "result_url" not in rows[small]


def test_cancel_stops_every_item_not_started(client: ApiClient, clock: Clock) -> None:
    """Waiting, queued and leased items (published, not yet started) are all cancelled; the
    leases are freed at once, and a message already on its way runs nothing."""
    key = client.tenant_key("quitter")
    batch_id = submit(client, key, {"kind": "sleep", "items": items(50)}).json()["id"]
    runtime = rt(client)
    sent = RecordingPublisher()
    dispatcher = Dispatcher(runtime, sent)
    dispatcher.run_once(clock.now)
    dispatcher.run_once(clock.now + 1)
    before = statuses(client, batch_id)
    assert before.get(Status.WAITING, 0) and before.get(Status.QUEUED, 0)
    leased = [job_id for job_id, _, _ in sent.sent]
    held = runtime.index.entries_of(leased)
    assert leased and all(held[job_id].leased for job_id in leased)
    response = client.post(f"/v1/batches/{batch_id}/cancel", headers=auth(key))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "cancelled"
    assert body["counts"]["waiting"] == body["counts"]["queued"] == 0
    assert body["counts"]["cancelled"] == 50
    # The index holds none of its items: no lease keeps a slot of the pool.
    assert runtime.index.entries_of(item_ids(client, key, batch_id)) == {}
    assert runtime.index.inflight() == 0
    # A message published before the cancel reaches a worker: its start runs nothing.
    registry, handler = counting()
    for job_id, attempt, _ in sent.sent:
        assert execute(runtime, registry, job_id, attempt, worker_id="w@host",
                       clock=clock) == "stale"
    assert handler.runs == []
    # Nothing is fed or dispatched afterwards.
    publisher = RecordingPublisher()
    Dispatcher(runtime, publisher).run_once(clock.now + 5)
    assert publisher.sent == []
    assert statuses(client, batch_id) == {Status.CANCELLED: 50}
    lines = client.get(f"/v1/batches/{batch_id}/results", headers=auth(key)).text.splitlines()
    assert len(lines) == 50 and json.loads(lines[0])["status"] == "cancelled"


def test_another_tenants_batch_is_not_found(client: ApiClient) -> None:
    owner = client.tenant_key("owner")
    stranger = client.tenant_key("stranger")
    batch_id = submit(client, owner, {"kind": "sleep", "items": items(2)}).json()["id"]
    for path in (f"/v1/batches/{batch_id}", f"/v1/batches/{batch_id}/results",
                 "/v1/batches/not-a-uuid"):
        response = client.get(path, headers=auth(stranger))
        assert response.status_code == 404, path
        assert response.json()["error"]["type"] == "not_found"
    assert client.post(f"/v1/batches/{batch_id}/cancel",
                       headers=auth(stranger)).status_code == 404


def test_a_waiting_item_is_a_job_and_can_be_cancelled_alone(
    client: ApiClient, clock: Clock
) -> None:
    key = client.tenant_key("picky")
    batch_id = submit(client, key, {"kind": "sleep", "items": items(3)}).json()["id"]
    waiting = client.get("/v1/jobs?status=waiting", headers=auth(key)).json()["jobs"]
    assert len(waiting) == 3 and {job["status"] for job in waiting} == {"waiting"}
    response = client.post(f"/v1/jobs/{waiting[0]['id']}/cancel", headers=auth(key))
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(rt(client), publisher)
    for step in range(3):
        dispatcher.run_once(clock.now + step)
    assert waiting[0]["id"] not in {job_id for job_id, _, _ in publisher.sent}
    assert statuses(client, batch_id)[Status.CANCELLED] == 1


def interrupted_feed(client: ApiClient, name: str) -> tuple[str, Any]:
    """A batch of one item whose feed was interrupted between its admit (Redis) and its
    UPDATE (SQL): the index holds an entry of a row still waiting."""
    from jobs.index.base import IndexedJob
    from jobs.store import batches

    key = client.tenant_key(name)
    batch_id = submit(client, key, {"kind": "sleep", "items": items(1)}).json()["id"]
    runtime = rt(client)
    with runtime.sessions() as session:
        [item] = batches.next_waiting(session, batch_id, limit=5)
    runtime.index.admit(IndexedJob(job_id=item.job_id, tenant=item.tenant_id, tier=item.tier,
                                   order_key=0.0), bound=100)
    return key, item


def test_an_item_indexed_but_not_yet_queued_is_fed_and_runs_once(
    client: ApiClient, clock: Clock
) -> None:
    """The entry of a row still waiting is leased and published like any other (a dispatch
    reads no row); the feed of the same round moves the row to queued and keeps that lease
    (no second entry, no second message), and the worker's start then runs it, once."""
    _, item = interrupted_feed(client, "interrupted")
    runtime = rt(client)
    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    stats = dispatcher.run_once(clock.now)
    assert stats.dispatched == 1 and stats.fed == 1
    assert publisher.sent == [(item.job_id, 1, item.tier)]
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, item.job_id)
    assert job is not None and job.status is Status.QUEUED and job.attempt == 1
    assert runtime.index.tenant_inflight(item.tenant_id) == 1
    assert runtime.index.tenant_queued(item.tenant_id) == 0

    registry, handler = counting()
    assert execute(runtime, registry, item.job_id, 1, worker_id="w@host",
                   clock=clock) == SUCCEEDED
    assert handler.runs == [item.job_id]
    with runtime.sessions() as session:
        done = jobs_sql.get_job(session, item.job_id)
    assert done is not None and done.status is Status.SUCCEEDED and done.starts == 1
    assert runtime.index.entries_of([item.job_id]) == {}
    again = RecordingPublisher()
    Dispatcher(runtime, again).run_once(clock.now + 5)
    assert again.sent == []


def test_an_item_started_before_its_feed_committed_is_offered_again_soon(
    client: ApiClient, clock: Clock
) -> None:
    """The message of such an entry reaches a worker before the feed's UPDATE: the start
    finds the row still waiting and runs nothing; the lease must not hold the item (nor its
    tenant's slot) until it lapses. Once fed, the item is dispatched again within a few
    rounds, well inside a lease TTL, and runs once."""
    _, item = interrupted_feed(client, "early")
    runtime = rt(client)
    ttl = runtime.policy.lease_ttl_s
    [lease] = runtime.index.dispatch(5, now=clock.now, lease_ttl_s=ttl)
    assert lease.job_id == item.job_id
    registry, handler = counting()
    assert execute(runtime, registry, item.job_id, 1, worker_id="w@host",
                   clock=clock) == "stale"
    assert handler.runs == []

    publisher = RecordingPublisher()
    dispatcher = Dispatcher(runtime, publisher)
    for step in range(5):  # the feed, then rounds a second apart: far short of the TTL
        dispatcher.run_once(clock.now + step)
        if publisher.sent:
            break
    assert ttl > 5
    assert publisher.sent == [(item.job_id, 1, item.tier)], (
        runtime.index.entries_of([item.job_id]))
    assert execute(runtime, registry, item.job_id, 1, worker_id="w@host",
                   clock=clock) == SUCCEEDED
    assert handler.runs == [item.job_id]


def test_batch_bodies_have_their_own_limit(
    pg_url: str, redis_server: Any, key_prefix: str, clock: Clock, redis_client: Any
) -> None:
    from jobs.process.settings import load_settings
    from tests.integration.api_harness import ADMIN_KEY, running_api

    settings = load_settings(
        database_url=pg_url, redis_url=redis_server.url, key_prefix=key_prefix,
        admin_key=ADMIN_KEY, policy={"pool_concurrency": 4},
        api={"max_body_bytes": 1024, "max_batch_body_bytes": 8192},
    )
    with running_api(settings, clock) as api:
        key = api.tenant_key("sized")
        fits = {"kind": "echo", "items": [{"text": "x" * 100} for _ in range(30)]}
        assert 1024 < len(json.dumps(fits)) < 8192
        assert submit(api, key, fits).status_code == 202
        too_big = {"kind": "echo", "items": [{"text": "x" * 100} for _ in range(100)]}
        refused = submit(api, key, too_big)
        assert refused.status_code == 413
        assert refused.json()["error"]["limit_bytes"] == 8192
        single = api.submit(key, {"kind": "echo", "payload": {"text": "x" * 2000}})
        assert single.status_code == 413


def test_open_batches_are_limited_per_tenant(
    client: ApiClient, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.service import batches

    monkeypatch.setattr(batches, "MAX_OPEN_BATCHES", 2)
    key = client.tenant_key("hoarder")
    other = client.tenant_key("neighbour")
    first = [submit(client, key, {"kind": "sleep", "items": items(3)}) for _ in range(2)]
    assert [r.status_code for r in first] == [202, 202]
    refused = submit(client, key, {"kind": "sleep", "items": items(3)})
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["type"] == "tenant_limit" and error["limit"] == "batches"
    assert error["open_batches"] == 2 and int(refused.headers["Retry-After"]) >= 1
    assert submit(client, other, {"kind": "sleep", "items": items(1)}).status_code == 202
    # Once a batch has no item waiting (here: cancelled), it no longer counts.
    client.post(f"/v1/batches/{first[0].json()['id']}/cancel", headers=auth(key))
    assert submit(client, key, {"kind": "sleep", "items": items(3)}).status_code == 202


def test_the_clients_submit_read_and_cancel_batches(client: ApiClient) -> None:
    import asyncio

    from jobs.client.http import ApiError, AsyncClient, Client, NotFound

    key = client.tenant_key("scripted")
    url = str(client.base_url)
    with Client(url, key) as sync:
        made = sync.submit_batch("echo", [{"i": i} for i in range(4)])
        assert made["total"] == 4 and sync.batch(made["id"])["counts"]["waiting"] == 4
        # A retried upload (same key) is the same batch.
        again = sync.submit_batch("echo", [{"i": i} for i in range(4)],
                                  idempotency_key="upload-1")
        assert sync.submit_batch("echo", [{"i": i} for i in range(4)],
                                 idempotency_key="upload-1")["id"] == again["id"]
        with pytest.raises(ApiError) as bad:
            sync.submit_batch("echo", [{"i": 0}, {"i": float("nan")}])
        assert bad.value.status == 422 and "items[1]" in str(bad.value)
        with pytest.raises(NotFound):
            list(sync.batch_results("01a2302a-8e3f-7236-aced-e262f24ba881"))

    async def use_async() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        async with AsyncClient(url, key) as aclient:
            listed = await aclient.list_batches()
            cancelled = await aclient.cancel_batch(made["id"])
            lines = [line async for line in aclient.batch_results(made["id"])]
            return listed, lines, cancelled

    listed, lines, cancelled = asyncio.run(use_async())
    assert len(listed["batches"]) == 2
    assert cancelled["status"] == "cancelled"
    assert [line["index"] for line in lines] == [0, 1, 2, 3]
    assert {line["status"] for line in lines} == {"cancelled"}



def test_an_item_whose_feed_commits_while_its_start_waits_runs_at_once(
    client: ApiClient, clock: Clock
) -> None:
    """A slot's hand-over can lease an item the feeder indexed a moment before its UPDATE to
    queued commits (the feeder admits first): the start waits for it, briefly, and runs it,
    rather than drop the lease and leave the item to the reconciler's grace."""
    import threading
    import time

    from jobs.store import batches

    _, item = interrupted_feed(client, "racing")
    runtime = rt(client)
    [lease] = runtime.index.dispatch(5, now=clock.now, lease_ttl_s=runtime.policy.lease_ttl_s)
    assert lease.job_id == item.job_id

    def feed_commits() -> None:
        time.sleep(0.2)
        with runtime.sessions.begin() as session:
            assert batches.admit_items(session, [item.job_id], order_key=0.0,
                                       now=clock.now) == 1

    committing = threading.Thread(target=feed_commits)
    committing.start()
    registry, handler = counting()
    try:
        assert execute(runtime, registry, item.job_id, 1, worker_id="w@host",
                       clock=clock) == SUCCEEDED
    finally:
        committing.join()
    assert handler.runs == [item.job_id]
