"""Packing made visible, on real Redis: ``record_run`` (what a worker calls once per run it
starts) fills each kind's histogram of items per run and its pool's items started, counts the
items of the last minute for the dashboard's items/s, and never raises; ``/metrics`` shows
``tierq_run_items`` and ``tierq_pool_items_started_total`` per pool."""

from __future__ import annotations

import logging

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobs.index import counters
from tests.integration.api_harness import ApiClient, Clock, rt

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Runs of eval.similarity, by size: two alone, one pair, one of 3 (bucket 4), one of 64, and
# one over the largest bound (+Inf only).
SIMILARITY = [1, 1, 2, 3, 64, 300]


def scrape(client: ApiClient) -> Samples:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_each_run_lands_in_its_kinds_bucket_and_its_items_in_the_pools_count(
    redis_client: redis.Redis, key_prefix: str,
) -> None:
    for items in SIMILARITY:
        counters.record_run(redis_client, key_prefix, kind="eval.similarity", pool="default",
                            items=items)
    counters.record_run(redis_client, key_prefix, kind="echo", pool="default", items=1)
    found = counters.read(redis_client, key_prefix, ["free"])
    similarity = found.run_items["eval.similarity"]
    assert dict(similarity.buckets) == {
        "1.0": 2, "2.0": 3, "4.0": 4, "8.0": 4, "16.0": 4, "32.0": 4, "64.0": 5, "128.0": 5,
        "256.0": 5, "+Inf": 6}
    assert similarity.count == 6 and similarity.sum == sum(SIMILARITY)
    assert dict(found.run_items["echo"].buckets)["1.0"] == 1
    assert found.items_started == sum(SIMILARITY) + 1
    # A run holds at least one item: nothing else is a run.
    counters.record_run(redis_client, key_prefix, kind="echo", pool="default", items=0)
    again = counters.read(redis_client, key_prefix, ["free"])
    assert again.run_items["echo"].count == 1 and again.items_started == found.items_started


def test_the_recent_items_are_those_started_in_the_last_minute(
    redis_client: redis.Redis, key_prefix: str,
) -> None:
    now = 1_800_000_005.0  # 5 s into a slot
    before = counters.read_runs(redis_client, key_prefix, now=now)
    assert before.recent.items == 0 and before.recent.per_s == 0.0 and before.run_items == {}
    for at, items in ((now - 200, 50), (now - 66, 7), (now - 64, 8), (now - 30, 16),
                      (now - 1, 4), (now, 2)):
        counters.record_run(redis_client, key_prefix, kind="echo", pool="default",
                            items=items, now=at)
    runs = counters.read_runs(redis_client, key_prefix, now=now)
    # The window is the last 60 s and the 5 s of the slot under way: from now - 65 s.
    assert runs.recent.span_s == 65.0
    assert runs.recent.items == 8 + 16 + 4 + 2
    assert runs.recent.per_s == pytest.approx(30 / 65)
    assert runs.items_started == 50 + 7 + 8 + 16 + 4 + 2
    assert runs.run_items["echo"].count == 6
    # Each slot's count is kept a while, then goes.
    ttls = [redis_client.ttl(counters.RunKeys(key_prefix).slot(number))
            for number in counters.recent_slots(now)[0]]
    assert all(0 < ttl <= counters.ITEMS_KEPT_S for ttl in ttls if ttl != -2)


def test_a_run_is_timed_by_redis_when_no_clock_is_given(
    redis_client: redis.Redis, key_prefix: str,
) -> None:
    counters.record_run(redis_client, key_prefix, kind="echo", pool="default", items=3)
    seconds, micros = redis_client.time()
    runs = counters.read_runs(redis_client, key_prefix, now=seconds + micros / 1e6)
    assert runs.recent.items == 3


def test_a_redis_that_does_not_answer_costs_the_count_not_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gone = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5,
                       retry=Retry(NoBackoff(), 0))
    with caplog.at_level(logging.WARNING, logger="tierq.counters"):
        counters.record_run(gone, "{nowhere}:", kind="echo", pool="gpu", items=4)
    [record] = [r for r in caplog.records if r.getMessage() == "counter.failed"]
    assert (record.__dict__["kind"], record.__dict__["pool"]) == ("echo", "gpu")


def test_metrics_show_items_per_run_per_kind_and_items_started_per_pool(
    pooled: ApiClient, clock: Clock,
) -> None:
    empty = scrape(pooled)
    assert sample(empty, "tierq_pool_items_started_total", pool="gpu") == 0
    assert not any(name.startswith("tierq_run_items") for name, _ in empty)
    gpu, default = rt(pooled).for_pool("gpu"), rt(pooled).for_pool("default")
    for items in SIMILARITY:
        counters.record_run(gpu.redis, gpu.prefix, kind="eval.similarity", pool="gpu",
                            items=items, now=clock.now)
    counters.record_run(default.redis, default.prefix, kind="echo", pool="default", items=1,
                        now=clock.now)

    samples = scrape(pooled)
    at = {"pool": "gpu", "kind": "eval.similarity"}
    bounds = ["1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "+Inf"]
    assert [sample(samples, "tierq_run_items_bucket", **at, le=le) for le in bounds] == [
        2, 3, 4, 4, 4, 4, 5, 5, 5, 6]
    assert sample(samples, "tierq_run_items_count", **at) == 6
    assert sample(samples, "tierq_run_items_sum", **at) == sum(SIMILARITY)
    alone = {"pool": "default", "kind": "echo"}
    assert sample(samples, "tierq_run_items_bucket", **alone, le="1.0") == 1
    assert sample(samples, "tierq_pool_items_started_total", pool="gpu") == sum(SIMILARITY)
    assert sample(samples, "tierq_pool_items_started_total", pool="default") == 1
    # Each kind is the series of the pool that ran it only.
    assert ("tierq_run_items_count", tuple(sorted({"pool": "default",
                                                   "kind": "eval.similarity"}.items()))
            ) not in samples
