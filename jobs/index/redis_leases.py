"""``RedisIndex``'s lease table and worker registry: what a running attempt and its worker touch."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence

from jobs.core.histograms import StartFigures
from jobs.index import wake
from jobs.index.keys import PROMOTE_LIMIT
from jobs.index.lean_script import one_trip
from jobs.index.redis_scripts import (
    RedisScripts,
    job_args,
    lease_of,
    now_arg,
    opt_float_of,
    opt_int_arg,
    opt_score_arg,
    score_arg,
    text_of,
)
from jobs.index.values import (
    Finished,
    FirstRenewal,
    IndexedJob,
    Lease,
    LiveWorker,
    MessagePush,
    Renewal,
    RunCandidate,
    TierPush,
    Work,
    kinds_arg,
    kinds_of,
)

logger = logging.getLogger("tierq.index")

# How long a process keeps the workers' ``TierPush`` before reading it again.
TIER_PUSH_REFRESH_S = 10.0
# A worker's device is kept beside its slots, under its id and this suffix (workers.lua), its
# memory (a GPU's) and the kinds it runs under the others.
DEVICE_SUFFIX = "#device"
MEMORY_SUFFIX = "#memory"
KINDS_SUFFIX = "#kinds"


class RedisLeases(RedisScripts):
    """Leases (renew, release, reap, restore) and live workers of ``RedisIndex``."""

    # The workers' ``TierPush`` as last read, and when (``time.monotonic()``).
    _tier_push_read: tuple[float, TierPush | None] | None = None

    def renew(
        self, job_id: str, *, attempt: int, ttl_s: float, now: float | None = None
    ) -> bool:
        return bool(self.renew_checked(job_id, attempt=attempt, ttl_s=ttl_s, now=now))

    def renew_checked(
        self,
        job_id: str,
        *,
        attempt: int,
        ttl_s: float,
        now: float | None = None,
        announce: bool = False,
        start: StartFigures | None = None,
        release: Finished | None = None,
    ) -> Renewal:
        keys, args = self._renew_call(job_id, attempt=attempt, ttl_s=ttl_s, now=now,
                                      announce=announce, start=start, release=release)
        return Renewal(int(self._scripts["renew"](keys=keys, args=args)))

    def _renew_call(
        self, job_id: str, *, attempt: int, ttl_s: float, now: float | None, announce: bool,
        start: StartFigures | None, release: Finished | None,
    ) -> tuple[list[str], list[str | int]]:
        figures = [""] * 6 if start is None else start.script_args()
        ending: list[str | int] = [] if release is None else [
            release.job_id, int(release.attempt), release.outcome,
            "" if release.capacity is None else int(release.capacity)]
        return ([*self._fenced, *self._keys.worker_keys()],
                [job_id, int(attempt), score_arg(ttl_s), now_arg(now),
                 "1" if announce else "", *figures, *ending])

    def hand_over(
        self,
        job_id: str,
        *,
        attempt: int,
        lease_ttl_s: float,
        capacity: int | None = None,
        now: float | None = None,
        announce: bool = False,
        outcome: str | None = None,
        take_next: bool = True,
        push: MessagePush | None = None,
        token: str | None = None,
        keep: bool = False,
        first: FirstRenewal | None = None,
    ) -> Lease | None:
        args = [job_id, str(int(attempt)), "1" if announce else "", outcome or "",
                score_arg(lease_ttl_s), now_arg(now),
                "" if capacity is None else str(int(capacity)), PROMOTE_LIMIT,
                "" if take_next else "1", "" if push is None else push.envelope, token or "",
                "1" if keep else ""]
        keys = [*self._fenced, *self._keys.worker_keys()]
        if push is not None:
            keys.append(push.key)
        if first is None:
            raw = self._scripts["hand_over"](keys=keys, args=args)
            return lease_of(raw[0]) if raw else None
        renew_keys, renew_args = self._renew_call(
            job_id, attempt=attempt, ttl_s=first.ttl_s, now=now, announce=first.announce,
            start=first.start, release=first.release)
        renewed, raw = one_trip((self._scripts["renew"], renew_keys, renew_args),
                                (self._scripts["hand_over"], keys, args))
        if isinstance(raw, Exception):
            raise raw
        if isinstance(renewed, Exception):  # best effort, as a first renewal is: the lease
            # it would have released lapses and is reaped
            logger.warning("job.release_failed", extra={
                "event": "job.release_failed", "job_id": job_id}, exc_info=renewed)
        return lease_of(raw[0]) if raw else None

    def offer(
        self,
        *,
        lease_ttl_s: float,
        push: TierPush | None,
        capacity: int | None = None,
        now: float | None = None,
    ) -> Lease | None:
        queues = () if push is None else push.queues
        args: list[str | int] = [score_arg(lease_ttl_s), now_arg(now),
                "" if capacity is None else str(int(capacity)), PROMOTE_LIMIT,
                "" if push is None else push.envelope, len(queues),
                *(queue.tier for queue in queues), *(queue.name for queue in queues)]
        keys = [*self._fenced, *self._keys.worker_keys(), *(queue.key for queue in queues)]
        raw = self._scripts["offer"](keys=keys, args=args)
        if not raw:
            return None
        lease = lease_of(raw[0][:7])
        if int(raw[0][7]) == 1:
            return lease
        # Its tier has no queue in ``push``: back in the queue at once, for the dispatcher.
        self.put_back(lease.job_id, attempt=lease.attempt)
        wake.ring(self._client, self._keys.prefix)
        return None

    def tier_push(self) -> TierPush | None:
        """Read at most every ``TIER_PUSH_REFRESH_S`` (a submit asks for it every time; the
        workers set it once, as they start)."""
        now = time.monotonic()
        cached = self._tier_push_read
        if cached is not None and now - cached[0] < TIER_PUSH_REFRESH_S:
            return cached[1]
        raw = self._client.get(self._keys.tier_push)
        push = None if raw is None else TierPush.from_json(text_of(raw))
        self._tier_push_read = (now, push)
        return push

    def set_tier_push(self, push: TierPush) -> None:
        self._client.set(self._keys.tier_push, push.to_json())
        self._tier_push_read = (time.monotonic(), push)

    def fill_run(
        self,
        lead_id: str,
        *,
        attempt: int,
        candidates: Sequence[RunCandidate],
        max_items: int,
        max_cost: int | None = None,
        lead_cost: int = 0,
        lease_ttl_s: float,
        now: float | None = None,
    ) -> list[Lease]:
        if max_items < 2 or not candidates:
            return []
        args: list[str] = [lead_id, str(int(attempt)), score_arg(lease_ttl_s), now_arg(now),
                           str(int(max_items)), opt_int_arg(max_cost), str(int(lead_cost))]
        for candidate in candidates:
            args += [candidate.job_id, candidate.tenant, str(int(candidate.cost))]
        return [lease_of(raw) for raw in self._run("fill_run", args)]

    def renew_many(
        self,
        items: Sequence[tuple[str, int, StartFigures | None]],
        *,
        ttl_s: float,
        now: float | None = None,
        announce: bool = False,
    ) -> list[Renewal]:
        if not items:
            return []
        args: list[str | int] = [score_arg(ttl_s), now_arg(now), "1" if announce else ""]
        for job_id, attempt, start in items:
            args += [job_id, int(attempt), *([""] * 6 if start is None else start.script_args())]
        return [Renewal(int(raw)) for raw in self._run("renew_many", args)]

    def release_many(self, items: Sequence[tuple[str, int, str | None]]) -> int:
        if not items:
            return 0
        args: list[str | int] = []
        for job_id, attempt, status in items:
            args += [job_id, int(attempt), status or ""]
        return int(self._run("release_many", args))

    def put_back(
        self, job_id: str, *, attempt: int, not_before: float | None = None,
        fence: str | None = None,
    ) -> bool:
        args = [job_id, str(int(attempt)), opt_score_arg(not_before), fence or ""]
        return bool(self._run("put_back", args))

    def flag_cancel(self, job_id: str, *, attempt: int | None = None) -> bool:
        which = "" if attempt is None else str(int(attempt))
        return bool(self._run("flag_cancel", [job_id, which]))

    def release(
        self,
        job_id: str,
        *,
        attempt: int | None = None,
        fence: str | None = None,
        ring: bool = False,
        announce: bool = False,
        outcome: str | None = None,
        ring_if_runnable: bool = False,
    ) -> bool:
        which = "" if attempt is None else str(int(attempt))
        flags = ["1" if ring else "2" if ring_if_runnable else "", "1" if announce else "",
                 outcome or ""]
        return bool(self._run("release", [job_id, which, fence or "", *flags]))

    def reap(
        self, *, now: float | None = None, limit: int = 1000, fence: str | None = None
    ) -> list[Lease]:
        if limit <= 0:
            return []
        raw = self._run("reap", [now_arg(now), limit, fence or ""])
        return [
            Lease(
                job_id=text_of(job), tenant=text_of(tenant), tier=text_of(tier),
                order_key=float(text_of(key)), expires_at=float(text_of(expires_at)),
                attempt=int(attempt), start_by=opt_float_of(start_by),
            )
            for job, tenant, tier, key, expires_at, attempt, start_by in raw
        ]

    def restore_lease(
        self,
        job: IndexedJob,
        *,
        ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
    ) -> bool:
        args = [*job_args(job), score_arg(ttl_s), now_arg(now), fence or ""]
        return bool(self._run("restore_lease", args))

    def inflight(self) -> int:
        return int(self._client.zcard(self._keys.leases))

    def tenant_inflight(self, tenant: str) -> int:
        return int(self._client.zcard(self._keys.tenant_leases(tenant)))

    def inflight_by_tenant(self) -> dict[str, int]:
        leased = [text_of(job) for job in self._client.zrange(self._keys.leases, 0, -1)]
        if not leased:
            return {}
        # A lease released between the reads has no entry left: not counted. A tenant's count
        # is what its cap counts (its lease set): a packed run's items hold one unit of it.
        tenants = sorted({str(json.loads(text_of(meta))[0])
                          for meta in self._client.hmget(self._keys.meta, leased)
                          if meta is not None})
        pipe = self._client.pipeline(transaction=False)
        for tenant in tenants:
            pipe.zcard(self._keys.tenant_leases(tenant))
        return {tenant: int(held) for tenant, held in zip(tenants, pipe.execute(), strict=True)
                if int(held) > 0}

    # -- the worker registry --

    def register_worker(
        self, worker_id: str, *, slots: int, ttl_s: float, now: float | None = None,
        device: str = "cpu", memory_bytes: int | None = None,
        kinds: Iterable[str] | None = None,
    ) -> None:
        self._register_worker(
            keys=[*self._keys.worker_keys(), self._keys.shared_kinds, self._keys.routed],
            args=[worker_id, int(slots), score_arg(ttl_s), now_arg(now), device,
                  "" if memory_bytes is None else int(memory_bytes), kinds_arg(kinds)],
        )

    def unregister_worker(self, worker_id: str) -> None:
        workers, slot_hash = self._keys.worker_keys()
        pipe = self._client.pipeline(transaction=True)
        pipe.zrem(workers, worker_id)
        pipe.hdel(slot_hash, worker_id, worker_id + DEVICE_SUFFIX, worker_id + MEMORY_SUFFIX,
                  worker_id + KINDS_SUFFIX)
        pipe.execute()

    def live_workers(self, *, now: float | None = None) -> list[LiveWorker]:
        rows = self._live_workers(keys=self._keys.worker_keys(), args=[now_arg(now)])
        return sorted(
            (LiveWorker(worker_id=text_of(worker), slots=int(slots), device=text_of(device),
                        expires_at=float(text_of(expires_at)),
                        memory_bytes=int(memory) if text_of(memory) else None,
                        kinds=kinds_of(text_of(kinds)))
             for worker, slots, device, expires_at, memory, kinds in rows),
            key=lambda worker: worker.worker_id,
        )

    def work(self) -> Work:
        pipe = self._client.pipeline(transaction=False)
        pipe.hgetall(self._keys.arrivals)
        pipe.hgetall(self._keys.kind_means)
        arrivals, kinds = pipe.execute()
        return Work.parse({text_of(k): text_of(v) for k, v in arrivals.items()},
                          {text_of(k): text_of(v) for k, v in kinds.items()})

    def pool_capacity(self, *, now: float | None = None) -> int:
        return int(self._pool_capacity(keys=self._keys.worker_keys(), args=[now_arg(now)]))
