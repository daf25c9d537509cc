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
table and worker registry (``memory_leases.py``), admission (``memory_admission.py``), upkeep
(``memory_upkeep.py``); the queue (requeue, dispatch, hand-over, cancel, positions) is here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from jobs.index.keys import PROMOTE_LIMIT
from jobs.index.memory_admission import MemoryAdmission
from jobs.index.memory_layout import check_scores, frozen_value
from jobs.index.memory_runs import MemoryRuns
from jobs.index.memory_upkeep import MemoryUpkeep
from jobs.index.values import (
    FirstRenewal,
    IndexedJob,
    KindRoutes,
    Lease,
    MessagePush,
    TierDepth,
    TierPush,
    kinds_of,
)

__all__ = ["MemoryIndex"]

class MemoryIndex(MemoryAdmission, MemoryUpkeep, MemoryRuns):
    """``DispatchIndex`` in process memory (not thread-safe; one owner at a time)."""

    def pool(self) -> MemoryIndex:
        """The twin of another pool of this index's fleet (``jobs.core.pools``): an index
        of its own that shares this one's leader lock and tenants' rate buckets, as a pool's
        ``RedisIndex`` shares the root prefix's keys."""
        other = MemoryIndex(clock=self.clock)
        other._shares_fleet = True
        other._fleet = self._fleet
        return other

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

    def dispatch_routed(
        self,
        n: int,
        *,
        lease_ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
        capacity: int | None = None,
    ) -> tuple[list[Lease], bool]:
        if n <= 0:
            return [], False
        return self._dispatch(n, lease_ttl_s=lease_ttl_s, now=now, fence=fence,
                              capacity=capacity)

    def dispatch(
        self,
        n: int,
        *,
        lease_ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
        capacity: int | None = None,
    ) -> list[Lease]:
        return self._dispatch(n, lease_ttl_s=lease_ttl_s, now=now, fence=fence,
                              capacity=capacity)[0]

    def _dispatch(
        self, n: int, *, lease_ttl_s: float, now: float | None, fence: str | None,
        capacity: int | None,
    ) -> tuple[list[Lease], bool]:
        """The leases, and whether the pool is routed by kind (said only when the call got as
        far as leasing, as dispatch.lua says it)."""
        now = self._at(now)
        self._check_fence(fence, now, "dispatch")
        if capacity is not None:
            n = min(n, min(capacity, self.pool_capacity(now=now)) - self._held_slots())
        if n <= 0:
            return [], False
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
        return out, self._routed

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
        first: FirstRenewal | None = None,
    ) -> Lease | None:
        """``announce`` and ``outcome`` reach nobody here, nor does the doorbell; there is no
        broker to ``push`` to."""
        if push is not None:
            raise ValueError("the twin has no broker to push a message to")
        if first is not None:
            self.renew_checked(job_id, attempt=attempt, ttl_s=first.ttl_s, now=now,
                               announce=first.announce, start=first.start,
                               release=first.release)
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
        if not take_next or self._generation is None or self._routed:
            return None  # not whole (``set_generation``), or routed by kind
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

    # -- routing by kind (``jobs.index.worker_registry``) --

    def kinds_waiting(self) -> frozenset[str]:
        return frozenset(self._kinds_waiting)

    def note_kinds_waiting(self, kinds: Iterable[str]) -> None:
        met = set(kinds)
        if met:
            self._kinds_waiting |= met
            self._routed = True

    def park(
        self, job_id: str, *, attempt: int, kind: str, until: float, fence: str | None = None
    ) -> bool:
        if not kind:
            raise ValueError("a parked job names its kind")
        if not self.put_back(job_id, attempt=attempt, not_before=until, fence=fence):
            return False
        self._parked.setdefault(kind, set()).add(job_id)
        self._kinds_waiting.add(kind)
        return True

    def route_kinds(
        self,
        *,
        now: float | None = None,
        forget: Sequence[str] = (),
        unpark: Sequence[str] = (),
        fence: str | None = None,
    ) -> KindRoutes:
        now = self._at(now)
        self._check_fence(fence, now, "route_kinds")
        for kind in forget:
            self._kinds_waiting.discard(kind)
            self._parked.pop(kind, None)
        for kind in unpark:
            for job_id in sorted(self._parked.pop(kind, set())):
                if self._delayed.score(job_id) is not None:  # still parked, not cancelled
                    job = self._meta[job_id]
                    self._undelay(job_id, job.tenant)
                    self._enqueue(job_id, job.tenant, job.order_key, recheck=False)
        self.pool_capacity(now=now)  # expired registrations dropped
        registered = {self._worker_kinds.get(worker, "") for worker in self._workers}
        first = min(registered) if len(registered) == 1 else None
        if not registered:
            self._shared_kinds = None
        elif first is not None:
            self._shared_kinds = first
        runs = kinds_of(first) if first is not None else None
        self._routed = (len(registered) > 1 or (not registered and bool(self._kinds_waiting))
                        or (runs is not None and not self._kinds_waiting <= runs))
        return KindRoutes(routed=self._routed, waiting=frozenset(self._kinds_waiting))

    def cancel(self, job_id: str, *, tenant: str | None = None, fence: str | None = None) -> bool:
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

    def places(
        self, jobs: Sequence[tuple[str, float]], *, free_slots: int
    ) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for job_id, order_key in jobs:
            position = self.position(job_id)
            if position is not None:
                found[job_id] = (position, self.runnable_ahead(job_id, order_key,
                                                               limit=free_slots))
        return found

    def position_at(self, order_key: float) -> int:
        # Members with a score at or below order_key (ZCOUNT -inf order_key).
        return self._queued.rank_at(order_key, "\U0010ffff")

    def tier_depths(self, tiers: Sequence[str]) -> dict[str, TierDepth]:
        depths: dict[str, TierDepth] = {}
        for tier in tiers:
            waiting = self._tiers.get(tier, {})
            keys = [key for job_id, key in waiting.items()
                    if self._delayed.score(job_id) is None]
            depths[tier] = TierDepth(queued=len(waiting),
                                     oldest_order_key=min(keys) if keys else None)
        return depths

    def depths_and_inflight(
        self, tiers: Sequence[str]
    ) -> tuple[dict[str, TierDepth], int]:
        return self.tier_depths(tiers), self.inflight()
