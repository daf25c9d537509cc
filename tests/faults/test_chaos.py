"""A bounded chaos soak: mixed load from every tier while processes and servers fail at random.

Six tenants (two per tier) submit ``tracked`` jobs of 0–1.5 s, some with a deadline, some
cancelled by their client, a few whose error or result holds U+0000, while the driver
(``tests.faults.chaos_faults``) SIGKILLs workers and the leading dispatcher, stalls the
leader (SIGSTOP, inside an SQL transaction when it can), pauses PostgreSQL, flushes Redis,
restarts it empty or from an older snapshot, sends a second broker message for every
dispatched attempt, holds batch uploads that stall mid-body, swaps in a worker whose
clock is two minutes off, freezes a worker whole (SIGSTOP) past its leases, submits a
job whose handler starts a child process and ignores every stop (its run-time limit must
end it, with the worker process running it and the child), aims webhooks at receivers that
hang, answer without end or with 48 MiB, and at names whose DNS never answers or turns to
loopback after the API's check (``tests.faults.chaos_webhooks``, the soak's own DNS in
``tests/faults/soak_site``), starts for a while a worker whose build lacks the soak's own
kinds (a rolling deploy), and slows the blob store past a short run-time limit while
handlers return results too large for their row. Then the faults stop,
the system is left to settle (bounded), and ``check_invariants`` must hold: every accepted
job terminal, each succeeded job completed exactly once, no attempt charged without a start,
no tenant above its cap at any instant; no job failed for a worker that lacked its kind;
each hung job ended ``failed``, ``timed_out``, its
child gone; each large result made in time kept, at the first start; nothing reached the
loopback receiver, every webhook try was recorded and the good receiver's events were
delivered; and the clients saw only the answers an outage allows, each job submitted once.

The seed is printed first; ``TIERQ_CHAOS_SEED=<seed>`` replays the same schedule of faults
and load (the timing of a loaded machine still varies), and ``TIERQ_CHAOS_FAULTS`` (names
from ``FaultDriver.faults``, comma-separated) keeps only some faults, to corner a failure. A
failure prints the seed, the fault timeline, and the offending jobs' SQL rows and trace
lines.
"""

from __future__ import annotations

import os
import random
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobs.core.domain import Job
from jobs.core.policy import Tier, tenant_cap
from jobs.store.models import JobRow, TenantRow
from tests.e2e.harness import System, free_port, wait_until
from tests.faults.chaos_faults import WORKER_SLOTS, FaultDriver, Fleet, Timeline
from tests.faults.chaos_load import ChaosLoad, Submission, TenantLoad
from tests.faults.chaos_webhooks import bad_webhooks_held
from tests.faults.checks import check_invariants
from tests.faults.conftest import HANDLERS, SystemFactory
from tests.faults.handlers import TrackedGpuHandler, read_runs
from tests.faults.load import probe_ready
from tests.faults.report import Violation
from tests.faults.servers import ThrowawayPostgres, ThrowawayRedis
from tests.faults.soak_names import ALLOWED
from tests.slow_store import DELAY_ENV as STORE_DELAY_ENV
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.faults, pytest.mark.chaos, pytest.mark.alone, pytest.mark.timeout(420)]

SEED_ENV = "TIERQ_CHAOS_SEED"
FAULTS_ENV = "TIERQ_CHAOS_FAULTS"
FAULT_PHASE_S = 100.0
SETTLE_S = 45.0
WORKERS, DISPATCHERS = 3, 2
POOL = WORKERS * WORKER_SLOTS
# The second pool, ``gpu``: its own worker and its own kind (``tracked.gpu``), so the soak's
# faults hit two pools' queues, leases and caps at once.
GPU_WORKERS = 1
GPU_POOL = GPU_WORKERS * WORKER_SLOTS
# With a default pool of 6 slots: caps floor(6 × share) = 3, 2 and 1; in the gpu pool's 2
# slots, 1 each.
CONFIG = f"""
[pools.gpu]
kinds = ["{TrackedGpuHandler.kind}"]
concurrency = {GPU_POOL}

[tiers.premium]
base_priority = 0
max_wait_s = 60
tenant_share = 0.5

[tiers.standard]
base_priority = 10
max_wait_s = 120
tenant_share = 0.34

[tiers.free]
base_priority = 20
max_wait_s = 300
tenant_share = 0.17
"""
TIER_CAPS = {name: tenant_cap(Tier(name=name, **tier), POOL)
             for name, tier in tomllib.loads(CONFIG)["tiers"].items()}
GPU_CAPS = {name: tenant_cap(Tier(name=name, **tier), GPU_POOL)
            for name, tier in tomllib.loads(CONFIG)["tiers"].items()}
# name, tier, mean seconds between bursts (1–5 jobs each): about 4 jobs/s in all.
TENANTS = [
    ("gold-a", "premium", 2.5), ("gold-b", "premium", 2.5),
    ("silver-a", "standard", 3.5), ("silver-b", "standard", 3.5),
    ("free-a", "free", 5.0), ("free-b", "free", 5.0),
]
SHARED_PORTS = (5432, 6379)
# On PYTHONPATH of every process of the soak: its DNS and its slow blob store's protocol.
SOAK_SITE = Path(__file__).resolve().parent / "soak_site"


def chosen_faults() -> set[str] | None:
    """``TIERQ_CHAOS_FAULTS=kill-worker,pause-postgres``: only those (to corner a failure)."""
    given = os.environ.get(FAULTS_ENV, "")
    return {name.strip() for name in given.split(",") if name.strip()} or None


def chaos_seed() -> int:
    given = os.environ.get(SEED_ENV)
    return int(given) if given else random.SystemRandom().randrange(2**31)


def test_chaos_soak(
    fault_system: SystemFactory,
    fault_pg: ThrowawayPostgres,
    fault_redis: ThrowawayRedis,
    run_log: Path,
) -> None:
    seed = chaos_seed()
    sys.stderr.write(f"\n[chaos] seed {seed} (replay: {SEED_ENV}={seed})\n")
    assert fault_pg.port not in SHARED_PORTS and fault_redis.port not in SHARED_PORTS
    timeline = Timeline()
    system = fault_system(CONFIG)
    delay_file = system.workdir / "store-delay"
    delay_file.write_text("0")
    system.env.update(
        TIERQ_POLICY__POOL_CONCURRENCY=str(POOL), TIERQ_POLICY__LEADER_TTL_S="2",
        TIERQ_POLICY__TIMEOUT_GRACE_S="1",
        # Webhooks may go to the soak's receivers (127.0.0.2) and nowhere else inside.
        TIERQ_WEBHOOK_ALLOW_NETWORKS=f'["{ALLOWED}/32"]',
        TIERQ_HANDLERS=f"{HANDLERS},tests.slow_store:HANDLERS",
        TIERQ_BLOB_URL=f"slowfile://{system.workdir / 'blobs'}",
        PYTHONPATH=f"{SOAK_SITE}{os.pathsep}{system.env['PYTHONPATH']}",
        **{STORE_DELAY_ENV: str(delay_file)})
    fleet = Fleet(system=system, timeline=timeline)
    receiver = Receiver(free_port(), lambda got, tries: 204, host=ALLOWED)
    load = ChaosLoad(url=system.url, tenants=start_fleet(fleet), seed=seed,
                     webhook_url=receiver.url)
    driver = FaultDriver(fleet=fleet, redis_server=fault_redis, pg=fault_pg,
                         rng=random.Random(seed), only=chosen_faults())
    driver.faults()  # an unknown name in TIERQ_CHAOS_FAULTS fails here, before any load
    try:
        load.start()
        try:
            driver.run(FAULT_PHASE_S)
        finally:
            fault_pg.resume()
            load.stop()
        timeline.log(f"faults over; {load.summary()}")
        fleet.heal(workers={"default": WORKERS, "gpu": GPU_WORKERS}, dispatchers=DISPATCHERS)
        found = client_violations(system, fleet, load, run_log, driver.driven)
        found += hung_jobs_timed_out(system.env["TIERQ_DATABASE_URL"], driver.hung_jobs)
        found += no_kind_unknown(system.env["TIERQ_DATABASE_URL"])
        found += driver.found
    except BaseException:
        sys.stderr.write(f"[chaos] seed {seed}\n{timeline.render()}\n")
        receiver.close()
        driver.close()
        raise
    try:
        found += events_delivered(system.env["TIERQ_DATABASE_URL"], load.submissions, receiver)
        if driver.receivers is not None:
            found += bad_webhooks_held(system.env["TIERQ_DATABASE_URL"], driver.hook_jobs,
                                       driver.receivers)
    finally:
        receiver.close()
        driver.close()
    jobs = check_invariants(
        system.env["TIERQ_DATABASE_URL"], load.accepted, tier_caps=TIER_CAPS,
        pool_caps={"gpu": GPU_CAPS}, kind_pools={TrackedGpuHandler.kind: "gpu"}, run_log=run_log,
        timeout=SETTLE_S, killed=fleet.killed, frozen=fleet.frozen,
        found=found, context=f"seed {seed} ({SEED_ENV}={seed})\n{load.summary()}\n"
                             f"{timeline.render()}",
    )
    timeline.log(f"settled: {summarise(jobs.values())}")


def start_fleet(fleet: Fleet) -> list[TenantLoad]:
    """The API, two dispatchers, the workers (registered), and the tenants' keys."""
    system = fleet.system
    system.start_api()
    for _ in range(DISPATCHERS):
        fleet.start_dispatcher()
    for _ in range(WORKERS):
        fleet.start_worker()
    for _ in range(GPU_WORKERS):
        fleet.start_worker(pool="gpu")
    wait_until(lambda: all("worker.registered" in w.log.read_text(errors="replace")
                           for w in fleet.workers), timeout=60)
    tenants = []
    for name, tier, gap in TENANTS:
        client = system.tenant(name, tier)
        key = client.headers["Authorization"].removeprefix("Bearer ")
        tenants.append(TenantLoad(name=name, tier=tier, api_key=key, mean_gap_s=gap))
    return tenants


def client_violations(
    system: System, fleet: Fleet, load: ChaosLoad, run_log: Path, driven: list[str]
) -> list[Violation]:
    """What the clients and the driver saw: answers an outage does not allow, processes
    that died by themselves, a job made twice or despite a 429, a clock skew not in effect.
    ``driven``: the jobs the fault driver submitted itself (not the load's)."""
    found = [Violation(invariant="API answers 2xx, 429 or 503", detail=a)
             for a in load.anomalies]
    found += [Violation(invariant="processes survive", detail=d) for d in fleet.died_unasked()]
    try:
        wait_until(lambda: probe_ready(system.url) == 200, timeout=30)
    except TimeoutError:
        found.append(Violation(invariant="processes survive", detail="/readyz not 200 at end"))
    found += submitted_once(system.env["TIERQ_DATABASE_URL"], load.submissions, driven)
    found += skew_in_effect(fleet, run_log)
    return found


def events_delivered(database_url: str, submissions: list[Submission],
                     receiver: Receiver) -> list[Violation]:
    """Each job that asked for its end to be posted and ended was posted ``job.completed``
    (at least once: a delivery whose record was lost is made again, under the same id), once
    every job has ended (waited for as long as the jobs are, plus a claim's lapse)."""
    asked = {s.job_id for s in submissions if s.job_id is not None and "webhook" in s.body}
    engine = sa.create_engine(database_url, poolclass=sa.NullPool)
    deadline = time.monotonic() + SETTLE_S + 60
    try:
        while True:
            with engine.connect() as conn:
                ended = {row.id for row in conn.execute(
                    sa.select(JobRow.id).where(JobRow.id.in_(asked),
                                               JobRow.finished_at.is_not(None)))}
            posted = {r.event["data"]["id"]: r.id for r in receiver.of_type("job.completed")}
            missing = ended - set(posted)
            if (not missing and len(ended) == len(asked)) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    finally:
        engine.dispose()
    pairs = {(r.event["data"]["id"], r.id) for r in receiver.of_type("job.completed")}
    twice = {job_id for job_id, n in Counter(job_id for job_id, _ in pairs).items() if n > 1}
    return ([Violation(invariant="a finished job's webhook event is delivered",
                       detail=f"{job_id}: ended, no job.completed posted", job_ids=(job_id,))
             for job_id in sorted(missing)]
            + [Violation(invariant="one event per ending",
                         detail=f"{job_id}: job.completed posted under several webhook-ids",
                         job_ids=(job_id,)) for job_id in sorted(twice)])


def hung_jobs_timed_out(database_url: str, job_ids: list[str]) -> list[Violation]:
    """Each job whose handler ignored every stop ended at its run-time limit: ``failed``,
    ``timed_out`` (waited for as long as the other jobs are)."""
    engine = sa.create_engine(database_url, poolclass=sa.NullPool)
    found = []
    try:
        deadline = time.monotonic() + SETTLE_S
        while True:
            with engine.connect() as conn:
                rows = conn.execute(sa.select(JobRow.id, JobRow.status, JobRow.error_type)
                                    .where(JobRow.id.in_(job_ids))).all() if job_ids else []
            if all(status in ("failed", "succeeded", "cancelled", "expired")
                   for _, status, _ in rows) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        engine.dispose()
    for job_id, status, error_type in rows:
        if (status, error_type) != ("failed", "timed_out"):
            found.append(Violation(invariant="a hung handler ends at its limit",
                                   detail=f"{job_id}: {status}, error_type {error_type}",
                                   job_ids=(job_id,)))
    return found


def no_kind_unknown(database_url: str) -> list[Violation]:
    """No job ended for reaching a worker without its kind's handler (the rolling deploy's
    worker): each went to one that runs it, or back uncharged."""
    engine = sa.create_engine(database_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(JobRow.id, JobRow.status, JobRow.error)
                                .where(JobRow.error.like("%unknown job kind%"))).all()
    finally:
        engine.dispose()
    return [Violation(invariant="a job reaches only a worker that runs its kind",
                      detail=f"{job_id}: {status}, {error}", job_ids=(job_id,))
            for job_id, status, error in rows]


def submitted_once(database_url: str, submissions: list[Submission],
                   driven: Iterable[str] = ()) -> list[Violation]:
    """Each row is one submission's: the job its client was answered with, never one that
    was refused (429) without doubt, never one no client sent (the driver's own, ``driven``,
    aside)."""
    by_key = {s.key: s for s in submissions}
    engine = sa.create_engine(database_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(JobRow.id, JobRow.idempotency_key, TenantRow.name)
                                .join(TenantRow, JobRow.tenant_id == TenantRow.id)).all()
    finally:
        engine.dispose()
    found = []
    for job_id, key, tenant in rows:
        if job_id in set(driven):
            continue
        sent = by_key.get(key or "")
        if sent is None or sent.tenant != tenant:
            detail, invariant = f"{job_id}: key {key!r} of {tenant}", "jobs come from clients"
        elif sent.job_id is not None and sent.job_id != job_id:
            detail, invariant = f"{key}: answered {sent.job_id}, row {job_id}", "submitted once"
        elif sent.refused and not sent.unsure:
            detail, invariant = f"{key}: answered {sent.answers}, row {job_id}", "429 is refusal"
        else:
            continue
        found.append(Violation(invariant=invariant, detail=detail, job_ids=(job_id,)))
    return found


def skew_in_effect(fleet: Fleet, run_log: Path) -> list[Violation]:
    """The skewed workers' runs saw their skew (the test's own set-up took effect)."""
    seen: dict[int, set[int]] = {}
    for runs in read_runs(run_log).values():
        for run in runs:
            if run.pid in fleet.skews:
                seen.setdefault(run.pid, set()).add(round(run.skew_s))
    for pid, skews in seen.items():
        fleet.timeline.log(f"skewed worker pid {pid} ran with clock skew {sorted(skews)} s")
    return [Violation(invariant="clock skew in effect",
                      detail=f"pid {pid}: asked {fleet.skews[pid]:+.0f} s, saw {sorted(s)}")
            for pid, s in seen.items() if any(abs(x - fleet.skews[pid]) > 5 for x in s)]


def summarise(jobs: Iterable[Job]) -> str:
    counts = Counter(job.status.value for job in jobs)
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
