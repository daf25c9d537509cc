"""The HTTP API over real HTTP (uvicorn on a free port), on real PostgreSQL and Redis:
tenants, submission and admission, queues, health and metrics."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from jobs.core.states import Status
from jobs.process.settings import load_settings
from jobs.service.tenants import create_tenant
from jobs.store import jobs as jobs_sql
from tests.integration.api_harness import (
    ADMIN_KEY,
    ApiClient,
    Clock,
    auth,
    dispatch_one,
    make_settings,
    queue_of,
    rt,
    running_api,
    start_one,
)
from tests.services import RedisServer
from workers.registration import WorkerRegistration

pytestmark = pytest.mark.integration

# -- tenants ---------------------------------------------------------------------------------


def test_tenants_are_created_listed_moved_and_rekeyed(client: ApiClient) -> None:
    created = client.create_tenant("acme", "premium")
    assert set(created) >= {"id", "name", "tier", "api_key"}
    assert (created["name"], created["tier"]) == ("acme", "premium")
    old_key = created["api_key"]

    listed = client.get("/v1/admin/tenants", headers=auth(ADMIN_KEY)).json()["tenants"]
    assert [t["name"] for t in listed] == ["acme"]
    assert not {"api_key", "api_key_hash"} & set(listed[0])

    patched = client.patch(f"/v1/admin/tenants/{created['id']}", json={"tier": "standard"},
                           headers=auth(ADMIN_KEY))
    assert patched.status_code == 200 and patched.json()["tier"] == "standard"
    assert client.submit(old_key).json()["tier"] == "standard"

    rotated = client.post(f"/v1/admin/tenants/{created['id']}/rotate-key",
                          headers=auth(ADMIN_KEY))
    assert rotated.status_code == 200
    new_key = rotated.json()["api_key"]
    assert new_key != old_key
    assert client.get("/v1/jobs", headers=auth(old_key)).status_code == 401
    assert client.get("/v1/jobs", headers=auth(new_key)).status_code == 200


def test_tenant_name_taken_or_tier_unknown_is_invalid(client: ApiClient) -> None:
    client.create_tenant("acme")
    again = client.post("/v1/admin/tenants", json={"name": "acme", "tier": "free"},
                        headers=auth(ADMIN_KEY))
    assert again.status_code == 422
    assert again.json()["error"]["message"] == "a tenant named 'acme' already exists"
    gold = client.post("/v1/admin/tenants", json={"name": "b", "tier": "gold"},
                       headers=auth(ADMIN_KEY))
    assert (gold.status_code, gold.json()["error"]["type"]) == (422, "invalid_request")
    missing = client.patch("/v1/admin/tenants/00000000-0000-4000-8000-000000000000",
                           json={"tier": "free"}, headers=auth(ADMIN_KEY))
    assert (missing.status_code, missing.json()["error"]["type"]) == (404, "not_found")


def test_admin_routes_are_off_without_an_admin_key(
    pg_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> None:
    settings = load_settings(database_url=pg_url, redis_url=redis_server.url,
                             key_prefix=key_prefix)
    with running_api(settings) as api:
        answer = api.get("/v1/admin/tenants", headers=auth("anything"))
        assert answer.status_code == 403
        assert "TIERQ_ADMIN_KEY" in answer.json()["error"]["message"]
        _, key = create_tenant(rt(api), name="acme", tier="free")
        assert api.submit(key).status_code == 202


# -- submit ----------------------------------------------------------------------------------


def test_submit_answers_202_with_location_and_body(client: ApiClient) -> None:
    key = client.tenant_key("acme", "premium")
    answer = client.submit(key, {"kind": "sleep", "payload": {"seconds": 2}, "max_wait_s": 60})
    assert answer.status_code == 202
    body = answer.json()
    job_id = body["id"]
    assert answer.headers["Location"] == f"/v1/jobs/{job_id}"
    assert body == {
        "id": job_id, "status": "queued", "tier": "premium", "queue_position": 0,
        "estimated_wait_s": 0.0,
        "links": {"self": f"/v1/jobs/{job_id}", "result": f"/v1/jobs/{job_id}/result"},
    }
    with rt(client).sessions.begin() as session:
        job = jobs_sql.get_job(session, job_id)
    assert job is not None and job.status is Status.QUEUED
    assert job.payload == {"seconds": 2.0, "fail": False}
    assert job.start_by == job.enqueued_at + 60
    assert rt(client).index.position(job_id) == 0


def test_the_same_idempotency_key_returns_the_same_job(client: ApiClient) -> None:
    tenant = client.create_tenant("acme")
    key = tenant["api_key"]
    body = {"kind": "echo", "payload": {"a": 1}, "idempotency_key": "run-7"}
    first = client.submit(key, body)
    second = client.submit(key, body)
    assert (first.status_code, second.status_code) == (202, 200)
    assert second.json()["id"] == first.json()["id"]
    assert set(second.json()) == set(first.json())
    jobs = client.get("/v1/jobs", headers=auth(key)).json()["jobs"]
    assert [job["id"] for job in jobs] == [first.json()["id"]]
    assert rt(client).index.tenant_queued(tenant["id"]) == 1
    other = client.tenant_key("other")
    assert client.submit(other, body).json()["id"] != first.json()["id"]


def test_an_idempotency_key_reused_for_other_work_is_a_conflict(client: ApiClient) -> None:
    tenant = client.create_tenant("acme")
    key = tenant["api_key"]
    first = client.submit(key, {"kind": "sleep", "payload": {"seconds": 2},
                                "idempotency_key": "run-8"})
    assert first.status_code == 202
    job_id = first.json()["id"]
    for other_work in (
        {"kind": "sleep", "payload": {"seconds": 3}},  # another payload
        {"kind": "echo", "payload": {"seconds": 2}},  # another kind
        {"kind": "sleep", "payload": {"seconds": 2, "fail": True}},
    ):
        answer = client.submit(key, {**other_work, "idempotency_key": "run-8"})
        assert answer.status_code == 409, answer.text
        error = answer.json()["error"]
        assert (error["type"], error["job_id"]) == ("idempotency_conflict", job_id)
    # The same work spelt as validation stores it is the same job: 2 and 2.0 seconds.
    same = client.submit(key, {"kind": "sleep", "payload": {"seconds": 2.0, "fail": False},
                               "idempotency_key": "run-8", "max_wait_s": 60})
    assert (same.status_code, same.json()["id"]) == (200, job_id)
    jobs = client.get("/v1/jobs", headers=auth(key)).json()["jobs"]
    assert [job["id"] for job in jobs] == [job_id]
    assert rt(client).index.tenant_queued(tenant["id"]) == 1


def test_another_tenants_job_is_not_found(client: ApiClient) -> None:
    owner, stranger = client.tenant_key("owner"), client.tenant_key("stranger")
    job_id = client.submit(owner).json()["id"]
    for answer in (
        client.get(f"/v1/jobs/{job_id}", headers=auth(stranger)),
        client.get(f"/v1/jobs/{job_id}/result", headers=auth(stranger)),
        client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(stranger)),
    ):
        assert (answer.status_code, answer.json()["error"]["type"]) == (404, "not_found")
    assert client.get("/v1/jobs", headers=auth(stranger)).json()["jobs"] == []
    assert client.get(f"/v1/jobs/{job_id}", headers=auth(owner)).status_code == 200


# -- admission -------------------------------------------------------------------------------


def test_a_full_tier_refuses_with_429_capacity(
    pg_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> None:
    # One slot served every 600 s: every tier's bound is 1.
    settings = make_settings(pg_url, redis_server.url, key_prefix, pool_concurrency=1,
                             mean_service_s=600)
    with running_api(settings) as api:
        first, second = api.tenant_key("first"), api.tenant_key("second")
        assert api.submit(first).status_code == 202
        refused = api.submit(second)
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "600"
        assert refused.headers["X-Tier"] == "free"
        assert refused.headers["X-Queue-Position"] == "1"
        error = refused.json()["error"]
        assert error["type"] == "capacity"
        assert error["message"] == "tier 'free' is at its bound of 1 queued jobs"
        assert (error["tier"], error["queue_position"], error["retry_after_seconds"]) == (
            "free", 1, 600)
        free = queue_of(api, first, "free")
        assert free["queued"] == free["bound"] == 1
        assert api.submit(api.tenant_key("paying", "premium")).status_code == 202
        metrics = api.get("/metrics").text
        assert ('tierq_rejections_total{cause="capacity",limit="bound",pool="default",'
                'tier="free"} 1.0') in metrics


def test_concurrent_submits_never_overshoot_the_bound(
    pg_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> None:
    # mu = 1/20 jobs/s, free max wait 60 s: the free tier's bound is 3.
    settings = make_settings(pg_url, redis_server.url, key_prefix, pool_concurrency=1,
                             mean_service_s=20)
    with running_api(settings) as api:
        keys = [api.tenant_key(f"t{i}") for i in range(8)]
        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(lambda k: api.submit(k).status_code, keys * 3))
        assert answers.count(202) == 3
        assert set(answers) == {202, 429}
        free = queue_of(api, keys[0], "free")
        assert free["queued"] == free["bound"] == 3


def test_a_tenant_over_its_quota_is_refused_while_others_are_admitted(
    client: ApiClient,
) -> None:
    # pool 4 at 6 s: free bound 40, a free tenant may hold floor(40 * 0.04) = 1 queued job.
    greedy, modest = client.tenant_key("greedy"), client.tenant_key("modest")
    assert client.submit(greedy).status_code == 202
    refused = client.submit(greedy)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == "tenant_limit"
    assert error["message"] == "tenant 'greedy' has 1 queued jobs, its limit is 1"
    # Its cap of 1 slot finishes a job every 6 s.
    assert refused.headers["Retry-After"] == "6" and error["retry_after_seconds"] == 6
    assert refused.headers["X-Tier"] == "free"
    assert client.submit(modest).status_code == 202


# -- queues, health, metrics -----------------------------------------------------------------


def _queues_scene(client: ApiClient, clock: Clock) -> tuple[str, str]:
    """acme (standard) has a job that waited 4 s and runs; other (standard) one queued for
    5 s. Returns acme's key and the queued job's id."""
    key = client.tenant_key("acme", "standard")
    t0 = clock.now
    started = client.submit(key).json()["id"]
    clock.now = t0 + 3
    dispatch_one(client, started)
    clock.now = t0 + 4
    start_one(client, started)  # waited 4 s, 1 s of it dispatched
    waiting = client.submit(client.tenant_key("other", "standard")).json()["id"]
    clock.now = t0 + 9
    return key, waiting


# pool 4 at 6 s: mu = 2/3; standard bound floor(2/3 * 20) = 13, cap max(1, 0.4) = 1.
# No leader measured the arrivals here: 0 jobs/s admitted.
STANDARD = {"name": "standard", "queued": 1, "bound": 13, "oldest_age_s": 5.0, "tenant_cap": 1,
            "wait_p50_s": 4.0, "wait_p95_s": 4.0, "arrival_rate": 0.0}
POOL = {"name": "default", "kinds": None, "live_workers": 0, "capacity": 4, "inflight": 1,
        "utilisation": 0.25, "service_rate": pytest.approx(4 / 6), "waiting_kinds": []}


def test_queues_show_a_tenant_its_tier_and_its_own_usage_only(
    client: ApiClient, clock: Clock
) -> None:
    key, waiting = _queues_scene(client, clock)
    answer = client.get("/v1/queues", headers=auth(key))
    assert answer.status_code == 200
    body = answer.json()
    assert body["scope"] == "tenant"
    assert body["tiers"] == [STANDARD]
    assert body["pool"] == POOL
    # One pool: ``pools`` holds the same figures as the top level.
    assert body["pools"] == [{"pool": body["pool"], "tiers": body["tiers"],
                              "usage": body["usage"]}]
    acme = next(t for t in client.get("/v1/admin/tenants", headers=auth(ADMIN_KEY)).json()[
        "tenants"] if t["name"] == "acme")
    # standard quota: floor(13 * 0.10) = 1
    assert body["usage"] == {"tenant": acme["id"], "tier": "standard", "queued": 0,
                             "inflight": 1, "cap": 1, "quota": 1}
    assert body["workers"] is None
    assert "other" not in answer.text  # never another tenant's name (nor its id)
    assert client.get("/v1/queues").status_code == 401
    assert rt(client).index.position(waiting) == 0


def test_queues_show_the_admin_the_fleet(client: ApiClient, clock: Clock) -> None:
    _queues_scene(client, clock)
    rt(client).index.register_worker("w-1@host", slots=2, ttl_s=30, now=clock.now)
    body = client.get("/v1/queues", headers=auth(ADMIN_KEY)).json()
    assert body["scope"] == "fleet" and body["usage"] is None
    assert [tier["name"] for tier in body["tiers"]] == ["premium", "standard", "free"]
    assert body["tiers"][1] == STANDARD
    assert body["tiers"][2]["oldest_age_s"] is None and body["tiers"][2]["wait_p50_s"] is None
    # configured pool_concurrency 4: the worker adds nothing
    assert body["pool"] == {**POOL, "live_workers": 1}
    assert body["workers"] == [
        {"id": "w-1@host", "device": "cpu", "memory_bytes": None, "slots": 2, "pool": "default",
         "expires_in_s": 30.0}]
    assert body["pools"] == [{"pool": body["pool"], "tiers": body["tiers"], "usage": None}]


def test_health_ready_and_metrics(client: ApiClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"sql": "ok", "redis": "ok"}
    key = client.tenant_key("acme")
    client.submit(key)
    client.submit(key)  # over its quota: a tenant_limit rejection
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    for line in (
        'tierq_queue_depth{pool="default",tier="free"} 1.0',
        'tierq_queue_bound{pool="default",tier="free"} 40.0',
        'tierq_jobs_entered_total{pool="default",status="queued"} 1.0',
        'tierq_pool_capacity{pool="default"} 4.0',
        'tierq_rejections_total{cause="tenant_limit",limit="quota",pool="default",tier="free"} 1.0',
        'tierq_backend_up{backend="redis"} 1.0',
        'tierq_queue_wait_seconds_bucket{le="+Inf",pool="default",tier="free"} 0.0',
    ):
        assert line in text, line


def test_happy_path_on_sqlite(
    sqlite_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> None:
    settings = make_settings(sqlite_url, redis_server.url, key_prefix)
    with running_api(settings) as api:
        key = api.tenant_key("acme", "premium")
        submitted = api.submit(key, {"kind": "echo", "payload": {"hello": "wörld"},
                                     "idempotency_key": "k"})
        assert submitted.status_code == 202
        job_id = submitted.json()["id"]
        assert api.submit(key, {"kind": "echo", "payload": {"hello": "wörld"},
                                "idempotency_key": "k"}).json()["id"] == job_id
        assert api.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()["status"] == "queued"
        assert [j["id"] for j in api.get("/v1/jobs", headers=auth(key)).json()["jobs"]] == [
            job_id]
        assert api.post(f"/v1/jobs/{job_id}/cancel", headers=auth(key)).json()["status"] == (
            "cancelled")
        assert api.get("/readyz").status_code == 200


def test_the_admin_sees_each_live_worker_with_its_device_and_slots(client: ApiClient) -> None:
    index = rt(client).index
    gpu = WorkerRegistration(index, worker_id="gpu@host-a", slots=1, ttl_s=30.0,
                             device="cuda:0", memory_bytes=80 * 2**30)
    cpu = WorkerRegistration(index, worker_id="cpu@host-b", slots=2, ttl_s=30.0)
    gpu.start()
    cpu.start()
    try:
        body = client.get("/v1/admin/workers", headers=auth(ADMIN_KEY)).json()
        assert [(w["id"], w["device"], w["slots"], w["memory_bytes"])
                for w in body["workers"]] == [
            ("cpu@host-b", "cpu", 2, None), ("gpu@host-a", "cuda:0", 1, 80 * 2**30)]
        assert body["slots"] == 3
        assert all(0 < w["expires_in_s"] <= 30 for w in body["workers"])
        tenant_key = client.tenant_key("acme")
        assert client.get("/v1/admin/workers",
                          headers=auth(tenant_key)).json()["error"]["type"] == "forbidden"
    finally:
        gpu.stop()
    body = client.get("/v1/admin/workers", headers=auth(ADMIN_KEY)).json()
    assert [w["id"] for w in body["workers"]] == ["cpu@host-b"]  # a clean stop leaves at once
    cpu.stop()
