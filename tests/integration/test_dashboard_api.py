"""``/v1/dashboard`` over real HTTP on PostgreSQL + Redis: the fleet's view for the admin key,
a tenant's own view for its key (nothing of any other tenant), 401 for none or a bad one, and
with a second pool each pool's own figures, workers and tenants; and ``/dashboard``, a page
that loads without a key and only from the app itself."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.core.states import Status
from jobs.process.settings import load_settings
from tests.integration.api_harness import (
    ADMIN_KEY,
    ApiClient,
    Clock,
    auth,
    dispatch_one,
    move,
    queue_of,
    rt,
    running_api,
    start_one,
)
from tests.services import RedisServer

pytestmark = pytest.mark.integration


def dashboard(client: ApiClient, key: str) -> dict[str, Any]:
    answer = client.get("/v1/dashboard", headers=auth(key))
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def tier(body: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(entry for entry in body["tiers"] if entry["name"] == name)
    return found


@pytest.fixture
def busy(client: ApiClient, clock: Clock) -> dict[str, str]:
    """acme (standard) has a job running that waited 4 s and one queued; rival (free) has one
    queued and was refused once over its quota. Keys and ids by name."""
    acme = client.create_tenant("acme", "standard")
    rival = client.create_tenant("rival", "free")
    t0 = clock.now
    running = client.submit(acme["api_key"]).json()["id"]
    clock.now = t0 + 3
    dispatch_one(client, running)
    clock.now = t0 + 4
    start_one(client, running)  # waited 4 s
    assert client.submit(acme["api_key"]).status_code == 202
    assert client.submit(rival["api_key"]).status_code == 202
    refused = client.submit(rival["api_key"])  # over its queued quota of 1
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "tenant_limit"
    clock.now = t0 + 9
    return {"acme": acme["api_key"], "rival": rival["api_key"], "acme_id": acme["id"],
            "rival_id": rival["id"], "running": running}


def test_the_admin_key_sees_the_fleet(client: ApiClient, busy: dict[str, str]) -> None:
    body = dashboard(client, ADMIN_KEY)
    assert body["view"] == "fleet" and body["tenant"] is None and body["window_s"] == 300
    assert [entry["name"] for entry in body["tiers"]] == ["premium", "standard", "free"]
    standard = tier(body, "standard")
    published = queue_of(client, ADMIN_KEY, "standard")
    for field in ("queued", "bound", "oldest_age_s", "tenant_cap", "wait_p50_s", "wait_p95_s"):
        assert standard[field] == published[field], field
    assert standard["queued"] == 1 and standard["oldest_age_s"] == 5.0
    assert standard["wait_p50_s"] == 4.0 and standard["waits_counted"] == 1
    # Priorities 0, 10, 20 at 6 s a point: standard ties with fresh premium work after 60 s.
    assert [entry["ageing_guarantee_s"] for entry in body["tiers"]] == [0.0, 60.0, 120.0]
    assert [entry["max_wait_s"] for entry in body["tiers"]] == [5.0, 20.0, 60.0]
    assert standard["refusals"] == []
    assert tier(body, "free")["refusals"] == [
        {"cause": "tenant_limit", "limit": "quota", "count": 1}]
    assert body["pool"] == {
        "name": "default", "kinds": None, "live_workers": 0,
        "capacity": 4, "inflight": 1, "utilisation": 0.25, "service_rate": pytest.approx(4 / 6),
        "waiting_kinds": [], "mean_service_s": 6.0, "service_measured": False, "workers": [],
    }
    # One pool: `pools` is the default pool alone, as /v1/queues has it.
    published_pools = client.get("/v1/queues", headers=auth(ADMIN_KEY)).json()["pools"]
    assert body["pools"] == [entry["pool"] for entry in published_pools]
    assert [entry["name"] for entry in body["pools"]] == ["default"]
    assert body["workers"] == []
    # Only acme holds a slot: at its cap of 1, with 1 of its standard quota queued.
    [acme] = body["tenants"]
    assert acme["name"] == "acme" and acme["tier"] == "standard" and acme["pool"] == "default"
    assert (acme["inflight"], acme["cap"], acme["cap_use"], acme["queued"]) == (1, 1, 1.0, 1)
    assert acme["quota"] >= 1 and acme["quota_use"] == 1 / acme["quota"]


def test_a_tenant_sees_only_its_own_view(client: ApiClient, busy: dict[str, str]) -> None:
    answer = client.get("/v1/dashboard", headers=auth(busy["rival"]))
    assert answer.status_code == 200
    body = answer.json()
    assert body["view"] == "tenant" and body["pool"] is None and body["tenants"] == []
    assert [entry["name"] for entry in body["tiers"]] == ["free"]
    assert body["tiers"][0]["refusals"] == [
        {"cause": "tenant_limit", "limit": "quota", "count": 1}]
    own = body["tenant"]
    assert own["use"] == {"name": "rival", "tier": "free", "inflight": 0, "cap": 1,
                          "cap_use": 0.0, "queued": 1, "quota": 1, "quota_use": 1.0,
                          "pool": "default"}
    assert own["pools"] == [own["use"]]
    assert body["pools"] == [] and body["workers"] == []
    assert own["jobs_counted"] == 1 and own["jobs_by_status"]["queued"] == 1
    assert own["waits_counted"] == 0 and own["wait_p50_s"] is None
    for name in ("acme", busy["acme_id"], busy["running"]):
        assert name not in answer.text

    acme = client.get("/v1/dashboard", headers=auth(busy["acme"]))
    own = acme.json()["tenant"]
    assert [entry["name"] for entry in acme.json()["tiers"]] == ["standard"]
    assert acme.json()["tiers"][0]["refusals"] == []  # rival's refusal is not its own
    assert own["use"]["inflight"] == 1 and own["use"]["queued"] == 1
    assert own["wait_p50_s"] == 4.0 and own["waits_counted"] == 1
    assert own["jobs_by_status"]["running"] == 1 and own["jobs_by_status"]["queued"] == 1
    assert [job["status"] for job in own["recent_jobs"]] == ["queued", "running"]
    assert own["recent_jobs"][1]["id"] == busy["running"]
    assert own["recent_jobs"][1]["wait_s"] == 4.0
    for name in ("rival", busy["rival_id"]):
        assert name not in acme.text


@pytest.fixture
def pooled(
    pg_url: str, redis_server: RedisServer, key_prefix: str, clock: Clock, redis_client: Any
) -> Iterator[ApiClient]:
    """The API with a second pool, ``gpu``: it runs ``echo`` on 20 slots of its own (a
    standard tenant's cap there is floor(20 × 0.10) = 2; 1 in the default pool's 4)."""
    settings = load_settings(
        database_url=pg_url, redis_url=redis_server.url, key_prefix=key_prefix,
        admin_key=ADMIN_KEY, policy={"pool_concurrency": 4},
        pools={"gpu": {"kinds": ["echo"], "concurrency": 20}},
    )
    with running_api(settings, clock) as api:
        yield api


def test_each_pool_shows_its_own_figures_workers_and_tenants(
    pooled: ApiClient, clock: Clock
) -> None:
    acme = pooled.create_tenant("acme", "standard")
    echo = pooled.submit(acme["api_key"], {"kind": "echo", "payload": {"a": 1}}).json()["id"]
    assert pooled.submit(acme["api_key"]).status_code == 202  # sleep: the default pool's
    gpu = rt(pooled).for_pool("gpu")
    gpu.index.register_worker("gpu@host", slots=2, ttl_s=60, now=clock.now, device="cuda:0",
                              memory_bytes=80 * 2**30)
    leases = gpu.index.dispatch(1, now=clock.now, lease_ttl_s=30)
    assert [lease.job_id for lease in leases] == [echo]
    move(pooled, echo, Status.DISPATCHED)

    body = dashboard(pooled, ADMIN_KEY)
    assert [entry["name"] for entry in body["pools"]] == ["default", "gpu"]
    default, gpu_pool = body["pools"]
    assert default["kinds"] is None and gpu_pool["kinds"] == ["echo"]
    assert (default["live_workers"], default["capacity"], default["inflight"]) == (0, 4, 0)
    assert (gpu_pool["live_workers"], gpu_pool["capacity"], gpu_pool["inflight"]) == (1, 20, 1)
    assert gpu_pool["utilisation"] == 0.05
    assert gpu_pool["service_rate"] == pytest.approx(5 * default["service_rate"])
    published = pooled.get("/v1/queues", headers=auth(ADMIN_KEY)).json()["pools"]
    assert body["pools"] == [entry["pool"] for entry in published]
    # `pool` and the tier cards stay the default pool's: the echo job is the gpu pool's.
    assert body["pool"]["name"] == "default" and body["pool"]["inflight"] == 0
    assert body["pool"]["workers"] == []
    assert tier(body, "standard")["queued"] == 1
    [worker] = body["workers"]
    assert (worker["id"], worker["pool"], worker["device"]) == ("gpu@host", "gpu", "cuda:0")
    assert worker["slots"] == 2 and worker["memory_bytes"] == 80 * 2**30
    # acme holds a slot in the gpu pool only, against its cap there.
    [use] = body["tenants"]
    assert (use["name"], use["pool"], use["inflight"], use["cap"]) == ("acme", "gpu", 1, 2)
    assert use["queued"] == 0

    own = dashboard(pooled, acme["api_key"])["tenant"]
    assert own["use"]["pool"] == "default" and own["pools"][0] == own["use"]
    assert [(u["pool"], u["inflight"], u["cap"], u["queued"]) for u in own["pools"]] == [
        ("default", 0, 1, 1), ("gpu", 1, 2, 0)]


def test_no_key_or_an_unknown_key_is_401(client: ApiClient) -> None:
    for headers in ({}, auth("no-such-key")):
        answer = client.get("/v1/dashboard", headers=headers)
        assert answer.status_code == 401
        assert answer.json()["error"]["type"] == "unauthorized"
    assert client.get("/v1/dashboard?key=x", headers=auth(ADMIN_KEY)).status_code == 422


def test_the_page_loads_without_a_key_and_only_from_the_app(client: ApiClient) -> None:
    page = client.get("/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(assets) == ["dashboard/assets/app.js", "dashboard/assets/style.css"]
    for asset in assets:
        answer = client.get(f"/{asset}")
        assert answer.status_code == 200 and answer.content, asset
    script = client.get("/dashboard/assets/app.js").text
    assert "http://" not in script and "https://" not in script
    assert 'API = "v1/dashboard"' in script and "Authorization" in script
