"""The in-memory twin of ``RedisIndex``: same behaviour, step for step, for the simulator
and for model-based tests. It mirrors the Lua scripts' data layout (see ``keys.py``) with
the sorted sets of ``zset.py``, ordered like Redis's: ascending score, ties by member bytes
(code point order of a ``str`` is the byte order of its UTF-8). The sets whose order no step
walks (the lease table, a tenant's leases, a tier's queued jobs) are plain dicts of member to
score, sorted only where one is read in order (``reap``).

The choices the protocol leaves open are the ones ``redis_index.py`` documents: delayed
jobs are counted but not positioned nor dispatched before their ``not_before``; ``requeue``
replaces any entry of the same id (a lease included); ``set_caps`` merges tier caps and
replaces tenant overrides (``None`` clears them); caps below 1 raise ``ValueError``.
The leader lock expires on the ``now`` passed in (Redis uses its own clock); ``clear``
forgets it with everything else, as a flushed Redis does. A ``now`` left out is the twin's
``clock`` (Redis's ``TIME`` in the real index), injected so the simulator runs on virtual time.

The twin is built in layers: its state and shared steps (``memory_layout.py``), the lease
table and worker registry (``memory_leases.py``), upkeep (``memory_upkeep.py``); the queue and
admission are here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from jobs.core import policy
from jobs.core.policy import Tier
from jobs.index.keys import PROMOTE_LIMIT
from jobs.index.memory_layout import check_scores, frozen_value
from jobs.index.memory_leases import MemoryLeases
from jobs.index.memory_upkeep import MemoryUpkeep
from jobs.index.values import (
    REFUSAL_BUCKET_S,
    REFUSALS_KEEP_S,
    Admission,
    AdmissionTerms,
    Admitted,
    IndexedJob,
    Lease,
    MessagePush,
    TierDepth,
    TierPush,
    refusal_minute,
)

__all__ = ["MemoryIndex"]

# What an admission decided: accepted, reason, tier queued, tenant queued, position, duplicate
# (the fields of ``Admitted``).
_Decision = tuple[bool, str | None, int, int, int, bool]


class MemoryIndex(MemoryLeases, MemoryUpkeep):
    """``DispatchIndex`` in process memory (not thread-safe; one owner at a time)."""

    def pool(self) -> MemoryIndex:
        """The twin of another pool of this index's fleet (``jobs.core.pools``): an index
        of its own that shares this one's leader lock and tenants' rate buckets, as a pool's
        ``RedisIndex`` shares the root prefix's keys."""
        other = MemoryIndex(clock=self.clock)
        other._shares_fleet = True
        other._fleet = self._fleet
        return other

    def admit(
        self,
        job: IndexedJob,
        *,
        bound: int,
        tenant_quota: int | None = None,
        max_position: int | None = None,
        fence: str | None = None,
    ) -> Admitted:
        self._check_fence(fence, None, "admit")
        check_scores(job)
        accepted, reason, tier_queued, queued, position, duplicate = self._admit(
            job, bound, tenant_quota, max_position)
        return Admitted(accepted=accepted, tier_queued=tier_queued, tenant_queued=queued,
                        position=position, reason=reason, duplicate=duplicate)

    def _admit(self, job: IndexedJob, bound: int, tenant_quota: int | None,
               max_position: int | None) -> _Decision:
        """``admit`` past its checks, as a plain tuple: ``admit_new`` answers with figures
        of its own, and needs no ``Admitted`` in between."""
        tier_queued = len(self._tiers.get(job.tier, ()))
        queued = self.tenant_queued(job.tenant)
        known = self._meta.get(job.job_id)
        if known is not None:
            position = self._queued.rank(job.job_id)
            if position is None:
                delayed = self._delayed.score(job.job_id) is not None
                position = self._queued.rank_at(known.order_key, job.job_id) if delayed else 0
            return True, None, tier_queued, queued, position, True
        reason = None
        if tier_queued >= bound:
            reason = "capacity"
        elif tenant_quota is not None and queued >= tenant_quota:
            reason = "tenant_limit"
        ahead = self._queued.rank_at(job.order_key, job.job_id)
        if reason is None and max_position is not None and ahead > max_position:
            reason = "deadline"
        if reason is not None:
            return False, reason, tier_queued, queued, ahead, False
        self._index(job if job.attempt == 1 else dataclasses.replace(job, attempt=1))
        # Its rank now (queued) or the rank it will have (delayed): the jobs before it.
        return True, None, tier_queued + 1, queued + 1, ahead, False

    def admit_new(self, job: IndexedJob, terms: AdmissionTerms) -> Admission:
        admission = self._admit_new(job, terms)
        if not admission.accepted and admission.reason is not None:
            self._count_refusal(job, admission.reason, now=terms.now)
        return admission

    def _count_refusal(self, job: IndexedJob, reason: str, *, now: float) -> None:
        minute = refusal_minute(now)
        if minute != self._refused_minute:  # the last count's sweep left none to lapse
            self._refused_minute = minute
            kept = minute - REFUSALS_KEEP_S // REFUSAL_BUCKET_S
            for old in [m for m in self._refusals if m < kept]:  # EXPIRE's twin
                del self._refusals[old]
        bucket = self._refusals.setdefault(minute, {})
        for key in (("tier", job.tier, reason), ("tenant", job.tenant, reason)):
            bucket[key] = bucket.get(key, 0) + 1

    def refusal_counts(self, minutes: Sequence[int]) -> dict[tuple[str, str, str], int]:
        counts: dict[tuple[str, str, str], int] = {}
        for minute in minutes:
            for key, count in self._refusals.get(minute, {}).items():
                counts[key] = counts.get(key, 0) + count
        return counts

    def _admit_new(self, job: IndexedJob, terms: AdmissionTerms) -> Admission:
        check_scores(job)
        duplicate = job.job_id in self._meta
        if terms.rate is not None and not duplicate:
            bucket = self._fleet.buckets.take(job.tenant, rate_per_s=terms.rate.rate_per_s,
                                              burst=terms.rate.burst, now=terms.now)
            if not bucket.allowed:
                ahead = self._ahead_of_new(job.order_key)
                return Admission(
                    accepted=False, reason="rate", duplicate=False, position=ahead,
                    tier_queued=0, tenant_queued=0, tenant_inflight=0, capacity=0,
                    inflight=0, measured=None, next_token_s=bucket.retry_after_s,
                    bound=0, quota=0, max_position=None, starts_ahead=ahead)
        measured = self.service_mean
        if measured is not None and not (math.isfinite(measured[0]) and measured[0] >= 0):
            measured = None
        mean = terms.mean_service_s
        if measured is not None and measured[1] >= terms.service_samples_min:
            mean = max(0.001, measured[0])
        capacity = terms.pool_concurrency or self.pool_capacity(now=terms.now)
        # ``_held_slots`` and ``tenant_inflight``, read in place: this runs per submit.
        inflight = len(self._leases) - len(self._ending)
        tenant_inflight = len(self._tenant_leases.get(job.tenant, ()))
        mu, bound, quota, cap = self._tier_figures(terms.tier, capacity, mean,
                                                   terms.client_timeout_s)
        if terms.tenant_quota is not None:
            quota = terms.tenant_quota
        if terms.tenant_cap is not None:
            cap = terms.tenant_cap
        max_position = None
        decision: _Decision | None = None
        if terms.max_wait_s is not None:
            max_position = policy.latest_useful_position(
                terms.max_wait_s, max(0, capacity - inflight), mu,
                passing=terms.passing)
            if not duplicate:
                decision = self._late_for_tenant(job, terms.max_wait_s, cap, capacity, mean,
                                                 tenant_inflight)
        admit_bound = bound
        if decision is None and not duplicate:
            decision, admit_bound = self._room(job, bound, cap, capacity - inflight,
                                               tenant_inflight)
        runnable: int | None = None  # as admit_new.lua: a new job that finds a free slot
        if decision is None:
            if not duplicate:
                free = max(0, capacity - inflight)
                ahead = self._runnable_ahead(job.order_key, free, None)
                if ahead < free:
                    runnable = ahead
            if job.not_before is not None:
                job = dataclasses.replace(job, not_before=None)
            decision = self._admit(job, admit_bound, quota,
                                   max_position if runnable is None else None)
        accepted, reason, tier_queued, tenant_queued, position, duplicate = decision
        return frozen_value(
            Admission, accepted=accepted, reason=reason, duplicate=duplicate, position=position,
            tier_queued=tier_queued, tenant_queued=tenant_queued,
            tenant_inflight=tenant_inflight, capacity=capacity, inflight=inflight,
            measured=measured, next_token_s=0.0, bound=bound, quota=quota,
            max_position=max_position, starts_ahead=position if runnable is None else runnable)

    def _tier_figures(self, tier: Tier, capacity: int, mean: float,
                      client_timeout_s: float | None) -> tuple[float, int, int, int]:
        """The policy's μ, the tier's bound and its tenants' default quota and cap on this
        pool; kept per tier while the pool and its mean stay the same, as they do for many
        admissions in a row."""
        kept = self._figured.get(tier.name)
        if kept is not None and kept[0] is tier and kept[1] == (capacity, mean,
                                                                  client_timeout_s):
            return kept[2]
        mu = policy.service_rate(capacity, mean)
        bound = policy.queue_bound(tier, mu, client_timeout_s, capacity=capacity)
        figures = (mu, bound, policy.tenant_quota(tier, bound), policy.tenant_cap(tier, capacity))
        self._figured[tier.name] = (tier, (capacity, mean, client_timeout_s), figures)
        return figures

    def _room(self, job: IndexedJob, bound: int, cap: int, free: int,
              tenant_inflight: int) -> tuple[_Decision | None, int]:
        """As admit_new.lua: a tier at its bound while a slot is free waits on its tenants'
        caps, not on the pool. A tenant at its own cap is refused for it ('cap'); another's
        job is let past the bound while more slots are free than tenants have a job
        runnable. The refusal, if any, and the bound to admit under."""
        tier_queued = len(self._tiers.get(job.tier, ()))
        if tier_queued < bound or free <= 0:
            return None, bound
        if tenant_inflight >= cap:
            return (False, "cap", tier_queued, self.tenant_queued(job.tenant),
                    self._ahead_of_new(job.order_key), False), bound
        return None, tier_queued + 1 if free > len(self._runnable) else bound

    def _late_for_tenant(self, job: IndexedJob, max_wait_s: float, cap: int, capacity: int,
                         mean: float, tenant_inflight: int) -> _Decision | None:
        """The refusal of a job its own tenant's cap would start too late (None: in time)."""
        max_excess = policy.latest_useful_excess(
            max_wait_s, policy.tenant_rate(cap, capacity, mean))
        queued = self.tenant_queued(job.tenant)
        load = policy.TenantLoad(cap=cap, inflight=tenant_inflight, ahead=queued)
        if max_excess is None or load.excess <= max_excess:
            return None
        return (False, "deadline", len(self._tiers.get(job.tier, ())), queued,
                self._ahead_of_new(job.order_key), False)

    def _runnable_ahead(self, order_key: float, limit: int, exclude: str | None) -> int:
        """common.lua's ``runnable_ahead``: the jobs at or below ``order_key`` that tenants
        below their caps can start on free slots, ``exclude`` left out, at most ``limit``."""
        if limit <= 0:
            return 0
        count = 0
        for head, _ in self._runnable.upto(order_key, limit):
            meta = self._meta.get(head)
            if meta is None:  # as the script: a head without its meta counts nothing
                continue
            tenant = meta.tenant
            queue = self._queues[tenant]
            ahead = queue.rank_at(order_key, "\U0010ffff")
            if exclude is not None and queue.score(exclude) is not None:
                ahead -= 1
            room = self._cap_of(tenant) - len(self._tenant_leases.get(tenant, ()))
            count += max(0, min(ahead, room))
            if count >= limit:
                return limit
        return count

    def runnable_ahead(self, job_id: str, order_key: float, *, limit: int) -> int:
        return self._runnable_ahead(order_key, limit, job_id)

    def _ahead_of_new(self, order_key: float) -> int:
        """Queued jobs at or below ``order_key`` (ZCOUNT -inf order_key)."""
        return self._queued.rank_at(order_key, "\U0010ffff")

    def requeue(self, job: IndexedJob, *, fence: str | None = None) -> None:
        self.requeue_many([job], fence=fence)

    def requeue_many(self, jobs: Iterable[IndexedJob], *, fence: str | None = None) -> int:
        self._check_fence(fence, None, "requeue")
        count = 0
        for job in jobs:
            check_scores(job)
            known = self._meta.get(job.job_id)
            if known is not None:
                newer = known.attempt > job.attempt or (
                    known.attempt == job.attempt and job.job_id in self._leases
                )
                if newer:
                    continue
                self._unindex(known)
            self._index(job)
            count += 1
        return count

    def dispatch(
        self,
        n: int,
        *,
        lease_ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
        capacity: int | None = None,
    ) -> list[Lease]:
        if capacity is not None:
            n = min(n, capacity - self._held_slots())
        if n <= 0:
            return []
        now = self._at(now)
        self._check_fence(fence, now, "dispatch")
        expires_at = now + lease_ttl_s
        if self._delayed:
            self._promote(now)
        out: list[Lease] = []
        runnable, blocked, meta = self._runnable, self._blocked, self._meta
        while len(out) < n:
            top = runnable.first()
            if top is None:
                break
            job_id = top[0]
            job = meta[job_id]
            tenant = job.tenant
            inflight = len(self._tenant_leases.get(tenant, ()))  # ``tenant_inflight``
            cap = self._cap_of(tenant)
            runnable.remove(job_id)
            if inflight >= cap:
                blocked.add(job_id, top[1])  # found at its cap: not counted
                continue
            self._zrem(self._queues, tenant, job_id)
            self._queued.remove(job_id)
            self._drop(self._tiers, job.tier, job_id)
            if job.start_by is not None:  # only a job with a deadline has one to drop
                self._deadlines.remove(job_id)
            self._put(self._tenant_leases, tenant, job_id, expires_at)
            self._leases[job_id] = expires_at
            head = self._head(tenant)
            if head is not None:
                (blocked if inflight + 1 >= cap else runnable).add(*head)
            out.append(frozen_value(Lease, job_id=job_id, tenant=tenant, tier=job.tier,
                                    order_key=job.order_key, expires_at=expires_at,
                                    attempt=job.attempt, start_by=job.start_by))
        return out

    def _promote(self, now: float) -> None:
        """Delayed jobs due by ``now`` join their queues (at most ``PROMOTE_LIMIT``)."""
        for job_id, _ in self._delayed.upto(now, PROMOTE_LIMIT):
            job = self._meta[job_id]
            self._undelay(job_id, job.tenant)
            self._enqueue(job_id, job.tenant, job.order_key, recheck=False)

    def hand_over(
        self,
        job_id: str,
        *,
        attempt: int,
        lease_ttl_s: float,
        capacity: int | None = None,
        now: float | None = None,
        announce: bool = False,
        outcome: str | None = None,
        take_next: bool = True,
        push: MessagePush | None = None,
        token: str | None = None,
        keep: bool = False,
    ) -> Lease | None:
        """``announce`` and ``outcome`` reach nobody here, nor does the doorbell; there is no
        broker to ``push`` to."""
        if push is not None:
            raise ValueError("the twin has no broker to push a message to")
        kept: tuple[str, float] | None = None
        if not keep:
            self.release(job_id, attempt=attempt)
        else:
            held, known = self._leases.get(job_id), self._meta.get(job_id)
            if held is not None and known is not None and known.attempt == attempt:
                kept = (known.tenant, held)  # set aside for the choice, put back after it
                del self._leases[job_id]
                self._drop(self._tenant_leases, known.tenant, job_id)
                head = self._head_of(known.tenant)
                if head is not None:
                    self._refile(known.tenant, head)  # under its cap now, for the choice
        handed = self._next(take_next=take_next, lease_ttl_s=lease_ttl_s, capacity=capacity,
                            now=now)
        if kept is not None:
            tenant, expires_at = kept
            self._leases[job_id] = expires_at
            self._put(self._tenant_leases, tenant, job_id, expires_at)
            if handed is not None:
                self._ending.add(job_id)  # its slot is the next job's now
            head = self._head_of(tenant)
            if head is not None:
                self._refile(tenant, head)
        return handed

    def _next(self, *, take_next: bool, lease_ttl_s: float, capacity: int | None,
              now: float | None) -> Lease | None:
        if not take_next:
            return None
        at = self._at(now)
        free = (self.pool_capacity(now=at) if capacity is None else capacity) - self._held_slots()
        if free <= 0:
            return None
        leases = self.dispatch(1, lease_ttl_s=lease_ttl_s, now=at)
        return leases[0] if leases else None

    def offer(
        self,
        *,
        lease_ttl_s: float,
        push: TierPush | None,
        capacity: int | None = None,
        now: float | None = None,
    ) -> Lease | None:
        """The doorbell reaches nobody here, and there is no broker to ``push`` to: without
        one, ``offer`` leases nothing, as Redis does."""
        if push is not None:
            raise ValueError("the twin has no broker to push a message to")
        return None

    def tier_push(self) -> TierPush | None:
        return self._tier_push

    def set_tier_push(self, push: TierPush) -> None:
        self._tier_push = push

    def put_back(
        self, job_id: str, *, attempt: int, not_before: float | None = None,
        fence: str | None = None,
    ) -> bool:
        self._check_fence(fence, None, "put_back")
        known = self._meta.get(job_id)
        if known is None or job_id not in self._leases or known.attempt != attempt:
            return False
        self._unindex(known)
        self._index(dataclasses.replace(known, not_before=not_before))
        return True

    def cancel(self, job_id: str, *, fence: str | None = None) -> bool:
        self._check_fence(fence, None, "cancel")
        if self._queued.score(job_id) is None and self._delayed.score(job_id) is None:
            return False
        self._unindex(self._meta[job_id])
        return True

    def expire_due(
        self, *, now: float | None = None, limit: int = 1000, fence: str | None = None
    ) -> list[IndexedJob]:
        if limit <= 0:
            return []
        now = self._at(now)
        self._check_fence(fence, now, "expire_due")
        out: list[IndexedJob] = []
        for job_id, _ in self._deadlines.upto(now, limit):
            job = self._meta[job_id]
            self._unindex(job)
            out.append(job)
        return out

    def position(self, job_id: str) -> int | None:
        return self._queued.rank(job_id)

    def position_at(self, order_key: float) -> int:
        # Members with a score at or below order_key (ZCOUNT -inf order_key).
        return self._queued.rank_at(order_key, "\U0010ffff")

    def tier_depths(self, tiers: Sequence[str]) -> dict[str, TierDepth]:
        depths: dict[str, TierDepth] = {}
        for tier in tiers:
            queued = self._tiers.get(tier)
            depths[tier] = TierDepth(
                queued=0 if queued is None else len(queued),
                oldest_order_key=None if not queued else min(queued.values()),
            )
        return depths
