"""Model-based test: MemoryIndex and RedisIndex, driven side by side, never disagree.

Random interleavings of every operation (and of time passing) run against both; each step's
result and, after each step, every observable count and position must be identical. The
hypothesis machine explores short runs and shrinks a failure; a few long seeded walks reach
the deep states (many leases, blocked tenants, caps changing under them) that short runs
reach rarely.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from jobs.index import DispatchIndex, IndexedJob, MemoryIndex, RedisIndex
from tests.services import RedisServer, delete_prefixed

pytestmark = pytest.mark.integration

TENANTS = ["a", 'q:"x\\', "\u00e9t\u00e9"]
TIERS = ["free", "t:{x}"]
JOB_IDS = [f"j{i}" for i in range(7)] + ["J", "j1x", "\u00e91"]
WORKERS = ["w1", "w2", "w3"]

# A job belongs to one tenant for life (its row's), so a call names it with that tenant.
TENANT_OF = {job: TENANTS[i % len(TENANTS)] for i, job in enumerate(JOB_IDS)}

keys = st.sampled_from([0.0, 1.0, 1.5, 2.0]) | st.floats(allow_nan=False)
# Mostly none, so that most jobs are runnable and few expire at once.
moments = st.one_of(
    st.none(), st.none(), st.none(), st.sampled_from([5.0, 10.0]), st.floats(0.0, 60.0)
)
jobs = st.sampled_from(JOB_IDS).flatmap(lambda job_id: st.builds(
    IndexedJob,
    job_id=st.just(job_id),
    tenant=st.just(TENANT_OF[job_id]),
    tier=st.sampled_from(TIERS),
    order_key=keys,
    start_by=moments,
    not_before=moments,
))
caps = st.sampled_from([1, 2, 3, 1, 2, 3, 0])  # now and then a 0, which is refused


def outcome(call: Callable[[DispatchIndex], Any], index: DispatchIndex) -> Any:
    """The call's result, or the type of the error it raised."""
    try:
        return call(index)
    except ValueError as error:
        return type(error)


class IndexPair(RuleBasedStateMachine):
    server: RedisServer

    def __init__(self) -> None:
        super().__init__()
        self.client = self.server.client()
        self.prefix = f"{{tierq-test-{uuid.uuid4().hex[:12]}}}:"
        self.redis = RedisIndex(self.client, self.prefix)
        self.memory = MemoryIndex()
        self.now = 0.0
        self.leased: list[str] = []  # ids dispatched so far (some since released or reaped)

    def teardown(self) -> None:
        delete_prefixed(self.client, self.prefix)
        self.client.close()

    def both(self, call: Callable[[DispatchIndex], Any]) -> Any:
        expected = outcome(call, self.memory)
        actual = outcome(call, self.redis)
        assert actual == expected
        return expected

    @initialize(batch=st.lists(jobs, max_size=8))
    def rebuild(self, batch: list[IndexedJob]) -> None:
        for job in batch:
            self.both(lambda index, job=job: index.requeue(job))
        self.both(lambda index: index.set_generation("1"))  # rebuilt: the index is whole

    @rule(whole=st.sampled_from([True, True, False]))
    def lose_or_rebuild(self, whole: bool) -> None:
        """The sentinel comes and goes as the index loses its data and is rebuilt: while it
        is gone, the fast paths lease nothing."""
        self.both(lambda index: index.set_generation("1" if whole else None))

    @rule(
        batch=st.lists(jobs, min_size=1, max_size=3),
        bound=st.sampled_from([100, 100]) | st.integers(0, 8),
        quota=st.none() | st.integers(0, 4),
    )
    def admit(self, batch: list[IndexedJob], bound: int, quota: int | None) -> None:
        for job in batch:
            self.both(
                lambda index, job=job: index.admit(job, bound=bound, tenant_quota=quota)
            )

    @rule(job=jobs)
    def requeue(self, job: IndexedJob) -> None:
        self.both(lambda index: index.requeue(job))

    @rule(n=st.integers(-1, 6), ttl=st.sampled_from([1.0, 5.0, 30.0]))
    def dispatch(self, n: int, ttl: float) -> None:
        leases = self.both(lambda index: index.dispatch(n, now=self.now, lease_ttl_s=ttl))
        self.leased.extend(lease.job_id for lease in leases)

    @rule(
        data=st.data(),
        renew_for=st.none() | st.sampled_from([0.0, 2.0, 20.0]),
        any_id=st.booleans(),
    )
    def finish(self, data: st.DataObject, renew_for: float | None, any_id: bool) -> None:
        """Release or renew a lease: mostly one dispatched earlier, now and then any id."""
        ids = JOB_IDS if any_id or not self.leased else self.leased
        job_id = data.draw(st.sampled_from(ids))
        if renew_for is None:
            self.both(lambda index: index.release(job_id))
        else:
            until = self.now + renew_for
            self.both(lambda index: index.renew(job_id, attempt=1, ttl_s=until, now=0.0))

    @rule(job_id=st.sampled_from(JOB_IDS), named=st.booleans())
    def cancel(self, job_id: str, named: bool) -> None:
        """Named: with its tenant, as the API cancels; else as a stray entry is removed."""
        tenant = TENANT_OF[job_id] if named else None
        self.both(lambda index: index.cancel(job_id, tenant=tenant))

    @rule(
        dt=st.sampled_from([0.0, 0.5, 1.0, 3.0, 10.0]),
        reap=st.integers(0, 5),
        expire=st.integers(0, 5),
    )
    def tick(self, dt: float, reap: int, expire: int) -> None:
        """Time passes, then the reaper and the expiry sweeper run (a limit of 0: nothing)."""
        self.now += dt
        self.both(lambda index: index.reap(now=self.now, limit=reap))
        self.both(lambda index: index.expire_due(now=self.now, limit=expire))

    @rule(
        tier_caps=st.dictionaries(st.sampled_from(TIERS), caps, max_size=3),
        tenant_caps=st.none() | st.dictionaries(st.sampled_from(TENANTS), caps, max_size=3),
    )
    def set_caps(self, tier_caps: dict[str, int], tenant_caps: dict[str, int] | None) -> None:
        self.both(lambda index: index.set_caps(tier_caps, tenant_caps))

    @rule(
        worker=st.sampled_from(WORKERS),
        slots=st.integers(0, 4),
        ttl=st.none() | st.floats(0.0, 20.0),
    )
    def heartbeat(self, worker: str, slots: int, ttl: float | None) -> None:
        if ttl is None:
            self.both(lambda index: index.unregister_worker(worker))
        else:
            until = self.now + ttl
            self.both(
                lambda index: index.register_worker(worker, slots=slots, ttl_s=until, now=0.0)
            )

    @invariant()
    def same_view(self) -> None:
        self.both(lambda index: index.inflight())
        self.both(lambda index: index.tier_depths(TIERS))
        self.both(lambda index: index.pool_capacity(now=self.now))
        for tenant in TENANTS:
            self.both(
                lambda index, t=tenant: (index.tenant_inflight(t), index.tenant_queued(t))
            )
        self.both(lambda index: [index.position(job_id) for job_id in JOB_IDS])


@pytest.mark.timeout(600)
def test_memory_twin_matches_redis(redis_server: RedisServer) -> None:
    IndexPair.server = redis_server
    run_state_machine_as_test(
        IndexPair,
        settings=settings(
            max_examples=100, stateful_step_count=40, deadline=None, database=None
        ),
    )


def random_job(rng: random.Random) -> IndexedJob:
    def moment() -> float | None:
        return None if rng.random() < 0.7 else rng.choice([5.0, 10.0, rng.uniform(0, 60)])

    job_id = rng.choice(JOB_IDS)
    return IndexedJob(
        job_id=job_id, tenant=TENANT_OF[job_id], tier=rng.choice(TIERS),
        order_key=rng.choice([0.0, 1.0, 1.5, 2.0, rng.uniform(-5, 5)]),
        start_by=moment(), not_before=moment(),
    )


def random_step(pair: IndexPair, rng: random.Random) -> None:
    """One operation, drawn with weights that keep work flowing through the index."""
    op = rng.choices(
        ["admit", "requeue", "dispatch", "release", "renew", "cancel", "tick", "caps"],
        weights=[6, 2, 6, 5, 1, 1, 2, 1],
    )[0]
    if op in ("admit", "requeue"):
        job, bound = random_job(rng), rng.choice([100, 100, 100, rng.randint(0, 8)])
        quota = rng.choice([None, None, rng.randint(0, 4)])
        if op == "admit":
            pair.both(lambda index: index.admit(job, bound=bound, tenant_quota=quota))
        else:
            pair.both(lambda index: index.requeue(job))
    elif op == "dispatch":
        pair.dispatch(rng.randint(-1, 6), rng.choice([1.0, 5.0, 30.0]))
    elif op in ("release", "renew", "cancel"):
        job_id = rng.choice(pair.leased if pair.leased and rng.random() < 0.8 else JOB_IDS)
        until = pair.now + rng.choice([0.0, 2.0, 20.0])
        if op == "release":
            pair.both(lambda index: index.release(job_id))
        elif op == "renew":
            pair.both(lambda index: index.renew(job_id, attempt=1, ttl_s=until, now=0.0))
        else:
            tenant = TENANT_OF[job_id] if rng.random() < 0.5 else None
            pair.both(lambda index: index.cancel(job_id, tenant=tenant))
    elif op == "tick":
        pair.tick(rng.choice([0.0, 0.5, 1.0, 3.0, 10.0]), rng.randint(0, 5), rng.randint(0, 5))
    else:
        tier_caps = {tier: rng.choice([1, 1, 2, 3, 0]) for tier in rng.sample(TIERS, 1)}
        tenants = rng.sample(TENANTS, rng.randint(0, 2))
        tenant_caps = rng.choice([None, {tenant: rng.randint(1, 3) for tenant in tenants}])
        pair.both(lambda index: index.set_caps(tier_caps, tenant_caps))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", range(3))
def test_long_walks_match(redis_server: RedisServer, seed: int) -> None:
    IndexPair.server = redis_server
    pair = IndexPair()
    rng = random.Random(seed)
    try:
        for _ in range(800):
            random_step(pair, rng)
            pair.same_view()
    finally:
        pair.teardown()
