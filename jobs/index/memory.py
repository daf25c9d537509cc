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
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from jobs.core import policy
from jobs.core.histograms import StartFigures
from jobs.index.base import (
    REFUSAL_BUCKET_S,
    REFUSALS_KEEP_S,
    Admission,
    AdmissionTerms,
    Admitted,
    Entry,
    IndexedJob,
    Lease,
    LiveWorker,
    NotLeader,
    Renewal,
    TierDepth,
    refusal_minute,
)
from jobs.index.keys import PROMOTE_LIMIT
from jobs.index.rate_limit import MemoryRateLimiter
from jobs.index.zset import ZSet


def _check(job: IndexedJob) -> None:
    for value in (job.order_key, job.start_by, job.not_before):
        if value is not None and math.isnan(value):
            raise ValueError("a score must be a number, not NaN")


def _check_caps(caps: Mapping[str, int], what: str) -> None:
    for name, cap in caps.items():
        if cap < 1:
            raise ValueError(f"{what} cap for {name!r} must be at least 1, got {cap}")


class MemoryIndex:
    """``DispatchIndex`` in process memory (not thread-safe; one owner at a time)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        # The last ``now`` a caller passed: the time of a fence check in a call that takes
        # none (the leader lock expires on the callers' virtual time, see the docstring).
        self._seen_now: float | None = None
        self.clear()

    def _at(self, now: float | None) -> float:
        if now is None:
            return self.clock()
        self._seen_now = now
        return now

    def now(self) -> float:
        return self.clock()

    def clear(self) -> None:
        self._queues: dict[str, ZSet] = {}
        self._tenant_leases: dict[str, ZSet] = {}
        self._tiers: dict[str, ZSet] = {}
        self._runnable, self._blocked, self._queued = ZSet(), ZSet(), ZSet()
        self._delayed, self._deadlines, self._leases = ZSet(), ZSet(), ZSet()
        self._meta: dict[str, IndexedJob] = {}
        self._cancels: set[str] = set()  # leased jobs flagged to cancel (meta's 7th field)
        self._tier_caps: dict[str, int] = {}
        self._tenant_caps: dict[str, int] = {}
        self._tenant_tier: dict[str, str] = {}
        self._tenant_delayed: dict[str, int] = {}
        self._workers: dict[str, tuple[float, int]] = {}
        self._devices: dict[str, str] = {}
        self._pool: tuple[int, float] | None = None  # pool_capacity's (slots, valid until)
        self._leader: tuple[str, float] | None = None  # token, expires_at
        self._leader_epoch = 0
        self._generation: str | None = None
        self._buckets = MemoryRateLimiter()
        # The ``refusals:<minute>`` hashes: (scope, name, reason) -> count, by minute.
        self._refusals: dict[int, dict[tuple[str, str, str], int]] = {}
        # The twin of the ``service_mean`` hash ``jobs.fleet.service_rate`` publishes in Redis:
        # the measured mean service time and its samples.
        self.service_mean: tuple[float, int] | None = None

    # -- the layout's small steps (the helpers of lua/common.lua) --

    @staticmethod
    def _zadd(sets: dict[str, ZSet], key: str, member: str, score: float) -> None:
        sets.setdefault(key, ZSet()).add(member, score)

    @staticmethod
    def _zrem(sets: dict[str, ZSet], key: str, member: str) -> bool:
        zset = sets.get(key)
        if zset is None or not zset.remove(member):
            return False
        if not zset:
            del sets[key]
        return True

    def _cap_of(self, tenant: str) -> int:
        cap = self._tenant_caps.get(tenant)
        if cap is None:
            tier = self._tenant_tier.get(tenant)
            cap = None if tier is None else self._tier_caps.get(tier)
        return 1 if cap is None else cap

    def _at_cap(self, tenant: str) -> bool:
        return self.tenant_inflight(tenant) >= self._cap_of(tenant)

    def _head(self, tenant: str) -> tuple[str, float] | None:
        queue = self._queues.get(tenant)
        return None if queue is None else queue.first()

    def _head_of(self, tenant: str) -> str | None:
        head = self._head(tenant)
        return None if head is None else head[0]

    def _refile(self, tenant: str, old: str | None) -> bool:
        head = self._head(tenant)
        was_blocked = old is not None and self._blocked.score(old) is not None
        source = self._blocked if was_blocked else self._runnable
        if head is None:
            if old is not None:
                source.remove(old)
            return False
        to_blocked = self._at_cap(tenant)
        if old == head[0] and was_blocked == to_blocked:
            return False
        if old is not None:
            source.remove(old)
        (self._blocked if to_blocked else self._runnable).add(head[0], head[1])
        return was_blocked and not to_blocked

    def _enqueue(self, job_id: str, tenant: str, order_key: float, recheck: bool) -> None:
        old = self._head_of(tenant)
        self._zadd(self._queues, tenant, job_id, order_key)
        self._queued.add(job_id, order_key)
        if recheck or self._head_of(tenant) != old:
            self._refile(tenant, old)

    def _undelay(self, job_id: str, tenant: str) -> bool:
        if not self._delayed.remove(job_id):
            return False
        left = self._tenant_delayed[tenant] - 1
        if left <= 0:
            del self._tenant_delayed[tenant]
        else:
            self._tenant_delayed[tenant] = left
        return True

    def _index(self, job: IndexedJob) -> None:
        self._meta[job.job_id] = job
        self._cancels.discard(job.job_id)
        retiered = self._tenant_tier.get(job.tenant) != job.tier
        self._tenant_tier[job.tenant] = job.tier
        self._zadd(self._tiers, job.tier, job.job_id, job.order_key)
        if job.start_by is not None:
            self._deadlines.add(job.job_id, job.start_by)
        if job.not_before is None:
            self._enqueue(job.job_id, job.tenant, job.order_key, retiered)
            return
        self._delayed.add(job.job_id, job.not_before)
        self._tenant_delayed[job.tenant] = self._tenant_delayed.get(job.tenant, 0) + 1
        head = self._head_of(job.tenant)
        if retiered and head is not None:
            self._refile(job.tenant, head)

    def _unindex(self, job: IndexedJob) -> str:
        job_id, tenant = job.job_id, job.tenant
        state, old = "none", None
        if self._undelay(job_id, tenant):
            state = "delayed"
        elif self._queued.score(job_id) is not None:
            state, old = "queued", self._head_of(tenant)
            self._zrem(self._queues, tenant, job_id)
            self._queued.remove(job_id)
        elif self._leases.remove(job_id):
            state = "leased"
            self._zrem(self._tenant_leases, tenant, job_id)
        self._zrem(self._tiers, job.tier, job_id)
        self._deadlines.remove(job_id)
        del self._meta[job_id]
        self._cancels.discard(job_id)
        if state == "queued":
            self._refile(tenant, old)
        elif state == "leased":
            head = self._head_of(tenant)
            if head is not None:
                self._refile(tenant, head)
        return state

    # -- the protocol --

    def admit(
        self,
        job: IndexedJob,
        *,
        bound: int,
        tenant_quota: int | None = None,
        max_position: int | None = None,
    ) -> Admitted:
        _check(job)
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
        _check(job)
        duplicate = job.job_id in self._meta
        if terms.rate is not None and not duplicate:
            decision = self._buckets.take(job.tenant, rate_per_s=terms.rate.rate_per_s,
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
        inflight, tenant_inflight = self.inflight(), self.tenant_inflight(job.tenant)
        mu = policy.service_rate(capacity, mean)
        bound = policy.queue_bound(terms.tier, mu, terms.client_timeout_s)
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
        return verdict(self.admit(job, bound=bound, tenant_quota=quota,
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
            _check(job)
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

    def set_caps(
        self,
        tier_caps: Mapping[str, int],
        tenant_caps: Mapping[str, int] | None = None,
        *,
        fence: str | None = None,
    ) -> None:
        """Merge ``tier_caps`` into the tier caps; replace all tenant overrides with
        ``tenant_caps`` (``None``: clear them). Blocked tenants now under their cap become
        runnable; runnable tenants over a lowered cap are blocked by the next dispatch."""
        self._check_fence(fence, None, "set_caps")
        overrides = dict(tenant_caps or {})
        _check_caps(tier_caps, "tier")
        _check_caps(overrides, "tenant")
        self._tier_caps.update({tier: int(cap) for tier, cap in tier_caps.items()})
        self._tenant_caps = {tenant: int(cap) for tenant, cap in overrides.items()}
        for job_id, score in self._blocked.items():
            if not self._at_cap(self._meta[job_id].tenant):
                self._blocked.remove(job_id)
                self._runnable.add(job_id, score)

    def _check_fence(self, fence: str | None, now: float | None, what: str) -> None:
        if now is None:
            now = self._seen_now if self._seen_now is not None else self.clock()
        if fence and self.leader(now=now) != fence:
            raise NotLeader(f"{what} refused: the fencing token is not the leader's")

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
            n = min(n, capacity - self.inflight())
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
                             attempt=job.attempt))
        return out

    def renew(
        self, job_id: str, *, attempt: int, ttl_s: float, now: float | None = None
    ) -> bool:
        return bool(self.renew_checked(job_id, attempt=attempt, ttl_s=ttl_s, now=now))

    def renew_checked(
        self,
        job_id: str,
        *,
        attempt: int,
        ttl_s: float,
        now: float | None = None,
        announce: bool = False,
        start: StartFigures | None = None,
    ) -> Renewal:
        """``start`` records nothing here: the twin keeps no metrics."""
        current = self._leases.score(job_id)
        if current is None or self._meta[job_id].attempt != attempt:
            return Renewal.LOST
        expires_at = self._at(now) + ttl_s
        if expires_at > current:
            self._leases.add(job_id, expires_at)
            self._tenant_leases[self._meta[job_id].tenant].add(job_id, expires_at)
        return Renewal.CANCEL_REQUESTED if job_id in self._cancels else Renewal.HELD

    def flag_cancel(self, job_id: str, *, attempt: int | None = None) -> bool:
        if self._leases.score(job_id) is None:
            return False
        if attempt is not None and self._meta[job_id].attempt != attempt:
            return False
        self._cancels.add(job_id)
        return True

    def release(
        self,
        job_id: str,
        *,
        attempt: int | None = None,
        fence: str | None = None,
        ring: bool = False,
        announce: bool = False,
        outcome: str | None = None,
    ) -> bool:
        """``ring`` and ``announce`` reach nobody here: nothing waits on a twin; nor does
        ``outcome`` count anything (the twin keeps no metrics)."""
        self._check_fence(fence, None, "release")
        if self._leases.score(job_id) is None:
            return False
        if attempt is not None and self._meta[job_id].attempt != attempt:
            return False
        tenant = self._meta.pop(job_id).tenant
        self._cancels.discard(job_id)
        self._leases.remove(job_id)
        self._zrem(self._tenant_leases, tenant, job_id)
        head = self._head_of(tenant)
        return head is not None and self._refile(tenant, head)

    def cancel(self, job_id: str, *, fence: str | None = None) -> bool:
        self._check_fence(fence, None, "cancel")
        if self._queued.score(job_id) is None and self._delayed.score(job_id) is None:
            return False
        self._unindex(self._meta[job_id])
        return True

    def reap(
        self, *, now: float | None = None, limit: int = 1000, fence: str | None = None
    ) -> list[Lease]:
        if limit <= 0:
            return []
        now = self._at(now)
        self._check_fence(fence, now, "reap")
        out: list[Lease] = []
        for job_id, expires_at in self._leases.upto(now, limit):
            job = self._meta[job_id]
            self._unindex(job)
            out.append(Lease(job_id=job_id, tenant=job.tenant, tier=job.tier,
                             order_key=job.order_key, expires_at=expires_at,
                             attempt=job.attempt))
        return out

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

    def restore_lease(
        self,
        job: IndexedJob,
        *,
        ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
    ) -> bool:
        _check(job)
        now = self._at(now)
        self._check_fence(fence, now, "restore_lease")
        job_id, expires_at = job.job_id, now + ttl_s
        known = self._meta.get(job_id)
        if known is not None:
            if known.attempt > job.attempt:
                return False
            current = self._leases.score(job_id)
            if known.attempt == job.attempt and current is not None:
                if current < expires_at:
                    self._leases.add(job_id, expires_at)
                    self._tenant_leases[known.tenant].add(job_id, expires_at)
                return True
            self._unindex(known)
        self._meta[job_id] = job
        self._cancels.discard(job_id)
        self._zadd(self._tenant_leases, job.tenant, job_id, expires_at)
        self._leases.add(job_id, expires_at)
        self._tenant_tier[job.tenant] = job.tier
        head = self._head_of(job.tenant)
        if head is not None:
            self._refile(job.tenant, head)
        return True

    def job_ids(self) -> Iterator[str]:
        for zset in (self._queued, self._delayed, self._leases):
            for job_id, _ in zset.items():
                yield job_id

    def scan_entries(self, cursor: int, count: int) -> tuple[int, list[Entry]]:
        ids = sorted(self._meta)[cursor:cursor + count]
        entries = [
            Entry(job_id=job_id, attempt=self._meta[job_id].attempt,
                  leased=self._leases.score(job_id) is not None)
            for job_id in ids
        ]
        following = cursor + count
        return (following if following < len(self._meta) else 0), entries

    def entries_of(self, job_ids: Sequence[str]) -> dict[str, Entry]:
        return {
            job_id: Entry(job_id=job_id, attempt=self._meta[job_id].attempt,
                          leased=self._leases.score(job_id) is not None)
            for job_id in job_ids
            if job_id in self._meta
        }

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

    def register_worker(
        self, worker_id: str, *, slots: int, ttl_s: float, now: float | None = None,
        device: str = "cpu",
    ) -> None:
        expires_at = self._at(now) + ttl_s
        self._workers[worker_id] = (expires_at, int(slots))
        self._devices[worker_id] = device or "cpu"
        self._pool = None

    def unregister_worker(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)
        self._devices.pop(worker_id, None)
        self._pool = None

    def live_workers(self, *, now: float | None = None) -> list[LiveWorker]:
        self.pool_capacity(now=now)  # drops the expired ones
        return [LiveWorker(worker_id=worker, slots=slots,
                           device=self._devices.get(worker, "cpu"), expires_at=expires_at)
                for worker, (expires_at, slots) in sorted(self._workers.items())]

    def pool_capacity(self, *, now: float | None = None) -> int:
        now = self._at(now)
        if self._pool is None or now >= self._pool[1]:
            self._workers = {w: entry for w, entry in self._workers.items() if entry[0] > now}
            if len(self._devices) > len(self._workers):
                self._devices = {w: d for w, d in self._devices.items() if w in self._workers}
            # The sum, and when it next changes by itself (the first registration to lapse).
            self._pool = (sum(slots for _, slots in self._workers.values()),
                          min((entry[0] for entry in self._workers.values()), default=math.inf))
        return self._pool[0]

    def inflight(self) -> int:
        return len(self._leases)

    def tenant_inflight(self, tenant: str) -> int:
        return len(self._tenant_leases.get(tenant, ()))

    def inflight_by_tenant(self) -> dict[str, int]:
        return {tenant: len(leases) for tenant, leases in self._tenant_leases.items() if leases}

    def tenant_queued(self, tenant: str) -> int:
        return len(self._queues.get(tenant, ())) + self._tenant_delayed.get(tenant, 0)

    # -- leadership and the rebuild sentinel --

    def acquire_leadership(self, owner: str, *, ttl_s: float, now: float) -> str | None:
        if self.leader(now=now) is not None:
            return None
        self._leader_epoch += 1
        token = f"{self._leader_epoch}:{owner}"
        self._leader = (token, now + ttl_s)
        return token

    def renew_leadership(self, token: str, *, ttl_s: float, now: float) -> bool:
        if self.leader(now=now) != token:
            return False
        self._leader = (token, now + ttl_s)
        return True

    def resign_leadership(self, token: str, *, now: float) -> bool:
        if self.leader(now=now) != token:
            return False
        self._leader = None
        return True

    def leader(self, *, now: float) -> str | None:
        self._seen_now = now
        if self._leader is None or self._leader[1] <= now:
            return None
        return self._leader[0]

    def generation(self) -> str | None:
        return self._generation

    def mark_generation(self, value: str) -> bool:
        if self._generation is not None:
            return False
        self._generation = value
        return True

    def set_generation(self, value: str, *, fence: str | None = None) -> None:
        self._check_fence(fence, None, "set_generation")
        self._generation = value
