"""What a client is told about a queued job: its queue position and its estimated wait.

The estimate is ``policy.expected_wait_s``: the later of the pool's start and the tenant's
own, so a tenant at its cap hears the time until one of its slots frees, not "0 s" because
the pool has idle slots it may not use. The same numbers answer the 202 of a submit, ``GET
/v1/jobs/{id}``, the list, and the deadline refusal.

``queue_position`` stays the index's: every queued job ahead in dispatch order, all tenants.
It is a plain fact a client can watch shrink; which of those jobs start first (others' at
their cap do not, its own beyond its cap hold it back) is what the estimate accounts for:
while tenants below their caps leave a job a free slot, it starts at once, however many jobs
wait on their tenants' caps ahead of it (``starts_ahead``).

The pool's side counts the better-ranked work expected to arrive while the job waits, at the
tiers' measured arrival rates (``policy.overtakers``, ``jobs.fleet.arrivals``): a free job
behind a premium stream that alone fills the pool is told the wait until ageing lets it
pass, not the drain time of the jobs ahead of it now.

The tenant's side waits for the tenant's own running jobs, each by what it has left: what it
has run against its kind's measured mean and spread (``jobs.core.remaining``), read with the
tenant's own work from SQL at most once a second (``own_side``). A tenant whose 25 s job has
run 20 s is told 5 s, and one whose job has overrun its kind's time is not told "at once".
Until the pool has measured kinds nothing is known of how long they run, and each running
job counts as a fresh one. The deadline refusal is decided in the admit script, which counts
them as fresh too.

The tenant's side is read next to, not inside, the atomic index calls: a job finishing or
another submit of the tenant between two reads moves an estimate by one job at most, which
an estimate can bear (the bound and the quota stay exact in the admit script).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from jobs.core import policy
from jobs.core.arrivals import Work
from jobs.core.domain import Job, Tenant
from jobs.core.policy import mean_service_s
from jobs.core.progress import Report
from jobs.core.remaining import own_slot_s
from jobs.core.service_times import kind_rest, mix_mean
from jobs.core.states import Status
from jobs.fleet.arrivals import read_work
from jobs.fleet.pool import PoolFigures, live_pool
from jobs.index import progress as progress_index
from jobs.index.base import DispatchIndex
from jobs.process.outage import REDIS_OUTAGE
from jobs.process.runtime import Runtime
from jobs.store import jobs as jobs_sql
from jobs.store import stats as stats_sql

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """A queued job's place: jobs ahead of it in the index, and its expected wait."""

    position: int
    estimated_wait_s: float | None  # None: nothing is being served, so no estimate
    # A slot of the pool was free when it was admitted (else its submit offers it none: the
    # next slot to free takes the best job, or the dispatcher does).
    slot_free: bool = True


def tenant_cap(tenant: Tenant, figures: PoolFigures) -> int:
    """The tenant's concurrency cap: its own override, else its tier's (the dispatcher's)."""
    if tenant.cap is not None:
        return tenant.cap
    return figures.caps.get(tenant.tier, 1)


def tenant_rate(tenant: Tenant, figures: PoolFigures) -> float:
    """Jobs/s the tenant's cap lets it finish, at the pool's mean service time."""
    return policy.tenant_rate(tenant_cap(tenant, figures), figures.capacity,
                              figures.mean_service_s)


def overtaking(
    runtime: Runtime, work: Work, *, order_key: float, now: float
) -> list[policy.Overtaker]:
    """The work the tiers' arrivals will pass a job of ``order_key`` with, in jobs of the
    pool's mean service time (the unit of its μ)."""
    pol = runtime.policy
    return policy.overtakers(pol.tiers, pol.ageing_rate_s, order_key=order_key, now=now,
                             arrivals=work.later_rates())


# A tenant's own work, as last read from SQL, per pool (its index) and tenant: a tenant at its
# cap submits many jobs a second, and its work moves far slower than that (the count query
# also grows with its queue).
OWN_WORK_CACHE_S = 1.0
_OWN_KEPT = 4096  # tenants kept per pool before the stale ones are dropped
_OWN_LOCK = threading.Lock()


@dataclass(frozen=True, kw_only=True)
class OwnWork:
    """A tenant's jobs queued or in flight by kind, and the kind and start (None: not yet)
    of each in flight."""

    kinds: dict[str, int]
    in_flight: tuple[tuple[str, float | None], ...]


_OWN: weakref.WeakKeyDictionary[DispatchIndex, dict[str, tuple[float, OwnWork]]] = (
    weakref.WeakKeyDictionary())


def _own_work(runtime: Runtime, tenant_id: str) -> OwnWork:
    """``stats.tenant_work`` and ``stats.in_flight_starts`` of the tenant, at most
    ``OWN_WORK_CACHE_S`` old."""
    now = time.monotonic()
    with _OWN_LOCK:
        kept = _OWN.setdefault(runtime.index, {})
        held = kept.get(tenant_id)
    if held is not None and now - held[0] < OWN_WORK_CACHE_S:
        return held[1]
    with runtime.sessions() as session:  # a read: on SQLite it must not take the write lock
        work = OwnWork(kinds=stats_sql.tenant_work(session, tenant_id, runtime.scope),
                       in_flight=tuple(stats_sql.in_flight_starts(
                           session, runtime.scope, tenant_id=tenant_id)))
    with _OWN_LOCK:
        if len(kept) >= _OWN_KEPT:
            for stale in [t for t, (at, _) in kept.items() if now - at >= OWN_WORK_CACHE_S]:
                del kept[stale]
        kept[tenant_id] = (now, work)
    return work


@dataclass(frozen=True, kw_only=True)
class OwnSide:
    """What a tenant's own work adds to the estimate of its next job: the mean service time
    of that work (None: the pool's), and when the first of the jobs holding its places under
    its cap is expected to end, from what each has run (None: as fresh jobs)."""

    mean_s: float | None = None
    first_end_s: float | None = None


NOTHING_OWN = OwnSide()


def own_side(
    runtime: Runtime, tenant: Tenant, work: Work, *, holds: int, cap: int, now: float
) -> OwnSide:
    """The tenant's own side, once the pool has measured kinds (before that nothing is known
    of how long its kinds run, and its jobs count at the pool's mean, as fresh). Its work is
    read at most once per ``OWN_WORK_CACHE_S`` per tenant and process; ``holds``: the jobs in
    flight the index counts for it now."""
    samples_min = runtime.policy.service_samples_min
    means = work.kind_means(samples_min)
    if not means:
        return NOTHING_OWN
    held = _own_work(runtime, tenant.id)
    fallback = mean_service_s(runtime.policy, None)
    mean = mix_mean(held.kinds, means, fallback) if held.kinds else None
    running = [kind_rest(work.kinds, kind, samples_min, fallback,
                         0.0 if started is None else now - started)
               for kind, started in held.in_flight]
    first = own_slot_s(running, holds=holds, cap=cap,
                       fresh_mean_s=fallback if mean is None else mean)
    return OwnSide(mean_s=mean, first_end_s=first if math.isfinite(first) else None)


def starts_ahead(position: int, runnable: int, free_slots: int) -> int:
    """The jobs ahead of a queued job that start before it: the ``runnable`` ones (those
    tenants below their caps can start on the free slots) when they leave it a slot, else
    every one (``position``)."""
    return runnable if 0 < free_slots and runnable < free_slots else position


def placement(
    figures: PoolFigures, *, position: int, load: policy.TenantLoad,
    later: Sequence[policy.Overtaker] = (), work: Work | None = None,
    own: OwnSide = NOTHING_OWN, ahead: int | None = None,
) -> Placement:
    """A job ``position`` jobs ahead in the index, ``ahead`` of them starting before it
    (None: all), its tenant as ``load`` and ``own`` say, passed by ``later`` work while it
    waits; ``work``: what the leader measured of the pool (the running jobs' mean)."""
    estimate = policy.expected_wait_s(
        position if ahead is None else ahead, figures.free_slots, figures.service_rate,
        tenant=load,
        capacity=figures.capacity, mean_service_s=figures.mean_service_s, later=later,
        tenant_mean_s=own.mean_s, tenant_first_end_s=own.first_end_s,
        running_mean_s=None if work is None else work.running_mean_s,
    )
    return Placement(position=position,
                     estimated_wait_s=estimate if math.isfinite(estimate) else None)


def placements(
    runtime: Runtime, tenant: Tenant, jobs: Sequence[Job], figures: PoolFigures
) -> dict[str, Placement]:
    """The places of the tenant's queued, indexed jobs among ``jobs``, by id. Its own jobs
    ahead come from SQL (one query): a job the dispatcher has just leased but not yet marked
    dispatched counts twice for that moment, in flight and ahead."""
    queued = [job for job in jobs if job.status is Status.QUEUED]
    if not queued:
        return {}
    inflight = runtime.index.tenant_inflight(tenant.id)
    with runtime.sessions() as session:  # a read: on SQLite it must not take the write lock
        order = jobs_sql.queued_order(session, tenant.id, runtime.scope)
    cap = tenant_cap(tenant, figures)
    now = runtime.clock()
    work = read_work(runtime.index)
    own: list[OwnSide] = []  # the tenant's own side, read once if a job needs it
    found: dict[str, Placement] = {}
    places = runtime.index.places([(job.id, job.order_key) for job in queued],
                                  free_slots=figures.free_slots)
    for job in queued:
        place = places.get(job.id)
        if place is None:  # waiting out a retry backoff, or not indexed (yet)
            continue
        position, runnable = place
        ahead = bisect_left(order, (job.order_key, job.id))
        load = policy.TenantLoad(cap=cap, inflight=inflight, ahead=ahead)
        if load.excess and not own:
            own.append(own_side(runtime, tenant, work, holds=inflight, cap=cap, now=now))
        found[job.id] = placement(
            figures, position=position, load=load, work=work,
            ahead=starts_ahead(position, runnable, figures.free_slots),
            own=own[0] if load.excess else NOTHING_OWN,
            later=overtaking(runtime, work, order_key=job.order_key, now=now))
    return found


def batch_finish_s(runtime: Runtime, kind: str, tier: str, remaining: int) -> float | None:
    """When a batch none of whose items has finished yet should be done: its ``remaining``
    items at their kind's measured mean (the pool's until measured), as many at once as its
    tier's cap lets one tenant run (never more than the pool's slots). The wait for its first
    slot is not in it; once items finish, the batch's own rate replaces this. None while
    nothing is served or the index is unreachable."""
    pool = runtime.for_kind(kind)
    try:
        figures = live_pool(pool, now=runtime.clock())
        work = read_work(pool.index)
    except REDIS_OUTAGE:
        return None
    slots = min(max(1, figures.caps.get(tier, 1)), figures.capacity)
    if slots <= 0:
        return None
    means = work.kind_means(pool.policy.service_samples_min)
    return round(remaining * means.get(kind, figures.mean_service_s) / slots, 3)


# -- what a lookup answers -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Progress:
    """A job with its live place in the queue (both None unless it is queued and indexed)."""

    job: Job
    queue_position: int | None = None
    estimated_wait_s: float | None = None  # None also when nothing is being served
    # The handler's latest report: from Redis while it runs, else the one stored with the
    # ending (``jobs.core.progress``).
    report: Report | None = None


def progress(runtime: Runtime, tenant: Tenant, job: Job) -> Progress:
    return progress_many(runtime, tenant, [job])[0]


def progress_many(runtime: Runtime, tenant: Tenant, jobs: Sequence[Job]) -> list[Progress]:
    """Live queue positions and estimates of the tenant's queued jobs among ``jobs``
    (``jobs.admission.estimates``). Status reads keep working while Redis is down: the positions are
    then unknown (None), not an error."""
    reports = {job.id: report for job in jobs
               if (report := Report.from_dict(job.progress)) is not None}
    if not any(job.status in (Status.QUEUED, Status.RUNNING) for job in jobs):
        return [Progress(job=job, report=reports.get(job.id)) for job in jobs]
    places: dict[str, Placement] = {}
    try:
        for pool, of_pool in _by_pool(runtime, jobs, Status.RUNNING):
            reports.update(progress_index.read(runtime.redis, pool.prefix,
                                               {job.id: job.attempt for job in of_pool}))
        for pool, of_pool in _by_pool(runtime, jobs, Status.QUEUED):
            figures = live_pool(pool, now=runtime.clock())
            places.update(placements(pool, tenant, of_pool, figures))
    except REDIS_OUTAGE:
        logger.warning("index.unreachable", extra={"event": "index.unreachable"})
        return [Progress(job=job, report=reports.get(job.id)) for job in jobs]
    return [_progress(job, places.get(job.id), reports.get(job.id)) for job in jobs]


def _by_pool(
    runtime: Runtime, jobs: Sequence[Job], status: Status
) -> list[tuple[Runtime, list[Job]]]:
    """The jobs in ``status`` by the runtime of their kind's pool (each pool has its own
    queue and its own reports)."""
    found: dict[str, tuple[Runtime, list[Job]]] = {}
    for job in jobs:
        if job.status is status:
            pool = runtime.for_kind(job.kind)
            found.setdefault(pool.pool, (pool, []))[1].append(job)
    return list(found.values())


def _progress(job: Job, place: Placement | None, report: Report | None) -> Progress:
    if place is None:
        return Progress(job=job, report=report)
    return Progress(job=job, queue_position=place.position,
                    estimated_wait_s=place.estimated_wait_s, report=report)
