"""What every part of ``RedisIndex`` shares: its registered Lua scripts, the fenced call that
runs them, and the codec of their arguments and replies (scores as ``repr(float)``, so they
round-trip exactly).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import redis

from jobs.index.base import NotLeader
from jobs.index.keys import IndexKeys
from jobs.index.lean_script import LeanScript
from jobs.index.values import IndexedJob, Lease

_SCRIPTS = (
    "admit", "admit_new", "requeue", "dispatch", "release", "renew", "cancel", "reap",
    "expire_due", "set_caps", "restore_lease", "flag_cancel", "hand_over",
    "put_back", "offer", "runnable_ahead", "position", "position_at", "upgrade_layout",
    "entries", "route_kinds", "fill_run",
    "renew_many", "release_many",
)
# The Lua prepended to an index script after common.lua: the steps it shares with others.
_PRELUDES: dict[str, tuple[str, ...]] = {
    "admit": ("admit_job",),
    "admit_new": ("token_bucket", "workers", "admit_job"),
    "dispatch": ("workers",),
    "hand_over": ("workers", "push"),
    "offer": ("workers", "push"),
    "renew": ("workers",),
    "route_kinds": ("workers",),
}
_LEADERSHIP = ("lead", "renew_lead", "resign")


def _lua(name: str, *preludes: str) -> str:
    """A script's source: ``preludes`` (other files' functions), then its own."""
    return "\n".join(
        (resources.files("jobs.index") / "lua" / f"{part}.lua").read_text(encoding="utf-8")
        for part in (*preludes, name)
    )


def text_of(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def score_arg(value: float) -> str:
    number = float(value)
    if math.isnan(number):
        raise ValueError("a score must be a number, not NaN")
    return repr(number)


def opt_score_arg(value: float | None) -> str:
    return "" if value is None else score_arg(value)


def opt_int_arg(value: int | None) -> str:
    return "" if value is None else str(int(value))


def now_arg(value: float | None) -> str:
    """A ``now`` for a script: '' lets the script read Redis's clock."""
    return "" if value is None else score_arg(value)


def opt_float_of(value: Any) -> float | None:
    text = text_of(value)
    return None if text == "" else float(text)


def lease_of(raw: Sequence[Any]) -> Lease:
    """A lease as dispatch.lua and hand_over.lua return it."""
    job, tenant, tier, key, attempt, expires_at, start_by = raw
    return Lease(
        job_id=text_of(job), tenant=text_of(tenant), tier=text_of(tier),
        order_key=float(text_of(key)), attempt=int(attempt),
        expires_at=float(text_of(expires_at)), start_by=opt_float_of(start_by),
    )


def job_args(job: IndexedJob) -> list[str]:
    return [
        job.job_id, job.tenant, job.tier, score_arg(job.order_key),
        opt_score_arg(job.start_by), opt_score_arg(job.not_before), str(int(job.attempt)),
    ]


def meta_attempt(meta: list[Any]) -> int:
    """The attempt of a ``meta`` entry (entries written before attempts were kept: 1)."""
    return int(meta[5]) if len(meta) > 5 else 1


def ttl_ms(ttl_s: float) -> int:
    return max(1, round(ttl_s * 1000))


def check_caps(caps: Mapping[str, int], what: str) -> None:
    for name, cap in caps.items():
        if cap < 1:
            raise ValueError(f"{what} cap for {name!r} must be at least 1, got {cap}")


class RedisScripts:
    """The client, the keys and the scripts the parts of ``RedisIndex`` run."""

    def __init__(self, client: redis.Redis, prefix: str, *, root: str | None = None) -> None:
        """``prefix``: the pool's keys; ``root``: the deployment's, for the leader lock and
        the rate buckets (``jobs.index.keys``); None: ``prefix`` is the root."""
        self._client = client
        self._keys = IndexKeys(prefix, root)
        self._fenced = self._keys.fenced()
        self._scripts: dict[str, LeanScript] = {
            name: LeanScript(client, _lua(name, "common", *_PRELUDES.get(name, ())),
                             self._fenced)
            for name in _SCRIPTS
        }
        self._pool_capacity = client.register_script(_lua("pool_capacity", "workers"))
        self._register_worker = client.register_script(_lua("register_worker"))
        self._live_workers = client.register_script(_lua("live_workers", "workers"))
        self._set_generation = client.register_script(_lua("set_generation"))
        self._leadership = {name: client.register_script(_lua(name)) for name in _LEADERSHIP}

    def _run(self, name: str, args: Sequence[str | int],
             more_keys: Sequence[str] = ()) -> Any:
        """Run one index script; every one gets the leader lock as KEYS[13], so any may be
        fenced by a token in its ARGV (``more_keys``: its KEYS[14] on)."""
        try:
            return self._scripts[name](keys=[*self._fenced, *more_keys], args=list(args))
        except redis.ResponseError as exc:
            if str(exc).startswith("NOTLEADER"):
                raise NotLeader(f"{name} refused: {exc}") from None
            raise
