"""``tierq`` itself under simulation: the in-memory twin of the dispatch index (the one the
contract suite holds to Redis's behaviour) driven as the API, the dispatcher and the workers
drive the real index, on the simulator's virtual clock.

- submit: ``MemoryIndex.admit_new`` with the terms ``jobs.admission.limits.terms`` builds (the
  tier's bound from the measured μ, the quota, the rate bucket, refuse-if-late on ``max_wait_s``);
  the told wait is ``policy.expected_wait_s`` on the figures of the admission, as
  ``jobs.admission.limits`` and ``jobs.admission.estimates`` tell it;
- dispatch: ``dispatch`` under the tier caps of ``jobs.fleet.pool.figures`` (``set_caps`` when
  the pool changes), a popped job past its ``start_by`` expires, ``expire_due`` sweeps. When a
  kind packs, a slot is leased at a time and a lead of such a kind fills its run with
  ``fill_run``, given the queued jobs of its kind in order (kept here, as the dispatcher reads
  them); a rider past its ``start_by`` expires as a lead does. A
  configured ``pool_concurrency`` sizes the bounds and caps, as in the real system; jobs
  start only on the slots the scenario's workers have (the rest would wait in the broker);
- the workers: ``register_worker``, lease ``renew`` (heartbeats of long jobs), ``release``;
  a crashed worker's leases lapse and ``reap`` returns them; retries are ``requeue`` with
  ``not_before`` (``policy.retry_backoff_s``) and the original order key.

With pools, each pool has a contender of its own (``jobs.simulate.lanes``): its own index, its
pool's policy (``jobs.simulate.pool_policy``) and its own measured μ, as each pool is a
dispatch index of its own under its own prefix in the real system.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from jobs.core import policy
from jobs.core.arrivals import ArrivalCounter, arrivals_from
from jobs.core.cadence import ARRIVALS_REFRESH_S
from jobs.core.policy import MeasuredMean, RateLimit, Tier
from jobs.core.remaining import Rest, own_slot_s
from jobs.core.service_times import KindMean, kind_rest, mix_mean, running_mean_s
from jobs.fleet import pool as capacity
from jobs.fleet.pool import PoolFigures
from jobs.index.base import Admission, AdmissionTerms, IndexedJob, Lease
from jobs.index.memory import MemoryIndex
from jobs.index.memory_layout import frozen_value
from jobs.simulate.candidates import QueuedByKind
from jobs.simulate.contender import Context, Dispatched, Verdict

_LIMITS = {"capacity": "bound", "tenant_limit": "quota"}
BATCH = 256  # jobs per dispatch call at most (the dispatcher's batch)


def job_id(job: int) -> str:
    """Ids that sort in arrival order, as tierq's time-ordered ids do."""
    return f"{job:010d}"


def _refused(admission: Admission) -> Verdict:
    """The refusal as ``jobs.admission.limits`` types it, with the figures it was decided on."""
    reason = admission.reason or "capacity"
    count: int | None = None
    limit: int | None = None
    if reason == "capacity":
        count, limit = admission.tier_queued, admission.bound
    elif reason == "tenant_limit":
        count, limit = admission.tenant_queued, admission.quota
    elif reason == "deadline":
        count, limit = admission.position, admission.max_position
    elif reason == "cap":
        count = admission.tenant_inflight
    return Verdict(accepted=False,
                   cause="tenant_limit" if reason in ("tenant_limit", "rate", "cap")
                   else "capacity",
                   limit=_LIMITS.get(reason, reason), count=count, limit_value=limit)


class TierqContender:
    name = "tierq"

    def __init__(self, context: Context) -> None:
        self.context = context
        self.policy = pol = context.policy
        self._now = 0.0
        self.index = MemoryIndex(clock=lambda: self._now)
        traffic = context.traffic
        self._tiers: list[Tier] = context.tiers
        self._tier_names = traffic.tiers
        self._rates: list[RateLimit | None] = [policy.rate_limit(t) for t in self._tiers]
        self._ttl = pol.lease_ttl_s
        self._capacity = 0  # what bounds and caps follow from: configured, else the slots
        self._slots = 0  # the live workers' slots: what the pool can run
        self._workers: set[str] = set()
        self._figured: tuple[tuple[int, tuple[float, int] | None], PoolFigures] | None = None
        self._caps: list[int] = [1] * len(self._tiers)
        self._deadlines = any(w is not None for w in traffic.max_wait_s)
        # Per tenant: its name, tier, own (cap, max_queued) and cap now (``set_workers``).
        self._tenant_names = traffic.tenants
        self._tenant_tier = traffic.tenant_tier
        self._own = [traffic.overrides.get(t, (None, None)) for t in range(len(traffic.tenants))]
        self._tenant_caps: list[int] = [1] * len(traffic.tenants)
        # Every job's id, formatted once: a job's id is asked for at its submit, release and
        # every heartbeat.
        self._ids = [job_id(job) for job in range(len(traffic))]
        # Admissions per tier, and the rates the dispatcher last published from them (every
        # ARRIVALS_REFRESH_S).
        self._arrivals = ArrivalCounter(pol.arrivals_window_s)
        self._later_rates: dict[str, float] = {}
        self._rates_next = 0.0
        self._measured: MeasuredMean | None = None
        self._kind_means: dict[str, float] = {}
        # Per tier: a new job's overtakers in work and in jobs (``_later``).
        self._later_of: list[list[policy.Overtaker] | None] = [None] * len(self._tiers)
        self._running_mean: float | None = None
        # Per tenant: its jobs queued or running in the pool, by kind (with one kind, its
        # own jobs' mean is the pool's, and nothing is kept).
        self._kinds_kept = len(traffic.kinds) > 1
        self._tenant_work: list[dict[str, int]] = [{} for _ in traffic.tenants]
        # Each measured kind's mean and spread, and per tenant its running jobs and their
        # starts: what they have left (``estimates.own_side``).
        self._measures: dict[str, KindMean] = {}
        self._running: list[dict[int, float]] = [{} for _ in traffic.tenants]
        self._started: dict[int, float] = {}  # every running job's start
        self._overall: float | None = None  # the latest runs' overall mean
        self._packs = context.packs
        self._of_kind = QueuedByKind(context, self._ids)

    # -- the pool --

    def set_workers(self, workers: dict[str, int], now: float) -> int:
        self._now = now
        for worker in self._workers - set(workers):
            self.index.unregister_worker(worker)
        self._workers = set(workers)
        for worker, slots in workers.items():
            self.index.register_worker(worker, slots=slots, ttl_s=math.inf, now=now)
        self._slots = self.index.pool_capacity(now=now)
        self._capacity = self.policy.pool_concurrency or self._slots
        figures = capacity.figures(self.policy, capacity=self._capacity, inflight=0)
        self._caps = [figures.caps[name] for name in self._tier_names]
        self._tenant_caps = [own if own is not None else self._caps[tier]
                             for (own, _), tier in zip(self._own, self._tenant_tier, strict=True)]
        traffic = self.context.traffic
        own_caps = {traffic.tenants[t]: cap for t, (cap, _) in traffic.overrides.items()
                    if cap is not None}
        self.index.set_caps(figures.caps, own_caps)
        return self._slots

    def measured(self, mean: MeasuredMean, now: float,
                 kinds: Mapping[str, float] | None = None,
                 measures: Mapping[str, KindMean] | None = None,
                 overall_s: float | None = None) -> None:
        self.index.service_mean = (mean.mean_s, mean.samples)
        self._measured = mean
        self._kind_means = dict(kinds or {})
        self._measures = dict(measures or {})
        self._overall = overall_s

    def cap(self, tenant: int) -> int | None:
        return self._tenant_caps[tenant]

    # -- submit --

    def submit(self, job: int, now: float) -> Verdict:
        self._now = now
        pol = self.policy
        tenant = self.context.traffic.tenant[job]
        tier_index = self._tenant_tier[tenant]
        tier = self._tiers[tier_index]
        max_wait = self.context.traffic.max_wait_s[job]
        own_cap, own_quota = self._own[tenant]
        order_key = policy.order_key(now, tier.base_priority, pol.ageing_rate_s)
        entry = frozen_value(
            IndexedJob, job_id=self._ids[job], tenant=self._tenant_names[tenant], tier=tier.name,
            order_key=order_key, start_by=None if max_wait is None else now + max_wait,
            not_before=None, attempt=1)
        later = self._later(tier_index, order_key, now) if max_wait is not None else None
        admission = self.index.admit_new(entry, frozen_value(
            AdmissionTerms, now=now, tier=tier, mean_service_s=pol.mean_service_s,
            service_samples_min=pol.service_samples_min, client_timeout_s=pol.client_timeout_s,
            pool_concurrency=pol.pool_concurrency, rate=self._rates[tier_index],
            tenant_cap=own_cap, tenant_quota=own_quota, max_wait_s=max_wait,
            passing=0.0 if later is None or max_wait is None
            else policy.passing_jobs(later, max_wait)))
        if not admission.accepted:
            return _refused(admission)
        if later is None:
            later = self._later(tier_index, order_key, now)
        traffic = self.context.traffic
        self._arrivals.arrived(tier.name, now, traffic.kinds[traffic.kind[job]])
        if self._kinds_kept:
            self._holds(job)
        if self._of_kind:
            self._of_kind.add(job, order_key)
        return Verdict(accepted=True,
                       told_wait_s=self._told_wait(admission, tier, tenant, job, own_cap, later))

    def _later(self, tier: int, order_key: float, now: float) -> list[policy.Overtaker]:
        """The work that will pass a job of ``tier`` submitted ``now`` (``policy.overtakers``)
        at the arrivals the dispatcher would have published last, in jobs of the pool's mean.
        A new job's depends on its tier alone: kept per tier until they change."""
        if now >= self._rates_next:
            self._refresh_arrivals(now)
        later = self._later_of[tier]
        if later is None:
            pol = self.policy
            later = self._later_of[tier] = policy.overtakers(
                pol.tiers, pol.ageing_rate_s, order_key=order_key, now=now,
                arrivals=self._later_rates)
        return later

    def _refresh_arrivals(self, now: float) -> None:
        """What the dispatcher publishes every ``ARRIVALS_REFRESH_S``: the tiers' arrivals."""
        pol = self.policy
        published = arrivals_from(self._arrivals.counts(now), self._kind_means,
                                  policy.mean_service_s(pol, self._measured),
                                  self._arrivals.spans)
        self._rates_next = now + ARRIVALS_REFRESH_S
        self._running_mean = self._running_now(now)
        rates = {name: a.jobs_per_s for name, a in published.items()}
        if rates != self._later_rates:
            self._later_rates = rates
            self._later_of = [None] * len(self._tiers)

    def _running_now(self, now: float) -> float | None:
        """What the dispatcher publishes with the arrivals: the mean at which the running
        jobs free their slots, from what each has run (``service_times.running_mean_s``)."""
        measured, overall = self._measured, self._overall
        if (overall is None or measured is None
                or measured.samples < self.policy.service_samples_min):
            return None
        if not self._started:
            return None
        traffic = self.context.traffic
        kinds, kind = traffic.kinds, traffic.kind
        return running_mean_s(
            [(kinds[kind[job]], started) for job, started in self._started.items()],
            self._measures, self.policy.service_samples_min, overall, now)

    def _told_wait(self, admission: Admission, tier: Tier, tenant: int, job: int,
                   own_cap: int | None, later: list[policy.Overtaker]) -> float | None:
        """The estimate an accepted job is told, as ``jobs.admission.estimates`` tells it."""
        figures = self._figures(admission.capacity, admission.measured)
        load = frozen_value(policy.TenantLoad, cap=own_cap or figures.caps[tier.name],
                            inflight=admission.tenant_inflight,
                            ahead=max(0, admission.tenant_queued - 1))
        own, first = None, None
        if load.excess and self._kind_means:  # as ``estimates.own_side``
            fallback = self.policy.mean_service_s
            if self._kinds_kept:  # its own kinds' mean, one not measured yet at the
                # configured mean
                own = mix_mean(self._ahead_of(tenant, job), self._kind_means, fallback)
            first = own_slot_s(self._rests(tenant, fallback), holds=load.inflight,
                               cap=load.cap,
                               fresh_mean_s=figures.mean_service_s if own is None else own)
        told = policy.expected_wait_s(
            admission.starts_ahead, max(0, figures.capacity - admission.inflight),
            figures.service_rate, tenant=load, capacity=figures.capacity,
            mean_service_s=figures.mean_service_s, later=later, tenant_mean_s=own,
            running_mean_s=self._running_mean,
            tenant_first_end_s=first if first is not None and math.isfinite(first) else None)
        return told if math.isfinite(told) else None

    def _rests(self, tenant: int, fallback_s: float) -> list[Rest]:
        """What the tenant's running jobs have left, each by its kind's measure."""
        traffic, now = self.context.traffic, self._now
        return [kind_rest(self._measures, traffic.kinds[traffic.kind[job]],
                          self.policy.service_samples_min, fallback_s, now - started)
                for job, started in self._running[tenant].items()]

    def _ahead_of(self, tenant: int, job: int) -> dict[str, int]:
        """The tenant's work in the pool, by kind, but for ``job`` itself."""
        traffic = self.context.traffic
        held = dict(self._tenant_work[tenant])
        held[traffic.kinds[traffic.kind[job]]] -= 1
        return held

    def _figures(self, pool: int, measured: tuple[float, int] | None) -> PoolFigures:
        """``capacity.figures`` of the admission's pool and measure (as ``jobs.admission.limits``
        reads them), kept while they stay the same: they change every few seconds, not per job."""
        if self._figured is None or self._figured[0] != (pool, measured):
            mean = None if measured is None else MeasuredMean(mean_s=measured[0],
                                                              samples=measured[1])
            self._figured = ((pool, measured),
                             capacity.figures(self.policy, capacity=pool, inflight=0,
                                              measured=mean))
        return self._figured[1]

    def feed(self, job: int, now: float) -> bool:
        """As ``jobs.dispatch.feeder``: ``admit`` under the bound and quota of the live pool,
        the order key of the admission."""
        self._now = now
        traffic = self.context.traffic
        tier = self._tiers[traffic.tier_of(job)]
        figures = self._figures(self._capacity, self.index.service_mean)
        own_quota = self._own[traffic.tenant[job]][1]
        outcome = self.index.admit(
            IndexedJob(job_id=job_id(job), tenant=traffic.tenants[traffic.tenant[job]],
                       tier=tier.name, order_key=self.policy.order_key(tier.name, now)),
            bound=figures.bounds[tier.name],
            tenant_quota=own_quota or figures.quotas[tier.name])
        if outcome.accepted and self._kinds_kept:
            self._holds(job)
        if outcome.accepted and self._of_kind:
            self._of_kind.add(job, self.policy.order_key(tier.name, now))
        return outcome.accepted

    # -- dispatch and the leases --

    def dispatch(self, now: float) -> Dispatched:
        self._now = now
        if self._packs:
            return self._dispatch_runs(now)
        out = Dispatched()
        while True:
            leases = self.index.dispatch(BATCH, lease_ttl_s=self._ttl, now=now,
                                         capacity=self._slots)
            late = 0
            for lease in leases:
                job = self._started_or_late(lease, now, out)
                if job is None:
                    late += 1
                else:
                    out.started.append((job, lease.attempt))
            if not late:
                return out

    def _started_or_late(self, lease: Lease, now: float, out: Dispatched) -> int | None:
        """A leased job starts, or (past its own ``start_by``) is released and expires;
        None then."""
        job = int(lease.job_id)
        deadline = self.context.start_by(job) if self._deadlines else None
        if deadline is not None and now >= deadline:
            self.index.release(lease.job_id, attempt=lease.attempt)
            out.expired.append(job)
            return None
        self._running[self.context.traffic.tenant[job]][job] = self._started[job] = now
        return job

    def _dispatch_runs(self, now: float) -> Dispatched:
        """A slot at a time, as workers take them: its first job, then, when its kind packs,
        the riders ``fill_run`` leases from the queued jobs of that kind."""
        out = Dispatched()
        while True:
            leases = self.index.dispatch(1, lease_ttl_s=self._ttl, now=now, capacity=self._slots)
            if not leases:
                return out
            lead = leases[0]
            job = int(lead.job_id)
            self._of_kind.remove(job)
            if self._started_or_late(lead, now, out) is None:
                continue
            out.started.append((job, lead.attempt))
            kind = self.context.kind(job)
            if not kind.packs:
                continue
            leased = self.index.fill_run(
                lead.job_id, attempt=lead.attempt, max_items=kind.max_items_per_run,
                candidates=self._of_kind.of(job),
                lease_ttl_s=self._ttl, now=now)
            riders = []
            for lease in leased:
                self._of_kind.remove(int(lease.job_id))
                rider = self._started_or_late(lease, now, out)
                if rider is not None:
                    riders.append((rider, lease.attempt))
            if riders:
                out.riders[job] = riders

    def finish(self, job: int, attempt: int, now: float) -> None:
        self.index.release(self._ids[job], attempt=attempt)
        self._running[self.context.traffic.tenant[job]].pop(job, None)
        self._started.pop(job, None)

    def gone(self, job: int) -> None:
        traffic = self.context.traffic
        held = self._tenant_work[traffic.tenant[job]]
        kind = traffic.kinds[traffic.kind[job]]
        held[kind] -= 1
        if not held[kind]:
            del held[kind]

    def _holds(self, job: int) -> None:
        """The job is work its tenant holds in the pool (queued or running), by kind."""
        traffic = self.context.traffic
        held = self._tenant_work[traffic.tenant[job]]
        kind = traffic.kinds[traffic.kind[job]]
        held[kind] = held.get(kind, 0) + 1

    def renew(self, job: int, attempt: int, now: float) -> None:
        self.index.renew(self._ids[job], attempt=attempt, ttl_s=self._ttl, now=now)

    def lose(self, job: int, attempt: int, now: float) -> None:
        """The lease simply stops being renewed; the job runs no more."""
        self._running[self.context.traffic.tenant[job]].pop(job, None)
        self._started.pop(job, None)

    def reap(self, now: float) -> list[tuple[int, int]]:
        return [(int(lease.job_id), lease.attempt)
                for lease in self.index.reap(now=now, limit=1_000_000)]

    def requeue(self, job: int, attempt: int, not_before: float | None, now: float) -> None:
        traffic = self.context.traffic
        order_key = self.context.order_key(job)
        self.index.requeue(IndexedJob(
            job_id=job_id(job), tenant=traffic.tenants[traffic.tenant[job]],
            tier=self._tier_names[traffic.tier_of(job)], order_key=order_key,
            start_by=self.context.start_by(job), not_before=not_before, attempt=attempt))
        if self._of_kind:
            self._of_kind.add(job, order_key)  # while its backoff lasts, fill_run skips it

    def expire(self, now: float) -> list[int]:
        if not self._deadlines:
            return []
        expired = [int(entry.job_id)
                   for entry in self.index.expire_due(now=now, limit=1_000_000)]
        for job in expired if self._of_kind else ():
            self._of_kind.remove(job)
        return expired

    def queued(self) -> list[int]:
        depths = self.index.tier_depths(self._tier_names)
        return [depths[name].queued for name in self._tier_names]
