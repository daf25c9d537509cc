"""``admit_new`` on Redis and on the twin: the same verdicts and the same figures.

The twin derives the bounds with ``jobs.core.policy``; the Lua script repeats that arithmetic in
doubles. Random pools, tiers, overrides, measured means and deadlines, over a random index
state (leases in flight, queued jobs, live workers), must give equal ``Admission`` values on
both, refusals and their figures included, so the script cannot drift from the policy.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.core import policy
from jobs.core.arrivals import Arrival, Work
from jobs.core.service_times import KindMean
from jobs.index import IndexedJob, MemoryIndex, RedisIndex
from jobs.index.base import Admission, AdmissionTerms, DispatchIndex, refusal_minute
from jobs.index.keys import IndexKeys

pytestmark = pytest.mark.integration

NOW = 1_900_000_000.0

shares = st.sampled_from([0.01, 0.04, 0.1, 0.25, 1 / 3, 0.5, 0.7, 1.0])
means = st.sampled_from([0.001, 0.1, 0.3, 1.0, 2.5, 6.0, 7.0, 60.0])
waits = st.sampled_from([0.5, 1.0, 2.0, 5.0, 7.0, 20.0, 60.0, 300.0, 3600.0])


@st.composite
def scenes(draw: Any) -> dict[str, Any]:
    tier = policy.Tier(
        name="std", base_priority=10, max_wait_s=draw(waits), tenant_share=draw(shares),
        queued_share=draw(st.none() | shares),
    )
    rate = draw(st.none() | st.sampled_from([policy.RateLimit(rate_per_s=0.5, burst=1),
                                             policy.RateLimit(rate_per_s=3.0, burst=4)]))
    terms = AdmissionTerms(
        now=NOW + draw(st.integers(0, 3)),
        tier=tier,
        mean_service_s=draw(means),
        service_samples_min=draw(st.sampled_from([1, 20])),
        client_timeout_s=draw(st.none() | waits),
        pool_concurrency=draw(st.none() | st.integers(1, 40)),
        rate=rate,
        tenant_cap=draw(st.none() | st.integers(1, 5)),
        tenant_quota=draw(st.none() | st.integers(1, 8)),
        max_wait_s=draw(st.none() | waits),
        passing=draw(st.sampled_from([0.0, 0.4, 3.0, 17.5, 500.0, 4000.0])),
    )
    return {
        "terms": terms,
        "workers": draw(st.lists(st.integers(0, 8), max_size=3)),
        "measured": draw(st.none() | st.tuples(means, st.integers(0, 40))),
        "queued": draw(st.lists(st.sampled_from(["a", "b"]), max_size=12)),
        "leased": draw(st.integers(0, 6)),
        "submits": draw(st.integers(1, 4)),
    }


def _set_scene(index: DispatchIndex, scene: dict[str, Any], client: redis.Redis,
               prefix: str) -> None:
    index.clear()
    for i, slots in enumerate(scene["workers"]):
        index.register_worker(f"w{i}", slots=slots, ttl_s=60, now=NOW)
    index.register_worker("gone", slots=50, ttl_s=1, now=NOW - 10)  # expired: not counted
    for i, tenant in enumerate(scene["queued"]):
        index.requeue(IndexedJob(job_id=f"q{i:02d}", tenant=tenant, tier="std",
                                 order_key=NOW + 60 + i))
    index.dispatch(scene["leased"], lease_ttl_s=600, now=NOW)
    measured = scene["measured"]
    if isinstance(index, MemoryIndex):
        index.service_mean = None if measured is None else (float(measured[0]), measured[1])
    elif measured is not None:
        client.hset(IndexKeys(prefix).service_mean,
                    mapping={"mean_s": repr(float(measured[0])), "samples": measured[1]})


def _verdicts(index: DispatchIndex, scene: dict[str, Any]) -> list[Admission]:
    terms: AdmissionTerms = scene["terms"]
    out = []
    for n in range(scene["submits"]):
        job = IndexedJob(job_id=f"new{n}", tenant="a", tier="std", order_key=NOW + 61.5 + n,
                         start_by=None if terms.max_wait_s is None else NOW + terms.max_wait_s)
        out.append(index.admit_new(job, terms))
    out.append(index.admit_new(IndexedJob(job_id="new0", tenant="a", tier="std",
                                          order_key=NOW + 61.5), terms))  # a replay
    return out


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scene=scenes())
def test_the_script_decides_as_the_policy_does(
    scene: dict[str, Any], redis_client: redis.Redis, key_prefix: str
) -> None:
    real, twin = RedisIndex(redis_client, key_prefix), MemoryIndex()
    _set_scene(real, scene, redis_client, key_prefix)
    _set_scene(twin, scene, redis_client, key_prefix)
    assert _verdicts(real, scene) == _verdicts(twin, scene)
    minutes = [refusal_minute(NOW), refusal_minute(NOW + 3)]
    assert real.refusal_counts(minutes) == twin.refusal_counts(minutes)


def test_a_refusal_for_the_rate_takes_nothing_else(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    for index in (RedisIndex(redis_client, key_prefix), MemoryIndex()):
        terms = AdmissionTerms(
            now=NOW, tier=policy.Tier(name="std", base_priority=0, max_wait_s=60,
                                      tenant_share=0.5),
            mean_service_s=1.0, service_samples_min=20, pool_concurrency=4,
            rate=policy.RateLimit(rate_per_s=2.0, burst=1),
        )
        first = index.admit_new(IndexedJob(job_id=f"j-{uuid.uuid4()}", tenant="a", tier="std",
                                           order_key=NOW), terms)
        second = index.admit_new(IndexedJob(job_id="j2", tenant="a", tier="std",
                                            order_key=NOW + 1), terms)
        assert first.accepted and first.bound == 240 and first.quota == 120
        assert (second.accepted, second.reason, second.position) == (False, "rate", 1)
        assert second.next_token_s == pytest.approx(0.5)
        assert index.tenant_queued("a") == 1
        # Counted for its tier and its tenant, in its minute only.
        assert index.refusal_counts([refusal_minute(NOW)]) == {
            ("tier", "std", "rate"): 1, ("tenant", "a", "rate"): 1}
        assert index.refusal_counts([refusal_minute(NOW) + 1]) == {}


def _submit(index: DispatchIndex, job_id: str, tenant: str, at: AdmissionTerms) -> Admission:
    return index.admit_new(IndexedJob(job_id=job_id, tenant=tenant, tier="std",
                                      order_key=at.now), at)


def test_refusals_are_counted_by_tier_tenant_reason_and_minute(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    tier = policy.Tier(name="std", base_priority=0, max_wait_s=2, tenant_share=0.5)
    for index in (RedisIndex(redis_client, key_prefix), MemoryIndex()):
        index.clear()
        # One slot, 1 s a job, 2 s useful: the bound is 2 and the quota 1 (share 0.5).
        terms = AdmissionTerms(now=NOW, tier=tier, mean_service_s=1.0, service_samples_min=20,
                               pool_concurrency=1)
        later = AdmissionTerms(now=NOW + 60, tier=tier, mean_service_s=1.0,
                               service_samples_min=20, pool_concurrency=1)

        assert _submit(index, "a1", "a", terms).accepted
        assert _submit(index, "a1", "a", terms).duplicate  # a replay is no refusal
        assert _submit(index, "a2", "a", terms).reason == "tenant_limit"
        assert _submit(index, "b1", "b", terms).accepted
        assert _submit(index, "b2", "b", terms).reason == "capacity"
        assert _submit(index, "b3", "b", later).reason == "capacity"
        first, second = refusal_minute(NOW), refusal_minute(NOW + 60)
        assert index.refusal_counts([first]) == {
            ("tier", "std", "tenant_limit"): 1, ("tenant", "a", "tenant_limit"): 1,
            ("tier", "std", "capacity"): 1, ("tenant", "b", "capacity"): 1}
        assert index.refusal_counts([first, second]) == {
            ("tier", "std", "tenant_limit"): 1, ("tenant", "a", "tenant_limit"): 1,
            ("tier", "std", "capacity"): 2, ("tenant", "b", "capacity"): 2}
        assert index.refusal_counts([]) == {}


def _hold_a_at_its_cap(index: DispatchIndex, tier: policy.Tier) -> AdmissionTerms:
    """Four slots at 4 s; tenant a runs one job at its cap of 1 (share 0.25) and queues four
    more one second apart (a quota of 10), so three slots stay free. The terms it used."""
    index.clear()
    terms = AdmissionTerms(now=NOW, tier=tier, mean_service_s=4.0, service_samples_min=20,
                           pool_concurrency=4, tenant_quota=10)
    assert _submit(index, "a1", "a", terms).accepted
    assert [lease.job_id for lease in index.dispatch(4, lease_ttl_s=600, now=NOW)] == ["a1"]
    for n in range(4):
        assert _submit(index, f"a{n + 2}", "a", replace(terms, now=NOW + 1 + n)).accepted
    return terms


def test_a_tier_at_its_bound_with_a_free_slot_refuses_only_for_a_tenants_own_cap(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Four slots, one busy; the tier's queue (its bound of 4: the slots floor Little's law's
    2) holds four jobs of tenants at their cap of 1, so three slots stay free. A tenant at its
    cap is refused for that cap, never for capacity; another tenant's job is let past the
    bound, since it starts at once; once the free slots are fewer than the tenants with a
    runnable job, the bound holds again."""
    tier = policy.Tier(name="std", base_priority=0, max_wait_s=2, tenant_share=0.25)
    for index in (RedisIndex(redis_client, key_prefix), MemoryIndex()):
        terms = _hold_a_at_its_cap(index, tier)
        assert index.dispatch(4, lease_ttl_s=600, now=NOW) == []

        capped = _submit(index, "a9", "a", terms)
        assert (capped.accepted, capped.reason, capped.bound) == (False, "cap", 4)
        assert (capped.tier_queued, capped.tenant_inflight, capped.inflight) == (4, 1, 1)
        past = _submit(index, "b1", "b", terms)
        assert past.accepted and past.tier_queued == 5 and past.bound == 4
        assert _submit(index, "c1", "c", terms).accepted  # 3 free slots, 1 tenant ready (b)
        assert _submit(index, "d1", "d", terms).accepted  # 3 free slots, 2 ready (b, c)
        full = _submit(index, "e1", "e", terms)  # 3 free slots, 3 ready (b, c, d): it waits
        assert (full.accepted, full.reason) == (False, "capacity")
        assert index.refusal_counts([refusal_minute(NOW)]) == {
            ("tier", "std", "cap"): 1, ("tenant", "a", "cap"): 1,
            ("tier", "std", "capacity"): 1, ("tenant", "e", "capacity"): 1}


def test_a_page_of_places_is_each_jobs_position_and_runnable_ahead(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """``places`` answers for a page of jobs what ``position`` and ``runnable_ahead`` answer
    for one: a's jobs wait on its cap and start ahead of nobody, b's one starts ahead of c's.
    A leased job and an unknown one are left out; with no free slot nothing is runnable."""
    tier = policy.Tier(name="std", base_priority=0, max_wait_s=60, tenant_share=0.25)
    for index in (RedisIndex(redis_client, key_prefix), MemoryIndex()):
        terms = _hold_a_at_its_cap(index, tier)
        assert _submit(index, "b1", "b", replace(terms, now=NOW + 10)).accepted
        assert _submit(index, "c1", "c", replace(terms, now=NOW + 11)).accepted
        page = [("a1", NOW), ("a2", NOW + 1), ("b1", NOW + 10), ("c1", NOW + 11),
                ("nobody", NOW)]
        assert index.places(page, free_slots=3) == {
            "a2": (0, 0), "b1": (4, 0), "c1": (5, 1)}
        for job_id, key in page[1:4]:
            assert index.places([(job_id, key)], free_slots=3)[job_id] == (
                index.position(job_id), index.runnable_ahead(job_id, key, limit=3))
        assert index.places(page, free_slots=0) == {
            "a2": (0, 0), "b1": (4, 0), "c1": (5, 0)}
        assert index.places([], free_slots=3) == {}


def test_runnable_ahead_counts_to_its_limit_across_tenants_with_room_to_spare(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Two tenants with caps far above their queues: the jobs ahead that take free slots are
    counted from the first tenant's head, then the next tenant's, to the limit; the job left
    out is never one of them, wherever it stands."""
    for index in (RedisIndex(redis_client, key_prefix), MemoryIndex()):
        index.set_caps({"free": 1_000})
        for tenant, first in (("a", 0.0), ("b", 0.5)):
            index.requeue_many(IndexedJob(job_id=f"{tenant}{i}", tenant=tenant, tier="free",
                                          order_key=first + i) for i in range(8))
        assert index.runnable_ahead("", 100.0, limit=3) == 3
        assert index.runnable_ahead("", 100.0, limit=11) == 11
        assert index.runnable_ahead("", 100.0, limit=40) == 16
        assert index.runnable_ahead("a0", 100.0, limit=40) == 15
        assert index.runnable_ahead("a0", 2.0, limit=40) == 4  # a1, a2, b0, b1
        assert index.runnable_ahead("b0", 2.0, limit=3) == 3


def test_jobs_waiting_on_their_tenants_caps_do_not_start_ahead(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Four slots, a's cap of 1 holds one and keeps four of its jobs queued: three slots stay
    free. A job of another tenant is four jobs back in the queue but starts at once: none of
    a's jobs ahead of it can take a free slot (``starts_ahead`` 0), so its max_wait_s of an
    eighth of a service time does not refuse it. The next tenant's job has b's ahead of it,
    which can; once the jobs that can start fill the free slots, every job ahead counts
    again."""
    tier = policy.Tier(name="std", base_priority=0, max_wait_s=60, tenant_share=0.25)
    for index in (RedisIndex(redis_client, key_prefix), MemoryIndex()):
        terms = replace(_hold_a_at_its_cap(index, tier), max_wait_s=0.5)
        b1 = _submit(index, "b1", "b", replace(terms, now=NOW + 10))
        assert (b1.accepted, b1.position, b1.starts_ahead, b1.max_position) == (True, 4, 0, 2)
        c1 = _submit(index, "c1", "c", replace(terms, now=NOW + 11))
        assert (c1.accepted, c1.position, c1.starts_ahead) == (True, 5, 1)
        assert index.runnable_ahead("b1", NOW + 10, limit=3) == 0
        assert index.runnable_ahead("c1", NOW + 11, limit=3) == 1
        assert index.runnable_ahead("c1", NOW + 11, limit=1) == 1
        assert index.runnable_ahead("c1", NOW + 11, limit=0) == 0
        d1 = _submit(index, "d1", "d", replace(terms, now=NOW + 12))
        assert (d1.accepted, d1.starts_ahead) == (True, 2)
        late = _submit(index, "e1", "e", replace(terms, now=NOW + 13))  # b, c, d fill 3 slots
        assert (late.accepted, late.reason, late.position, late.starts_ahead) == (
            False, "deadline", 7, 7)
        started = [lease.job_id for lease in index.dispatch(4, lease_ttl_s=600, now=NOW + 14)]
        assert started == ["b1", "c1", "d1"]


def test_the_published_work_reads_the_same(redis_client: redis.Redis, key_prefix: str) -> None:
    real, twin = RedisIndex(redis_client, key_prefix), MemoryIndex()
    assert real.work() == twin.work() == Work()
    work = Work(arrivals={"premium": Arrival(rate_per_s=5.5, weight=1.0),
                          "standard": Arrival(rate_per_s=0.25, weight=0.004)},
                running_mean_s=42.5,
                kinds={"eval": KindMean(mean_s=60.0, spread_s=12.5, samples=200)})
    published = {**work.fields(NOW), "tier:odd": "nan 1.0", "tier:bad": "1", "tier:no": "x y"}
    kinds = {**Work.kind_fields(work.kinds), "broken": "1 2"}
    redis_client.hset(IndexKeys(key_prefix).arrivals, mapping=published)
    redis_client.hset(IndexKeys(key_prefix).kind_means, mapping=kinds)
    twin.published_work, twin.published_kinds = published, kinds
    assert real.work() == twin.work() == work
    assert work.later_rates() == {"premium": 5.5, "standard": 0.25 * 0.004}
    assert work.kind_means(samples_min=20) == {"eval": 60.0}
    assert work.kind_means(samples_min=201) == {}
