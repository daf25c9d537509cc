"""The twin's admission (``admit.lua``, ``admit_new.lua``, ``admit_job.lua``): the bound,
quota and deadline checks of a submit and of the batch feeder, the figures they are decided
on, and the refusals counted per minute. Step for step as the scripts, in the same order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from jobs.core import policy
from jobs.core.policy import Tier
from jobs.index.memory_layout import check_scores, frozen_value
from jobs.index.memory_leases import MemoryLeases
from jobs.index.values import (
    REFUSAL_BUCKET_S,
    REFUSALS_KEEP_S,
    Admission,
    AdmissionTerms,
    Admitted,
    IndexedJob,
    refusal_minute,
)

# What an admission decided: accepted, reason, tier queued, tenant queued, position, duplicate
# (the fields of ``Admitted``).
_Decision = tuple[bool, str | None, int, int, int, bool]


class MemoryAdmission(MemoryLeases):
    """Admission on the twin's layout (it reads the live workers' slots: ``MemoryLeases``)."""

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
