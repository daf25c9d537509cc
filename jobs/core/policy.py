"""Tier policy: the order key, queue bounds, tenant caps and the ageing guarantee.

Pure functions of their arguments: no clock, no I/O, standard library only. Every other
module asks this one for the numbers, so the maths lives in one place (see docs/policy.md).

- Ageing: ``effective_priority = base_priority - waited / ageing_rate`` (lower is served
  sooner). With one ageing rate for all tiers the relative order of two queued jobs never
  changes, so it equals ordering by the static ``order_key = enqueued_at + base_priority *
  ageing_rate``: a virtual deadline, computed once on insert.
- Bound (Little's law): ``queue_bound = max(1, capacity, floor(mu * min(max_wait,
  client_timeout)))``: never fewer than the pool's slots, which keep the pool busy.
- Cap: ``tenant_cap = max(1, floor(pool_concurrency * tenant_share))``; never 0, which would
  block a tenant forever.
- Deadline: a job may wait ``max_wait_s``; ``latest_useful_position`` is the last place in the
  queue from which it is still expected to start in time.
- Estimate: the later of the pool's start (``estimated_wait_s``) and the tenant's own (its
  cap, its jobs in flight and queued ahead: ``tenant_wait_s``), see ``expected_wait_s``. The
  pool's start counts the better-ranked work expected to arrive while the job waits
  (``overtakers``, ``overtaken_wait_s``); both count what the running jobs have left
  (``jobs.core.remaining``).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_RETENTION_S = 7 * 86400.0
# The longest run-time limit one attempt may be given (``timeout_s``): a day.
MAX_TIMEOUT_S = 86400.0


@dataclass(frozen=True, kw_only=True)
class Tier:
    """A service class. The tenant's record names its tier; clients never choose it."""

    name: str
    base_priority: float
    max_wait_s: float
    tenant_share: float
    # Share of the tier's bound one tenant may hold queued (None: same as tenant_share).
    queued_share: float | None = None
    # Token-bucket request rate per tenant (submits/s); None means unlimited.
    rate_per_s: float | None = None
    rate_burst: int | None = None
    # Seconds a finished job (and its result) is kept before it is pruned; 0: kept forever.
    retention_s: float = DEFAULT_RETENTION_S


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The validated policy; built from settings by ``jobs.process.settings``."""

    tiers: Mapping[str, Tier]
    ageing_rate_s: float = 6.0
    pool_concurrency: int | None = None
    mean_service_s: float = 6.0
    # Completed runs needed before the measured mean service time replaces mean_service_s.
    service_samples_min: int = 20
    client_timeout_s: float | None = None
    lease_ttl_s: float = 30.0
    leader_ttl_s: float = 5.0
    max_attempts: int = 3
    retry_backoff_s: float = 2.0
    retry_backoff_max_s: float = 300.0
    stop_grace_s: float = 10.0
    # One attempt's run-time limit when neither the job nor its kind names one, and how long
    # a handler asked to stop at its limit has before the process running it is ended.
    default_timeout_s: float = 3600.0
    timeout_grace_s: float = 10.0
    # Arrival rates are the admissions of at most this last window, since the rate last
    # changed (``jobs.core.arrivals``).
    arrivals_window_s: float = 60.0

    def tier(self, name: str) -> Tier:
        return self.tiers[name]

    def order_key(self, tier: str, enqueued_at: float) -> float:
        return order_key(enqueued_at, self.tiers[tier].base_priority, self.ageing_rate_s)


def order_key(enqueued_at: float, base_priority: float, ageing_rate_s: float) -> float:
    """The static dispatch key: the time at which a fresh top-priority job would tie."""
    return enqueued_at + base_priority * ageing_rate_s


def effective_priority(base_priority: float, waited_s: float, ageing_rate_s: float) -> float:
    """Priority after waiting ``waited_s``; lower is served sooner."""
    return base_priority - waited_s / ageing_rate_s


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """A tenant's token bucket: ``rate_per_s`` submits/s on average, ``burst`` at once."""

    rate_per_s: float
    burst: int


def default_burst(rate_per_s: float) -> int:
    """A bucket that holds one second's worth of submits, and at least one."""
    return max(1, math.ceil(rate_per_s - 1e-9))


def rate_limit(
    tier: Tier, *, rate_per_s: float | None = None, burst: int | None = None
) -> RateLimit | None:
    """The bucket of a tenant of ``tier`` with overrides ``rate_per_s``/``burst`` (None: the
    tier's). A tenant's own rate brings its own default burst; None: no rate limit."""
    if rate_per_s is not None:
        return RateLimit(rate_per_s=rate_per_s, burst=burst or default_burst(rate_per_s))
    if tier.rate_per_s is None:
        return None
    size = burst or tier.rate_burst or default_burst(tier.rate_per_s)
    return RateLimit(rate_per_s=tier.rate_per_s, burst=size)


def service_rate(capacity: int, mean_service_s: float) -> float:
    """Jobs per second the pool completes: ``mu = capacity / mean_service_time``."""
    if mean_service_s <= 0:
        raise ValueError("mean_service_s must be > 0")
    return max(0, capacity) / mean_service_s


def useful_wait_s(tier: Tier, client_timeout_s: float | None = None) -> float:
    """The longest wait still useful: the tier's ``max_wait_s``, capped by a client timeout."""
    if client_timeout_s is None:
        return tier.max_wait_s
    return min(tier.max_wait_s, client_timeout_s)


def queue_bound(
    tier: Tier, mu: float, client_timeout_s: float | None = None, *, capacity: int = 0
) -> int:
    """How many jobs of this tier may wait: ``max(1, capacity, floor(mu * W))``. Never fewer
    than the pool's slots: a smaller bound (a small pool of long jobs) would refuse work that
    an idle slot could start, and call the pool full while it is not."""
    return max(1, capacity, math.floor(mu * useful_wait_s(tier, client_timeout_s) + 1e-9))


def tenant_cap(tier: Tier, pool_concurrency: int) -> int:
    """Jobs one tenant of this tier may run at once, fleet-wide."""
    return max(1, math.floor(pool_concurrency * tier.tenant_share + 1e-9))


def tenant_quota(tier: Tier, bound: int) -> int:
    """Jobs one tenant of this tier may hold queued, so no tenant can fill the tier alone."""
    share = tier.queued_share if tier.queued_share is not None else tier.tenant_share
    return max(1, math.floor(bound * share + 1e-9))


def ageing_guarantee_s(tier: Tier, tiers: Mapping[str, Tier], ageing_rate_s: float) -> float:
    """Seconds after which a job of ``tier`` ties with fresh work of the best tier."""
    best = min(t.base_priority for t in tiers.values())
    return (tier.base_priority - best) * ageing_rate_s


def ageing_rate_for(guarantee_s: float, tier: Tier, tiers: Mapping[str, Tier]) -> float:
    """The ageing rate (seconds per point) that makes ``tier`` tie with the best tier
    after ``guarantee_s``: "free within 120 s" with priorities 0 and 20 gives 6 s/point."""
    best = min(t.base_priority for t in tiers.values())
    gap = tier.base_priority - best
    if gap <= 0:
        raise ValueError(f"tier {tier.name!r} already has the best priority")
    if guarantee_s <= 0:
        raise ValueError("guarantee_s must be > 0")
    return guarantee_s / gap


def prune_before(tier: Tier, now: float) -> float | None:
    """Finished jobs of ``tier`` that finished before this time are due for pruning; None
    when the tier keeps them forever (``retention_s`` 0)."""
    if tier.retention_s <= 0:
        return None
    return now - tier.retention_s


def retry_backoff_s(attempt: int, base_s: float, max_s: float) -> float:
    """Delay before a retryable failure of ``attempt`` (1-based) may run again."""
    return min(max_s, base_s * 2.0 ** max(0, attempt - 1))


# Tenant overrides (API and CLI): far above any real pool, far below what a column or a Lua
# number holds.
MAX_TENANT_CAP = 1_000_000
MAX_TENANT_QUEUED = 10**9
MAX_TENANT_RATE_PER_S = 1e6
MAX_TENANT_BURST = 1_000_000


def handback_after_s(stop_grace_s: float) -> float:
    """When, after a stop signal, a worker hands back the jobs still running: late enough to
    let most finish, early enough (3 s, or half a short grace) to record it before the kill."""
    return max(stop_grace_s / 2.0, stop_grace_s - 3.0)


def estimated_wait_s(position: int, free_slots: int, mu: float) -> float:
    """Expected wait of a job with ``position`` jobs ahead of it: the first ``free_slots``
    start at once, the rest drain at ``mu`` jobs/s. Infinite when nothing is served."""
    behind_free = position + 1 - max(0, free_slots)
    if behind_free <= 0:
        return 0.0
    if mu <= 0:
        return math.inf
    return behind_free / mu


def latest_useful_position(
    max_wait_s: float, free_slots: int, mu: float, *, passing: float = 0.0
) -> int | None:
    """The last position (jobs ahead) from which a job is expected to start within
    ``max_wait_s``: the largest ``p`` with ``overtaken_wait_s(p + 1 - free_slots, mu, later)
    <= max_wait_s``, where ``passing`` is ``passing_jobs(later, max_wait_s)``. The least
    fixed point is at most ``M`` exactly when the right side at ``M`` is (past the fixed
    point the passing rate stays below ``mu``), so ``p + 1 - free + passing <= mu × M``. -1
    when even the head of the queue would start too late; None when nothing is
    served (``mu == 0``): there is no estimate to refuse on."""
    if mu <= 0:
        return None
    free = max(0, free_slots)  # a job with a free slot starts at once, whatever passes later
    return free - 1 + max(0, math.floor(mu * max_wait_s - passing + 1e-9))


def passing_jobs(later: Sequence[Overtaker], within_s: float) -> float:
    """Jobs expected to arrive within ``within_s`` and rank ahead of the job ``later``
    describes: each tier's rate over the part of its window that ``within_s`` covers."""
    return sum(o.rate_per_s * min(o.window_s, within_s) for o in later)


@dataclass(frozen=True, kw_only=True)
class Overtaker:
    """Later work that passes a queued job: jobs of a tier arriving at ``rate_per_s`` rank
    ahead of it while they arrive within ``window_s`` of now (after that, ageing has made the
    job the better of the two)."""

    rate_per_s: float
    window_s: float


def overtakers(
    tiers: Mapping[str, Tier], ageing_rate_s: float, *, order_key: float, now: float,
    arrivals: Mapping[str, float],
) -> list[Overtaker]:
    """Who passes a job of ``order_key`` from ``now``: a job of tier ``t`` arriving ``s``
    seconds later has order key ``now + s + p_t * ageing_rate``, ahead of ``order_key`` while
    ``s < order_key - now - p_t * ageing_rate``; ``arrivals`` are the tiers' measured rates
    (jobs/s). A job's own tier never passes it (a tie goes to the earlier id)."""
    found = []
    for name, rate in arrivals.items():
        tier = tiers.get(name)
        if tier is None or rate <= 0:
            continue
        window = order_key - now - tier.base_priority * ageing_rate_s
        if window > 0:
            found.append(Overtaker(rate_per_s=rate, window_s=window))
    return found


def overtaken_wait_s(behind: float, mu: float, later: Sequence[Overtaker]) -> float:
    """The least ``W`` with ``W = (behind + Σ rate × min(window, W)) / mu``: the wait of a job
    ``behind`` jobs past the free slots when the work that arrives meanwhile and ranks ahead
    of it is served first. The right side grows with ``W`` and is bounded (each tier passes
    the job for its window at most), so the least fixed point exists; it is found segment by
    segment between the windows, where the equation is linear. Infinite when nothing is
    served."""
    if behind <= 0:
        return 0.0
    if mu <= 0:
        return math.inf
    if not later:
        return behind / mu
    if len(later) == 1:  # one tier passes it: below its window, or past it
        rate, window = later[0].rate_per_s, later[0].window_s
        if rate < mu:
            wait = behind / (mu - rate)
            if wait <= window:
                return wait
        return (behind + rate * window) / mu
    windows = sorted((o.window_s, o.rate_per_s) for o in later)
    slope = sum(rate for _, rate in windows)  # jobs/s passing while W is below every window
    passed = 0.0  # jobs of the tiers whose window W has outlived: rate × window each
    for window, rate in [*windows, (math.inf, 0.0)]:
        if slope < mu:
            wait = (behind + passed) / (mu - slope)
            if wait <= window:
                return wait
        passed += rate * window
        slope -= rate
    return (behind + passed) / mu  # not reached: the last segment has slope 0


@dataclass(frozen=True, kw_only=True)
class TenantLoad:
    """A tenant's side of a job's wait: its concurrency cap, its jobs in flight now, and its
    own queued jobs ahead of the job (which take its slots first)."""

    cap: int
    inflight: int
    ahead: int

    @property
    def excess(self) -> int:
        """Own jobs that must finish before the job has a slot under the cap (0: it has one)."""
        return max(0, self.inflight + self.ahead - max(1, self.cap) + 1)


def tenant_rate(cap: int, capacity: int, mean_service_s: float) -> float:
    """Jobs/s one tenant can finish: its cap (never more than the pool) over the mean service
    time; 0 when nothing is served."""
    if capacity <= 0 or mean_service_s <= 0:
        return 0.0
    return min(max(1, cap), capacity) / mean_service_s


def tenant_wait_s(
    load: TenantLoad, tenant_rate: float, first_end_s: float | None = None
) -> float:
    """Expected wait for a slot under the tenant's own cap: its ``excess`` jobs finish at its
    ``tenant_rate``. With ``first_end_s``, when the first of the jobs holding its places is
    expected to end from what each has run (``jobs.core.remaining.own_slot_s``), the first
    of them ends then and the rest at the rate; None: each counts as a fresh job, and the
    first ends at the rate too. 0 while it is under its cap; infinite when nothing is
    served."""
    if load.excess == 0:
        return 0.0
    if tenant_rate <= 0:
        return math.inf
    if first_end_s is None:
        return load.excess / tenant_rate
    return first_end_s + (load.excess - 1) / tenant_rate


def expected_wait_s(
    position: int,
    free_slots: int,
    mu: float,
    *,
    tenant: TenantLoad,
    capacity: int,
    mean_service_s: float,
    later: Sequence[Overtaker] = (),
    tenant_mean_s: float | None = None,
    running_mean_s: float | None = None,
    tenant_first_end_s: float | None = None,
) -> float:
    """Expected wait of a queued job: it starts once the pool has a slot for it AND its tenant
    has one under its cap, so the later of the two.

    - The pool: ``position`` jobs ahead that start first, ``free_slots`` free, draining at
      ``mu`` jobs/s (``estimated_wait_s``), and the ``later`` work that arrives while it waits
      and ranks ahead of it (``overtaken_wait_s``). Jobs of tenants at their cap take no free
      slot: while the runnable ones ahead leave it one, the index counts only those
      (``Admission.starts_ahead``, ``DispatchIndex.runnable_ahead``); once the pool is full
      it counts every job ahead, an overestimate where capped tenants hold the slots.
    - The tenant: with ``r`` jobs in flight, ``q`` of its own queued ahead and cap ``c``, it
      adds nothing while ``r + q < c``; otherwise ``r + q - c + 1`` of its own jobs must
      finish first, at its rate ``min(c, capacity) / mean_service_s`` (``tenant_wait_s``),
      the first of them at ``tenant_first_end_s`` when what its running jobs have run is
      known (``jobs.core.remaining``; None: as fresh jobs).
      ``tenant_mean_s``: the mean service time of the tenant's own work (its kinds', each at
      its own mean, ``jobs.core.service_times``); None: the pool's.
    - Kinds: ``mean_service_s`` (and so ``mu`` and ``later``'s rates) is that of the queued
      work; the slot the job needs is freed by a running job, whose mean is
      ``running_mean_s`` (the leader's, from what each running job has run, as the mean at
      which they free slots: ``n × jobs.core.remaining.first_end_s``). The ``p + 1`` jobs to
      start (the ``p`` ahead, then its own) are
      spent at ``(p × queued + running) / (p + 1)`` each: twenty 20 ms jobs queued ahead of
      one while one-minute jobs fill the slots wait for one of those to end, not twenty.
    """
    own = mean_service_s if tenant_mean_s is None else tenant_mean_s
    rate = tenant_rate(tenant.cap, capacity, own)
    if running_mean_s is not None and running_mean_s != mean_service_s and mean_service_s > 0:
        spent = max(1e-9, (max(0, position) * mean_service_s + running_mean_s)
                    / (max(0, position) + 1))
        scale = mean_service_s / spent  # jobs of the queued mean -> jobs of ``spent``
        mu = mu * scale
        later = [Overtaker(rate_per_s=o.rate_per_s * scale, window_s=o.window_s)
                 for o in later]
    pool = overtaken_wait_s(position + 1 - max(0, free_slots), mu, later)
    return max(pool, tenant_wait_s(tenant, rate, tenant_first_end_s))


def latest_useful_excess(max_wait_s: float, tenant_rate: float) -> int | None:
    """The tenant-side twin of ``latest_useful_position``: the most own jobs that may still
    have to finish before a job's slot frees for it to start within ``max_wait_s`` (the
    largest ``k`` with ``k / tenant_rate <= max_wait_s``). None when nothing is served."""
    if tenant_rate <= 0:
        return None
    return math.floor(tenant_rate * max_wait_s + 1e-9)


# -- the measured mean service time ------------------------------------------------------------

# The last WINDOW finished runs, the newest weighing most (half the weight HALF_LIFE runs back).
WINDOW = 200
HALF_LIFE = 50.0


@dataclass(frozen=True, kw_only=True)
class MeasuredMean:
    mean_s: float
    samples: int  # finished runs behind the figure (at most WINDOW)


def weighted_mean(run_times_newest_first: Sequence[float], half_life: float = HALF_LIFE) -> float:
    """Recency-weighted mean: the ``i``-th newest run weighs ``0.5 ** (i / half_life)``."""
    if not run_times_newest_first:
        raise ValueError("no run times to average")
    weights, weight = _weights(len(run_times_newest_first), half_life)
    if min(run_times_newest_first) >= 0:  # nothing to clamp: the same sum, added in C
        added: float = sum(map(operator.mul, weights, run_times_newest_first))
        return added / weight
    total = sum(w * max(0.0, t) for w, t in zip(weights, run_times_newest_first, strict=True))
    return total / weight


@functools.lru_cache(maxsize=64)
def _weights(count: int, half_life: float) -> tuple[tuple[float, ...], float]:
    """The weights of ``count`` runs, newest first, and their sum (the same every refresh)."""
    weights = tuple(math.pow(0.5, i / half_life) for i in range(count))
    return weights, sum(weights)


def mean_service_s(policy: Policy, measured: MeasuredMean | None) -> float:
    """The mean service time to use: measured once enough runs back it, else configured.
    A measured mean of 0 (instant jobs) is floored at 1 ms so that μ stays finite."""
    if measured is None or measured.samples < policy.service_samples_min:
        return policy.mean_service_s
    return max(0.001, measured.mean_s)
