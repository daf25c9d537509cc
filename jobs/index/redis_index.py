"""The dispatch index in Redis: one Lua script per operation, all keys under one prefix.

Every change that touches more than one key is one script (``jobs/index/lua``), so
concurrent API replicas and dispatchers never overshoot a bound or a cap. Key names come
from ``keys.py``; scores travel as ``repr(float)`` so they round-trip exactly.

Choices the protocol leaves open (``MemoryIndex`` makes the same ones):

- A job with a ``not_before`` is *delayed*: counted in its tier's depth and its tenant's
  queued count, but not in ``position`` nor dispatchable until a ``dispatch(now)`` with
  ``now >= not_before`` promotes it (at most ``PROMOTE_LIMIT`` per call, by ``not_before``).
- ``requeue`` of a job the index holds replaces it, whatever it was: queued, delayed or
  leased (its lease is dropped).
- ``set_caps``: tier caps are merged into the earlier ones; tenant overrides replace all
  earlier overrides, and ``None`` clears them. A cap below 1 raises ``ValueError``.
- Runnable tenants are filed under their head job, so tenants whose heads tie on
  ``order_key`` go by job id, the same order as ``position``.
- ``admit`` of a job already indexed returns ``duplicate=True`` with the counts of the
  given tenant and tier; its position is its rank when queued, the rank it would have when
  delayed, 0 when leased.
- The leader lock's TTL runs on Redis's clock (``PX``); the ``now`` the leadership methods
  take is the twin's clock and is not used here. Every other ``now`` left out is Redis's
  ``TIME``, read inside the script that decides.

The parts: the scripts and their codec (``redis_scripts.py``), the lease table and worker
registry (``redis_leases.py``), routing by kind (``redis_kinds.py``), upkeep
(``redis_upkeep.py``); the queue and admission are here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from jobs.core import policy
from jobs.index.keys import PROMOTE_LIMIT
from jobs.index.redis_kinds import RedisKinds
from jobs.index.redis_leases import DEVICE_SUFFIX, RedisLeases
from jobs.index.redis_scripts import (
    job_args,
    lease_of,
    now_arg,
    opt_float_of,
    opt_int_arg,
    opt_score_arg,
    score_arg,
    text_of,
)
from jobs.index.redis_upkeep import RedisUpkeep
from jobs.index.values import (
    REFUSALS_KEEP_S,
    Admission,
    AdmissionTerms,
    Admitted,
    IndexedJob,
    Lease,
    TierDepth,
    refusal_minute,
)

__all__ = ["DEVICE_SUFFIX", "REQUEUE_CHUNK", "RedisIndex"]

# Jobs per requeue script call when loading many (keeps each call short).
REQUEUE_CHUNK = 5000


class RedisIndex(RedisLeases, RedisKinds, RedisUpkeep):
    """``DispatchIndex`` on Redis. ``prefix`` must carry one hash tag, e.g. ``{tierq}:``."""

    def admit(
        self,
        job: IndexedJob,
        *,
        bound: int,
        tenant_quota: int | None = None,
        max_position: int | None = None,
        fence: str | None = None,
    ) -> Admitted:
        quota = "" if tenant_quota is None else str(tenant_quota)
        ahead = "" if max_position is None else str(max_position)
        raw = self._run("admit", [*job_args(job)[:6], str(bound), quota, ahead, fence or ""])
        reason = text_of(raw[4])
        return Admitted(
            accepted=bool(raw[0]),
            tier_queued=int(raw[1]),
            tenant_queued=int(raw[2]),
            position=int(raw[3]),
            reason=reason or None,
            duplicate=bool(raw[5]),
        )

    def admit_new(self, job: IndexedJob, terms: AdmissionTerms) -> Admission:
        tier, rate = terms.tier, terms.rate
        queued_share = tier.queued_share if tier.queued_share is not None else tier.tenant_share
        args = [
            *job_args(job)[:5], score_arg(terms.now),
            "" if rate is None else score_arg(rate.rate_per_s),
            "" if rate is None else str(int(rate.burst)),
            opt_int_arg(terms.pool_concurrency), score_arg(terms.mean_service_s),
            str(int(terms.service_samples_min)),
            score_arg(policy.useful_wait_s(tier, terms.client_timeout_s)),
            score_arg(queued_share), score_arg(tier.tenant_share),
            opt_int_arg(terms.tenant_cap), opt_int_arg(terms.tenant_quota),
            opt_score_arg(terms.max_wait_s), str(REFUSALS_KEEP_S), score_arg(terms.passing),
        ]
        keys = [*self._fenced, *self._keys.worker_keys(), self._keys.service_mean,
                self._keys.rate_bucket(job.tenant),
                self._keys.refusals(refusal_minute(terms.now))]
        raw = self._scripts["admit_new"](keys=keys, args=args)
        mean, samples = text_of(raw[9]), text_of(raw[10])
        return Admission(
            accepted=bool(raw[0]),
            reason=text_of(raw[1]) or None,
            tier_queued=int(raw[2]),
            tenant_queued=int(raw[3]),
            position=int(raw[4]),
            duplicate=bool(raw[5]),
            tenant_inflight=int(raw[6]),
            capacity=int(raw[7]),
            inflight=int(raw[8]),
            measured=None if mean == "" else (float(mean), int(samples)),
            next_token_s=float(text_of(raw[11])),
            bound=int(raw[12]),
            quota=int(raw[13]),
            max_position=None if text_of(raw[14]) == "" else int(raw[14]),
            starts_ahead=int(raw[15]),
        )

    def refusal_counts(self, minutes: Sequence[int]) -> dict[tuple[str, str, str], int]:
        pipe = self._client.pipeline(transaction=False)
        for minute in minutes:
            pipe.hgetall(self._keys.refusals(minute))
        counts: dict[tuple[str, str, str], int] = {}
        for bucket in pipe.execute() if minutes else []:
            for raw, value in bucket.items():
                scope, name, reason = (str(part) for part in json.loads(text_of(raw)))
                key = (scope, name, reason)
                counts[key] = counts.get(key, 0) + int(value)
        return counts

    def requeue(self, job: IndexedJob, *, fence: str | None = None) -> None:
        self._run("requeue", [fence or "", *job_args(job)])

    def requeue_many(self, jobs: Iterable[IndexedJob], *, fence: str | None = None) -> int:
        """``requeue`` each job, in chunks of ``REQUEUE_CHUNK`` per script call (rebuilds,
        bulk loads). Each chunk is atomic and fenced; the whole is not. Returns the number
        indexed."""
        count, chunk = 0, []
        for job in jobs:
            chunk.extend(job_args(job))
            if len(chunk) >= 7 * REQUEUE_CHUNK:
                count += int(self._run("requeue", [fence or "", *chunk]))
                chunk = []
        if chunk:
            count += int(self._run("requeue", [fence or "", *chunk]))
        return count

    def dispatch(
        self,
        n: int,
        *,
        lease_ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
        capacity: int | None = None,
    ) -> list[Lease]:
        if n <= 0:
            return []
        return self._dispatch(n, lease_ttl_s=lease_ttl_s, now=now, fence=fence,
                              capacity=capacity, say_routed=False)[0]

    def dispatch_routed(
        self,
        n: int,
        *,
        lease_ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
        capacity: int | None = None,
    ) -> tuple[list[Lease], bool]:
        if n <= 0:
            return [], False
        return self._dispatch(n, lease_ttl_s=lease_ttl_s, now=now, fence=fence,
                              capacity=capacity, say_routed=True)

    def _dispatch(
        self, n: int, *, lease_ttl_s: float, now: float | None, fence: str | None,
        capacity: int | None, say_routed: bool,
    ) -> tuple[list[Lease], bool]:
        raw = self._run("dispatch", [
            n, now_arg(now), score_arg(lease_ttl_s), PROMOTE_LIMIT, fence or "",
            "" if capacity is None else int(capacity), "1" if say_routed else "",
        ], self._keys.worker_keys())
        routed = bool(raw) and not isinstance(raw[-1], list)  # the trailing 'routed'
        return [lease_of(item) for item in (raw[:-1] if routed else raw)], routed

    def cancel(self, job_id: str, *, tenant: str | None = None, fence: str | None = None) -> bool:
        return bool(self._run("cancel", [job_id, fence or "", tenant or ""]))

    def expire_due(
        self, *, now: float | None = None, limit: int = 1000, fence: str | None = None
    ) -> list[IndexedJob]:
        if limit <= 0:
            return []
        raw = self._run("expire_due", [now_arg(now), limit, fence or ""])
        return [
            IndexedJob(
                job_id=text_of(job), tenant=text_of(tenant), tier=text_of(tier),
                order_key=float(text_of(key)), start_by=opt_float_of(start_by),
                not_before=opt_float_of(not_before), attempt=int(attempt),
            )
            for job, tenant, tier, key, start_by, not_before, attempt in raw
        ]

    def now(self) -> float:
        seconds, micros = self._client.time()
        return int(seconds) + int(micros) / 1_000_000

    def position(self, job_id: str) -> int | None:
        rank: Any = self._run("position", [job_id])
        return None if rank is None else int(rank)

    def position_at(self, order_key: float) -> int:
        return int(self._run("position_at", [score_arg(order_key)]))

    def runnable_ahead(self, job_id: str, order_key: float, *, limit: int) -> int:
        if limit <= 0:
            return 0
        return int(self._run("runnable_ahead", [score_arg(order_key), str(int(limit)), job_id]))

    def places(
        self, jobs: Sequence[tuple[str, float]], *, free_slots: int
    ) -> dict[str, tuple[int, int]]:
        if not jobs:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for job_id, order_key in jobs:
            self._scripts["position"](keys=self._fenced, args=[job_id], client=pipe)
            if free_slots > 0:
                self._scripts["runnable_ahead"](
                    keys=self._fenced, client=pipe,
                    args=[score_arg(order_key), str(int(free_slots)), job_id])
        replies = pipe.execute()
        step = 2 if free_slots > 0 else 1
        found: dict[str, tuple[int, int]] = {}
        for i, (job_id, _) in enumerate(jobs):
            rank = replies[step * i]
            if rank is not None:
                found[job_id] = (int(rank), int(replies[step * i + 1]) if step == 2 else 0)
        return found

    def tier_depths(self, tiers: Sequence[str]) -> dict[str, TierDepth]:
        return self.depths_and_inflight(tiers)[0]

    def depths_and_inflight(
        self, tiers: Sequence[str]
    ) -> tuple[dict[str, TierDepth], int]:
        pipe = self._client.pipeline(transaction=True)  # MULTI: one instant
        for tier in tiers:
            pipe.zcard(self._keys.tier(tier))
            pipe.zrange(self._keys.tier(tier), 0, 0, withscores=True)
            pipe.hget(self._keys.tier_delayed, tier)
        pipe.zcard(self._keys.leases)
        *replies, inflight = pipe.execute()
        depths: dict[str, TierDepth] = {}
        for i, tier in enumerate(tiers):
            count, head, delayed = replies[3 * i: 3 * i + 3]
            oldest = float(head[0][1]) if head else None
            depths[tier] = TierDepth(queued=int(count) + int(delayed or 0),
                                     oldest_order_key=oldest)
        return depths, int(inflight)

    def tenant_queued(self, tenant: str) -> int:
        return self.tenant_counts(tenant)[0]

    def tenant_counts(self, tenant: str) -> tuple[int, int]:
        pipe = self._client.pipeline(transaction=True)  # MULTI: one instant
        pipe.llen(self._keys.tenant_queue(tenant))
        pipe.hget(self._keys.tenant_delayed, tenant)
        pipe.zcard(self._keys.tenant_leases(tenant))
        queued, delayed, inflight = pipe.execute()
        return int(queued) + int(delayed or 0), int(inflight)
