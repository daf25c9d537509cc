"""The job explorer's API over real HTTP, on SQLite and PostgreSQL: ``GET /v1/jobs`` with its
filters (a tenant's own jobs only), ``GET /v1/admin/jobs`` (every tenant's, or one's), a job
read whole (``/v1/jobs/{id}/detail``, ``/v1/admin/jobs/{id}``), the admin's cancel and retry,
and the typed 422 of every bad filter.

The clock is moved by hand between submits, so creation times (and the time window) are
exact; finished states are driven through the repository as a worker would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jobs.api.schemas import rfc3339 as format_time
from jobs.core.states import Status
from jobs.service.explorer import PAYLOAD_SHOWN_BYTES
from tests.integration.api_harness import (
    ADMIN_KEY,
    ApiClient,
    Clock,
    auth,
    make_settings,
    move,
    running_api,
)
from tests.services import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ADMIN = auth(ADMIN_KEY)


@pytest.fixture
def api(
    db_url: str, redis_server: RedisServer, key_prefix: str, clock: Clock, redis_client: Any
) -> Iterator[ApiClient]:
    # Slots enough for quotas of tens of queued jobs per tenant.
    settings = make_settings(db_url, redis_server.url, key_prefix, pool_concurrency=400)
    with running_api(settings, clock) as client:
        yield client


def rfc3339(epoch: float) -> str:
    text = format_time(epoch)
    assert text is not None
    return text


def ids(answer: Any) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [job["id"] for job in answer.json()["jobs"]]


class World:
    """Two tenants' jobs, each submitted one second after the last."""

    def __init__(self, api: ApiClient, clock: Clock) -> None:
        self.acme = api.tenant_key("acme", "premium")
        self.globex = api.tenant_key("globex", "free")
        self.start = clock.now
        self.jobs: list[tuple[str, str, str]] = []  # (id, tenant, kind), oldest first
        for tenant, kind in [("acme", "sleep"), ("globex", "sleep"), ("acme", "echo"),
                             ("acme", "sleep"), ("globex", "echo"), ("acme", "echo")]:
            key = self.acme if tenant == "acme" else self.globex
            payload = {"seconds": 1} if kind == "sleep" else {"n": len(self.jobs)}
            answer = api.submit(key, {"kind": kind, "payload": payload})
            assert answer.status_code == 202, answer.text
            self.jobs.append((answer.json()["id"], tenant, kind))
            clock.now += 1

    def of(self, tenant: str | None = None, kind: str | None = None) -> list[str]:
        """Ids newest first, of this tenant and kind."""
        return [job_id for job_id, t, k in reversed(self.jobs)
                if tenant in (None, t) and kind in (None, k)]


@pytest.fixture
def world(api: ApiClient, clock: Clock) -> World:
    return World(api, clock)


def test_a_tenant_searches_its_own_jobs_by_each_filter(api: ApiClient, world: World) -> None:
    mine = auth(world.acme)
    assert ids(api.get("/v1/jobs", headers=mine)) == world.of("acme")
    assert ids(api.get("/v1/jobs", params={"kind": "echo"}, headers=mine)) == world.of(
        "acme", "echo")
    assert ids(api.get("/v1/jobs", params={"tier": "premium"}, headers=mine)) == world.of("acme")
    assert ids(api.get("/v1/jobs", params={"tier": "free"}, headers=mine)) == []
    first, _, _ = world.jobs[0]
    api.post(f"/v1/jobs/{first}/cancel", headers=mine)
    assert ids(api.get("/v1/jobs", params={"status": "cancelled"}, headers=mine)) == [first]
    queued = ids(api.get("/v1/jobs", params={"status": "queued", "kind": "sleep"},
                         headers=mine))
    assert queued == [world.jobs[3][0]]
    # Created in [start + 2, start + 5): the jobs made at 2, 3 and 4 seconds (acme's 2, 3).
    window = {"since": rfc3339(world.start + 2), "until": rfc3339(world.start + 5)}
    assert ids(api.get("/v1/jobs", params=window, headers=mine)) == [
        world.jobs[3][0], world.jobs[2][0]]
    # The same instant written in another zone is the same filter.
    assert ids(api.get("/v1/jobs", params={"since": rfc3339(world.start + 5).replace(
        "Z", "+00:00")}, headers=mine)) == [world.jobs[5][0]]
    # Nothing names another tenant's jobs: globex's echo is not acme's to find.
    assert ids(api.get("/v1/jobs", params={"kind": "echo", "tier": "free"}, headers=mine)) == []
    theirs = world.of("globex")
    assert not set(theirs) & set(ids(api.get("/v1/jobs", params={"limit": 500}, headers=mine)))


def test_pages_follow_the_cursor_under_a_filter(api: ApiClient, world: World) -> None:
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1, "kind": "sleep"} | (
            {"cursor": cursor} if cursor else {})
        page = api.get("/v1/admin/jobs", params=params, headers=ADMIN)
        seen += ids(page)
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == world.of(kind="sleep")


def test_the_admin_sees_every_tenant_and_one_by_id_or_name(
    api: ApiClient, world: World
) -> None:
    every = api.get("/v1/admin/jobs", headers=ADMIN)
    assert ids(every) == world.of()
    names = {job["id"]: job["tenant"] for job in every.json()["jobs"]}
    assert names == {job_id: tenant for job_id, tenant, _ in world.jobs}
    assert all(job["queue_position"] is not None for job in every.json()["jobs"])
    assert ids(api.get("/v1/admin/jobs", params={"tenant": "globex"}, headers=ADMIN)) == (
        world.of("globex"))
    globex_id = every.json()["jobs"][1]["tenant_id"]
    assert ids(api.get("/v1/admin/jobs", params={"tenant": globex_id, "kind": "echo"},
                       headers=ADMIN)) == world.of("globex", "echo")
    assert ids(api.get("/v1/admin/jobs", params={"tier": "free"}, headers=ADMIN)) == (
        world.of("globex"))
    # Each key keeps to its own routes.
    assert api.get("/v1/admin/jobs", headers=auth(world.acme)).status_code == 403
    assert api.get("/v1/jobs", headers=ADMIN).status_code == 403


def test_a_job_read_whole_with_its_payload_cut_when_large(
    api: ApiClient, world: World
) -> None:
    job_id, _, _ = world.jobs[2]  # acme's first echo
    own = api.get(f"/v1/jobs/{job_id}/detail", headers=auth(world.acme))
    assert own.status_code == 200, own.text
    body = own.json()
    assert (body["tenant"], body["kind"], body["tier"], body["status"]) == (
        "acme", "echo", "premium", "queued")
    assert (body["payload"], body["payload_truncated"], body["payload_excerpt"]) == (
        {"n": 2}, False, None)
    assert body["created_at"] is not None and body["starts"] == 0
    assert api.get(f"/v1/admin/jobs/{job_id}", headers=ADMIN).json() == body
    # Another tenant's job is not found, as any id that is not one's own.
    assert api.get(f"/v1/jobs/{job_id}/detail", headers=auth(world.globex)).json()[
        "error"]["type"] == "not_found"

    big = api.submit(world.acme, {"kind": "echo", "payload": {"text": "é" * 10_000}})
    big_id = big.json()["id"]
    move(api, big_id, Status.RUNNING, Status.FAILED, error="RuntimeError: boom",
         error_type="handler_error")
    read = api.get(f"/v1/admin/jobs/{big_id}", headers=ADMIN).json()
    assert read["payload"] is None and read["payload_truncated"] is True
    assert read["payload_bytes"] > PAYLOAD_SHOWN_BYTES
    assert read["payload_excerpt"].startswith('{"text":"éé')
    assert len(read["payload_excerpt"].encode()) <= PAYLOAD_SHOWN_BYTES
    assert (read["error"], read["error_type"], read["status"]) == (
        "RuntimeError: boom", "handler_error", "failed")
    assert read["started_at"] is not None and read["finished_at"] is not None

    for missing in ("0190b6f0-6c4e-7a35-9a3c-1f0e2d3c4b5a", "not-an-id"):
        answer = api.get(f"/v1/admin/jobs/{missing}", headers=ADMIN)
        assert (answer.status_code, answer.json()["error"]["type"]) == (404, "not_found")


def test_the_admin_cancels_and_retries_any_tenants_job(api: ApiClient, world: World) -> None:
    job_id, _, _ = world.jobs[1]  # globex's queued sleep
    again = api.post(f"/v1/admin/jobs/{job_id}/retry", headers=ADMIN)
    assert (again.status_code, again.json()["error"]["type"]) == (409, "job_not_ended")
    cancelled = api.post(f"/v1/admin/jobs/{job_id}/cancel", headers=ADMIN)
    assert (cancelled.status_code, cancelled.json()["status"]) == (200, "cancelled")
    keyed = ADMIN | {"Idempotency-Key": "admin-retry-1"}
    retried = api.post(f"/v1/admin/jobs/{job_id}/retry", headers=keyed)
    assert retried.status_code == 202, retried.text
    new_id = retried.json()["id"]
    assert retried.headers["Location"] == f"/v1/admin/jobs/{new_id}"
    # Sent again (its answer lost): the same new job, no second one.
    resent = api.post(f"/v1/admin/jobs/{job_id}/retry", headers=keyed)
    assert (resent.status_code, resent.json()["id"]) == (200, new_id)
    # The new job is globex's own, of its tier, naming the one it retries.
    view = api.get(f"/v1/jobs/{new_id}", headers=auth(world.globex)).json()
    assert (view["retry_of"], view["tier"], view["status"]) == (job_id, "free", "queued")
    assert api.post("/v1/admin/jobs/not-an-id/cancel", headers=ADMIN).status_code == 404
    assert api.post(f"/v1/admin/jobs/{job_id}/cancel",
                    headers=auth(world.globex)).status_code == 403
    assert api.get(f"/v1/jobs/{job_id}", headers=auth(world.globex)).json()[
        "status"] == "cancelled"


@pytest.mark.parametrize(("params", "loc"), [
    ({"status": "done"}, ["query", "status"]),
    ({"kind": "no.such.kind"}, ["query", "kind"]),
    ({"kind": ""}, ["query", "kind"]),
    ({"tier": "gold"}, ["query", "tier"]),
    ({"since": "yesterday"}, ["query", "since"]),
    ({"since": "2026-12-04T10:00:00"}, ["query", "since"]),  # no zone
    ({"since": "1733306400"}, ["query", "since"]),  # a bare number
    ({"until": "2026-02-30T10:00:00Z"}, ["query", "until"]),
    ({"since": "2026-12-04T10:00:00Z", "until": "2026-12-04T10:00:00Z"}, ["query", "until"]),
    ({"cursor": "not-a-cursor"}, None),
    ({"limit": 0}, ["query", "limit"]),
    ({"limit": 501}, ["query", "limit"]),
    ({"knd": "echo"}, ["query", "knd"]),
])
def test_bad_filters_are_typed_422s(
    api: ApiClient, params: dict[str, Any], loc: list[str] | None
) -> None:
    key = api.tenant_key("acme")
    for path, headers in (("/v1/jobs", auth(key)), ("/v1/admin/jobs", ADMIN)):
        answer = api.get(path, params=params, headers=headers)
        assert answer.status_code == 422, (path, answer.text)
        error = answer.json()["error"]
        assert error["type"] == "invalid_request"
        if loc is not None:
            assert loc in [detail["loc"] for detail in error["details"]], error
    unknown = api.get("/v1/admin/jobs", params={"tenant": "nobody"}, headers=ADMIN)
    assert unknown.status_code == 422
    assert unknown.json()["error"]["details"][0]["loc"] == ["query", "tenant"]
