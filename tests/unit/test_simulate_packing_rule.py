"""How runs are formed under simulation: a slot's first item is the job the policy starts
without packing, and a kind that packs fills its run with the next queued jobs of that kind
in the policy's order, a tenant already in the run riding free and another joining only under
its cap. Checked against a model of the queue for tierq (the in-memory index's ``fill_run``)
and for the strict baseline, and the rule itself (``packing.fill``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.core.policy import Policy, Tier
from jobs.simulate.baselines import RescoreContender, StrictContender
from jobs.simulate.contender import Contender, Context
from jobs.simulate.packing import Kind, RunTime, fill
from jobs.simulate.real import TierqContender
from jobs.simulate.traffic import Traffic

pytestmark = pytest.mark.unit

TENANTS = 6  # tenant i is of tier i % 3
SLOTS = 3
MAX_ITEMS = 3
POLICY = Policy(
    tiers={name: Tier(name=name, base_priority=base, max_wait_s=1000, tenant_share=0.34)
           for name, base in (("gold", 0), ("silver", 2), ("bronze", 5))},
    ageing_rate_s=4.0, mean_service_s=6.0)
KINDS = (Kind(max_items_per_run=MAX_ITEMS, run_time=RunTime(a=1.0, b=0.1)), Kind())
EMBED, RENDER = 0, 1


@dataclass(frozen=True)
class Op:
    quarters: int  # time step, in quarter seconds
    what: str  # arrive, dispatch, finish
    tenant: int
    kind: int


ops = st.lists(st.builds(Op, st.integers(0, 6),
                         st.sampled_from(["arrive", "arrive", "arrive", "dispatch", "finish"]),
                         st.integers(0, TENANTS - 1), st.sampled_from([EMBED, EMBED, RENDER])),
               min_size=1, max_size=80)


def _traffic(steps: list[Op]) -> tuple[Traffic, list[tuple[float, Op]]]:
    now, timed, arrival, tenant, kind = 0.0, [], [], [], []
    for op in steps:
        now += op.quarters / 4
        timed.append((now, op))
        if op.what == "arrive":
            arrival.append(now)
            tenant.append(op.tenant)
            kind.append(op.kind)
    n = len(arrival)
    traffic = Traffic(tiers=["gold", "silver", "bronze"],
                      tenants=[f"t{i}" for i in range(TENANTS)],
                      tenant_tier=[i % 3 for i in range(TENANTS)], arrival=arrival,
                      tenant=tenant, service_s=[1.0] * n, failures=[0] * n,
                      max_wait_s=[None] * n, batch=bytearray(n), kinds=("embed", "render"),
                      kind=kind)
    return traffic, timed


def _play(steps: list[Op], make: Callable[[Context], Contender],
          order: Callable[[Context, int], tuple[float, ...]]) -> int:
    """Drive a contender through ``steps`` beside a model of its queue and of the units of
    its tenants' caps; every run it starts must be the model's. Returns the runs of more than
    one item seen."""
    traffic, timed = _traffic(steps)
    context = Context(policy=POLICY, traffic=traffic, enqueued=list(traffic.arrival),
                      kinds=KINDS)
    contender = make(context)
    assert contender.set_workers({"w": SLOTS}, 0.0) == SLOTS
    queued: list[int] = []
    seats = [0] * TENANTS  # runs holding items of each tenant
    runs: list[list[tuple[int, int]]] = []
    packed, job = 0, 0
    tenant_of = traffic.tenant

    def room(tenant: int) -> bool:
        cap = contender.cap(tenant)
        return cap is None or seats[tenant] < cap

    for now, op in timed:
        if op.what == "arrive":
            if contender.submit(job, now).accepted:
                queued.append(job)
            job += 1
        elif op.what == "finish" and runs:
            run = runs.pop(0)
            for item, attempt in run:
                contender.finish(item, attempt, now)
            for tenant in {tenant_of[item] for item, _ in run}:
                seats[tenant] -= 1
        elif op.what == "dispatch":
            dispatched = contender.dispatch(now)
            assert not dispatched.expired
            assert len(dispatched.started) <= SLOTS - len(runs)
            for lead, attempt in dispatched.started:
                waiting = sorted(queued, key=lambda j: order(context, j))
                # The first item: the best queued job whose tenant has room, as unpacked.
                assert lead == next(j for j in waiting if room(tenant_of[j]))
                riders = dispatched.riders.get(lead, [])
                expected = fill(tenant_of[lead],
                                [(j, tenant_of[j]) for j in waiting
                                 if j != lead and traffic.kind[j] == traffic.kind[lead]],
                                KINDS[traffic.kind[lead]].max_items_per_run, room)
                assert [j for j, _ in riders] == expected
                run = [(lead, attempt), *riders]
                for item, _ in run:
                    queued.remove(item)
                for tenant in {tenant_of[item] for item, _ in run}:
                    seats[tenant] += 1
                runs.append(run)
                packed += len(run) > 1
            if len(runs) < SLOTS:  # a slot left free: nothing queued could start
                assert not any(room(tenant_of[j]) for j in queued)
    return packed


def _key(context: Context, job: int) -> tuple[float, ...]:
    return (context.order_key(job), job)


def _priority(context: Context, job: int) -> tuple[float, ...]:
    return (POLICY.tier(context.traffic.tiers[context.traffic.tier_of(job)]).base_priority, job)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_tierq_forms_runs_as_the_rule_says(steps: list[Op]) -> None:
    """The in-memory index's ``fill_run``, given the simulator's queued jobs of the lead's
    kind, leases exactly the riders the rule names, and the next slot's first item is the
    next job tierq would start."""
    _play(steps, TierqContender, _key)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_strict_forms_runs_as_the_rule_says(steps: list[Op]) -> None:
    _play(steps, StrictContender, _priority)


def test_runs_of_several_tenants_and_several_items_are_seen() -> None:
    """The model is not vacuous: a queue of one kind packs, across tenants."""
    steps = ([Op(1, "arrive", t % TENANTS, EMBED) for t in range(12)]
             + [Op(1, "dispatch", 0, 0), Op(1, "finish", 0, 0), Op(1, "dispatch", 0, 0)])
    for make, order in ((TierqContender, _key), (StrictContender, _priority)):
        assert _play(steps, make, order) >= 2


def test_the_first_item_is_the_one_started_without_packing() -> None:
    """A premium render queued behind free embeddings takes the only slot: the run of
    embeddings a slot could fill does not go first."""
    steps = [Op(1, "arrive", 2, EMBED), Op(1, "arrive", 5, EMBED), Op(1, "arrive", 0, RENDER),
             Op(0, "dispatch", 0, 0)]
    traffic, timed = _traffic(steps)
    for make in (TierqContender, StrictContender, RescoreContender):
        context = Context(policy=POLICY, traffic=traffic, enqueued=list(traffic.arrival),
                          kinds=KINDS)
        contender = make(context)
        contender.set_workers({"w": 1}, 0.0)
        for job in range(3):
            assert contender.submit(job, traffic.arrival[job]).accepted
        dispatched = contender.dispatch(timed[-1][0])
        assert dispatched.started == [(2, 1)], make
        assert dispatched.riders == {}


def test_fill_takes_the_next_items_under_caps() -> None:
    # (job, tenant) in order; tenant "a" leads; "b" has room, "c" is at its cap.
    candidates = [(1, "c"), (2, "a"), (3, "b"), (4, "c"), (5, "b"), (6, "d")]
    room = {"a": True, "b": True, "c": False, "d": True}.__getitem__
    assert fill("a", candidates, 10, room) == [2, 3, 5, 6]
    assert fill("a", candidates, 3, room) == [2, 3]  # the lead and two riders
    assert fill("c", candidates, 10, room) == [1, 2, 3, 4, 5, 6]  # "c" leads: it rides free
    assert fill("a", candidates, 1, room) == []
