"""Overtaking: how long a job waited while later work of a better tier was served first.

A job is passed over when a job of a better tier that arrived after it starts while it waits
and could have started (its tenant is under its cap: a tenant at its cap waits for its own
jobs, which is the cap at work, not an overtaking). Per tier this keeps the worst case two
ways: the passed-over job's wait at that moment, and how much later than it the job served
first had arrived. With ageing the latter never exceeds the tier's ageing guarantee
(``policy.ageing_guarantee_s``); under priority only it grows without limit.

Kept incrementally at O(log n) per event: per tenant its waiting jobs by arrival, per tier
the oldest waiting job of each tenant that has room under its cap.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

# (arrival, job, tenant): the oldest waiting job of a tenant with room under its cap.
Head = tuple[float, int, int]


class Overtaking:
    """Heaps with lazy deletion throughout: an entry counts while it is the current one, by
    identity (a job's while it waits, a tenant's head while it is the head); others are
    dropped when they reach the top."""

    def __init__(self, *, tenant_tier: list[int], tier_rank: list[float],
                 cap: Callable[[int], int | None]) -> None:
        self._tenant_tier = tenant_tier
        self._cap = cap
        self._waiting: list[list[tuple[float, int]]] = [[] for _ in tenant_tier]
        self._live: dict[int, tuple[float, int]] = {}  # waiting job → its heap entry
        self._inflight = [0] * len(tenant_tier)
        self._heads: list[list[Head]] = [[] for _ in tier_rank]
        self._head_of: list[Head | None] = [None] * len(tenant_tier)
        # Lower rank is better (the base priority).
        self._worse = [[t for t in range(len(tier_rank)) if tier_rank[t] > tier_rank[u]]
                       for u in range(len(tier_rank))]
        self.wait_max = [0.0] * len(tier_rank)  # passed over after waiting this long
        self.gap_max = [0.0] * len(tier_rank)  # by a job that arrived this much later

    def _oldest(self, tenant: int) -> tuple[float, int] | None:
        waiting, live = self._waiting[tenant], self._live
        while waiting and live.get(waiting[0][1]) is not waiting[0]:
            heapq.heappop(waiting)
        return waiting[0] if waiting else None

    def _refresh(self, tenant: int) -> None:
        cap = self._cap(tenant)
        if cap is not None and self._inflight[tenant] >= cap:  # no room: no head to offer
            self._head_of[tenant] = None
            return
        oldest = self._oldest(tenant)
        old = self._head_of[tenant]
        if oldest is None:
            self._head_of[tenant] = None
            return
        if old is not None and old[1] == oldest[1]:
            return
        head = (oldest[0], oldest[1], tenant)
        self._head_of[tenant] = head
        heapq.heappush(self._heads[self._tenant_tier[tenant]], head)

    def _first(self, tier: int) -> Head | None:
        heads, head_of = self._heads[tier], self._head_of
        while heads and head_of[heads[0][2]] is not heads[0]:
            heapq.heappop(heads)
        return heads[0] if heads else None

    def refresh_all(self) -> None:
        """Caps changed (the pool did)."""
        for tenant in range(len(self._tenant_tier)):
            self._refresh(tenant)

    def wait(self, job: int, tenant: int, arrival: float) -> None:
        entry = (arrival, job)
        self._live[job] = entry
        heapq.heappush(self._waiting[tenant], entry)
        self._refresh(tenant)

    def unwait(self, job: int, tenant: int, arrival: float) -> None:
        """``job`` stopped waiting without starting (expired); a job not waiting (a retry
        still in its backoff) is left as it is."""
        if self._live.pop(job, None) is None:
            return
        head = self._head_of[tenant]
        if head is not None and head[1] == job:
            self._refresh(tenant)

    def start(self, job: int, tenant: int, arrival: float, now: float, *,
              holds: bool = True, passes: bool = True) -> None:
        """``job`` starts: it stops waiting, and overtakes the oldest waiting job of every
        worse tier that arrived before it. A run's rider does not pass (``passes``: it takes
        no slot) and holds no more of its tenant's cap once one item of it is in the run
        (``holds``)."""
        if not holds:
            del self._live[job]
            self._refresh(tenant)
            return
        for tier in self._worse[self._tenant_tier[tenant]] if passes else ():
            first = self._first(tier)
            if first is not None and first[0] < arrival:
                oldest = first[0]
                # As ``max(kept, new)``, without a call per worse tier and start.
                if now - oldest > self.wait_max[tier]:
                    self.wait_max[tier] = now - oldest
                if arrival - oldest > self.gap_max[tier]:
                    self.gap_max[tier] = arrival - oldest
        self._inflight[tenant] += 1
        del self._live[job]
        self._refresh(tenant)

    def finish(self, tenant: int) -> None:
        self._inflight[tenant] -= 1
        self._refresh(tenant)
