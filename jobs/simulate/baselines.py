"""The baselines tierq is compared with; they live here, not in the product.

- ``strict``: priority only, as Celery's native priorities serve: the best tier first, first
  in first out within it; no bound, no quota, no caps. Nothing is ever refused.
- ``rescore``: a heap of effective priorities (``base − waited / ageing_rate``) rescored
  once per simulated second, a job of a tenant at its cap popped and pushed back (skipped);
  the tier bounds and quotas and the caps of ``jobs.fleet.pool.figures``.

Both expire a job popped past its own deadline and retry as tierq does. Neither has a rate
limit or refuses a job for its own deadline, and neither tells an estimate. Both pack as
tierq does (``jobs.simulate.packing.fill``): a slot's first job is the one the baseline pops,
and a kind that packs fills its run with the next queued jobs of that kind in the baseline's
own order, under its caps.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from jobs.core.policy import MeasuredMean
from jobs.core.service_times import KindMean
from jobs.fleet import pool
from jobs.simulate.contender import ACCEPTED, Context, Dispatched, Verdict
from jobs.simulate.packing import fill

RESCORE_PERIOD_S = 1.0

# A queued job as each baseline keeps it: (its key in the baseline's order, seq, job, attempt).
Entry = tuple[float, int, int, int]


@dataclass(eq=False)
class _Hold:
    """What a run of several items holds until its last item ends: one slot, and one unit of
    the cap of each tenant it has items of."""

    items: int = 0
    tenants: Counter[int] = field(default_factory=Counter)


class _Baseline:
    """Leases, counts, bounds, caps and the retry backoff the baselines share; the queue
    itself (``_push``, ``_pop``) is each baseline's own."""

    capped = True
    bounded = True

    def __init__(self, context: Context) -> None:
        self.context = context
        traffic = context.traffic
        self._tier_queued = [0] * len(traffic.tiers)
        self._tenant_queued = [0] * len(traffic.tenants)
        self._tenant_inflight = [0] * len(traffic.tenants)
        self._inflight = 0  # lost leases count until they are reaped, as in the index
        self._lost: list[tuple[float, int, int]] = []  # (lease lapses, job, attempt)
        self._delayed: list[tuple[float, int, int]] = []  # (not_before, job, attempt)
        self._capacity = 0  # what bounds and caps follow from: configured, else the slots
        self._slots = 0  # the live workers' slots: what the pool can run
        self._measured: MeasuredMean | None = None
        self._bounds = self._quotas = self._caps = [1] * len(traffic.tiers)
        self._holds: dict[int, _Hold] = {}  # job → its run's, for runs of several items
        self._packs = context.packs

    def _refigure(self) -> None:
        names = self.context.traffic.tiers
        figures = pool.figures(self.context.policy, capacity=self._capacity, inflight=0,
                                   measured=self._measured)
        self._bounds = [figures.bounds[n] for n in names]
        self._quotas = [figures.quotas[n] for n in names]
        self._caps = [figures.caps[n] for n in names]

    def set_workers(self, workers: dict[str, int], now: float) -> int:
        self._slots = sum(workers.values())
        self._capacity = self.context.policy.pool_concurrency or self._slots
        self._refigure()
        return self._slots

    def measured(self, mean: MeasuredMean, now: float,
                 kinds: Mapping[str, float] | None = None,
                 measures: Mapping[str, KindMean] | None = None,
                 overall_s: float | None = None) -> None:
        self._measured = mean
        self._refigure()

    def cap(self, tenant: int) -> int | None:
        if not self.capped:
            return None
        traffic = self.context.traffic
        own = traffic.overrides.get(tenant, (None, None))[0]
        return own if own is not None else self._caps[traffic.tenant_tier[tenant]]

    def _quota(self, tenant: int, tier: int) -> int:
        own = self.context.traffic.overrides.get(tenant, (None, None))[1]
        return own if own is not None else self._quotas[tier]

    def _room(self, tenant: int) -> bool:
        cap = self.cap(tenant)
        return cap is None or self._tenant_inflight[tenant] < cap

    def submit(self, job: int, now: float) -> Verdict:
        traffic = self.context.traffic
        tenant = traffic.tenant[job]
        tier = traffic.tenant_tier[tenant]
        if self.bounded and self._tier_queued[tier] >= self._bounds[tier]:
            return Verdict(accepted=False, cause="capacity", limit="bound",
                           count=self._tier_queued[tier], limit_value=self._bounds[tier])
        if self.bounded and self._tenant_queued[tenant] >= self._quota(tenant, tier):
            return Verdict(accepted=False, cause="tenant_limit", limit="quota",
                           count=self._tenant_queued[tenant],
                           limit_value=self._quota(tenant, tier))
        self._count(job, 1)
        self._push(job, 1, now)
        return ACCEPTED

    def feed(self, job: int, now: float) -> bool:
        return self.submit(job, now).accepted

    def _count(self, job: int, delta: int) -> None:
        traffic = self.context.traffic
        tenant = traffic.tenant[job]
        self._tenant_queued[tenant] += delta
        self._tier_queued[traffic.tenant_tier[tenant]] += delta

    def dispatch(self, now: float) -> Dispatched:
        while self._delayed and self._delayed[0][0] <= now:
            _, job, attempt = heapq.heappop(self._delayed)
            self._push(job, attempt, now)
        out = Dispatched()
        if self._slots - self._inflight > 0:
            self._pop(self._slots - self._inflight, now, out)
        return out

    def _popped(self, job: int, attempt: int, now: float, out: Dispatched) -> None:
        """A job left the queue: it expires if past its deadline, else it starts, and leads
        a run when its kind packs."""
        self._count(job, -1)
        start_by = self.context.start_by(job)
        if start_by is not None and now >= start_by:
            out.expired.append(job)
            return
        self._inflight += 1
        self._tenant_inflight[self.context.traffic.tenant[job]] += 1
        out.started.append((job, attempt))
        if self._packs:
            self._fill(job, now, out)

    def finish(self, job: int, attempt: int, now: float) -> None:
        tenant = self.context.traffic.tenant[job]
        hold = self._holds.pop(job, None) if self._holds else None
        if hold is None:
            self._inflight -= 1
            self._tenant_inflight[tenant] -= 1
            return
        hold.tenants[tenant] -= 1
        if not hold.tenants[tenant]:
            self._tenant_inflight[tenant] -= 1
        hold.items -= 1
        if not hold.items:
            self._inflight -= 1

    def _fill(self, lead: int, now: float, out: Dispatched) -> None:
        """The run ``lead`` started: the next queued jobs of its kind that may join it."""
        kind = self.context.kind(lead)
        if not kind.packs:
            return
        tenant_of = self.context.traffic.tenant
        chosen = fill(tenant_of[lead], ((entry, tenant_of[entry[2]])
                                        for entry in self._candidates(lead)),
                      kind.max_items_per_run, self._room)
        if not chosen:
            return
        self._take(chosen)
        hold = _Hold(items=1, tenants=Counter({tenant_of[lead]: 1}))
        riders = []
        for _, _, job, attempt in chosen:
            self._count(job, -1)
            start_by = self.context.start_by(job)
            if start_by is not None and now >= start_by:
                out.expired.append(job)
                continue
            tenant = tenant_of[job]
            if not hold.tenants[tenant]:
                self._tenant_inflight[tenant] += 1
            hold.tenants[tenant] += 1
            hold.items += 1
            self._holds[job] = hold
            riders.append((job, attempt))
        if riders:
            self._holds[lead] = hold
            out.riders[lead] = riders

    def _candidates(self, lead: int) -> Iterator[Entry]:
        """The queued jobs of ``lead``'s kind in the baseline's order."""
        raise NotImplementedError

    def _take(self, entries: list[Entry]) -> None:
        """Riders leave the queue."""
        raise NotImplementedError

    def gone(self, job: int) -> None:
        pass

    def renew(self, job: int, attempt: int, now: float) -> None:
        """The baselines' leases do not lapse while their worker lives."""

    def lose(self, job: int, attempt: int, now: float) -> None:
        ttl = self.context.policy.lease_ttl_s
        heapq.heappush(self._lost, (now + ttl, job, attempt))

    def reap(self, now: float) -> list[tuple[int, int]]:
        out = []
        while self._lost and self._lost[0][0] <= now:
            _, job, attempt = heapq.heappop(self._lost)
            self.finish(job, attempt, now)
            out.append((job, attempt))
        return out

    def requeue(self, job: int, attempt: int, not_before: float | None, now: float) -> None:
        self._count(job, 1)
        if not_before is not None and not_before > now:
            heapq.heappush(self._delayed, (not_before, job, attempt))
        else:
            self._push(job, attempt, now)

    def expire(self, now: float) -> list[int]:
        """No sweep: a baseline finds a late job when it pops it."""
        return []

    def queued(self) -> list[int]:
        return list(self._tier_queued)

    def _push(self, job: int, attempt: int, now: float) -> None:
        raise NotImplementedError

    def _pop(self, n: int, now: float, out: Dispatched) -> None:
        raise NotImplementedError


class StrictContender(_Baseline):
    """Priority only: Celery's native priorities (best tier first, FIFO within a tier)."""

    name = "strict"
    capped = False
    bounded = False

    def __init__(self, context: Context) -> None:
        super().__init__(context)
        self._heap: list[Entry] = []  # (priority, seq, job, attempt)
        self._seq = 0
        self._priority = [t.base_priority for t in context.tiers]
        # Per kind that packs, its queued jobs in order; riders taken from the heap's middle
        # (their seq) are dropped when they reach its top.
        self._of_kind: dict[int, SortedList] = {
            kind: SortedList() for kind, each in enumerate(context.kinds) if each.packs}
        self._taken: set[int] = set()

    def _push(self, job: int, attempt: int, now: float) -> None:
        self._seq += 1
        priority = self._priority[self.context.traffic.tier_of(job)]
        entry = (priority, self._seq, job, attempt)
        heapq.heappush(self._heap, entry)
        if self._of_kind:
            queue = self._of_kind.get(self.context.traffic.kind[job])
            if queue is not None:
                queue.add(entry)

    def _pop(self, n: int, now: float, out: Dispatched) -> None:
        while len(out.started) < n and self._heap:
            entry = heapq.heappop(self._heap)
            _, seq, job, attempt = entry
            if self._of_kind:
                if seq in self._taken:
                    self._taken.discard(seq)
                    continue
                queue = self._of_kind.get(self.context.traffic.kind[job])
                if queue is not None:
                    queue.remove(entry)
            self._popped(job, attempt, now, out)

    def _candidates(self, lead: int) -> Iterator[Entry]:
        return iter(self._of_kind[self.context.traffic.kind[lead]])

    def _take(self, entries: list[Entry]) -> None:
        for entry in entries:
            self._of_kind[self.context.traffic.kind[entry[2]]].remove(entry)
            self._taken.add(entry[1])


class RescoreContender(_Baseline):
    """A heap of effective priorities, rescored once per simulated second, skipping (pop and
    push back) the jobs of tenants at their cap.

    Kept as a sorted list with scores scaled to seconds: a score ``s`` computed at ``t`` is
    held as ``s × ageing_rate + r``, ``r`` the last rescore time. Rescoring with one ageing
    rate moves every score by the same amount, so it changes the order only of jobs pushed
    since the previous rescore (they were scored at their push, not at ``r``): the rescore
    re-keys just those. That is the heap's order at every pop, at O(log n) a job instead of
    O(n) a second (``tests/unit/test_simulate_baselines.py`` checks it against a heap
    rescored in full).
    """

    name = "rescore"

    def __init__(self, context: Context, period_s: float = RESCORE_PERIOD_S) -> None:
        super().__init__(context)
        self.period_s = period_s
        self._queue: SortedList = SortedList()  # (key, seq, job, attempt)
        self._fresh: list[tuple[float, int, int, int]] = []  # pushed since the last rescore
        self._rescored_at = 0.0
        self._seq = 0

    def _true_key(self, job: int) -> float:
        return self.context.order_key(job)

    def _catch_up(self, now: float) -> None:
        """Apply the rescore that ran at the last whole period before ``now``."""
        tick = math.floor(now / self.period_s) * self.period_s
        if tick <= self._rescored_at:
            return
        self._rescored_at = tick
        for item in self._fresh:
            if item in self._queue:  # not popped since
                self._queue.remove(item)
                _, seq, job, attempt = item
                self._queue.add((self._true_key(job), seq, job, attempt))
        self._fresh.clear()

    def _push(self, job: int, attempt: int, now: float) -> None:
        self._catch_up(now)
        self._seq += 1
        # Scored at ``now``: base − (now − enqueued)/rate, held relative to the last rescore.
        key = self._true_key(job) - (now - self._rescored_at)
        item = (key, self._seq, job, attempt)
        self._queue.add(item)
        if now > self._rescored_at:
            self._fresh.append(item)

    def _pop(self, n: int, now: float, out: Dispatched) -> None:
        self._catch_up(now)
        tenant_of = self.context.traffic.tenant
        i = 0
        while len(out.started) < n and i < len(self._queue):
            _, _, job, attempt = self._queue[i]
            if not self._room(tenant_of[job]):
                i += 1  # popped and pushed back: it keeps its score
                continue
            self._queue.pop(i)
            self._popped(job, attempt, now, out)

    def _candidates(self, lead: int) -> Iterator[Entry]:
        kind_of = self.context.traffic.kind
        kind = kind_of[lead]
        return (entry for entry in self._queue if kind_of[entry[2]] == kind)

    def _take(self, entries: list[Entry]) -> None:
        for entry in entries:
            self._queue.remove(entry)
