"""The values the dispatch index takes and returns. They sit apart from the Protocol
(``base.py``, which re-exports them) so that module holds the contract and nothing else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

from jobs.core.arrivals import Arrival, Work
from jobs.core.histograms import StartFigures
from jobs.core.policy import RateLimit, Tier

__all__ = [
    "REFUSALS_KEEP_S",
    "REFUSAL_BUCKET_S",
    "Admission",
    "AdmissionTerms",
    "Admitted",
    "Arrival",
    "Entry",
    "Finished",
    "FirstRenewal",
    "IndexedJob",
    "KindRoutes",
    "Lease",
    "LiveWorker",
    "Renewal",
    "TierDepth",
    "TierPush",
    "TierQueue",
    "Work",
    "refusal_minute",
]

# Refusals of ``admit_new`` are counted by minute (seconds since the epoch // 60, on the
# admission's clock), each minute's counts kept this long.
REFUSAL_BUCKET_S = 60
REFUSALS_KEEP_S = 600


def refusal_minute(now: float) -> int:
    return math.floor(now / REFUSAL_BUCKET_S)


class Renewal(IntEnum):
    """What a lease renewal found (``renew_checked``); false only when the lease is lost."""

    LOST = 0
    HELD = 1
    # Held, and a cancel was requested for the job (``flag_cancel``): stop the handler.
    CANCEL_REQUESTED = 2


@dataclass(frozen=True, kw_only=True)
class MessagePush:
    """A broker message the index pushes itself, in the step that leases its job, when the
    broker is the index's own Redis: ``key`` the broker queue's list, ``envelope`` the
    message as the broker's client would write it (JSON), less its per-message fields. The
    script fills those in (``push.lua``): the task's id, its arguments
    ``[job_id, attempt, dispatched_at]``, and their repr."""

    key: str
    envelope: str


@dataclass(frozen=True, kw_only=True)
class Finished:
    """An attempt whose ending is committed: its lease to release, announcing the move and
    counting ``outcome`` (``renew_checked``'s ``release``)."""

    job_id: str
    attempt: int
    outcome: str
    # The pool's slots (None: the live workers'): a release that leaves one free while a job
    # is runnable rings the dispatcher.
    capacity: int | None = None


@dataclass(frozen=True, kw_only=True)
class FirstRenewal:
    """A started attempt's first renewal (``renew_checked`` with these), made in the round
    trip of its own ``hand_over`` when its handler ended before the renewal was made."""

    ttl_s: float
    start: StartFigures | None
    release: Finished | None
    announce: bool = True


@dataclass(frozen=True, kw_only=True)
class TierQueue:
    """A tier's broker queue: its name (the routing key) and, on Redis, its list's key."""

    tier: str
    name: str
    key: str


@dataclass(frozen=True, kw_only=True)
class TierPush:
    """How the index pushes a leased job's message to its tier's broker queue (``offer``),
    as the workers publish it where the broker is the index's own Redis: the message's
    ``envelope`` (``MessagePush``) and every tier's queue."""

    envelope: str
    queues: tuple[TierQueue, ...]

    def to_json(self) -> str:
        return json.dumps({"envelope": self.envelope,
                           "queues": [[q.tier, q.name, q.key] for q in self.queues]})

    @classmethod
    def from_json(cls, raw: str) -> TierPush:
        data = json.loads(raw)
        return cls(envelope=str(data["envelope"]), queues=tuple(
            TierQueue(tier=str(tier), name=str(name), key=str(key))
            for tier, name, key in data["queues"]))

    def covers(self, tiers: Iterable[str]) -> bool:
        return set(tiers) <= {queue.tier for queue in self.queues}


@dataclass(frozen=True, kw_only=True)
class IndexedJob:
    """What the index knows of a queued job."""

    job_id: str
    tenant: str
    tier: str
    order_key: float
    # The job must have started by then or it expires (None: never).
    start_by: float | None = None
    # Retry backoff: not dispatched before this time (None: at once).
    not_before: float | None = None
    # The attempt this entry (and the lease it becomes) belongs to.
    attempt: int = 1


@dataclass(frozen=True, kw_only=True)
class Admitted:
    accepted: bool
    # The tier's queued count after the call (before it, if refused).
    tier_queued: int
    # The tenant's queued count after the call (before it, if refused).
    tenant_queued: int
    # Jobs ahead of this one in dispatch order (when accepted); the position it would have
    # had (when refused).
    position: int
    # Why it was refused: "capacity" (tier at its bound), "tenant_limit" (tenant quota) or
    # "deadline" (more than max_position jobs would be ahead of it).
    reason: str | None = None
    # The job id was already indexed: nothing changed.
    duplicate: bool = False


@dataclass(frozen=True, kw_only=True)
class AdmissionTerms:
    """The policy's side of ``admit_new``; the index reads the rest (the live workers, the
    leases, the measured mean service time, the tenant's bucket and counts) in the same
    atomic step, and derives the bounds as ``jobs.core.policy`` does."""

    # The clock of the rate bucket and of the worker registrations.
    now: float
    tier: Tier
    mean_service_s: float  # configured; a published measure replaces it (service_samples_min)
    service_samples_min: int
    client_timeout_s: float | None = None
    pool_concurrency: int | None = None  # None: the live workers' slots
    rate: RateLimit | None = None  # the tenant's bucket; None: no rate limit
    tenant_cap: int | None = None  # the tenant's overrides; None: the tier's
    tenant_quota: int | None = None
    max_wait_s: float | None = None  # the job's own deadline
    # Jobs (of the pool's mean service time) expected to arrive within max_wait_s and pass it
    # (``policy.passing_jobs``): its predicted start counts them, so the latest useful
    # position is that many places earlier.
    passing: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Admission:
    """What ``admit_new`` decided and the figures it decided on. A rate refusal reads no
    figures: only ``position`` and ``next_token_s`` mean anything then."""

    accepted: bool
    # "rate" (tenant's bucket empty), "deadline" (would start after max_wait_s, by the pool's
    # queue or the tenant's own cap), "capacity" (tier at its bound), "tenant_limit" (quota).
    reason: str | None
    duplicate: bool  # the job id was already indexed: nothing changed
    position: int  # jobs ahead of it (accepted), or that would be (refused)
    tier_queued: int  # after the call (before it, if refused)
    tenant_queued: int  # after the call (before it, if refused)
    tenant_inflight: int
    capacity: int  # the pool's slots
    inflight: int  # leases held, all tenants
    measured: tuple[float, int] | None  # the published mean service time and its samples
    next_token_s: float  # rate refusal: seconds until the bucket holds a token
    bound: int
    quota: int
    max_position: int | None
    # The jobs ahead that start before it: when tenants below their caps leave it a free slot,
    # their jobs ahead (it starts at once); otherwise every job ahead (``position``).
    starts_ahead: int


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A job handed out (``dispatch``) or taken back (``reap``), with what indexing it again
    needs: a lease of a job whose row is not visible yet goes back to the queue from the
    lease alone (``jobs.dispatch.upkeep.retry_soon``), and must keep its deadline there."""

    job_id: str
    tenant: str
    tier: str
    order_key: float
    expires_at: float
    attempt: int = 1
    # The start_by it was indexed with (None: never expires). Its not_before is not kept:
    # a lease was due when it was handed out, and whoever queues it again sets its own.
    start_by: float | None = None


@dataclass(frozen=True, kw_only=True)
class RunCandidate:
    """A queued job that may join a run (``fill_run``): its id, its tenant (whose cap it
    counts against) and its cost in the kind's units (0 without a budget)."""

    job_id: str
    tenant: str
    cost: int = 0


@dataclass(frozen=True, kw_only=True)
class Entry:
    """What the index holds for one job (the reconciler's walk)."""

    job_id: str
    attempt: int
    leased: bool


@dataclass(frozen=True, kw_only=True)
class LiveWorker:
    """A worker whose registration has not expired: the slots it brings, on which device,
    and the kinds it runs."""

    worker_id: str
    slots: int
    device: str
    expires_at: float
    memory_bytes: int | None = None  # the device's memory, on a GPU
    # The kinds it has handlers for (None: it registered none, as a worker of an earlier
    # version does: taken to run every kind of its pool).
    kinds: frozenset[str] | None = None

    def runs(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds


def kinds_arg(kinds: Iterable[str] | None) -> str:
    """A worker's kinds as the index keeps them: a sorted JSON array, so that two workers of
    the same kinds register the same string ('' when it said none)."""
    return "" if kinds is None else json.dumps(sorted(set(kinds)), separators=(",", ":"))


def kinds_of(raw: str) -> frozenset[str] | None:
    """``kinds_arg`` read back."""
    return None if raw == "" else frozenset(str(kind) for kind in json.loads(raw))


@dataclass(frozen=True, kw_only=True)
class KindRoutes:
    """How a pool's jobs reach its workers (``route_kinds``): ``routed`` while not every live
    worker runs every kind its jobs may have (their kinds differ, or a kind was met that one
    of them does not run), so that only the dispatcher leases, by kind; ``waiting``, the
    kinds met that some live worker did not run, whose jobs may be parked until one does."""

    routed: bool
    waiting: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True)
class TierDepth:
    """A tier's waiting jobs (queued and delayed), and the order key of its oldest queued one:
    a delayed job (a retry's backoff, a start asked for later) waits for its time, not for a
    slot, and does not make the queue look old."""

    queued: int
    oldest_order_key: float | None
