"""``/v1/dashboard`` shows packing to the admin: each pool's items started a second over the
last minute and in all, each kind's runs, mean items per run and runs by size, under the pool
that ran it; a tenant's view shows none of it."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.index import counters
from tests.integration.api_harness import ADMIN_KEY, ApiClient, Clock, auth, rt

pytestmark = pytest.mark.integration


def dashboard(client: ApiClient, key: str) -> dict[str, Any]:
    answer = client.get("/v1/dashboard", headers=auth(key))
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_the_fleet_sees_items_per_run_per_kind_and_items_a_second_per_pool(
    pooled: ApiClient, clock: Clock,
) -> None:
    before = dashboard(pooled, ADMIN_KEY)["packing"]
    assert before["window_s"] == 60 and before["kinds"] == []
    assert [(p["pool"], p["items_per_s"], p["items_started"]) for p in before["pools"]] == [
        ("default", 0.0, 0), ("gpu", 0.0, 0)]

    clock.now = float(int(clock.now) // 10 * 10 + 5)  # 5 s into a slot: a 65 s window
    gpu, default = rt(pooled).for_pool("gpu"), rt(pooled).for_pool("default")
    # Two minutes ago a run of 64 (outside the window), then 3 runs of 32 and 1 of 2 lately.
    counters.record_run(gpu.redis, gpu.prefix, kind="eval.similarity", pool="gpu", items=64,
                        now=clock.now - 120)
    for items in (32, 32, 32, 2):
        counters.record_run(gpu.redis, gpu.prefix, kind="eval.similarity", pool="gpu",
                            items=items, now=clock.now - 10)
    for _ in range(13):
        counters.record_run(default.redis, default.prefix, kind="sleep", pool="default",
                            items=1, now=clock.now - 1)

    packing = dashboard(pooled, ADMIN_KEY)["packing"]
    pools = {p["pool"]: p for p in packing["pools"]}
    assert pools["gpu"]["items_per_s"] == pytest.approx(98 / 65)
    assert pools["gpu"]["items_started"] == 64 + 98
    assert pools["default"]["items_per_s"] == pytest.approx(13 / 65)
    assert [(k["pool"], k["kind"]) for k in packing["kinds"]] == [
        ("default", "sleep"), ("gpu", "eval.similarity")]
    sleep, similarity = packing["kinds"]
    assert (sleep["runs"], sleep["items"], sleep["mean_items_per_run"]) == (13, 13, 1.0)
    assert (similarity["runs"], similarity["items"]) == (5, 162)
    assert similarity["mean_items_per_run"] == pytest.approx(162 / 5)
    assert [(s["le"], s["runs"]) for s in similarity["sizes"] if s["runs"]] == [
        (2.0, 1), (32.0, 3), (64.0, 1)]
    assert [s["le"] for s in similarity["sizes"]] == [1, 2, 4, 8, 16, 32, 64, 128, 256, None]

    # The window moves on: a minute later the runs above are out of it, their counts stay.
    clock.now += 70
    later = {p["pool"]: p for p in dashboard(pooled, ADMIN_KEY)["packing"]["pools"]}
    assert later["gpu"]["items_per_s"] == 0.0 and later["gpu"]["items_started"] == 162

    tenant = pooled.create_tenant("acme", "standard")
    assert dashboard(pooled, tenant["api_key"])["packing"] is None
