"""Live pool figures: capacity, service rate, and the bounds and caps that follow from them.

Capacity is the configured ``pool_concurrency`` or else the sum of live workers' slots (each
worker registers with a heartbeat). The bounds and caps are recomputed from it on demand, so
they follow the pool as workers come and go. The mean service time is the dispatcher's
measured one once enough runs back it (``jobs.fleet.service_rate``), else the configured one.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.core import policy
from jobs.core.policy import MeasuredMean, mean_service_s
from jobs.fleet.service_rate import read_measured
from jobs.index.base import DispatchIndex
from jobs.process.runtime import Runtime


@dataclass(frozen=True, kw_only=True)
class PoolFigures:
    capacity: int
    inflight: int
    mean_service_s: float
    # Finished runs behind mean_service_s; 0 when it is the configured fallback.
    service_samples: int
    service_rate: float
    bounds: dict[str, int]
    caps: dict[str, int]
    quotas: dict[str, int]

    @property
    def free_slots(self) -> int:
        return max(0, self.capacity - self.inflight)

    @property
    def utilisation(self) -> float:
        return min(1.0, self.inflight / self.capacity) if self.capacity else 0.0


def figures(
    pol: policy.Policy, *, capacity: int, inflight: int, measured: MeasuredMean | None = None
) -> PoolFigures:
    """Pure: the numbers that follow from a capacity and a (measured) mean service time."""
    mean = mean_service_s(pol, measured)
    enough = measured is not None and measured.samples >= pol.service_samples_min
    samples = measured.samples if measured is not None and enough else 0
    mu = policy.service_rate(capacity, mean)
    bounds = {
        name: policy.queue_bound(tier, mu, pol.client_timeout_s, capacity=capacity)
        for name, tier in pol.tiers.items()
    }
    return PoolFigures(
        capacity=capacity,
        inflight=inflight,
        mean_service_s=mean,
        service_samples=samples,
        service_rate=mu,
        bounds=bounds,
        caps={name: policy.tenant_cap(tier, capacity) for name, tier in pol.tiers.items()},
        quotas={name: policy.tenant_quota(tier, bounds[name]) for name, tier in pol.tiers.items()},
    )


def read_pool(
    pol: policy.Policy,
    index: DispatchIndex,
    *,
    now: float,
    measured: MeasuredMean | None = None,
    inflight: int | None = None,
) -> PoolFigures:
    """The figures for the pool as it is now (configured capacity, or live workers), with
    ``measured`` the published mean service time (``jobs.fleet.service_rate``); None: the
    configured mean (enough for caps, which do not depend on it; see ``live_pool``).
    ``inflight``: the leases as read already (None: read them now)."""
    capacity = pol.pool_concurrency or index.pool_capacity(now=now)
    held = index.inflight() if inflight is None else inflight
    return figures(pol, capacity=capacity, inflight=held, measured=measured)


def live_pool(runtime: Runtime, *, now: float, inflight: int | None = None) -> PoolFigures:
    """``read_pool`` with the measured mean as published: one Redis read more."""
    measured = read_measured(runtime.redis, runtime.prefix)
    return read_pool(runtime.policy, runtime.index, now=now, measured=measured,
                     inflight=inflight)
