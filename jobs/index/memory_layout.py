"""The twin's state and the small steps every operation shares (those of ``lua/common.lua``),
with the leader lock that fences them: the base the twin's parts build on (``memory.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from jobs.core.policy import Tier
from jobs.index.base import NotLeader
from jobs.index.rate_limit import MemoryRateLimiter
from jobs.index.values import IndexedJob, TierPush
from jobs.index.zset import ZSet

V = TypeVar("V")


def frozen_value(cls: type[V], **fields: Any) -> V:
    """A frozen dataclass's value, filled in without its ``__init__``: that one sets each
    field through ``object.__setattr__`` and costs about three times as much, and the twin
    and the simulator build one per simulated job. Every field must be given (defaults are
    not applied), and the class must have no ``__post_init__`` and no ``__slots__``."""
    if len(fields) != len(cls.__dataclass_fields__):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__}: every field must be given")
    value = object.__new__(cls)
    value.__dict__.update(fields)
    return value


def check_scores(job: IndexedJob) -> None:
    for value in (job.order_key, job.start_by, job.not_before):
        if value is not None and math.isnan(value):
            raise ValueError("a score must be a number, not NaN")


def check_caps(caps: Mapping[str, int], what: str) -> None:
    for name, cap in caps.items():
        if cap < 1:
            raise ValueError(f"{what} cap for {name!r} must be at least 1, got {cap}")


@dataclass
class FleetState:
    """What the root prefix holds for every pool (``jobs.index.keys``): the leader lock and
    its epoch, and the tenants' rate buckets; shared by the twins of one fleet's pools."""

    leader: tuple[str, float] | None = None  # token, expires_at
    leader_epoch: int = 0
    buckets: MemoryRateLimiter = field(default_factory=MemoryRateLimiter)


class MemoryLayout:
    """The data layout of ``keys.py`` in process memory, and its shared steps."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._shares_fleet = False
        # The last ``now`` a caller passed: the time of a fence check in a call that takes
        # none (the leader lock expires on the callers' virtual time, see ``memory.py``).
        self._seen_now: float | None = None
        self.clear()

    def _at(self, now: float | None) -> float:
        if now is None:
            return self.clock()
        self._seen_now = now
        return now

    def now(self) -> float:
        return self.clock()

    def clear(self) -> None:
        self._queues: dict[str, ZSet] = {}
        # A tenant's leases and a tier's queued jobs, member -> score: they are counted, and
        # a tier's lowest score read, but never walked in order, so a dict does (see ``_put``).
        self._tenant_leases: dict[str, dict[str, float]] = {}
        self._tiers: dict[str, dict[str, float]] = {}
        self._runnable, self._blocked, self._queued = ZSet(), ZSet(), ZSet()
        self._delayed, self._deadlines = ZSet(), ZSet()
        # job -> lease expiry: looked up per job, walked in order only by ``reap`` (``_lapsed``).
        self._leases: dict[str, float] = {}
        self._meta: dict[str, IndexedJob] = {}
        self._cancels: set[str] = set()  # leased jobs flagged to cancel (meta's 7th field)
        self._ending: set[str] = set()  # leases kept while ending (common.lua's ENDING)
        self._riders: set[str] = set()  # a run's items after its first (common.lua's RIDERS)
        self._tier_caps: dict[str, int] = {}
        self._tenant_caps: dict[str, int] = {}
        self._tenant_tier: dict[str, str] = {}
        self._tenant_delayed: dict[str, int] = {}
        self._workers: dict[str, tuple[float, int]] = {}
        self._devices: dict[str, tuple[str, int | None]] = {}  # worker -> device, memory
        # Routing by kind (``worker_registry``): each worker's kinds as registered
        # (``values.kinds_arg``), the ones they share, the flag, the waiting kinds and, by
        # kind, the jobs parked for a worker of it.
        self._worker_kinds: dict[str, str] = {}
        self._shared_kinds: str | None = None
        self._routed = False
        self._kinds_waiting: set[str] = set()
        self._parked: dict[str, set[str]] = {}
        self._pool: tuple[int, float] | None = None  # pool_capacity's (slots, valid until)
        if not self._shares_fleet:  # a pool's twin keeps the fleet's (``MemoryIndex.pool``)
            self._fleet = FleetState()
        self._generation: str | None = None
        # The ``refusals:<minute>`` hashes: (scope, name, reason) -> count, by minute.
        self._refusals: dict[int, dict[tuple[str, str, str], int]] = {}
        self._refused_minute: int | None = None  # the minute of the last refusal counted
        # The twin of the ``service_mean`` hash ``jobs.fleet.service_rate`` publishes in Redis:
        # the measured mean service time and its samples.
        self.service_mean: tuple[float, int] | None = None
        # The twin of the ``arrivals`` hash, as published (``Work.fields``).
        self.published_work: dict[str, str] = {}
        self.published_kinds: dict[str, str] = {}  # the ``kind_means`` hash
        self._tier_push: TierPush | None = None
        # ``admit_new``'s figures per tier: (tier, (capacity, mean, client timeout), figures).
        self._figured: dict[str, tuple[Tier, tuple[int, float, float | None],
                                       tuple[float, int, int, int]]] = {}

    # -- the layout's small steps (the helpers of lua/common.lua) --

    @staticmethod
    def _zadd(sets: dict[str, ZSet], key: str, member: str, score: float) -> None:
        zset = sets.get(key)
        if zset is None:  # not ``setdefault``: that would build a set per call
            zset = sets[key] = ZSet()
        zset.add(member, score)

    @staticmethod
    def _zrem(sets: dict[str, ZSet], key: str, member: str) -> bool:
        zset = sets.get(key)
        if zset is None or not zset.remove(member):
            return False
        if not zset:
            del sets[key]
        return True

    @staticmethod
    def _put(sets: dict[str, dict[str, float]], key: str, member: str, score: float) -> None:
        """``_zadd`` for a set kept as a dict: the same members and scores, no order kept."""
        members = sets.get(key)
        if members is None:
            members = sets[key] = {}
        members[member] = score

    @staticmethod
    def _drop(sets: dict[str, dict[str, float]], key: str, member: str) -> bool:
        """``_zrem`` for a set kept as a dict."""
        members = sets.get(key)
        if members is None or members.pop(member, None) is None:
            return False
        if not members:
            del sets[key]
        return True

    def _lapsed(self, now: float, limit: int) -> list[tuple[str, float]]:
        """Leases expiring at or before ``now``, in (expiry, job) order, at most ``limit``."""
        due = sorted((expires_at, job_id) for job_id, expires_at in self._leases.items()
                     if expires_at <= now)
        return [(job_id, expires_at) for expires_at, job_id in due[:limit]]

    def _cap_of(self, tenant: str) -> int:
        cap = self._tenant_caps.get(tenant)
        if cap is None:
            tier = self._tenant_tier.get(tenant)
            cap = None if tier is None else self._tier_caps.get(tier)
        return 1 if cap is None else cap

    def _at_cap(self, tenant: str) -> bool:
        return len(self._tenant_leases.get(tenant, ())) >= self._cap_of(tenant)

    def _head(self, tenant: str) -> tuple[str, float] | None:
        queue = self._queues.get(tenant)
        return None if queue is None else queue.first()

    def _head_of(self, tenant: str) -> str | None:
        head = self._head(tenant)
        return None if head is None else head[0]

    def _refile(self, tenant: str, old: str | None) -> bool:
        head = self._head(tenant)
        blocked, runnable = self._blocked, self._runnable
        was_blocked = old is not None and blocked.score(old) is not None
        source = blocked if was_blocked else runnable
        if head is None:
            if old is not None:
                source.remove(old)
            return False
        to_blocked = self._at_cap(tenant)
        if old == head[0] and was_blocked == to_blocked:
            return False
        if old is not None:
            source.remove(old)
        (blocked if to_blocked else runnable).add(head[0], head[1])
        return was_blocked and not to_blocked

    def _enqueue(self, job_id: str, tenant: str, order_key: float, recheck: bool) -> None:
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = ZSet()
        old = queue.first()
        old_id = None if old is None else old[0]
        queue.add(job_id, order_key)
        self._queued.add(job_id, order_key)
        head = queue.first()
        if recheck or head is None or head[0] != old_id:
            self._refile(tenant, old_id)

    def _undelay(self, job_id: str, tenant: str) -> bool:
        if not self._delayed.remove(job_id):
            return False
        left = self._tenant_delayed[tenant] - 1
        if left <= 0:
            del self._tenant_delayed[tenant]
        else:
            self._tenant_delayed[tenant] = left
        return True

    def _index(self, job: IndexedJob) -> None:
        self._meta[job.job_id] = job
        self._cancels.discard(job.job_id)
        retiered = self._tenant_tier.get(job.tenant) != job.tier
        self._tenant_tier[job.tenant] = job.tier
        self._put(self._tiers, job.tier, job.job_id, job.order_key)
        if job.start_by is not None:
            self._deadlines.add(job.job_id, job.start_by)
        if job.not_before is None:
            self._enqueue(job.job_id, job.tenant, job.order_key, retiered)
            return
        self._delayed.add(job.job_id, job.not_before)
        self._tenant_delayed[job.tenant] = self._tenant_delayed.get(job.tenant, 0) + 1
        head = self._head_of(job.tenant)
        if retiered and head is not None:
            self._refile(job.tenant, head)

    def _unindex(self, job: IndexedJob) -> str:
        job_id, tenant = job.job_id, job.tenant
        state, old = "none", None
        if self._undelay(job_id, tenant):
            state = "delayed"
        elif self._queued.score(job_id) is not None:
            state, old = "queued", self._head_of(tenant)
            self._zrem(self._queues, tenant, job_id)
            self._queued.remove(job_id)
        elif self._leases.pop(job_id, None) is not None:
            state = "leased"
            self._drop(self._tenant_leases, tenant, job_id)
            self._ending.discard(job_id)
            self._riders.discard(job_id)
        self._drop(self._tiers, job.tier, job_id)
        self._deadlines.remove(job_id)
        del self._meta[job_id]
        self._cancels.discard(job_id)
        if state == "queued":
            self._refile(tenant, old)
        elif state == "leased":
            head = self._head_of(tenant)
            if head is not None:
                self._refile(tenant, head)
        return state

    def _check_fence(self, fence: str | None, now: float | None, what: str) -> None:
        if not fence:
            return
        if now is None:
            now = self._seen_now if self._seen_now is not None else self.clock()
        if self.leader(now=now) != fence:
            raise NotLeader(f"{what} refused: the fencing token is not the leader's")

    # -- counts --

    def inflight(self) -> int:
        return len(self._leases)

    def _held_slots(self) -> int:
        """The leases that hold a slot of the pool: all but those kept while ending and a
        run's riders."""
        return len(self._leases) - len(self._ending) - len(self._riders)

    def tenant_inflight(self, tenant: str) -> int:
        return len(self._tenant_leases.get(tenant, ()))

    def tenant_queued(self, tenant: str) -> int:
        return len(self._queues.get(tenant, ())) + self._tenant_delayed.get(tenant, 0)

    def tenant_counts(self, tenant: str) -> tuple[int, int]:
        return self.tenant_queued(tenant), self.tenant_inflight(tenant)

    # -- the leader lock (the fence reads it) --

    def acquire_leadership(self, owner: str, *, ttl_s: float, now: float) -> str | None:
        if self.leader(now=now) is not None:
            return None
        self._fleet.leader_epoch += 1
        token = f"{self._fleet.leader_epoch}:{owner}"
        self._fleet.leader = (token, now + ttl_s)
        return token

    def renew_leadership(self, token: str, *, ttl_s: float, now: float) -> bool:
        if self.leader(now=now) != token:
            return False
        self._fleet.leader = (token, now + ttl_s)
        return True

    def resign_leadership(self, token: str, *, now: float) -> bool:
        if self.leader(now=now) != token:
            return False
        self._fleet.leader = None
        return True

    def leader(self, *, now: float) -> str | None:
        self._seen_now = now
        held = self._fleet.leader
        if held is None or held[1] <= now:
            return None
        return held[0]
