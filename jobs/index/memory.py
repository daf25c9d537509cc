"""The in-memory twin of ``RedisIndex``: same behaviour, step for step, for the simulator
and for model-based tests. It mirrors the Lua scripts' data layout (see ``keys.py``) with
the sorted sets of ``zset.py``, ordered like Redis's: ascending score, ties by member bytes
(code point order of a ``str`` is the byte order of its UTF-8).

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
from jobs.index.keys import PROMOTE_LIMIT
from jobs.index.memory_layout import check_scores
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
        tier_queued = len(self._tiers.get(job.tier, ()))
        queued = self.tenant_queued(job.tenant)
        known = self._meta.get(job.job_id)
        if known is not None:
            position = self._queued.rank(job.job_id)
            if position is None:
                delayed = self._delayed.score(job.job_id) is not None
                position = self._queued.rank_at(known.order_key, job.job_id) if delayed else 0
            return Admitted(accepted=True, tier_queued=tier_queued, tenant_queued=queued,
                            position=position, duplicate=True)
        reason = None
        if tier_queued >= bound:
            reason = "capacity"
        elif tenant_quota is not None and queued >= tenant_quota:
            reason = "tenant_limit"
        ahead = self._queued.rank_at(job.order_key, job.job_id)
        if reason is None and max_position is not None and ahead > max_position:
            reason = "deadline"
        if reason is not None:
            return Admitted(accepted=False, tier_queued=tier_queued, tenant_queued=queued,
                            position=ahead, reason=reason)
        self._index(job if job.attempt == 1 else dataclasses.replace(job, attempt=1))
        # Its rank now (queued) or the rank it will have (delayed): the jobs before it.
        return Admitted(accepted=True, tier_queued=tier_queued + 1, tenant_queued=queued + 1,
                        position=ahead)

    def admit_new(self, job: IndexedJob, terms: AdmissionTerms) -> Admission:
        admission = self._admit_new(job, terms)
        if not admission.accepted and admission.reason is not None:
            self._count_refusal(job, admission.reason, now=terms.now)
        return admission

    def _count_refusal(self, job: IndexedJob, reason: str, *, now: float) -> None:
        minute = refusal_minute(now)
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
            decision = self._fleet.buckets.take(job.tenant, rate_per_s=terms.rate.rate_per_s,
                                          burst=terms.rate.burst, now=terms.now)
            if not decision.allowed:
                return Admission(
                    accepted=False, reason="rate", duplicate=False,
                    position=self._ahead_of_new(job.order_key),
                    tier_queued=0, tenant_queued=0, tenant_inflight=0, capacity=0,
                    inflight=0, measured=None, next_token_s=decision.retry_after_s,
                    bound=0, quota=0, max_position=None)
        measured = self.service_mean
        if measured is not None and not (math.isfinite(measured[0]) and measured[0] >= 0):
            measured = None
        mean = terms.mean_service_s
        if measured is not None and measured[1] >= terms.service_samples_min:
            mean = max(0.001, measured[0])
        capacity = terms.pool_concurrency or self.pool_capacity(now=terms.now)
        inflight, tenant_inflight = self._held_slots(), self.tenant_inflight(job.tenant)
        mu = policy.service_rate(capacity, mean)
        bound = policy.queue_bound(terms.tier, mu, terms.client_timeout_s, capacity=capacity)
        quota = terms.tenant_quota
        if quota is None:
            quota = policy.tenant_quota(terms.tier, bound)
        cap = terms.tenant_cap
        if cap is None:
            cap = policy.tenant_cap(terms.tier, capacity)
        max_position = None
        if terms.max_wait_s is not None:
            max_position = policy.latest_useful_position(
                terms.max_wait_s, max(0, capacity - inflight), mu)

        def verdict(admitted: Admitted) -> Admission:
            return Admission(
                accepted=admitted.accepted, reason=admitted.reason,
                duplicate=admitted.duplicate, position=admitted.position,
                tier_queued=admitted.tier_queued, tenant_queued=admitted.tenant_queued,
                tenant_inflight=tenant_inflight, capacity=capacity, inflight=inflight,
                measured=measured, next_token_s=0.0, bound=bound, quota=quota,
                max_position=max_position)

        if terms.max_wait_s is not None and not duplicate:
            max_excess = policy.latest_useful_excess(
                terms.max_wait_s, policy.tenant_rate(cap, capacity, mean))
            queued = self.tenant_queued(job.tenant)
            load = policy.TenantLoad(cap=cap, inflight=tenant_inflight, ahead=queued)
            if max_excess is not None and load.excess > max_excess:
                return verdict(Admitted(
                    accepted=False, reason="deadline",
                    position=self._ahead_of_new(job.order_key), tenant_queued=queued,
                    tier_queued=len(self._tiers.get(job.tier, ()))))
        if job.not_before is not None:
            job = dataclasses.replace(job, not_before=None)
        admit_bound = bound
        tier_queued = len(self._tiers.get(job.tier, ()))
        free = max(0, capacity - inflight)
        if not duplicate and tier_queued >= bound and free > 0:
            # As admit_new.lua: the tier's queue waits on caps, not on the pool.
            if tenant_inflight >= cap:
                return verdict(Admitted(
                    accepted=False, reason="cap", position=self._ahead_of_new(job.order_key),
                    tenant_queued=self.tenant_queued(job.tenant), tier_queued=tier_queued))
            if free > len(self._runnable):
                admit_bound = tier_queued + 1
        return verdict(self.admit(job, bound=admit_bound, tenant_quota=quota,
                                  max_position=max_position))

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
                    known.attempt == job.attempt and self._leases.score(job.job_id) is not None
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
        for job_id, _ in self._delayed.upto(now, PROMOTE_LIMIT):
            job = self._meta[job_id]
            self._undelay(job_id, job.tenant)
            self._enqueue(job_id, job.tenant, job.order_key, recheck=False)
        out: list[Lease] = []
        while len(out) < n:
            top = self._runnable.first()
            if top is None:
                break
            job = self._meta[top[0]]
            inflight, cap = self.tenant_inflight(job.tenant), self._cap_of(job.tenant)
            self._runnable.remove(job.job_id)
            if inflight >= cap:
                self._blocked.add(job.job_id, top[1])  # found at its cap: not counted
                continue
            self._zrem(self._queues, job.tenant, job.job_id)
            self._queued.remove(job.job_id)
            self._zrem(self._tiers, job.tier, job.job_id)
            self._deadlines.remove(job.job_id)
            self._zadd(self._tenant_leases, job.tenant, job.job_id, expires_at)
            self._leases.add(job.job_id, expires_at)
            head = self._head(job.tenant)
            if head is not None:
                (self._blocked if inflight + 1 >= cap else self._runnable).add(*head)
            out.append(Lease(job_id=job.job_id, tenant=job.tenant, tier=job.tier,
                             order_key=job.order_key, expires_at=expires_at,
                             attempt=job.attempt, start_by=job.start_by))
        return out

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
            held, known = self._leases.score(job_id), self._meta.get(job_id)
            if held is not None and known is not None and known.attempt == attempt:
                kept = (known.tenant, held)  # set aside for the choice, put back after it
                self._leases.remove(job_id)
                self._zrem(self._tenant_leases, known.tenant, job_id)
                head = self._head_of(known.tenant)
                if head is not None:
                    self._refile(known.tenant, head)  # under its cap now, for the choice
        handed = self._next(take_next=take_next, lease_ttl_s=lease_ttl_s, capacity=capacity,
                            now=now)
        if kept is not None:
            tenant, expires_at = kept
            self._leases.add(job_id, expires_at)
            self._zadd(self._tenant_leases, tenant, job_id, expires_at)
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
        if known is None or self._leases.score(job_id) is None or known.attempt != attempt:
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
            zset = self._tiers.get(tier)
            first = None if zset is None else zset.first()
            depths[tier] = TierDepth(
                queued=0 if zset is None else len(zset),
                oldest_order_key=None if first is None else first[1],
            )
        return depths
