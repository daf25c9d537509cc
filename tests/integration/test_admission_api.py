"""Admission over real HTTP (uvicorn on a free port), on real PostgreSQL and Redis: the typed
429s and their numbers, tenant rate limits and quotas, refusal of jobs that would start too
late, queue position and estimated wait, and the measured service rate moving the bounds."""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from jobs.cli.main import build_app
from jobs.core.arrivals import Arrival, Work
from jobs.core.domain import NewJob
from jobs.core.policy import MeasuredMean, weighted_mean
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.fleet.service_rate import (
    ServiceRateTracker,
    publish,
    publish_work,
    read_measured,
)
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
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
)
from tests.integration.stand_in import stand_ins_for
from tests.services import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


class NoPublisher:
    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        pass


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def urls(pg_url: str, redis_server: RedisServer, key_prefix: str,
         redis_client: redis.Redis) -> tuple[str, str, str]:
    return pg_url, redis_server.url, key_prefix


def api(urls: tuple[str, str, str], clock: Clock, **policy: Any) -> Any:
    return running_api(make_settings(*urls, **policy), clock)


@pytest.fixture
def client(urls: tuple[str, str, str], clock: Clock) -> Iterator[ApiClient]:
    # 24 slots at 6 s: μ = 4/s; free bound 240, free quota floor(240 × 0.04) = 9.
    with api(urls, clock, pool_concurrency=24) as served:
        yield served


def patch_tenant(client: ApiClient, tenant_id: str, **fields: Any) -> httpx.Response:
    return client.patch(f"/v1/admin/tenants/{tenant_id}", json=fields, headers=auth(ADMIN_KEY))


def assert_refusal(answer: httpx.Response, *, type_: str, limit: str, tier: str) -> dict[str, Any]:
    """Every 429: Retry-After (whole seconds ≥ 1), X-Queue-Position, X-Tier, and the same
    numbers in the body, with a message and the limit that was hit."""
    assert answer.status_code == 429, answer.text
    retry_after = answer.headers["Retry-After"]
    assert retry_after.isdigit() and int(retry_after) >= 1
    position = answer.headers["X-Queue-Position"]
    assert position.isdigit()
    assert answer.headers["X-Tier"] == tier
    error: dict[str, Any] = answer.json()["error"]
    assert (error["type"], error["limit"], error["tier"]) == (type_, limit, tier)
    assert error["retry_after_seconds"] == int(retry_after)
    assert error["queue_position"] == int(position)
    assert error["message"]
    return error


# -- tenant limits ---------------------------------------------------------------------------


def test_a_tenant_over_its_rate_gets_tenant_limit_and_others_are_unaffected(
    client: ApiClient, clock: Clock
) -> None:
    acme = client.create_tenant("acme")
    patched = patch_tenant(client, acme["id"], rate_per_s=0.5, rate_burst=2)
    assert patched.status_code == 200, patched.text
    assert (patched.json()["rate_per_s"], patched.json()["rate_burst"]) == (0.5, 2)
    other = client.tenant_key("other")
    assert [client.submit(acme["api_key"]).status_code for _ in range(2)] == [202, 202]

    refused = client.submit(acme["api_key"])
    error = assert_refusal(refused, type_="tenant_limit", limit="rate", tier="free")
    assert error["message"] == "tenant 'acme' is over its rate of 0.5 submits/s"
    assert refused.headers["Retry-After"] == "2"  # one token at 0.5/s
    assert refused.headers["X-Queue-Position"] == "2"  # behind acme's own two jobs
    assert (error["rate_per_s"], error["burst"]) == (0.5, 2)
    # It left nothing behind.
    assert len(client.get("/v1/jobs", headers=auth(acme["api_key"])).json()["jobs"]) == 2
    assert rt(client).index.tenant_queued(acme["id"]) == 2

    assert client.submit(other).status_code == 202
    clock.now += 2
    assert client.submit(acme["api_key"]).status_code == 202
    metrics = client.get("/metrics").text
    assert ('tierq_rejections_total{cause="tenant_limit",limit="rate",pool="default",'
            'tier="free"} 1.0') in metrics


def test_a_tiers_rate_applies_to_each_of_its_tenants(
    urls: tuple[str, str, str], clock: Clock
) -> None:
    db, redis_url, prefix = urls
    settings = load_settings(
        database_url=db, redis_url=redis_url, key_prefix=prefix, admin_key=ADMIN_KEY,
        policy={"pool_concurrency": 24},
        tiers={"free": {"base_priority": 20, "max_wait_s": 60, "tenant_share": 0.5,
                        "rate_per_s": 1.0, "rate_burst": 3}},
    )
    with running_api(settings, clock) as served:
        first, second = served.tenant_key("first"), served.tenant_key("second")
        assert [served.submit(first).status_code for _ in range(4)] == [202, 202, 202, 429]
        assert [served.submit(second).status_code for _ in range(4)] == [202, 202, 202, 429]
        clock.now += 1
        assert served.submit(first).status_code == 202


def test_a_tenant_flooding_its_tier_gets_tenant_limit_while_another_is_admitted(
    client: ApiClient,
) -> None:
    flood = client.tenant_key("flood")
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda _: client.submit(flood), range(40)))
    statuses = [answer.status_code for answer in answers]
    assert statuses.count(202) == 9  # its quota: floor(240 × 0.04)
    refusals = [answer for answer in answers if answer.status_code == 429]
    assert {answer.json()["error"]["type"] for answer in refusals} == {"tenant_limit"}
    error = assert_refusal(refusals[0], type_="tenant_limit", limit="quota", tier="free")
    assert error["message"] == "tenant 'flood' has 9 queued jobs, its limit is 9"
    assert error["quota"] == 9
    # Its cap of 1 slot finishes one job every 6 s: one place in its queue.
    assert refusals[0].headers["Retry-After"] == "6"

    quiet = client.tenant_key("quiet")
    assert client.submit(quiet).status_code == 202
    assert queue_of(client, quiet, "free")["queued"] == 10


def test_per_tenant_overrides_are_set_and_cleared_by_the_admin(client: ApiClient) -> None:
    acme = client.create_tenant("acme")
    assert {"cap", "max_queued", "rate_per_s", "rate_burst"} <= set(acme)
    patched = patch_tenant(client, acme["id"], cap=3, max_queued=2)
    assert patched.status_code == 200
    body = patched.json()
    assert (body["cap"], body["max_queued"], body["tier"]) == (3, 2, "free")
    assert [client.submit(acme["api_key"]).status_code for _ in range(3)] == [202, 202, 429]
    cleared = patch_tenant(client, acme["id"], max_queued=None).json()
    assert (cleared["cap"], cleared["max_queued"]) == (3, None)
    bad = patch_tenant(client, acme["id"], cap=0)
    assert (bad.status_code, bad.json()["error"]["type"]) == (422, "invalid_request")
    listed = client.get("/v1/admin/tenants", headers=auth(ADMIN_KEY)).json()["tenants"]
    assert listed[0]["cap"] == 3


# -- capacity --------------------------------------------------------------------------------


def test_a_full_tier_refuses_with_capacity_and_the_drain_time(
    urls: tuple[str, str, str], clock: Clock
) -> None:
    # 1 slot at 20 s: μ = 0.05/s, free bound floor(0.05 × 60) = 3.
    with api(urls, clock, pool_concurrency=1, mean_service_s=20) as served:
        keys = [served.tenant_key(f"t{i}") for i in range(4)]
        for key in keys[:3]:
            assert served.submit(key).status_code == 202
            clock.now += 0.01  # distinct order keys: positions in arrival order
        refused = served.submit(keys[3])
        error = assert_refusal(refused, type_="capacity", limit="bound", tier="free")
        assert error["message"] == "tier 'free' is at its bound of 3 queued jobs"
        assert (error["bound"], error["tier_queued"]) == (3, 3)
        assert refused.headers["Retry-After"] == "20"  # one job served at 0.05/s
        assert refused.headers["X-Queue-Position"] == "3"


def test_a_tenant_at_its_cap_is_refused_for_its_cap_while_a_slot_is_free(
    urls: tuple[str, str, str], clock: Clock
) -> None:
    # tierq up's pool: 2 slots at 6 s. Premium's Little's-law bound is 1, floored at the 2
    # slots; its cap is 1. With one job running and two queued behind its tenant's cap, the
    # tier is at its bound while a slot is free: the pool is not what holds the work back.
    with api(urls, clock, pool_concurrency=2) as served:
        acme = served.create_tenant("acme", "premium")
        assert patch_tenant(served, acme["id"], max_queued=10).status_code == 200
        first = served.submit(acme["api_key"]).json()["id"]
        dispatch_one(served, first)
        for _ in range(2):
            clock.now += 0.01
            assert served.submit(acme["api_key"]).status_code == 202
        refused = served.submit(acme["api_key"])
        error = assert_refusal(refused, type_="tenant_limit", limit="cap", tier="premium")
        assert (error["tenant_cap"], error["tenant_inflight"]) == (1, 1)
        assert (error["bound"], error["tier_queued"]) == (2, 2)
        assert "its cap of 1" in error["message"] and "1 free slot" in error["message"]
        assert refused.headers["Retry-After"] == "6"  # its running job ends in a service time
        # Another tenant's job takes the free slot at once: admitted past the bound.
        other = served.tenant_key("other", "premium")
        assert served.submit(other).status_code == 202
        # Now the free slot has a job ready for it: the bound holds.
        assert_refusal(served.submit(other), type_="capacity", limit="bound", tier="premium")
        metrics = served.get("/metrics").text
        assert ('tierq_rejections_total{cause="tenant_limit",limit="cap",pool="default",'
                'tier="premium"} 1.0') in metrics


def test_with_no_workers_the_refusal_says_so_and_waits_a_registration_period(
    urls: tuple[str, str, str], clock: Clock
) -> None:
    db, redis_url, prefix = urls
    settings = load_settings(database_url=db, redis_url=redis_url, key_prefix=prefix,
                             admin_key=ADMIN_KEY, policy={"lease_ttl_s": 12})
    with running_api(settings, clock) as served:  # capacity from live workers: none
        assert served.submit(served.tenant_key("first")).status_code == 202
        refused = served.submit(served.tenant_key("second"))
        error = assert_refusal(refused, type_="capacity", limit="bound", tier="free")
        assert error["message"] == ("tier 'free' is at its bound of 1 queued jobs; "
                                    "no workers are serving")
        assert refused.headers["Retry-After"] == "12"


def test_a_job_that_would_start_after_its_max_wait_is_refused_and_leaves_nothing(
    urls: tuple[str, str, str], clock: Clock
) -> None:
    # 1 slot at 10 s: μ = 0.1/s. With the slot taken, the next job starts in about 10 s.
    with api(urls, clock, pool_concurrency=1, mean_service_s=10) as served:
        busy = served.submit(served.tenant_key("busy")).json()["id"]
        dispatch_one(served, busy)
        hurried = served.tenant_key("hurried")
        refused = served.submit(hurried, {"kind": "echo", "payload": {}, "max_wait_s": 5})
        error = assert_refusal(refused, type_="capacity", limit="deadline", tier="free")
        assert error["message"] == ("tier 'free' would start this job in about 10 s, later "
                                    "than its max_wait_s of 5 s")
        assert (error["estimated_wait_s"], error["max_wait_s"]) == (10.0, 5.0)
        assert refused.headers["Retry-After"] == "10"
        assert served.get("/v1/jobs", headers=auth(hurried)).json()["jobs"] == []
        assert queue_of(served, hurried, "free")["queued"] == 0

        patient = served.submit(hurried, {"kind": "echo", "payload": {}, "max_wait_s": 15})
        assert patient.status_code == 202
        assert patient.json()["estimated_wait_s"] == 10.0
        # No max_wait_s of its own: the tier's bound is the only limit.
        assert served.submit(served.tenant_key("relaxed")).status_code == 202
        metrics = served.get("/metrics").text
        assert ('tierq_rejections_total{cause="capacity",limit="deadline",pool="default",'
                'tier="free"} 1.0') in metrics


# -- position and wait -----------------------------------------------------------------------


def test_202_and_get_carry_queue_position_and_estimated_wait(
    urls: tuple[str, str, str], clock: Clock
) -> None:
    # 2 slots at 6 s: μ = 1/3 per second; two jobs start at once, then one every 3 s.
    with api(urls, clock, pool_concurrency=2) as served:
        keys = [served.tenant_key(f"t{i}") for i in range(4)]
        submitted = []
        for key in keys:
            submitted.append(served.submit(key).json())
            clock.now += 0.01  # distinct order keys: positions in arrival order
        assert [s["queue_position"] for s in submitted] == [0, 1, 2, 3]
        assert [s["estimated_wait_s"] for s in submitted] == [0.0, 0.0, 3.0, 6.0]
        for job, key in zip(submitted, keys, strict=True):
            seen = served.get(f"/v1/jobs/{job['id']}", headers=auth(key)).json()
            assert (seen["queue_position"], seen["estimated_wait_s"]) == (
                job["queue_position"], job["estimated_wait_s"])

        dispatch_one(served, submitted[0]["id"])  # one slot busy, three jobs queued
        seen = [served.get(f"/v1/jobs/{job['id']}", headers=auth(key)).json()
                for job, key in zip(submitted, keys, strict=True)]
        assert [s["queue_position"] for s in seen] == [None, 0, 1, 2]
        assert [s["estimated_wait_s"] for s in seen] == [None, 0.0, 3.0, 6.0]


# -- the measured service rate ---------------------------------------------------------------


def finished_runs(runtime: Runtime, tenant_id: str, *, count: int, seconds: float,
                  now: float, kind: str = "echo") -> None:
    """``count`` jobs of ``kind`` that ran ``seconds`` each and finished before ``now``."""
    with runtime.sessions.begin() as session:
        for i in range(count):
            start = now - 100 + i
            job = jobs_sql.insert_job(session, NewJob(
                tenant_id=tenant_id, tier="free", kind=kind, payload={},
                order_key=start, enqueued_at=start))
            steps = ((Status.QUEUED, Status.DISPATCHED, start), (Status.DISPATCHED,
                     Status.RUNNING, start), (Status.RUNNING, Status.SUCCEEDED, start + seconds))
            for src, dst, at in steps:
                assert jobs_sql.transition(session, job.id, src=src, attempt=1, dst=dst,
                                             now=at)


def test_the_measured_service_rate_moves_the_bounds(
    urls: tuple[str, str, str], clock: Clock
) -> None:
    # 4 slots, configured 6 s: μ = 2/3, free bound 40. Jobs really take 3 s: μ = 4/3, bound 80.
    with api(urls, clock, pool_concurrency=4) as served:
        runtime = rt(served)
        tenant = served.create_tenant("acme")
        key = tenant["api_key"]
        dispatcher = Dispatcher(runtime, NoPublisher())
        finished_runs(runtime, tenant["id"], count=19, seconds=3.0, now=clock.now)
        dispatcher.run_once(clock.now)
        assert read_measured(runtime.redis, runtime.settings.key_prefix) == MeasuredMean(
            mean_s=3.0, samples=19)
        assert queue_of(served, key, "free")["bound"] == 40  # 19 runs: not enough yet

        finished_runs(runtime, tenant["id"], count=1, seconds=3.0, now=clock.now)
        dispatcher.run_once(clock.now + 1)  # refreshed at most every 5 s
        assert queue_of(served, key, "free")["bound"] == 40
        dispatcher.run_once(clock.now + 5)
        body = served.get("/v1/queues", headers=auth(key)).json()
        assert body["pool"]["service_rate"] == pytest.approx(4 / 3)
        assert queue_of(served, key, "free")["bound"] == 80
        assert 'tierq_pool_mean_service_seconds{pool="default"} 3.0' in served.get("/metrics").text


def test_each_kind_is_measured_and_the_pool_is_the_mean_of_the_work_it_holds(
    urls: tuple[str, str, str], clock: Clock
) -> None:
    """One-minute evaluations and 20 ms lookups: each kind's mean is its own; the pool's mean
    (its μ, bounds and estimates) is that of the queued work, each kind at its mean, and the
    running jobs' mean is published beside it."""
    with api(urls, clock, pool_concurrency=24) as served:
        runtime = rt(served)
        tenant_id = served.create_tenant("acme")["id"]
        finished_runs(runtime, tenant_id, count=25, seconds=60.0, now=clock.now, kind="eval")
        finished_runs(runtime, tenant_id, count=25, seconds=0.02, now=clock.now, kind="echo")
        key = served.tenant_key("lux", tier="premium")
        ids = []
        for kind in ("echo", "echo", "echo", "sleep"):  # three lookups and a kind not measured
            payload = {"seconds": 1} if kind == "sleep" else {}
            answer = served.submit(key, {"kind": kind, "payload": payload})
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["id"])
            clock.now += 0.01  # each ranks behind the one before (ids of a millisecond tie)
        measured = ServiceRateTracker().refresh(runtime, clock.now)
        work = runtime.index.work()
        assert work.kind_means(samples_min=20) == pytest.approx({"eval": 60.0, "echo": 0.02})
        assert work.kinds["eval"].samples == 25 and work.kinds["eval"].spread_s == 0.0
        # The queued work: three echos at 20 ms and a sleep at the overall mean of all runs
        # (newest first: the evaluations finished last).
        overall = weighted_mean([60.0] * 25 + [0.02] * 25)
        assert measured is not None
        assert measured.mean_s == pytest.approx((3 * 0.02 + overall) / 4, abs=1e-6)
        assert read_measured(runtime.redis, runtime.prefix) == measured
        assert work.running_mean_s is None  # nothing runs
        dispatch_one(served, ids[0])  # an echo runs
        ServiceRateTracker().refresh(runtime, clock.now)
        assert runtime.index.work().running_mean_s == pytest.approx(0.02)
        # All four run, the unmeasured sleep at the overall mean, of unknown spread: the
        # echos, measured at 20 ms exactly, end together 20 ms in, so the first slot frees
        # then unless the sleep ends first (jobs.core.remaining); the four free their slots
        # at 4 times that, not at their plain mean of about 7.5 s.
        runtime.index.set_caps({"premium": 6})  # the dispatcher's (24 slots x 0.25)
        for job_id in ids[1:]:
            dispatch_one(served, job_id)
        ServiceRateTracker().refresh(runtime, clock.now)
        first_end = overall * (1 - math.exp(-0.02 / overall))
        assert runtime.index.work().running_mean_s == pytest.approx(4 * first_end, abs=1e-6)


def test_the_tracker_weights_recent_runs_more(
    urls: tuple[str, str, str], clock: Clock
) -> None:
    with api(urls, clock, pool_concurrency=4) as served:
        runtime = rt(served)
        tenant_id = served.create_tenant("acme")["id"]
        finished_runs(runtime, tenant_id, count=30, seconds=10.0, now=clock.now - 1000)
        finished_runs(runtime, tenant_id, count=30, seconds=2.0, now=clock.now)
        measured = ServiceRateTracker().refresh(runtime, clock.now)
        assert measured is not None and measured.samples == 60
        assert 2.0 < measured.mean_s < 6.0  # nearer the recent 2 s than the plain mean


def test_policy_command_shows_the_live_figures_next_to_the_configured(
    urls: tuple[str, str, str], redis_client: redis.Redis, clock: Clock
) -> None:
    _, redis_url, prefix = urls
    with api(urls, clock) as served:
        runtime = rt(served)
        runtime.index.register_worker("w1", slots=8, ttl_s=3600, now=clock.now,
                                      device="cuda:0")
        publish(redis_client, prefix, MeasuredMean(mean_s=3.0, samples=25), now=clock.now)
        publish_work(redis_client, prefix, Work(arrivals={"premium": Arrival(rate_per_s=2.5)}),
                     now=clock.now)
        env = {"TIERQ_REDIS_URL": redis_url, "TIERQ_KEY_PREFIX": prefix,
               "COLUMNS": "200"}
        result = CliRunner().invoke(build_app(), ["policy"], env=env)
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in result.stdout.splitlines() if line.startswith("│")}
    assert rows["capacity"] == ["-", "8 (live workers)"]
    assert rows["w1"] == ["cuda:0", "8"]  # the live workers' table: device and slots
    assert rows["mean service time"] == ["6 s", "3 s (measured, 25 runs)"]
    assert rows["service rate μ"] == ["-", "2.67 jobs/s"]
    # free: bound floor(8/3 × 60) = 160, cap 1, quota floor(160 × 0.04) = 6
    assert rows["free"][2:8] == ["-", "160", "-", "1", "-", "6"]
    assert (rows["premium"][-1], rows["free"][-1]) == ("2.5", "0")  # admitted /s, live
