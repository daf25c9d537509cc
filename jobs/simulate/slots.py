"""What runs on a pool's slots: a job, or a run of several items of one kind that holds one
slot (``jobs.simulate.packing``), started, and stopped when it ends or its worker is lost.

Kept apart from the event loop (``engine``), whose ``Engine`` it is the base of: the counts
of what is busy, each tenant's units of its cap, and the overtaking tracker's starts.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from jobs.simulate.contender import Context
from jobs.simulate.lanes import Lane
from jobs.simulate.outcome import SERVED, Run

# Event kinds.
_FINISH, _RENEW, _POOL, _REAP, _WAKE, _FEED = range(6)


class Slots:
    """The engine's slots: set up by ``Engine.__init__``."""

    context: Context
    run: Run
    _events: list[tuple[float, int, int, int, int]]
    _seq: itertools.count[int]
    _busy: int
    _tenant: list[int]
    _enqueued: list[float]
    _service_s: list[float]
    _kind: list[int]
    _kinds: tuple[str, ...]
    _renew_after: float
    _renew_every: float
    _backoff: dict[int, int]  # job → the attempt that waits out its backoff

    def _woken(self, lane: Lane, job: int, tenant: int) -> None:
        """A retry starts the instant its backoff ends, before its wake was played (the items
        of a run that failed together end their backoffs together): it waited until now."""
        if self._backoff.pop(job, None) is not None:
            lane.tracker.wait(job, tenant, self._enqueued[job])

    def _push(self, at: float, kind: int, job: int = 0, attempt: int = 0) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, job, attempt))

    def _start(self, lane: Lane, job: int, attempt: int, now: float) -> None:
        run = self.run
        tenant = self._tenant[job]
        if run.start[job] != run.start[job]:  # nan: its first start
            run.start[job] = now
            run.status[job] = SERVED
        if attempt > 1:
            run.restarts += 1
            if self._backoff:
                self._woken(lane, job, tenant)
        self._busy += 1
        lane.busy += 1
        running = lane.tenant_running[tenant] = lane.tenant_running[tenant] + 1
        if running > run.peak[tenant]:
            run.peak[tenant] = running
        cap = lane.c.cap(tenant)
        if cap is not None and running > cap:
            run.cap_exceeded += 1
        lane.tracker.start(job, tenant, self._enqueued[job], now)
        end = now + self._service_s[job]
        lane.running[job] = (attempt, end)
        self._push(end, _FINISH, job, attempt)
        if end - now > self._renew_after:
            self._push(now + self._renew_every, _RENEW, job, attempt)

    def _start_run(self, lane: Lane, lead: int, attempt: int,
                   riders: Sequence[tuple[int, int]], now: float) -> None:
        """A slot takes a run: its first item and the riders its contender joined to it. The
        run holds one slot, and one unit of the cap of each tenant it has items of; its items
        end together, after ``a + b × n`` (the lead's draw, stretched by the kind's model)."""
        kind = self.context.kind(lead)
        if kind.packs:
            counted = self.run.run_items.setdefault(self._kinds[self._kind[lead]], [0, 0])
            counted[0] += 1
            counted[1] += 1 + len(riders)
        if not riders:
            self._start(lane, lead, attempt, now)
            return
        assert kind.run_time is not None  # a kind that packs has its model
        items = [(lead, attempt), *riders]
        end = now + self._service_s[lead] * kind.run_time.stretch(len(items))
        run, tenant_of = self.run, self._tenant
        self._busy += 1
        lane.busy += 1
        inside: set[int] = set()
        for job, item_attempt in items:
            tenant = tenant_of[job]
            if run.start[job] != run.start[job]:
                run.start[job] = now
                run.status[job] = SERVED
            if item_attempt > 1:
                run.restarts += 1
                if self._backoff:
                    self._woken(lane, job, tenant)
            holds = tenant not in inside
            if holds:
                inside.add(tenant)
                self._occupy(lane, tenant)
            # A rider takes no slot: it passes nobody.
            lane.tracker.start(job, tenant, self._enqueued[job], now, holds=holds,
                               passes=job == lead)
            lane.running[job] = (item_attempt, end)
            if job != lead:
                lane.rider_of[job] = lead
            if end - now > self._renew_after:
                self._push(now + self._renew_every, _RENEW, job, item_attempt)
        lane.runs[lead] = items
        self._push(end, _FINISH, lead, attempt)

    def _occupy(self, lane: Lane, tenant: int) -> None:
        """The tenant holds one more unit of its cap."""
        run = self.run
        running = lane.tenant_running[tenant] = lane.tenant_running[tenant] + 1
        if running > run.peak[tenant]:
            run.peak[tenant] = running
        cap = lane.c.cap(tenant)
        if cap is not None and running > cap:
            run.cap_exceeded += 1

    def _vacate(self, lane: Lane, items: Sequence[tuple[int, int]]) -> None:
        """A run ends (finished or lost): its slot frees, and each of its tenants' unit."""
        self._busy -= 1
        lane.busy -= 1
        tenants = {self._tenant[job] for job, _ in items}
        for tenant in tenants:
            lane.tenant_running[tenant] -= 1
            lane.tracker.finish(tenant)
        for job, _ in items:
            del lane.running[job]
            lane.rider_of.pop(job, None)

    def _stop(self, lane: Lane, job: int) -> None:
        """A running attempt ends (finished or lost): its slot frees."""
        tenant = self._tenant[job]
        del lane.running[job]
        self._busy -= 1
        lane.busy -= 1
        lane.tenant_running[tenant] -= 1
        lane.tracker.finish(tenant)
