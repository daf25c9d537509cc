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
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script

from jobs.core import policy
from jobs.core.histograms import StartFigures
from jobs.index.base import (
    REFUSALS_KEEP_S,
    Admission,
    AdmissionTerms,
    Admitted,
    Entry,
    IndexedJob,
    Lease,
    LiveWorker,
    NotLeader,
    Renewal,
    TierDepth,
    refusal_minute,
)
from jobs.index.keys import PROMOTE_LIMIT, IndexKeys

_SCRIPTS = (
    "admit", "admit_new", "requeue", "dispatch", "release", "renew", "cancel", "reap",
    "expire_due", "set_caps", "restore_lease", "flag_cancel",
)
# The Lua prepended to an index script after common.lua: the steps it shares with others.
_PRELUDES: dict[str, tuple[str, ...]] = {
    "admit": ("admit_job",),
    "admit_new": ("token_bucket", "workers", "admit_job"),
}
_LEADERSHIP = ("lead", "renew_lead", "resign")
# A worker's device is kept beside its slots, under its id and this suffix (workers.lua).
DEVICE_SUFFIX = "#device"
# Jobs per requeue script call when loading many (keeps each call short).
REQUEUE_CHUNK = 5000


def _lua(name: str, *preludes: str) -> str:
    """A script's source: ``preludes`` (other files' functions), then its own."""
    return "\n".join(
        (resources.files("jobs.index") / "lua" / f"{part}.lua").read_text(encoding="utf-8")
        for part in (*preludes, name)
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _score(value: float) -> str:
    number = float(value)
    if math.isnan(number):
        raise ValueError("a score must be a number, not NaN")
    return repr(number)


def _opt_score(value: float | None) -> str:
    return "" if value is None else _score(value)


def _opt_int(value: int | None) -> str:
    return "" if value is None else str(int(value))


def _now(value: float | None) -> str:
    """A ``now`` for a script: '' lets the script read Redis's clock."""
    return "" if value is None else _score(value)


def _opt_float(value: Any) -> float | None:
    text = _text(value)
    return None if text == "" else float(text)


def _job_args(job: IndexedJob) -> list[str]:
    return [
        job.job_id, job.tenant, job.tier, _score(job.order_key),
        _opt_score(job.start_by), _opt_score(job.not_before), str(int(job.attempt)),
    ]


def _meta_attempt(meta: list[Any]) -> int:
    """The attempt of a ``meta`` entry (entries written before attempts were kept: 1)."""
    return int(meta[5]) if len(meta) > 5 else 1


def _ttl_ms(ttl_s: float) -> int:
    return max(1, round(ttl_s * 1000))


def _check_caps(caps: Mapping[str, int], what: str) -> None:
    for name, cap in caps.items():
        if cap < 1:
            raise ValueError(f"{what} cap for {name!r} must be at least 1, got {cap}")


class RedisIndex:
    """``DispatchIndex`` on Redis. ``prefix`` must carry one hash tag, e.g. ``{tierq}:``."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._client = client
        self._keys = IndexKeys(prefix)
        self._fenced = self._keys.fenced()
        self._scripts: dict[str, Script] = {
            name: client.register_script(_lua(name, "common", *_PRELUDES.get(name, ())))
            for name in _SCRIPTS
        }
        self._pool_capacity = client.register_script(_lua("pool_capacity", "workers"))
        self._register_worker = client.register_script(_lua("register_worker"))
        self._live_workers = client.register_script(_lua("live_workers", "workers"))
        self._set_generation = client.register_script(_lua("set_generation"))
        self._leadership = {name: client.register_script(_lua(name)) for name in _LEADERSHIP}

    def _run(self, name: str, args: Sequence[str | int]) -> Any:
        """Run one index script; every one gets the leader lock as KEYS[13], so any may be
        fenced by a token in its ARGV."""
        try:
            return self._scripts[name](keys=self._fenced, args=list(args))
        except redis.ResponseError as exc:
            if str(exc).startswith("NOTLEADER"):
                raise NotLeader(f"{name} refused: {exc}") from None
            raise

    def admit(
        self,
        job: IndexedJob,
        *,
        bound: int,
        tenant_quota: int | None = None,
        max_position: int | None = None,
    ) -> Admitted:
        quota = "" if tenant_quota is None else str(tenant_quota)
        ahead = "" if max_position is None else str(max_position)
        raw = self._run("admit", [*_job_args(job)[:6], str(bound), quota, ahead])
        reason = _text(raw[4])
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
            *_job_args(job)[:5], _score(terms.now),
            "" if rate is None else _score(rate.rate_per_s),
            "" if rate is None else str(int(rate.burst)),
            _opt_int(terms.pool_concurrency), _score(terms.mean_service_s),
            str(int(terms.service_samples_min)),
            _score(policy.useful_wait_s(tier, terms.client_timeout_s)),
            _score(queued_share), _score(tier.tenant_share),
            _opt_int(terms.tenant_cap), _opt_int(terms.tenant_quota),
            _opt_score(terms.max_wait_s), str(REFUSALS_KEEP_S),
        ]
        keys = [*self._fenced, *self._keys.worker_keys(), self._keys.service_mean,
                self._keys.rate_bucket(job.tenant),
                self._keys.refusals(refusal_minute(terms.now))]
        raw = self._scripts["admit_new"](keys=keys, args=args)
        mean, samples = _text(raw[9]), _text(raw[10])
        return Admission(
            accepted=bool(raw[0]),
            reason=_text(raw[1]) or None,
            tier_queued=int(raw[2]),
            tenant_queued=int(raw[3]),
            position=int(raw[4]),
            duplicate=bool(raw[5]),
            tenant_inflight=int(raw[6]),
            capacity=int(raw[7]),
            inflight=int(raw[8]),
            measured=None if mean == "" else (float(mean), int(samples)),
            next_token_s=float(_text(raw[11])),
            bound=int(raw[12]),
            quota=int(raw[13]),
            max_position=None if _text(raw[14]) == "" else int(raw[14]),
        )

    def refusal_counts(self, minutes: Sequence[int]) -> dict[tuple[str, str, str], int]:
        pipe = self._client.pipeline(transaction=False)
        for minute in minutes:
            pipe.hgetall(self._keys.refusals(minute))
        counts: dict[tuple[str, str, str], int] = {}
        for bucket in pipe.execute() if minutes else []:
            for raw, value in bucket.items():
                scope, name, reason = (str(part) for part in json.loads(_text(raw)))
                key = (scope, name, reason)
                counts[key] = counts.get(key, 0) + int(value)
        return counts

    def requeue(self, job: IndexedJob, *, fence: str | None = None) -> None:
        self._run("requeue", [fence or "", *_job_args(job)])

    def requeue_many(self, jobs: Iterable[IndexedJob], *, fence: str | None = None) -> int:
        """``requeue`` each job, in chunks of ``REQUEUE_CHUNK`` per script call (rebuilds,
        bulk loads). Each chunk is atomic and fenced; the whole is not. Returns the number
        indexed."""
        count, chunk = 0, []
        for job in jobs:
            chunk.extend(_job_args(job))
            if len(chunk) >= 7 * REQUEUE_CHUNK:
                count += int(self._run("requeue", [fence or "", *chunk]))
                chunk = []
        if chunk:
            count += int(self._run("requeue", [fence or "", *chunk]))
        return count

    def set_caps(
        self,
        tier_caps: Mapping[str, int],
        tenant_caps: Mapping[str, int] | None = None,
        *,
        fence: str | None = None,
    ) -> None:
        """Merge ``tier_caps`` into the tier caps; replace all tenant overrides with
        ``tenant_caps`` (``None``: clear them). Blocked tenants now under their cap become
        runnable; runnable tenants over a lowered cap are blocked by the next dispatch."""
        overrides = tenant_caps or {}
        _check_caps(tier_caps, "tier")
        _check_caps(overrides, "tenant")
        args: list[str | int] = [fence or "", len(tier_caps)]
        for caps in (tier_caps, overrides):
            for name, cap in caps.items():
                args += [name, int(cap)]
        self._run("set_caps", args)

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
        raw = self._run("dispatch", [
            n, _now(now), _score(lease_ttl_s), PROMOTE_LIMIT, fence or "",
            "" if capacity is None else int(capacity),
        ])
        return [
            Lease(
                job_id=_text(job), tenant=_text(tenant), tier=_text(tier),
                order_key=float(_text(key)), attempt=int(attempt),
                expires_at=float(_text(expires_at)),
            )
            for job, tenant, tier, key, attempt, expires_at in raw
        ]

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
    ) -> Renewal:
        figures = [] if start is None else start.script_args()
        answer = self._run("renew", [job_id, int(attempt), _score(ttl_s), _now(now),
                                     "1" if announce else "", *figures])
        return Renewal(int(answer))

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
    ) -> bool:
        which = "" if attempt is None else str(int(attempt))
        flags = ["1" if ring else "", "1" if announce else "", outcome or ""]
        return bool(self._run("release", [job_id, which, fence or "", *flags]))

    def cancel(self, job_id: str, *, fence: str | None = None) -> bool:
        return bool(self._run("cancel", [job_id, fence or ""]))

    def reap(
        self, *, now: float | None = None, limit: int = 1000, fence: str | None = None
    ) -> list[Lease]:
        if limit <= 0:
            return []
        raw = self._run("reap", [_now(now), limit, fence or ""])
        return [
            Lease(
                job_id=_text(job), tenant=_text(tenant), tier=_text(tier),
                order_key=float(_text(key)), expires_at=float(_text(expires_at)),
                attempt=int(attempt),
            )
            for job, tenant, tier, key, expires_at, attempt in raw
        ]

    def expire_due(
        self, *, now: float | None = None, limit: int = 1000, fence: str | None = None
    ) -> list[IndexedJob]:
        if limit <= 0:
            return []
        raw = self._run("expire_due", [_now(now), limit, fence or ""])
        return [
            IndexedJob(
                job_id=_text(job), tenant=_text(tenant), tier=_text(tier),
                order_key=float(_text(key)), start_by=_opt_float(start_by),
                not_before=_opt_float(not_before), attempt=int(attempt),
            )
            for job, tenant, tier, key, start_by, not_before, attempt in raw
        ]

    def restore_lease(
        self,
        job: IndexedJob,
        *,
        ttl_s: float,
        now: float | None = None,
        fence: str | None = None,
    ) -> bool:
        args = [*_job_args(job), _score(ttl_s), _now(now), fence or ""]
        return bool(self._run("restore_lease", args))

    def job_ids(self) -> Iterator[str]:
        keys = self._keys
        for zset in (keys.queued, keys.delayed, keys.leases):
            for member, _ in self._client.zscan_iter(zset, count=1000):
                yield _text(member)

    def scan_entries(self, cursor: int, count: int) -> tuple[int, list[Entry]]:
        next_cursor, found = self._client.hscan(self._keys.meta, cursor, count=count)
        pairs: dict[Any, Any] = dict(found) if isinstance(found, dict) else {}
        metas = [(_text(job), json.loads(_text(raw))) for job, raw in pairs.items()]
        pipe = self._client.pipeline(transaction=False)
        for job_id, _ in metas:
            pipe.zscore(self._keys.leases, job_id)
        leased = pipe.execute() if metas else []
        entries = [
            Entry(job_id=job_id, attempt=_meta_attempt(meta), leased=lease is not None)
            for (job_id, meta), lease in zip(metas, leased, strict=True)
        ]
        return int(next_cursor), entries

    def entries_of(self, job_ids: Sequence[str]) -> dict[str, Entry]:
        if not job_ids:
            return {}
        pipe = self._client.pipeline(transaction=True)
        for job_id in job_ids:
            pipe.zscore(self._keys.leases, job_id)
            pipe.hget(self._keys.meta, job_id)
        replies = pipe.execute()
        found: dict[str, Entry] = {}
        for i, job_id in enumerate(job_ids):
            lease, meta = replies[2 * i], replies[2 * i + 1]
            if meta is not None:
                attempt = _meta_attempt(json.loads(_text(meta)))
                found[job_id] = Entry(job_id=job_id, attempt=attempt, leased=lease is not None)
        return found

    def now(self) -> float:
        seconds, micros = self._client.time()
        return int(seconds) + int(micros) / 1_000_000

    def position(self, job_id: str) -> int | None:
        rank: Any = self._client.zrank(self._keys.queued, job_id)
        return None if rank is None else int(rank)

    def position_at(self, order_key: float) -> int:
        return int(self._client.zcount(self._keys.queued, "-inf", _score(order_key)))

    def tier_depths(self, tiers: Sequence[str]) -> dict[str, TierDepth]:
        pipe = self._client.pipeline(transaction=True)
        for tier in tiers:
            pipe.zcard(self._keys.tier(tier))
            pipe.zrange(self._keys.tier(tier), 0, 0, withscores=True)
        replies = pipe.execute()
        depths: dict[str, TierDepth] = {}
        for i, tier in enumerate(tiers):
            count, head = replies[2 * i], replies[2 * i + 1]
            oldest = float(head[0][1]) if head else None
            depths[tier] = TierDepth(queued=int(count), oldest_order_key=oldest)
        return depths

    def register_worker(
        self, worker_id: str, *, slots: int, ttl_s: float, now: float | None = None,
        device: str = "cpu",
    ) -> None:
        self._register_worker(
            keys=self._keys.worker_keys(),
            args=[worker_id, int(slots), _score(ttl_s), _now(now), device],
        )

    def unregister_worker(self, worker_id: str) -> None:
        workers, slot_hash = self._keys.worker_keys()
        pipe = self._client.pipeline(transaction=True)
        pipe.zrem(workers, worker_id)
        pipe.hdel(slot_hash, worker_id, worker_id + DEVICE_SUFFIX)
        pipe.execute()

    def live_workers(self, *, now: float | None = None) -> list[LiveWorker]:
        rows = self._live_workers(keys=self._keys.worker_keys(), args=[_now(now)])
        return sorted(
            (LiveWorker(worker_id=_text(worker), slots=int(slots), device=_text(device),
                        expires_at=float(_text(expires_at)))
             for worker, slots, device, expires_at in rows),
            key=lambda worker: worker.worker_id,
        )

    def pool_capacity(self, *, now: float | None = None) -> int:
        return int(self._pool_capacity(keys=self._keys.worker_keys(), args=[_now(now)]))

    def inflight(self) -> int:
        return int(self._client.zcard(self._keys.leases))

    def tenant_inflight(self, tenant: str) -> int:
        return int(self._client.zcard(self._keys.tenant_leases(tenant)))

    def inflight_by_tenant(self) -> dict[str, int]:
        leased = [_text(job) for job in self._client.zrange(self._keys.leases, 0, -1)]
        if not leased:
            return {}
        counts: dict[str, int] = {}
        # A lease released between the two reads has no entry left: not counted.
        for meta in self._client.hmget(self._keys.meta, leased):
            if meta is not None:
                tenant = str(json.loads(_text(meta))[0])
                counts[tenant] = counts.get(tenant, 0) + 1
        return counts

    def tenant_queued(self, tenant: str) -> int:
        pipe = self._client.pipeline(transaction=True)
        pipe.zcard(self._keys.tenant_queue(tenant))
        pipe.hget(self._keys.tenant_delayed, tenant)
        queued, delayed = pipe.execute()
        return int(queued) + int(delayed or 0)

    def clear(self) -> None:
        """Delete every key under the prefix (SCAN + UNLINK in batches: not a hot path).
        The Celery broker's queues share the prefix (kombu's ``global_keyprefix``) and go
        too: never call this while the system runs."""
        batch: list[Any] = []
        for key in self._client.scan_iter(match=self._keys.glob(), count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                self._client.unlink(*batch)
                batch = []
        if batch:
            self._client.unlink(*batch)

    # -- leadership and the rebuild sentinel --

    def acquire_leadership(self, owner: str, *, ttl_s: float, now: float) -> str | None:
        token = self._leadership["lead"](
            keys=self._keys.leader_keys(), args=[owner, _ttl_ms(ttl_s)]
        )
        return None if not token else _text(token)

    def renew_leadership(self, token: str, *, ttl_s: float, now: float) -> bool:
        return bool(
            self._leadership["renew_lead"](
                keys=self._keys.leader_keys(), args=[token, _ttl_ms(ttl_s)]
            )
        )

    def resign_leadership(self, token: str, *, now: float) -> bool:
        return bool(self._leadership["resign"](keys=self._keys.leader_keys(), args=[token]))

    def leader(self, *, now: float) -> str | None:
        value = self._client.get(self._keys.leader)
        return None if value is None else _text(value)

    def generation(self) -> str | None:
        value = self._client.get(self._keys.generation)
        return None if value is None else _text(value)

    def mark_generation(self, value: str) -> bool:
        return bool(self._client.set(self._keys.generation, value, nx=True))

    def set_generation(self, value: str, *, fence: str | None = None) -> None:
        keys = [self._keys.generation, self._keys.leader]
        if not self._set_generation(keys=keys, args=[value, fence or ""]):
            raise NotLeader("set_generation refused: the fencing token is not the leader's")
