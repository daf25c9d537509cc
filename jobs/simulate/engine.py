"""The discrete-event loop: a contender per pool, the scenario's traffic, a virtual clock.

The engine plays the parts around the queue: clients submitting at their arrival times, a
pool of workers (joining, leaving, crashing) running each started job for its service time,
heartbeats for long jobs, the reaper, retries with backoff, and the dispatcher's measure of
the mean service time (``jobs.fleet.service_rate.weighted_mean`` every ``REFRESH_S``). The
contender decides admission, order and caps. The run ends at the last arrival: what is still
queued then is reported as waiting, so a policy that starves a tier cannot hide it by
draining the queue once the traffic stops.

With pools, each pool is a lane of its own (``lanes``): its contender, workers and measure;
a job's events go to its pool's lane only. A slot takes a run (``slots``): one job, or with a
kind that packs, the items its contender joined to it, which end together; the measure counts
each item at its share of its run.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Iterator, Sequence

from jobs.core import policy
from jobs.core.cadence import FEED_PERIOD_S, ITEMS_PER_ROUND, MAINTENANCE_PERIOD_S
from jobs.core.cadence import SERVICE_REFRESH_S as REFRESH_S
from jobs.core.policy import WINDOW, MeasuredMean, weighted_mean
from jobs.core.service_times import kind_mean, mix_mean, usable
from jobs.simulate.contender import Contender, Context, Verdict
from jobs.simulate.lanes import Lane, lane_tenants
from jobs.simulate.outcome import EXPIRED, FAILED, HELD, REFUSED, SERVED, WAITING, Run, Sample
from jobs.simulate.overtaking import Overtaking
from jobs.simulate.scenario import Pool
from jobs.simulate.slots import _FEED, _FINISH, _POOL, _REAP, _RENEW, _WAKE, Slots

__all__ = ["EXPIRED", "FAILED", "HELD", "REFUSED", "SERVED", "WAITING", "Engine", "Run",
           "Sample"]

NAN = math.nan


class Engine(Slots):
    """``contender`` runs ``pool``, the scenario's first; ``others`` the further pools, in
    ``Traffic.pools`` order. A contender of each pool shares ``context.enqueued``."""

    def __init__(self, contender: Contender, context: Context, pool: Pool,
                 *, samples: int = 400, others: Sequence[tuple[Contender, Pool]] = ()) -> None:
        self.context = context
        traffic = context.traffic
        n = len(traffic)
        self.horizon = traffic.arrival[-1] if n else 0.0
        ntenants = len(traffic.tenants)
        self.run = Run(
            policy=contender.name, horizon_s=self.horizon, enqueued=context.enqueued,
            start=[NAN] * n,
            status=bytearray(n), refusal=[None] * n, refusal_figures={},
            told_wait_s=[None] * n,
            overtaken_wait_s=[], overtaken_gap_s=[], peak=[0] * ntenants,
            caps=[None] * ntenants, cap_exceeded=0, restarts=0, busy_s=0.0,
            capacity_s=0.0)
        pairs = [(contender, pool), *others]
        if len(pairs) != len(traffic.pools):
            raise ValueError(f"{len(pairs)} contenders for {len(traffic.pools)} pools")
        tenants: Sequence[range | list[int]] = (
            [range(ntenants)] if not others else
            lane_tenants(traffic.tenant, traffic.pool, len(pairs)))
        rank = [t.base_priority for t in context.tiers]
        self.lanes = [
            Lane(index=i, c=c, pool=p, tenants=tenants[i], tenant_running=[0] * ntenants,
                 tracker=Overtaking(tenant_tier=traffic.tenant_tier, tier_rank=rank, cap=c.cap))
            for i, (c, p) in enumerate(pairs)]
        self._one = [(lane,) for lane in self.lanes]  # what an event of one pool dispatches
        self._pooled = len(self.lanes) > 1
        # The columns the loop reads per event, bound once.
        self._pool = traffic.pool
        self._tenant = traffic.tenant
        self._service_s = traffic.service_s
        self._failures = traffic.failures
        self._kind = traffic.kind
        self._kinds = traffic.kinds
        self._one_kind = len(traffic.kinds) == 1
        self._packs = context.packs
        self._batch = traffic.batch
        self._enqueued = context.enqueued
        self._events: list[tuple[float, int, int, int, int]] = []
        self._seq = itertools.count()
        self._next_worker = 0
        self._capacity = 0
        self._busy = 0
        self._sample_dt = self.horizon / samples if self.horizon > 0 else math.inf
        self._ttl = context.policy.lease_ttl_s
        self._renew_after = self._ttl / 2  # a job running longer than this is renewed
        self._renew_every = self._ttl / 3
        # (pool, tenant) → batch items not admitted yet
        self._held: dict[tuple[int, int], deque[int]] = {}
        self._backoff: dict[int, int] = {}  # job → the attempt that waits out its backoff
        self._last = 0.0  # the time of the last event
        self._next_sample, self._next_measure = 0.0, REFRESH_S
        self._next_upkeep = MAINTENANCE_PERIOD_S
        self._next_timer = 0.0  # the first of the three above: no timer is due before it

    def _lane(self, job: int) -> Lane:
        return self.lanes[self._pool[job]]

    def _add_workers(self, lane: Lane, count: int, now: float) -> None:
        for _ in range(count):
            lane.workers[f"w{self._next_worker}"] = lane.pool.slots
            self._next_worker += 1
        self._pool_changed(lane, now)

    def _pool_changed(self, lane: Lane, now: float) -> None:
        lane.capacity = lane.c.set_workers(dict(lane.workers), now)
        self._capacity = sum(each.capacity for each in self.lanes)
        lane.tracker.refresh_all()
        caps = self.run.caps
        for tenant in lane.tenants:
            cap, seen = lane.c.cap(tenant), caps[tenant]
            if cap is not None and (seen is None or cap > seen):
                caps[tenant] = cap

    def simulate(self) -> Run:
        began = time.perf_counter()
        run = self.run
        for lane in self.lanes:
            self._add_workers(lane, lane.pool.workers, 0.0)
            for i, change in enumerate(lane.pool.changes):
                self._push(change.at_s, _POOL, i, lane.index)
        # Bound once: the loop runs per event.
        account, timers, arrive, handle = self._account, self._timers, self._arrive, self._handle
        dispatch = self._dispatch
        for now, kind, job, attempt in self._timeline():
            account(now)
            if now >= self._next_timer:
                timers(now)
            lanes = arrive(job, now) if kind == -1 else handle(kind, job, attempt, now)
            for lane in lanes:
                # A dispatch can start nothing while every slot is busy.
                if lane.busy < lane.capacity:
                    dispatch(lane, now)
        self._account(self.horizon)
        trackers = [lane.tracker for lane in self.lanes]
        run.overtaken_wait_s = [max(w) for w in zip(*(t.wait_max for t in trackers), strict=True)]
        run.overtaken_gap_s = [max(g) for g in zip(*(t.gap_max for t in trackers), strict=True)]
        if len(self.lanes) == 1:
            run.pool_busy_s, run.pool_capacity_s = [run.busy_s], [run.capacity_s]
        else:
            run.pool_busy_s = [lane.busy_s for lane in self.lanes]
            run.pool_capacity_s = [lane.capacity_s for lane in self.lanes]
        run.wall_s = time.perf_counter() - began
        return run

    def _timeline(self) -> Iterator[tuple[float, int, int, int]]:
        """Arrivals and events in time order, up to the last arrival: (time, kind, job,
        attempt), kind -1 for an arrival."""
        arrival, n, i = self.context.traffic.arrival, len(self.context.traffic), 0
        events, horizon, pop = self._events, self.horizon, heapq.heappop
        while True:
            if events and (i >= n or events[0][0] <= arrival[i]):
                if events[0][0] > horizon:
                    return
                at, _, kind, job, attempt = pop(events)
                yield at, kind, job, attempt
            elif i < n:
                i += 1
                yield arrival[i - 1], -1, i - 1, 0
            else:
                return

    def _account(self, now: float) -> None:
        """Slot-seconds busy and offered since the last event."""
        elapsed = now - self._last
        run = self.run
        run.busy_s += self._busy * elapsed
        run.capacity_s += self._capacity * elapsed
        if self._pooled:
            for lane in self.lanes:
                lane.busy_s += lane.busy * elapsed
                lane.capacity_s += lane.capacity * elapsed
        self._last = now

    def _timers(self, now: float) -> None:
        """What runs on timers: the samples for the picture, the dispatcher's measure of the
        mean service time (``REFRESH_S``) and its expiry sweep (``MAINTENANCE_PERIOD_S``)."""
        while now >= self._next_sample:
            queued = [sum(q) for q in zip(*(lane.c.queued() for lane in self.lanes),
                                          strict=True)]
            self.run.samples.append(Sample(
                at_s=self._next_sample, queued=queued, busy=self._busy, capacity=self._capacity,
                pools=tuple((lane.busy, lane.capacity) for lane in self.lanes)))
            self._next_sample += self._sample_dt
        if now >= self._next_measure:
            self._next_measure = now + REFRESH_S
            for lane in self.lanes:
                if lane.run_times and (lane.completions != lane.measured_at
                                       or not self._one_kind):
                    lane.measured_at = lane.completions
                    self._measure(lane, now)
        if now >= self._next_upkeep:
            self._next_upkeep = now + MAINTENANCE_PERIOD_S
            for lane in self.lanes:
                self._expire(lane.c.expire(now))
        self._next_timer = min(self._next_sample, self._next_measure, self._next_upkeep)

    def _measure(self, lane: Lane, now: float) -> None:
        """As ``jobs.fleet.service_rate``: each kind's mean and spread from its newest runs,
        and the mean of the work the pool holds queued, each kind at its own (the overall
        mean for a kind with too few runs, and with none queued). The running jobs' the
        contender counts with the arrivals, as the leader does."""
        samples = len(lane.run_times)
        samples_min = self.context.policy.service_samples_min
        if lane.kinds_at != lane.completions:  # new runs: each kind's measure again (only
            # of those measured well enough to be used)
            lane.kinds_at = lane.completions
            lane.overall = weighted_mean(lane.run_times)
            runs_of = ({self._kinds[0]: lane.run_times} if self._one_kind else
                       {self._kinds[kind]: runs for kind, runs in lane.kind_runs.items()})
            lane.kinds = {name: kind_mean(runs) for name, runs in runs_of.items()
                          if len(runs) >= samples_min}
        overall = lane.overall
        assert overall is not None
        if self._one_kind:  # its mean is the overall one, queued and running alike
            self._tell(lane, MeasuredMean(mean_s=overall, samples=samples), now)
            return
        means = usable(lane.kinds, samples_min)
        running: dict[str, int] = {}
        for job in lane.running:
            name = self._kinds[self._kind[job]]
            running[name] = running.get(name, 0) + 1
        queued = {self._kinds[kind]: count - running.get(self._kinds[kind], 0)
                  for kind, count in lane.live.items()}
        self._tell(lane, MeasuredMean(mean_s=mix_mean(queued, means, overall), samples=samples),
                   now)

    def _tell(self, lane: Lane, mean: MeasuredMean, now: float) -> None:
        """Tell the lane's contender a measure that differs from the last one told."""
        measures = lane.kinds
        means = {name: m.mean_s for name, m in measures.items()}
        measure = (mean, means, measures, lane.overall)
        if measure != lane.measure:
            lane.measure = measure
            lane.c.measured(mean, now, kinds=means, measures=measures, overall_s=lane.overall)

    def _gone(self, lane: Lane, job: int) -> None:
        """A job of the lane's work ended for good (its kind's count kept with two kinds
        or more: one kind's mean is the overall one)."""
        if not self._one_kind:
            lane.live[self._kind[job]] -= 1
            lane.c.gone(job)

    def _handle(self, kind: int, job: int, attempt: int, now: float) -> Sequence[Lane]:
        """Play one event other than an arrival; the lanes where a dispatch may start
        something."""
        if kind == _FINISH:
            return self._finish(job, attempt, now)
        if kind == _RENEW:
            self._renew(job, attempt, now)
            return ()
        if kind == _WAKE:
            if self._backoff.pop(job, None) == attempt:  # not expired meanwhile
                self._wait(job)
            return self._one[self._pool[job]]
        if kind == _FEED:
            return self._feed(now)
        lane = self.lanes[attempt]
        if kind == _REAP:
            for lost, lost_attempt in lane.c.reap(now):
                self._retry(lane, lost, lost_attempt, None, now)
        else:
            self._change_pool(lane, job, now)
        return self._one[lane.index]

    def _wait(self, job: int) -> None:
        self._lane(job).tracker.wait(job, self._tenant[job], self._enqueued[job])

    def _arrive(self, job: int, now: float) -> Sequence[Lane]:
        lane = self.lanes[self._pool[job]]
        if self._batch[job]:
            self._hold(lane, job, now)
            return ()
        verdict = lane.c.submit(job, now)
        if not verdict.accepted:
            self._refuse(job, verdict)
            return ()
        self.run.told_wait_s[job] = verdict.told_wait_s
        if not self._one_kind:
            kind = self._kind[job]
            lane.live[kind] = lane.live.get(kind, 0) + 1
        lane.tracker.wait(job, self._tenant[job], self._enqueued[job])
        return self._one[lane.index]

    def _hold(self, lane: Lane, job: int, now: float) -> None:
        """A batch item waits with its tenant's for the feeder."""
        if not self._held:
            self._push(now, _FEED)
        key = (lane.index, self._tenant[job])
        self._held.setdefault(key, deque()).append(job)
        self.run.status[job] = HELD

    def _refuse(self, job: int, verdict: Verdict) -> None:
        run = self.run
        run.status[job] = REFUSED
        run.refusal[job] = f"{verdict.cause}/{verdict.limit}"
        run.refusal_figures[job] = (verdict.count, verdict.limit_value)

    def _feed(self, now: float) -> Sequence[Lane]:
        """A round of the batch feeder: each tenant's items in order until the first one
        refused, at most ``ITEMS_PER_ROUND`` in all; again a period later while any wait."""
        budget = ITEMS_PER_ROUND
        fed: set[int] = set()
        for key, items in list(self._held.items()):
            lane = self.lanes[key[0]]
            while items and budget > 0:
                job = items[0]
                self.context.enqueued[job] = now
                if not lane.c.feed(job, now):
                    break
                items.popleft()
                if not self._one_kind:
                    kind = self._kind[job]
                    lane.live[kind] = lane.live.get(kind, 0) + 1
                budget -= 1
                fed.add(lane.index)
                self.run.status[job] = WAITING
                self._wait(job)
            if not items:
                del self._held[key]
        if self._held:
            self._push(now + FEED_PERIOD_S, _FEED)
        return [self.lanes[i] for i in sorted(fed)]

    def _dispatch(self, lane: Lane, now: float) -> None:
        dispatched = lane.c.dispatch(now)
        if dispatched.expired:
            self._expire(dispatched.expired)
        riders = dispatched.riders
        for job, attempt in dispatched.started:
            if self._packs:
                self._start_run(lane, job, attempt, riders.get(job, ()), now)
            else:
                self._start(lane, job, attempt, now)

    def _expire(self, jobs: list[int]) -> None:
        for job in jobs:
            self.run.status[job] = EXPIRED
            self._backoff.pop(job, None)
            lane = self._lane(job)
            lane.tracker.unwait(job, self._tenant[job], self._enqueued[job])
            self._gone(lane, job)

    def _finish_run(self, lane: Lane, items: Sequence[tuple[int, int]], now: float) -> None:
        """All items of a run end together; each took its share of the run's time (so μ
        counts items)."""
        lead = items[0][0]
        kind = self.context.kind(lead)
        assert kind.run_time is not None
        share = self._service_s[lead] * kind.run_time.stretch(len(items)) / len(items)
        self._vacate(lane, items)
        for job, attempt in items:
            lane.c.finish(job, attempt, now)
        for job, attempt in items:
            self._ended(lane, job, attempt, share, now)

    def _finish(self, job: int, attempt: int, now: float) -> Sequence[Lane]:
        lane = self.lanes[self._pool[job]]
        held = lane.running.get(job)
        if held is None or held[0] != attempt:
            return ()  # lost with its worker
        items = lane.runs.pop(job, None) if self._packs else None
        if items is not None:
            self._finish_run(lane, items, now)
            return self._one[lane.index]
        self._stop(lane, job)
        lane.c.finish(job, attempt, now)
        self._ended(lane, job, attempt, self._service_s[job], now)
        return self._one[lane.index]

    def _ended(self, lane: Lane, job: int, attempt: int, seconds: float, now: float) -> None:
        """An attempt that took ``seconds`` of its slot (its share of its run's) ended: it is
        measured, and retried or gone."""
        lane.run_times.appendleft(seconds)
        if not self._one_kind:
            runs = lane.kind_runs.get(self._kind[job])
            if runs is None:
                runs = lane.kind_runs[self._kind[job]] = deque(maxlen=WINDOW)
            runs.appendleft(seconds)
        lane.completions += 1
        if attempt <= self._failures[job]:
            pol = self.context.policy
            backoff = policy.retry_backoff_s(attempt, pol.retry_backoff_s,
                                             pol.retry_backoff_max_s)
            self._retry(lane, job, attempt, now + backoff, now)
        else:
            self._gone(lane, job)

    def _retry(self, lane: Lane, job: int, attempt: int, not_before: float | None,
               now: float) -> None:
        """A failed or lost attempt: queue the next one, if starts are left."""
        if attempt >= self.context.policy.max_attempts:
            self.run.status[job] = FAILED
            self._gone(lane, job)
            return
        lane.c.requeue(job, attempt + 1, not_before, now)
        if not_before is None:
            self._wait(job)
        else:
            self._backoff[job] = attempt + 1
            self._push(not_before, _WAKE, job, attempt + 1)

    def _renew(self, job: int, attempt: int, now: float) -> None:
        lane = self._lane(job)
        held = lane.running.get(job)
        if held is None or held[0] != attempt:
            return
        lane.c.renew(job, attempt, now)
        if held[1] - now > self._renew_after:
            self._push(now + self._renew_every, _RENEW, job, attempt)

    def _change_pool(self, lane: Lane, index: int, now: float) -> None:
        change = lane.pool.changes[index]
        if change.workers == 0:
            return
        if change.workers > 0:
            self._add_workers(lane, change.workers, now)
            return
        leaving = list(lane.workers)[change.workers:]
        before = lane.capacity
        for worker in leaving:
            del lane.workers[worker]
        self._pool_changed(lane, now)
        if change.crash and before:
            lost_slots = len(leaving) * lane.pool.slots
            leads = [job for job in lane.running if job not in lane.rider_of]
            for job in leads[: math.ceil(len(leads) * lost_slots / before)]:
                attempt = lane.running[job][0]
                items = lane.runs.pop(job, None)
                if items is None:
                    self._stop(lane, job)
                else:
                    self._vacate(lane, items)
                for item, item_attempt in items or ((job, attempt),):
                    lane.c.lose(item, item_attempt, now)
            self._push(now + self._ttl, _REAP, 0, lane.index)
