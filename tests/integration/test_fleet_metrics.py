"""``/metrics`` over real HTTP from two API replicas on one PostgreSQL and one Redis: the
figures agree, the queue wait is a cumulative histogram whose rate answers
``histogram_quantile`` right, and every transition is counted fleet-wide."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from jobs.core.histograms import WAIT_BUCKETS_S, histogram_quantile
from jobs.core.states import Status
from jobs.dispatch.dispatcher import Dispatcher
from jobs.execution.attempt import SUCCEEDED, execute
from jobs.fleet.metrics import percentile
from jobs.index import counters
from jobs.index.base import IndexedJob
from jobs.index.redis_index import RedisIndex
from tests.integration.api_harness import (
    ADMIN_KEY,
    ApiClient,
    Clock,
    auth,
    dispatch_one,
    make_settings,
    move,
    rt,
    running_api,
    start_one,
)
from tests.integration.stand_in import register_stand_ins, stand_ins_for
from tests.services import RedisServer
from workers.handlers import default_registry

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def live_slots(request: pytest.FixtureRequest) -> None:
    """The workers these tests play by hand: live slots the dispatcher may lease into."""
    stand_ins_for(request)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class NoPublisher:
    def publish(
        self, job_id: str, attempt: int, tier: str, *, dispatched_at: float | None = None
    ) -> None:
        pass


@pytest.fixture
def replicas(
    pg_url: str, redis_server: RedisServer, key_prefix: str, redis_client: Any
) -> Iterator[tuple[ApiClient, ApiClient, Clock]]:
    """Two API processes' apps (each its own runtime and HTTP server) on the same stores."""
    clock = Clock()
    settings = make_settings(pg_url, redis_server.url, key_prefix)
    with running_api(settings, clock) as a, running_api(settings, clock) as b:
        yield a, b, clock


def scrape(client: ApiClient) -> Samples:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


# Families of the fleet, not of a pool: no ``pool`` label.
POOL_LESS = ("tierq_backend_up", "tierq_jobs_pruned", "tierq_jobs_abandoned")


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample; a pool's family is read in the default pool unless ``pool`` is given."""
    if not name.startswith(POOL_LESS):
        labels = {"pool": "default", **labels}
    return samples[(name, tuple(sorted(labels.items())))]


def buckets(samples: Samples, name: str, tier: str) -> list[tuple[float, float]]:
    """The cumulative ``(le, count)`` pairs of one tier's histogram, in ``le`` order."""
    found = [(float(dict(labels)["le"]), count) for (sample, labels), count in samples.items()
             if sample == f"{name}_bucket" and dict(labels)["tier"] == tier]
    return sorted(found)


def rate_buckets(before: Samples, after: Samples, name: str, tier: str,
                 seconds: float) -> list[tuple[float, float]]:
    """``rate()`` of each bucket between two scrapes (counters that only grow)."""
    old = dict(buckets(before, name, tier))
    return [(le, (count - old[le]) / seconds) for le, count in buckets(after, name, tier)]


def run_one(client: ApiClient, key: str, clock: Clock, *, wait_s: float) -> None:
    """Submit a job, start it ``wait_s`` later (dispatched 0.5 s before), finish it."""
    job_id = client.submit(key).json()["id"]
    clock.now += wait_s - 0.5 if wait_s > 0.5 else 0
    dispatch_one(client, job_id)
    clock.now += 0.5 if wait_s > 0.5 else wait_s
    start_one(client, job_id)
    move(client, job_id, Status.SUCCEEDED)
    rt(client).index.release(job_id, attempt=1, outcome="succeeded")


def test_two_replicas_agree_and_histogram_quantile_of_the_wait_rate_is_right(
    replicas: tuple[ApiClient, ApiClient, Clock],
) -> None:
    a, b, clock = replicas
    key = a.tenant_key("acme", "premium")
    for _ in range(3):  # before the first scrape: no part of the rate
        run_one(a, key, clock, wait_s=100.0)
    clock.now += 301  # out of the 5-minute window too
    first = scrape(a)
    assert scrape(b) == first

    waits = [0.05] * 4 + [0.3] * 6 + [2.0] * 6 + [20.0] * 4
    for i, wait in enumerate(waits):
        run_one(a if i % 2 else b, key, clock, wait_s=wait)  # started through both replicas
    clock.now += 10
    seconds = 60.0  # the scrape interval the rate is taken over
    second = scrape(b)
    assert scrape(a) == second

    name = "tierq_queue_wait_seconds"
    old, new = dict(buckets(first, name, "premium")), buckets(second, name, "premium")
    assert [le for le, _ in new] == [*WAIT_BUCKETS_S, float("inf")]
    assert all(count >= old[le] for le, count in new)  # a counter: it only grows
    assert value(second, f"{name}_count", tier="premium") - value(
        first, f"{name}_count", tier="premium") == len(waits)
    assert value(second, f"{name}_sum", tier="premium") - value(
        first, f"{name}_sum", tier="premium") == pytest.approx(sum(waits))

    rates = rate_buckets(first, second, name, "premium", seconds)
    # Prometheus's interpolation inside the bucket holding the rank: p50 is rank 10 of 20,
    # the 10th wait closes (0.25, 0.5]; p95 is rank 19, 3/4 into (10, 30].
    assert histogram_quantile(0.5, rates) == pytest.approx(0.5)
    assert histogram_quantile(0.95, rates) == pytest.approx(25.0)
    assert histogram_quantile(0.99, rate_buckets(first, second, name, "standard",
                                                 seconds)) is None
    for q in (0.5, 0.95):  # the estimate lies in the bucket of the true quantile
        true = sorted(waits)[int(q * len(waits)) - 1]
        estimate = histogram_quantile(q, rates)
        assert estimate is not None
        low = max([0.0, *(le for le in WAIT_BUCKETS_S if le < true)])
        assert low < estimate <= min(le for le in WAIT_BUCKETS_S if le >= true)

    # The windowed percentiles (the last 5 minutes: the 20 waits, not the 100 s ones).
    for q, label in ((0.5, "0.5"), (0.95, "0.95")):
        assert value(second, "tierq_queue_wait_recent_seconds", tier="premium",
                     quantile=label) == pytest.approx(percentile(waits, q))
    premium = a.get("/v1/queues", headers=auth(ADMIN_KEY)).json()["tiers"][0]
    assert premium["wait_p50_s"] == pytest.approx(percentile(waits, 0.5))
    assert premium["wait_p95_s"] == pytest.approx(percentile(waits, 0.95))
    # Dispatch latency: 0.5 s for the longer waits, the whole wait for the shorter ones.
    latency = buckets(second, "tierq_dispatch_latency_seconds", "premium")
    assert dict(latency)[0.1] - dict(buckets(first, "tierq_dispatch_latency_seconds",
                                              "premium"))[0.1] == 4
    assert latency[-1][1] == 3 + len(waits)


def test_every_transition_is_counted_once_fleet_wide(
    replicas: tuple[ApiClient, ApiClient, Clock],
) -> None:
    a, b, clock = replicas
    key = a.tenant_key("acme", "free")
    job_id = a.submit(key, {"kind": "echo", "payload": {"x": 1}}).json()["id"]
    assert a.submit(key).status_code == 429  # free quota 1: tenant_limit
    assert b.submit(key).status_code == 429  # refused by the other replica

    runtime = rt(a)
    register_stand_ins(runtime)  # the worker this test plays by hand
    dispatcher = Dispatcher(runtime, NoPublisher())
    stats = dispatcher.run_once(clock.now)
    assert stats.dispatched == 1 and stats.reconciled is not None and stats.reconciled.full
    clock.now += 0.25
    outcome = execute(runtime, default_registry(""), job_id, 1, worker_id="w@host",
                      clock=clock)
    assert outcome == SUCCEEDED

    samples = scrape(b)
    assert scrape(a) == samples
    entered = {status: value(samples, "tierq_jobs_entered_total", status=status)
               for status in ("queued", "dispatched", "running", "succeeded", "failed",
                              "cancelled", "expired")}
    assert entered == {"queued": 1, "dispatched": 1, "running": 1, "succeeded": 1,
                       "failed": 0, "cancelled": 0, "expired": 0}
    assert value(samples, "tierq_rejections_total", tier="free", cause="tenant_limit",
                 limit="quota") == 2
    assert value(samples, "tierq_reconciler_repairs_total", kind="full_pass") == 1
    assert value(samples, "tierq_dispatch_latency_seconds_count", tier="free") == 1
    assert value(samples, "tierq_dispatch_latency_seconds_bucket", tier="free",
                 le="0.25") == 1
    assert value(samples, "tierq_queue_max_wait_seconds", tier="free") == 60

    # A cancel through the other replica; the live states: the leader's count, taken with
    # its reconciler round. A dispatch writes nothing to SQL: the job it leased is counted
    # queued until a worker starts it (the dispatch script counts it as dispatched, once).
    waiting = a.submit(a.tenant_key("other", "free"),
                       {"kind": "echo", "payload": {"x": 2}}).json()["id"]
    third = a.tenant_key("third", "free")
    doomed = a.submit(third).json()["id"]
    assert b.post(f"/v1/jobs/{doomed}/cancel", headers=auth(third)).status_code == 200
    clock.now += 5
    assert dispatcher.run_once(clock.now).dispatched == 1
    samples = scrape(a)
    assert scrape(b) == samples
    assert {status: value(samples, "tierq_jobs", status=status)
            for status in ("waiting", "queued", "dispatched", "running")} == {
        "waiting": 0, "queued": 1, "dispatched": 0, "running": 0}
    assert value(samples, "tierq_jobs_entered_total", status="dispatched") == 2
    assert value(samples, "tierq_jobs_entered_total", status="cancelled") == 1
    assert value(samples, "tierq_jobs_entered_total", status="queued") == 3
    assert rt(b).index.position(waiting) is None  # leased
    assert rt(b).index.entries_of([waiting])[waiting].leased
    # Its start (queued -> running) and its end are counted once each; the dispatch is not
    # counted again by the start.
    assert execute(rt(b), default_registry(""), waiting, 1, worker_id="w@host",
                   clock=clock) == SUCCEEDED
    samples = scrape(a)
    assert scrape(b) == samples
    assert {status: value(samples, "tierq_jobs_entered_total", status=status)
            for status in ("queued", "dispatched", "running", "succeeded")} == {
        "queued": 3, "dispatched": 2, "running": 2, "succeeded": 2}


def test_every_metric_the_alerts_and_grafana_read_is_in_a_real_scrape(
    replicas: tuple[ApiClient, ApiClient, Clock],
) -> None:
    a, _, clock = replicas
    run_one(a, a.tenant_key("acme", "free"), clock, wait_s=2.0)
    Dispatcher(rt(a), NoPublisher()).run_once(clock.now)  # the leader counts the live states
    exported = {name for name, _ in scrape(a)}
    root = Path(__file__).resolve().parents[2]
    alerts = yaml.safe_load((root / "deploy" / "prometheus" / "alerts.yml").read_text())
    exprs = [rule["expr"] for group in alerts["groups"] for rule in group["rules"]]
    board = json.loads((root / "deploy" / "grafana" / "tierq.json").read_text())
    exprs += [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"\btierq_[a-z_]+", expr)}
    assert len(used) >= 15
    assert used <= exported, used - exported


def test_the_scripts_count_new_jobs_once_and_duplicates_never(
    redis_client: Any, key_prefix: str
) -> None:
    """The batch feeder's admit (``admit.lua``) counts a job it lets in as entering queued;
    admitting it again (a duplicate) counts nothing; a dispatch counts its leases."""
    index = RedisIndex(redis_client, key_prefix)
    item = IndexedJob(job_id="j-1", tenant="t-1", tier="free", order_key=1.0)
    assert index.admit(item, bound=10).accepted
    assert index.admit(item, bound=10).duplicate
    assert not index.admit(IndexedJob(job_id="j-2", tenant="t-1", tier="free", order_key=2.0),
                           bound=1).accepted  # no room: it waits, no 429, nothing counted
    assert [lease.job_id for lease in index.dispatch(5, lease_ttl_s=30)] == ["j-1"]
    found = counters.read(redis_client, key_prefix, ["free"])
    assert found.jobs == {"queued": 1, "dispatched": 1}
    assert found.rejections == {}
