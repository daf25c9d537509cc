"""Truthful estimates over real HTTP, on real PostgreSQL and Redis: a tenant's own cap and the
jobs it has in flight count in the wait it is told (the 202, GET, the list) and in the
refusal of a job that could not start within its own ``max_wait_s``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from jobs.core.arrivals import Work
from jobs.core.service_times import KindMean
from jobs.index.keys import IndexKeys
from jobs.store import stats as stats_sql
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

pytestmark = pytest.mark.integration

HURRIED = {"kind": "sleep", "payload": {"seconds": 1}, "max_wait_s": 2}


@pytest.fixture
def served(
    pg_url: str, redis_server: RedisServer, key_prefix: str, clock: Clock,
    redis_client: redis.Redis,
) -> Iterator[ApiClient]:
    # 4 slots at 10 s: μ = 0.4/s; a standard tenant's cap is max(1, floor(4 × 0.10)) = 1, so
    # one of its jobs finishes every 10 s however idle the rest of the pool is.
    settings = make_settings(pg_url, redis_server.url, key_prefix, pool_concurrency=4,
                             mean_service_s=10)
    with running_api(settings, clock) as api:
        yield api


def deadline_refusal(answer: httpx.Response) -> dict[str, Any]:
    """A 429 of type ``capacity`` for the ``deadline`` limit, with its headers (API.md)."""
    assert answer.status_code == 429, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert (error["type"], error["limit"], error["tier"]) == ("capacity", "deadline", "standard")
    assert answer.headers["X-Tier"] == "standard"
    assert error["retry_after_seconds"] == int(answer.headers["Retry-After"]) >= 1
    assert error["queue_position"] == int(answer.headers["X-Queue-Position"])
    return error


def seen(client: ApiClient, key: str, job_id: str) -> tuple[Any, Any]:
    body = client.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
    return body["queue_position"], body["estimated_wait_s"]


def test_a_tenant_at_its_cap_is_told_the_wait_for_its_own_slot(
    served: ApiClient, clock: Clock
) -> None:
    acme = served.create_tenant("acme", "standard")
    key = acme["api_key"]
    quota = served.patch(f"/v1/admin/tenants/{acme['id']}", json={"max_queued": 10},
                         headers=auth(ADMIN_KEY))
    assert quota.status_code == 200  # the tier's quota is 1 queued job: floor(8 × 0.10)
    first = served.submit(key).json()
    assert first["estimated_wait_s"] == 0.0  # a free slot and a free place under its cap
    dispatch_one(served, first["id"])  # its one slot is taken by a 10 s job
    clock.now += 0.01

    # Three pool slots are free and nothing is queued, but acme must wait for its own job.
    refused = served.submit(key, HURRIED)
    error = deadline_refusal(refused)
    assert error["message"] == ("tenant 'acme' has 1 running and 0 queued jobs at its cap of "
                                "1: this job would start in about 10 s, later than its "
                                "max_wait_s of 2 s")
    assert (error["estimated_wait_s"], error["max_wait_s"]) == (10.0, 2.0)
    assert (error["tenant_cap"], error["tenant_inflight"], error["tenant_queued_ahead"]) == (
        1, 1, 0)
    assert refused.headers["Retry-After"] == "10"  # its running job done: one service
    assert refused.headers["X-Queue-Position"] == "0"
    assert rt(served).index.tenant_queued(acme["id"]) == 0  # it left nothing behind
    assert queue_of(served, key, "standard")["queued"] == 0

    # Without a max_wait_s it is accepted, and told the truth.
    second = served.submit(key).json()
    clock.now += 0.01
    third = served.submit(key).json()
    assert (second["queue_position"], second["estimated_wait_s"]) == (0, 10.0)
    assert (third["queue_position"], third["estimated_wait_s"]) == (1, 20.0)
    assert seen(served, key, second["id"]) == (0, 10.0)
    assert seen(served, key, third["id"]) == (1, 20.0)
    listed = served.get("/v1/jobs", params={"status": "queued"}, headers=auth(key)).json()
    assert [(j["queue_position"], j["estimated_wait_s"]) for j in listed["jobs"]] == [
        (1, 20.0), (0, 10.0)]

    # Two own jobs queued: 3 must finish for a slot, 30 s; 15 s allows 1, so 20 s to wait.
    clock.now += 0.01
    late = served.submit(key, {**HURRIED, "max_wait_s": 15})
    error = deadline_refusal(late)
    assert (error["estimated_wait_s"], late.headers["Retry-After"]) == (30.0, "20")
    fits = served.submit(key, {**HURRIED, "max_wait_s": 30})
    assert (fits.status_code, fits.json()["estimated_wait_s"]) == (202, 30.0)

    # Another tenant is not held back by acme's cap: 3 ahead, but they wait on acme's cap and
    # take none of the 3 free slots, so it starts at once (it was told 2.5 s when every job
    # ahead counted), in its 202 and its GET alike.
    other = served.tenant_key("other", "standard")
    clock.now += 0.01
    free = served.submit(other).json()
    assert (free["queue_position"], free["estimated_wait_s"]) == (3, 0.0)
    assert seen(served, other, free["id"]) == (3, 0.0)
    clock.now += 0.01
    # Its own queued job comes first for its one slot: 10 s, later than the pool's 0 s.
    error = deadline_refusal(served.submit(other, HURRIED))
    assert (error["estimated_wait_s"], error["retry_after_seconds"]) == (10.0, 10)


def test_a_tenant_under_its_cap_is_told_the_pools_estimate(
    served: ApiClient, clock: Clock
) -> None:
    roomy = served.create_tenant("roomy", "standard")
    key = roomy["api_key"]
    patched = served.patch(f"/v1/admin/tenants/{roomy['id']}", json={"cap": 4},
                           headers=auth(ADMIN_KEY))
    assert patched.status_code == 200
    first = served.submit(key).json()
    dispatch_one(served, first["id"])
    clock.now += 0.01
    accepted = served.submit(key, HURRIED)
    assert (accepted.status_code, accepted.json()["estimated_wait_s"]) == (202, 0.0)


def test_a_tenant_at_its_cap_waits_for_its_own_kinds_read_once_a_second(
    served: ApiClient, clock: Clock, redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool is configured at 10 s a job, but the leader measured sleep at 0.5 s: a tenant
    at its cap of 1 with a sleep running waits for that one, 0.5 s, not 10 s. What it holds
    is read from SQL once a second per tenant: the next submits within that second reuse it."""
    redis_client.hset(IndexKeys(rt(served).prefix).kind_means, mapping=Work.kind_fields({
        "sleep": KindMean(mean_s=0.5, spread_s=0.1, samples=200)}))
    acme = served.create_tenant("acme", "standard")
    key = acme["api_key"]
    quota = served.patch(f"/v1/admin/tenants/{acme['id']}", json={"max_queued": 10},
                         headers=auth(ADMIN_KEY))
    assert quota.status_code == 200
    first = served.submit(key).json()
    dispatch_one(served, first["id"])
    clock.now += 0.01
    reads = []
    original = stats_sql.tenant_work

    def counted(*args: Any, **kwargs: Any) -> dict[str, int]:
        reads.append(args[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(stats_sql, "tenant_work", counted)  # counts the real reads
    second = served.submit(key).json()
    clock.now += 0.01
    third = served.submit(key).json()
    assert (second["queue_position"], second["estimated_wait_s"]) == (0, 0.5)
    assert (third["queue_position"], third["estimated_wait_s"]) == (1, 1.0)
    assert reads == [acme["id"]]


def test_a_tenant_at_its_cap_is_told_what_its_running_job_has_left(
    served: ApiClient, clock: Clock, redis_client: redis.Redis
) -> None:
    """Its kind runs 25 s give or take half a second: 20 s into its one running job, a tenant
    at its cap of 1 is told its next job starts in 5 s, not a whole 25 s (nor the pool's
    10 s), and a submit over its queued quota is told to come back then. A job that has run
    past its kind's time is not taken to be nearly done: 5 s over, it is expected to need as
    long again."""
    redis_client.hset(IndexKeys(rt(served).prefix).kind_means, mapping=Work.kind_fields({
        "sleep": KindMean(mean_s=25.0, spread_s=0.5, samples=200)}))
    acme = served.create_tenant("acme", "standard")
    key = acme["api_key"]
    quota = served.patch(f"/v1/admin/tenants/{acme['id']}", json={"max_queued": 1},
                         headers=auth(ADMIN_KEY))
    assert quota.status_code == 200
    first = served.submit(key, {"kind": "sleep", "payload": {"seconds": 25}}).json()
    dispatch_one(served, first["id"])
    start_one(served, first["id"])

    clock.now += 20
    second = served.submit(key, {"kind": "sleep", "payload": {"seconds": 25}}).json()
    assert second["estimated_wait_s"] == pytest.approx(5.0, abs=0.01)
    assert seen(served, key, second["id"])[1] == pytest.approx(5.0, abs=0.01)
    over = served.submit(key)
    assert over.status_code == 429, over.text
    assert (over.json()["error"]["type"], over.json()["error"]["limit"]) == (
        "tenant_limit", "quota")
    assert over.headers["Retry-After"] == "5"  # when its running job frees its slot

    clock.now += 10  # 30 s in: 5 s past its kind's time
    assert seen(served, key, second["id"])[1] == pytest.approx(5.0, abs=0.01)
    assert served.submit(key).headers["Retry-After"] == "5"
