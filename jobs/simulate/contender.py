"""What the engine asks of a scheduling policy under test (``tierq`` and the baselines).

Jobs are the traffic's numbers (``jobs.simulate.traffic``); an attempt is a start of one.
The engine owns time, the pool's workers and the jobs' running; a contender owns the queue,
admission, the order and the caps, as the index and the dispatcher do in the real system.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from jobs.core import policy
from jobs.core.policy import MeasuredMean, Policy, Tier
from jobs.core.service_times import KindMean
from jobs.simulate.packing import NO_PACKING, Kind
from jobs.simulate.traffic import Traffic


@dataclass(kw_only=True, slots=True)
class Verdict:
    """A submit's answer: accepted with a told estimate, or refused with its cause (the API
    error ``type``) and limit (``bound``, ``quota``, ``rate``, ``deadline``).

    Not frozen: one is made per simulated submit, and a frozen dataclass's ``__init__``
    costs about three times as much. Nobody changes one once made."""

    accepted: bool
    cause: str | None = None
    limit: str | None = None
    told_wait_s: float | None = None  # the estimate the client is told (None: none)
    # A refusal's figures: what the limit counts (queued jobs of the tier or the tenant,
    # jobs ahead) and the limit's value, as the index read them.
    count: int | None = None
    limit_value: int | None = None


ACCEPTED = Verdict(accepted=True)


@dataclass(kw_only=True, slots=True)
class Dispatched:
    """What a dispatch started: one run per slot, led by its first item (``started``), its
    further items (``riders``, by lead; a run of one has none); and what it found late."""

    started: list[tuple[int, int]] = field(default_factory=list)  # (job, attempt)
    expired: list[int] = field(default_factory=list)  # popped past their deadline
    riders: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


class Contender(Protocol):
    name: str

    def set_workers(self, workers: dict[str, int], now: float) -> int:
        """The live workers (id → slots); returns the pool's capacity."""
        ...

    def measured(self, mean: MeasuredMean, now: float,
                 kinds: Mapping[str, float] | None = None,
                 measures: Mapping[str, KindMean] | None = None,
                 overall_s: float | None = None) -> None:
        """The measured mean service time, as the dispatcher publishes it (the mean of the
        work the pool holds queued), each measured kind's mean, and its mean and spread, and
        the latest runs' overall mean (a kind not measured yet counts at it)."""
        ...

    def submit(self, job: int, now: float) -> Verdict: ...

    def feed(self, job: int, now: float) -> bool:
        """The batch feeder's admit of a batch item (bound and quota, no rate, no estimate);
        False: no room now, it stays with its batch."""
        ...

    def dispatch(self, now: float) -> Dispatched:
        """Start as many runs as the pool's free slots and the caps allow: each slot's first
        job, and with it, when its kind packs, the next queued jobs of that kind that may
        join (``jobs.simulate.packing``)."""
        ...

    def finish(self, job: int, attempt: int, now: float) -> None:
        """The attempt ended (success or failure): its slot frees once the last item of its
        run has ended."""
        ...

    def gone(self, job: int) -> None:
        """The job ended for good (succeeded, failed its last attempt, or expired): it is
        no longer work the pool holds."""
        ...

    def renew(self, job: int, attempt: int, now: float) -> None:
        """The worker's heartbeat for a running attempt."""
        ...

    def lose(self, job: int, attempt: int, now: float) -> None:
        """The attempt's worker crashed: nobody renews or releases it any more."""
        ...

    def reap(self, now: float) -> list[tuple[int, int]]:
        """Lost attempts whose lease lapsed by ``now``, removed."""
        ...

    def requeue(self, job: int, attempt: int, not_before: float | None, now: float) -> None:
        """Queue ``job`` again as ``attempt`` (retry or reaped), with its original order."""
        ...

    def expire(self, now: float) -> list[int]:
        """Queued jobs past their deadline, removed."""
        ...

    def queued(self) -> list[int]:
        """Queued jobs per tier (the traffic's tier order)."""
        ...

    def cap(self, tenant: int) -> int | None:
        """The tenant's concurrency cap now (None: no cap)."""
        ...


@dataclass(frozen=True, kw_only=True)
class Context:
    """What every contender is built from: the policy in force and the traffic, and when
    each job entered the queue (its arrival; a batch item's, when the feeder admitted it)."""

    policy: Policy
    traffic: Traffic
    enqueued: list[float]
    # Per kind of ``traffic.kinds``: how it runs (none: no kind packs).
    kinds: tuple[Kind, ...] = ()

    def kind(self, job: int) -> Kind:
        """How the job's kind runs."""
        return self.kinds[self.traffic.kind[job]] if self.kinds else NO_PACKING

    @property
    def packs(self) -> bool:
        return any(kind.packs for kind in self.kinds)

    @property
    def tiers(self) -> list[Tier]:
        return [self.policy.tier(name) for name in self.traffic.tiers]

    def order_key(self, job: int) -> float:
        traffic = self.traffic
        tier = self.policy.tier(traffic.tiers[traffic.tier_of(job)])
        return policy.order_key(self.enqueued[job], tier.base_priority,
                                self.policy.ageing_rate_s)

    def start_by(self, job: int) -> float | None:
        max_wait = self.traffic.max_wait_s[job]
        return None if max_wait is None else self.enqueued[job] + max_wait
