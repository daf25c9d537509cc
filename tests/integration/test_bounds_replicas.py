"""Exact bounds across replicas: two API processes, one database and Redis, 50 clients at once.

No dispatcher and no worker run, so nothing drains the queue: the tier's bound (or a tenant's
queued quota) is the only thing that can stop a submit. A sampler process reads the tier's
depth from Redis and the queued count from SQL as fast as it can for the whole storm; neither
may ever exceed the bound, and every answer must be a 202 or a typed 429.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import sqlalchemy as sa

from jobs.index.keys import IndexKeys
from jobs.index.redis_index import RedisIndex
from tests.e2e.harness import System, free_port, running, system_env, wait_until
from tests.services import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TIER = "free"
# μ = 2 slots / 1 s = 2 jobs/s; bound = floor(2 × 10 s) = 20 queued jobs.
BOUND = 20
CLIENTS = 50
# Fewer samples than this during the storm and "never exceeded" would prove little.
MIN_SAMPLES = 50
JOBS_PER_CLIENT = 6


def config(*, queued_share: float) -> str:
    return f"""
[policy]
pool_concurrency = 2
mean_service_s = 1

[tiers.{TIER}]
base_priority = 20
max_wait_s = 10
tenant_share = 0.5
queued_share = {queued_share}
"""


@contextlib.contextmanager
def two_apis(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, key_prefix: str, toml: str
) -> Iterator[tuple[System, list[str]]]:
    """Two API processes on one database, Redis and key prefix (and nothing else)."""
    path = tmp_path / "tierq.toml"
    path.write_text(toml)
    env = system_env(database_url=pg_url, redis_url=redis_server.url, key_prefix=key_prefix,
                     extra={"TIERQ_CONFIG": str(path)})
    ports = [free_port(), free_port()]
    with running(System(env=env, workdir=tmp_path, port=ports[0])) as system:
        for n, port in enumerate(ports, start=1):
            system.start(f"api{n}", "api", "--host", "127.0.0.1", "--port", str(port))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url in urls:
            wait_until(functools.partial(ready, url))
        yield system, urls


def ready(url: str) -> bool:
    return httpx.get(f"{url}/readyz", timeout=2).status_code == 200


def create_tenant(system: System, name: str) -> tuple[str, str]:
    """The new tenant's id and key."""
    with system.admin() as admin:
        response = admin.post("/v1/admin/tenants", json={"name": name, "tier": TIER})
        response.raise_for_status()
        body = response.json()
    return body["id"], body["api_key"]


@dataclass(frozen=True, kw_only=True)
class Sample:
    at: float
    tier_depth: int  # Redis: the tier's queued jobs in the index
    sql_queued: int  # SQL: the tier's rows in status queued
    tenant_queued: dict[str, int]


def sample_until(
    stop: Any, started: Any, out: Any, *, redis_url: str, key_prefix: str, pg_url: str,
    tenants: Sequence[str],
) -> None:
    """The sampler process: read the counts as fast as possible until ``stop`` is set, then
    send back ``(samples, error)``."""
    samples: list[Sample] = []
    failure = None
    client = redis.Redis.from_url(redis_url)
    engine = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    query = sa.text("SELECT count(*) FROM jobs WHERE tier = :tier AND status = 'queued'")
    try:
        index = RedisIndex(client, key_prefix)
        with engine.connect() as conn:
            started.set()
            while not stop.is_set():
                depth = index.tier_depths([TIER])[TIER].queued
                sql_queued = conn.execute(query, {"tier": TIER}).scalar_one()
                per_tenant = {t: index.tenant_queued(t) for t in tenants}
                samples.append(Sample(at=time.monotonic(), tier_depth=depth,
                                      sql_queued=sql_queued, tenant_queued=per_tenant))
    except Exception as exc:
        failure = repr(exc)
    finally:
        engine.dispose()
        client.close()
        out.put((samples, failure))


@dataclass
class Sampler:
    """Samples the counts in a process of its own, so that the clients' threads cannot
    starve it of the interpreter lock; ``samples`` is filled when sampling ends."""

    redis_url: str
    key_prefix: str
    pg_url: str
    tenants: Sequence[str] = ()
    samples: list[Sample] = field(default_factory=list)

    @contextlib.contextmanager
    def sampling(self) -> Iterator[Sampler]:
        context = multiprocessing.get_context("spawn")  # never fork a threaded process
        stop, started, out = context.Event(), context.Event(), context.Queue()
        kwargs = {"redis_url": self.redis_url, "key_prefix": self.key_prefix,
                  "pg_url": self.pg_url, "tenants": list(self.tenants)}
        process = context.Process(target=sample_until, args=(stop, started, out), kwargs=kwargs,
                                  name="sampler", daemon=True)
        process.start()
        try:
            assert started.wait(60), "the sampler did not start"
            yield self
        finally:
            stop.set()
            self.samples, failure = out.get(timeout=60)
            process.join(timeout=30)
            out.close()
        assert failure is None, f"the sampler failed: {failure}"

    def during(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.at <= end]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    tenant: str
    status: int
    headers: dict[str, str]
    body: Any
    at: float


def post_job(http: httpx.Client, url: str, tenant: str, n: int) -> Outcome:
    response = http.post(f"{url}/v1/jobs", json={"kind": "echo", "payload": {"n": n}})
    return Outcome(tenant=tenant, status=response.status_code, headers=dict(response.headers),
                   body=response.json(), at=time.monotonic())


# submit(tenant_id, api_key, n): one POST /v1/jobs, to the next API in turn.
Submit = Callable[[str, str, int], Outcome]


def storm(
    urls: Sequence[str], plan: Sequence[Callable[[Submit], None]]
) -> tuple[list[Outcome], float, float]:
    """Run each client of ``plan`` on its own thread, all released at once; each gets a
    ``submit(tenant_id, key, n)`` that sends to the APIs round-robin. Returns every answer
    and the storm's start and end (monotonic)."""
    outcomes: list[Outcome] = []
    barrier = threading.Barrier(len(plan), timeout=30)

    def client(i: int) -> None:
        with httpx.Client(timeout=30) as http:
            sent = 0

            def submit(tenant: str, key: str, n: int) -> Outcome:
                nonlocal sent
                http.headers["Authorization"] = f"Bearer {key}"
                outcome = post_job(http, urls[(i + sent) % len(urls)], tenant, n)
                sent += 1
                outcomes.append(outcome)
                return outcome

            barrier.wait()
            plan[i](submit)

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(plan)) as pool:
        for future in [pool.submit(client, i) for i in range(len(plan))]:
            future.result()
    return outcomes, start, time.monotonic()


def check_refusal(outcome: Outcome, reason: str) -> None:
    assert outcome.status == 429, outcome
    error = outcome.body["error"]
    assert error["type"] == reason, outcome
    assert error["message"], outcome
    assert int(outcome.headers["retry-after"]) >= 1, outcome
    assert error["retry_after_seconds"] >= 1, outcome
    assert 0 <= int(outcome.headers["x-queue-position"]) <= BOUND, outcome
    assert outcome.headers["x-tier"] == TIER, outcome


def accepted_ids(outcomes: Sequence[Outcome]) -> set[str]:
    return {o.body["id"] for o in outcomes if o.status == 202}


def rows_in_sql(pg_url: str) -> dict[str, str]:
    """Every job row: id -> status."""
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            return {row[0]: row[1] for row in conn.execute(sa.text("SELECT id, status FROM jobs"))}
    finally:
        engine.dispose()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def indexed_ids(client: redis.Redis, key_prefix: str) -> tuple[set[str], set[str]]:
    """The job ids in the tier's queue and those in its tenants' queues."""
    keys = IndexKeys(key_prefix)
    tier = {_text(m) for m in client.zrange(keys.tier(TIER), 0, -1)}
    queues = client.scan_iter(match=keys.tenant_queue("*"), count=1000)
    entries = {_text(m) for queue in queues for m in client.lrange(queue, 0, -1)}
    return tier, entries


def check_nothing_left_behind(
    outcomes: Sequence[Outcome], pg_url: str, client: redis.Redis, key_prefix: str
) -> None:
    accepted = accepted_ids(outcomes)
    assert len(accepted) == sum(o.status == 202 for o in outcomes)  # no id answered twice
    rows = rows_in_sql(pg_url)
    assert set(rows) == accepted, "a refused job left a row, or an accepted one has none"
    assert set(rows.values()) == {"queued"}
    assert indexed_ids(client, key_prefix) == (accepted, accepted)


def test_the_tier_bound_holds_across_two_replicas_and_fifty_clients(
    tmp_path: Path,
    pg_url: str,
    redis_server: RedisServer,
    key_prefix: str,
    redis_client: redis.Redis,
) -> None:
    toml = config(queued_share=1.0)  # a tenant may fill the tier: only the bound stops it
    with two_apis(tmp_path, pg_url, redis_server, key_prefix, toml) as (system, urls):
        tenants = [create_tenant(system, f"crowd-{n}") for n in range(5)]

        def client_of(tenant_id: str, key: str) -> Callable[[Submit], None]:
            def client(submit: Submit) -> None:
                for n in range(JOBS_PER_CLIENT):
                    submit(tenant_id, key, n)

            return client

        plan = [client_of(*tenants[i % len(tenants)]) for i in range(CLIENTS)]
        sampler = Sampler(redis_url=redis_server.url, key_prefix=key_prefix, pg_url=pg_url)
        with sampler.sampling():
            outcomes, start, end = storm(urls, plan)

    samples = sampler.during(start, end)
    assert len(samples) >= MIN_SAMPLES, f"only {len(samples)} samples during the storm"
    max_depth = max(s.tier_depth for s in sampler.samples)
    max_sql = max(s.sql_queued for s in sampler.samples)
    report = f"{len(samples)} samples during the storm; max depth {max_depth}, max SQL {max_sql}"
    assert max_depth <= BOUND, report
    assert max_sql <= BOUND, report
    assert max_depth == BOUND, report  # the storm did reach the bound
    assert len(outcomes) == CLIENTS * JOBS_PER_CLIENT
    assert {o.status for o in outcomes} == {202, 429}
    for outcome in outcomes:
        if outcome.status == 429:
            check_refusal(outcome, "capacity")
    assert sum(o.status == 202 for o in outcomes) == BOUND, report
    check_nothing_left_behind(outcomes, pg_url, redis_client, key_prefix)


def test_a_tenant_at_its_quota_is_refused_while_another_of_its_tier_is_admitted(
    tmp_path: Path,
    pg_url: str,
    redis_server: RedisServer,
    key_prefix: str,
    redis_client: redis.Redis,
) -> None:
    quota = 5  # floor(bound 20 × queued_share 0.25)
    quiet_clients = 4  # fewer than the quota: every one of them must get in
    toml = config(queued_share=0.25)
    with two_apis(tmp_path, pg_url, redis_server, key_prefix, toml) as (system, urls):
        noisy, noisy_key = create_tenant(system, "noisy")
        quiet, quiet_key = create_tenant(system, "quiet")
        noisy_refused = threading.Event()

        def noisy_client(submit: Submit) -> None:
            for n in range(8):
                if submit(noisy, noisy_key, n).status == 429:
                    noisy_refused.set()

        def quiet_client(submit: Submit) -> None:
            assert noisy_refused.wait(30), "the noisy tenant was never refused"
            submit(quiet, quiet_key, 0)

        plan = [quiet_client] * quiet_clients + [noisy_client] * (CLIENTS - quiet_clients)
        sampler = Sampler(redis_url=redis_server.url, key_prefix=key_prefix, pg_url=pg_url,
                          tenants=[noisy, quiet])
        with sampler.sampling():
            outcomes, start, end = storm(urls, plan)
        with httpx.Client(timeout=30) as http:  # after the storm: the same, one at a time
            http.headers["Authorization"] = f"Bearer {noisy_key}"
            outcomes.append(post_job(http, urls[0], noisy, 99))
            http.headers["Authorization"] = f"Bearer {quiet_key}"
            outcomes.append(post_job(http, urls[1], quiet, 99))

    samples = sampler.during(start, end)
    assert len(samples) >= MIN_SAMPLES, f"only {len(samples)} samples during the storm"
    max_noisy = max(s.tenant_queued[noisy] for s in sampler.samples)
    report = f"{len(samples)} samples during the storm; noisy tenant held at most {max_noisy}"
    assert max_noisy <= quota, report
    assert max(s.tier_depth for s in sampler.samples) <= BOUND, report
    assert max(s.sql_queued for s in sampler.samples) <= BOUND, report

    by_noisy = [o for o in outcomes if o.tenant == noisy]
    by_quiet = [o for o in outcomes if o.tenant == quiet]
    assert sum(o.status == 202 for o in by_noisy) == quota, report
    for outcome in by_noisy:
        if outcome.status != 202:
            check_refusal(outcome, "tenant_limit")
            assert f"its limit is {quota}" in outcome.body["error"]["message"]
    first_refusal = min(o.at for o in by_noisy if o.status == 429)
    assert [o.status for o in by_quiet] == [202] * (quiet_clients + 1)
    assert all(o.at > first_refusal for o in by_quiet)  # admitted after noisy was refused
    check_nothing_left_behind(outcomes, pg_url, redis_client, key_prefix)
