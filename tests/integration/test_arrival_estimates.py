"""Later arrivals in what a client is told, over real HTTP on real PostgreSQL and Redis: the
leader measures each tier's arrival rate from SQL and publishes it; a lower tier's estimate
and its deadline count the better-ranked work that will pass it (``policy.overtakers``)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from jobs.core.arrivals import Arrival, Work
from jobs.fleet.arrivals import CACHE_S
from jobs.fleet.service_rate import ServiceRateTracker, publish_work
from tests.integration.api_harness import (
    ADMIN_KEY,
    Clock,
    auth,
    dispatch_one,
    make_settings,
    rt,
    running_api,
)
from tests.services import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(pg_url: str, redis_server: RedisServer, key_prefix: str,
             redis_client: redis.Redis) -> Any:
    # One slot at 6 s: μ = 1/6 jobs/s. Premium passes a free job for (20 - 0) × 6 = 120 s.
    return make_settings(pg_url, redis_server.url, key_prefix, pool_concurrency=1)


def test_the_leader_publishes_each_tiers_admissions_over_the_window(settings: Any) -> None:
    clock = Clock()
    with running_api(settings.model_copy(update={"policy": settings.policy.model_copy(
            update={"pool_concurrency": 24})}), clock) as served:
        premium = served.tenant_key("lux", tier="premium")
        free = [served.tenant_key(f"f{i}") for i in range(3)]
        assert all(served.submit(premium).status_code == 202 for _ in range(5))
        assert all(served.submit(key).status_code == 202 for key in free)
        runtime = rt(served)
        ServiceRateTracker().refresh(runtime, clock.now)
        # No runs measured yet: each tier's jobs weigh as the pool's mean ones.
        assert runtime.index.work().arrivals == {
            "premium": Arrival(rate_per_s=5 / 60, weight=1.0),
            "free": Arrival(rate_per_s=3 / 60, weight=1.0)}
        time.sleep(CACHE_S)  # what the API read of them before is that old at most
        tiers = {t["name"]: t for t in served.get("/v1/queues", headers=auth(ADMIN_KEY))
                 .json()["tiers"]}
        assert [tiers[n]["arrival_rate"] for n in ("premium", "standard", "free")] == [
            round(5 / 60, 6), 0.0, round(3 / 60, 6)]
        # A window later they have all aged out of it.
        ServiceRateTracker().refresh(runtime, clock.now + 61)
        assert runtime.index.work().arrivals == {}


def test_a_step_in_load_is_measured_within_seconds(settings: Any) -> None:
    """Free work at 0.1 jobs/s for a minute, then premium at 5 jobs/s: 5 s after the step the
    leader publishes premium at about 5 jobs/s (not 25 jobs over a 60 s window, 0.42), and
    free still at its steady 0.1."""
    clock = Clock()
    with running_api(settings.model_copy(update={"policy": settings.policy.model_copy(
            update={"pool_concurrency": 100})}), clock) as served:
        free = served.tenant_key("f")
        premium = [served.tenant_key(f"lux{i}", tier="premium") for i in range(2)]
        start = clock.now
        for i in range(6):  # one every 10 s over the minute before the step
            clock.now = start + 10 * i
            assert served.submit(free).status_code == 202
        step = start + 55
        for i in range(25):  # 5 a second from the step, two tenants in turn
            clock.now = step + i / 5
            assert served.submit(premium[i % 2]).status_code == 202
        clock.now = step + 5
        ServiceRateTracker().refresh(rt(served), clock.now)
        arrivals = rt(served).index.work().arrivals
        assert arrivals["premium"].rate_per_s == pytest.approx(5.0, rel=0.25), arrivals
        assert arrivals["free"].rate_per_s == pytest.approx(0.1, rel=0.25), arrivals


def test_a_free_job_is_told_the_premium_work_that_will_pass_it(
    settings: Any, redis_client: redis.Redis, key_prefix: str
) -> None:
    clock = Clock()
    # Premium admitted at 3 a minute: it passes a free job for the first 120 s of its wait.
    publish_work(redis_client, key_prefix,
                 Work(arrivals={"premium": Arrival(rate_per_s=0.05)}), now=clock.now)
    with running_api(settings, clock) as served:
        running = served.submit(served.tenant_key("std", tier="standard")).json()["id"]
        dispatch_one(served, running)  # the one slot is busy

        # One job to finish first: 6 s alone; W = (1 + 0.05 W) × 6 with premium passing.
        f1 = served.tenant_key("f1")
        told = served.submit(f1).json()
        assert told["queue_position"] == 0
        assert told["estimated_wait_s"] == pytest.approx(6 / 0.7, abs=1e-3)
        again = served.get(f"/v1/jobs/{told['id']}", headers=auth(f1)).json()
        assert again["estimated_wait_s"] == pytest.approx(6 / 0.7, abs=1e-3)  # as it was told

        clock.now += 0.5  # a later id: behind f1's job (ids of one millisecond tie at random)
        # Two ahead: 12 s alone, within 15 s; 12 / 0.7 = 17.1 s with premium passing: late.
        late = served.submit(served.tenant_key("f2"), {
            "kind": "sleep", "payload": {"seconds": 1}, "max_wait_s": 15})
        assert late.status_code == 429, late.text
        error = late.json()["error"]
        assert (error["type"], error["limit"]) == ("capacity", "deadline")
        assert error["estimated_wait_s"] == pytest.approx(12 / 0.7, abs=1e-3)
        clock.now += 0.5
        in_time = served.submit(served.tenant_key("f3"), {
            "kind": "sleep", "payload": {"seconds": 1}, "max_wait_s": 18})
        assert in_time.status_code == 202, in_time.text
