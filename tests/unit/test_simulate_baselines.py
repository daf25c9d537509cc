"""The baselines: ``rescore`` is the heap rescored in full every period (checked against a
literal one), it orders as tierq's rule (the least order key among tenants with room) to
within one rescore period, and ``strict`` serves by priority alone."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.core import policy
from jobs.core.policy import Policy, Tier
from jobs.simulate.baselines import RescoreContender, StrictContender
from jobs.simulate.contender import Context
from jobs.simulate.traffic import Traffic

pytestmark = pytest.mark.unit

AGEING = 4.0  # a power of two: the literal heap's scores are exact, ties compare equal
PERIOD = 1.0
TENANTS = 6  # tenant i is of tier i % 3, cap 1 each on a pool of 3 slots
POLICY = Policy(
    tiers={name: Tier(name=name, base_priority=base, max_wait_s=1000, tenant_share=0.34)
           for name, base in (("gold", 0), ("silver", 2), ("bronze", 5))},
    ageing_rate_s=AGEING, mean_service_s=6.0)


@dataclass(frozen=True)
class Op:
    quarters: int  # time step, in quarter seconds
    kind: str  # arrive, dispatch, finish
    tenant: int


ops = st.lists(st.builds(Op, st.integers(0, 10),
                         st.sampled_from(["arrive", "arrive", "dispatch", "finish"]),
                         st.integers(0, TENANTS - 1)), min_size=1, max_size=80)


def _traffic(steps: list[Op]) -> tuple[Traffic, list[tuple[float, Op]]]:
    now, timed, arrival, tenant = 0.0, [], [], []
    for op in steps:
        now += op.quarters / 4
        timed.append((now, op))
        if op.kind == "arrive":
            arrival.append(now)
            tenant.append(op.tenant)
    n = len(arrival)
    traffic = Traffic(tiers=["gold", "silver", "bronze"],
                      tenants=[f"t{i}" for i in range(TENANTS)],
                      tenant_tier=[i % 3 for i in range(TENANTS)], arrival=arrival,
                      tenant=tenant, service_s=[1.0] * n, failures=[0] * n,
                      max_wait_s=[None] * n, batch=bytearray(n))
    return traffic, timed


class LiteralRescore:
    """The rescored heap as first written: effective priorities ``base − waited / rate``,
    every entry rescored at each whole period, a job of a tenant at its cap popped and pushed
    back."""

    def __init__(self, base: Callable[[int], float], enqueued: list[float]) -> None:
        self.base, self.enqueued = base, enqueued
        self.heap: list[tuple[float, int, int]] = []
        self.rescored_at, self.seq = 0.0, 0

    def _rescore(self, now: float) -> None:
        while self.rescored_at + PERIOD <= now:
            self.rescored_at += PERIOD
            at = self.rescored_at
            self.heap = [(self.base(job) - (at - self.enqueued[job]) / AGEING, seq, job)
                         for _, seq, job in self.heap]
            heapq.heapify(self.heap)

    def push(self, job: int, now: float) -> None:
        self._rescore(now)
        self.seq += 1
        score = self.base(job) - (now - self.enqueued[job]) / AGEING
        heapq.heappush(self.heap, (score, self.seq, job))

    def pop(self, n: int, now: float, room: Callable[[int], bool]) -> list[int]:
        self._rescore(now)
        taken: list[int] = []
        skipped = []
        while len(taken) < n and self.heap:
            item = heapq.heappop(self.heap)
            if room(item[2]):
                taken.append(item[2])
            else:
                skipped.append(item)
        for item in skipped:
            heapq.heappush(self.heap, item)
        return taken


def _play(steps: list[Op], check: Callable[..., None]) -> None:
    """Drive a RescoreContender through ``steps``; ``check(popped, queued, room, now)`` after
    every dispatch, with the jobs queued before it."""
    traffic, timed = _traffic(steps)
    context = Context(policy=POLICY, traffic=traffic, enqueued=list(traffic.arrival))
    rescore = RescoreContender(context, period_s=PERIOD)
    assert rescore.set_workers({"w": 3}, 0.0) == 3
    queued: set[int] = set()
    running: list[int] = []
    job = 0
    for now, op in timed:
        if op.kind == "arrive":
            assert rescore.submit(job, now).accepted
            queued.add(job)
            job += 1
        elif op.kind == "finish" and running:
            done = running.pop(0)
            rescore.finish(done, 1, now)
        elif op.kind == "dispatch":
            before = set(queued)
            started = [j for j, _ in rescore.dispatch(now).started]
            check(started, before, running, now, context)
            queued -= set(started)
            running.extend(started)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_rescore_pops_as_the_heap_rescored_in_full(steps: list[Op]) -> None:
    traffic, _ = _traffic(steps)
    literal = LiteralRescore(
        lambda job: POLICY.tier(traffic.tiers[traffic.tier_of(job)]).base_priority,
        traffic.arrival)
    pushed: set[int] = set()

    def check(started: list[int], before: set[int], running: list[int], now: float,
              context: Context) -> None:
        for job in sorted(before - pushed):
            literal.push(job, context.enqueued[job])
            pushed.add(job)
        inflight = [0] * TENANTS
        for job in running:
            inflight[traffic.tenant[job]] += 1

        def room(job: int) -> bool:
            if inflight[traffic.tenant[job]] >= 1:
                return False
            inflight[traffic.tenant[job]] += 1
            return True

        assert literal.pop(3 - len(running), now, room) == started

    _play(steps, check)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_rescore_orders_as_tierq_to_within_one_period(steps: list[Op]) -> None:
    """Each job the rescored heap starts has an order key at most one period above the
    least key among the jobs tierq could start instead (tenants with room)."""
    def check(started: list[int], before: set[int], running: list[int], now: float,
              context: Context) -> None:
        traffic = context.traffic
        busy = {traffic.tenant[job] for job in running}
        waiting = set(before)
        for job in started:
            candidates = [context.order_key(j) for j in waiting
                          if traffic.tenant[j] not in busy]
            assert context.order_key(job) <= min(candidates) + PERIOD + 1e-9
            waiting.discard(job)
            busy.add(traffic.tenant[job])

    _play(steps, check)


def test_rescore_favours_a_fresh_job_until_the_next_rescore() -> None:
    """Pushed between two rescores, a job is scored as if it had arrived at the last one:
    up to one period ahead of its place."""
    steps = [Op(2, "arrive", 0), Op(1, "arrive", 3), Op(0, "dispatch", 0)]
    traffic, _ = _traffic(steps)  # t0 (gold) at 0.5 s, t3 (gold) at 0.75 s
    context = Context(policy=POLICY, traffic=traffic, enqueued=list(traffic.arrival))
    rescore = RescoreContender(context, period_s=PERIOD)
    rescore.set_workers({"w": 1}, 0.0)
    for job in (0, 1):
        rescore.submit(job, traffic.arrival[job])
    # Both scored at their push with nothing waited: a tie, broken by push order.
    assert rescore.dispatch(0.9).started == [(0, 1)]
    assert math.isclose(context.order_key(1) - context.order_key(0), 0.25)


def test_strict_serves_by_priority_then_arrival_with_no_bound_and_no_cap() -> None:
    steps = [Op(1, "arrive", 2)] * 3 + [Op(1, "arrive", 0)] * 2 + [Op(1, "arrive", 1)]
    traffic, _ = _traffic(steps)
    context = Context(policy=POLICY, traffic=traffic, enqueued=list(traffic.arrival))
    strict = StrictContender(context)
    strict.set_workers({"w": 6}, 0.0)
    for job in range(len(traffic)):
        assert strict.submit(job, traffic.arrival[job]).accepted
    order = [job for job, _ in strict.dispatch(10.0).started]
    # tenant 0 is gold, tenant 1 silver, tenant 2 bronze; one tenant runs two at once
    assert order == [3, 4, 5, 0, 1, 2]
    assert strict.cap(0) is None


def test_rescore_refuses_at_the_bound_of_the_policy() -> None:
    tight = Policy(tiers={"gold": Tier(name="gold", base_priority=0, max_wait_s=1,
                                       tenant_share=1.0)}, mean_service_s=1.0)
    steps = [Op(0, "arrive", 0)] * 5
    traffic, _ = _traffic(steps)
    traffic = Traffic(**{**traffic.__dict__, "tiers": ["gold"], "tenant_tier": [0] * TENANTS})
    context = Context(policy=tight, traffic=traffic, enqueued=list(traffic.arrival))
    rescore = RescoreContender(context)
    rescore.set_workers({"w": 2}, 0.0)  # μ = 2/s, a 1 s wait: a bound of 2
    bound = policy.queue_bound(tight.tier("gold"), policy.service_rate(2, 1.0))
    verdicts = [rescore.submit(job, 0.0) for job in range(5)]
    assert [v.accepted for v in verdicts] == [True] * bound + [False] * (5 - bound)
    assert verdicts[-1].limit == "bound" and verdicts[-1].count == bound
