"""Live pool figures: capacity, service rate, and the bounds and caps that follow from them.

Capacity is the configured ``pool_concurrency`` or else the sum of live workers' slots (each
worker registers with a heartbeat). The bounds and caps are recomputed from it on demand, so
they follow the pool as workers come and go.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs import policy
from jobs.index.base import DispatchIndex


@dataclass(frozen=True, kw_only=True)
class PoolFigures:
    capacity: int
    inflight: int
    mean_service_s: float
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
    pol: policy.Policy, *, capacity: int, inflight: int, mean_service_s: float | None = None
) -> PoolFigures:
    """Pure: the numbers that follow from a capacity and a mean service time."""
    mean = mean_service_s if mean_service_s and mean_service_s > 0 else pol.mean_service_s
    mu = policy.service_rate(capacity, mean)
    bounds = {
        name: policy.queue_bound(tier, mu, pol.client_timeout_s) for name, tier in pol.tiers.items()
    }
    return PoolFigures(
        capacity=capacity,
        inflight=inflight,
        mean_service_s=mean,
        service_rate=mu,
        bounds=bounds,
        caps={name: policy.tenant_cap(tier, capacity) for name, tier in pol.tiers.items()},
        quotas={name: policy.tenant_quota(tier, bounds[name]) for name, tier in pol.tiers.items()},
    )


def read_pool(
    pol: policy.Policy, index: DispatchIndex, *, now: float, mean_service_s: float | None = None
) -> PoolFigures:
    """The figures for the pool as it is now (configured capacity, or live workers)."""
    capacity = pol.pool_concurrency or index.pool_capacity(now=now)
    return figures(pol, capacity=capacity, inflight=index.inflight(), mean_service_s=mean_service_s)
