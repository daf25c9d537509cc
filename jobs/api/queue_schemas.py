"""Bodies of ``/v1/queues``, ``/v1/admin/workers`` and the probes: the published figures of
each pool and tier, the live workers, health and readiness (``docs/api.md``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from jobs.index.base import LiveWorker


class TierQueue(BaseModel):
    """One tier's queue, as it is now."""

    name: str = Field(description="the tier")
    queued: int = Field(description="jobs queued in it")
    bound: int = Field(description="queued jobs beyond which submits are refused (429 "
                       "capacity): the pool's service rate times the tier's max_wait_s")
    oldest_age_s: float | None = Field(description="seconds its oldest queued job has waited")
    tenant_cap: int = Field(description="jobs one tenant of the tier may run at once")
    wait_p50_s: float | None = Field(description="median wait of its jobs that started in the "
                                     "last 5 minutes; null when none did")
    wait_p95_s: float | None = Field(description="95th percentile of the same waits")
    arrival_rate: float = Field(default=0.0, description="jobs per second admitted to it over "
                                "the span since its rate last changed, at most the last "
                                "policy.arrivals_window_s, as the leader measured them: the "
                                "work that passes a lower tier's queued jobs")


class KindWaiting(BaseModel):
    """A kind of the pool's queued jobs that no live worker of the pool runs."""

    kind: str = Field(description="the kind")
    queued: int = Field(ge=0, description="its jobs queued: they wait, in their places, for a "
                        "worker that runs it to register, and start then")


class PoolView(BaseModel):
    """A pool of workers and the kinds it runs (``default``: every kind no pool names)."""

    name: str = Field(default="default", description="the pool ([pools.NAME]; default)")
    kinds: list[str] | None = Field(default=None, description="the kinds it runs; null for "
                                    "the default pool, which runs every kind no pool names")
    live_workers: int = Field(default=0, ge=0, description="workers registered in it now; 0: "
                              "its jobs are accepted against its configured capacity and "
                              "wait for a worker to start")
    capacity: int = Field(description="worker slots: configured, or the sum over live workers")
    inflight: int = Field(description="jobs holding a slot (dispatched or running)")
    utilisation: float = Field(description="inflight / capacity")
    service_rate: float = Field(description="μ, jobs per second the pool finishes: capacity "
                                "over the measured mean service time")
    waiting_kinds: list[KindWaiting] = Field(
        default_factory=list, description="the kinds of its queued jobs that no live worker "
        "of the pool runs (a worker without their handler: a rolling deploy, a host without "
        "the package), by kind: their jobs wait instead of failing, and start once a worker "
        "that runs the kind registers")


class TenantUsage(BaseModel):
    """The calling tenant's own figures (a tenant key only)."""

    tenant: str = Field(description="the tenant's id")
    tier: str = Field(description="its tier")
    queued: int = Field(description="its jobs queued (delayed retries included)")
    inflight: int = Field(description="its jobs holding a slot (dispatched or running)")
    cap: int = Field(description="jobs it may run at once: its own cap, else its tier's")
    quota: int = Field(description="jobs it may hold queued: its own max_queued, else its "
                       "tier's share of the bound")


class WorkerView(BaseModel):
    """One live worker (the admin key only)."""

    id: str = Field(description="the worker's id (Celery hostname: name@host)")
    device: str = Field(description="what it runs jobs on: cuda:N or cpu")
    memory_bytes: int | None = Field(default=None, description="the device's memory, on a "
                                     "GPU; null on a CPU")
    slots: int = Field(ge=0, description="jobs it runs at once: what it adds to the pool")
    pool: str = Field(default="default", description="the pool it joined (tierq worker "
                      "--pool)")
    expires_in_s: float = Field(description="seconds until its registration lapses unless "
                                "renewed (it renews every third of that)")

    @classmethod
    def of(cls, worker: LiveWorker, now: float, pool: str = "default") -> WorkerView:
        return cls(id=worker.worker_id, device=worker.device, slots=worker.slots, pool=pool,
                   memory_bytes=worker.memory_bytes,
                   expires_in_s=round(max(0.0, worker.expires_at - now), 3))


class PoolQueues(BaseModel):
    """One pool: its figures and its tiers' queues (each pool has its own)."""

    pool: PoolView = Field(description="the pool's figures")
    tiers: list[TierQueue] = Field(description="its tiers' queues, best first; a tenant sees "
                                   "its own tier only")
    usage: TenantUsage | None = Field(default=None, description="the tenant's own figures in "
                                      "this pool; null for the admin key")


class QueuesResponse(BaseModel):
    """Each tier's queue and the pool: the fleet for the admin key, the caller's own tier and
    usage for a tenant key."""

    scope: Literal["fleet", "tenant"] = Field(
        default="fleet", description="fleet: every tier (the admin key); tenant: the caller's "
        "tier and its own usage, nothing of other tenants")
    tiers: list[TierQueue] = Field(description="the default pool's queues, best tier first; "
                                   "a tenant sees its own tier only")
    pool: PoolView = Field(description="the default pool (the only one without [pools])")
    usage: TenantUsage | None = Field(default=None, description="the tenant's own figures in "
                                      "the default pool; null for the admin key")
    workers: list[WorkerView] | None = Field(default=None, description="live workers of every "
                                             "pool, by id; null for a tenant key")
    pools: list[PoolQueues] = Field(default_factory=list, description="every pool, default "
                                    "first: its figures, its tiers' queues and the tenant's "
                                    "usage there")


class HealthResponse(BaseModel):
    """The process lives."""

    status: str = Field(description="ok", examples=["ok"])


class ReadyResponse(BaseModel):
    """SQL and Redis answer."""

    status: str = Field(description="ready", examples=["ready"])
    checks: dict[str, str] = Field(description="each backend (sql, redis): ok, or why not")


