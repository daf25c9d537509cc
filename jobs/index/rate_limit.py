"""Per-tenant request rates: a token bucket in Redis, one Lua call per submit.

A tenant's bucket holds up to ``burst`` tokens and gains ``rate_per_s`` tokens a second; a
submit takes one or is refused, and the refusal says when the next token comes. The bucket
lives under the key prefix (``IndexKeys.rate_bucket``), so every API replica draws from the
same one. Time is passed in (``now``, the caller's clock), as everywhere in the index.

``MemoryRateLimiter`` is the in-process twin with the same arithmetic (one contract test
runs both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis

from jobs.index.keys import IndexKeys


@dataclass(frozen=True, kw_only=True)
class RateDecision:
    allowed: bool
    # Seconds until the next token (0 when allowed).
    retry_after_s: float
    tokens_left: float


def _check(rate_per_s: float, burst: int, now: float) -> None:
    if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
        raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s}")
    if burst < 1:
        raise ValueError(f"burst must be at least 1, got {burst}")
    if not math.isfinite(now):
        raise ValueError("now must be a finite number")


def _number(value: Any) -> float:
    return float(value.decode() if isinstance(value, bytes) else value)


class RateLimiter:
    """Token buckets in Redis; ``prefix`` as for the index (one hash tag)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._keys = IndexKeys(prefix)
        lua = resources.files("jobs.index") / "lua"
        source = "\n".join((lua / f"{name}.lua").read_text(encoding="utf-8")
                           for name in ("token_bucket", "rate_limit"))
        self._script = client.register_script(source)

    def take(self, tenant: str, *, rate_per_s: float, burst: int, now: float) -> RateDecision:
        """Take one token from ``tenant``'s bucket if it holds one."""
        _check(rate_per_s, burst, now)
        allowed, wait, left = self._script(
            keys=[self._keys.rate_bucket(tenant)],
            args=[repr(float(rate_per_s)), int(burst), repr(float(now))],
        )
        return RateDecision(
            allowed=bool(allowed), retry_after_s=_number(wait), tokens_left=_number(left)
        )


class MemoryRateLimiter:
    """The twin: the same buckets in a dict (not thread-safe). Redis's key expiry needs no
    counterpart: a key expires only when its bucket would be full again anyway."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, tenant: str, *, rate_per_s: float, burst: int, now: float) -> RateDecision:
        _check(rate_per_s, burst, now)
        tokens, at = self._buckets.get(tenant, (float(burst), now))
        if now > at:
            tokens, at = tokens + (now - at) * rate_per_s, now
        tokens = min(float(burst), tokens)
        if tokens >= 1:
            self._buckets[tenant] = (tokens - 1, at)
            return RateDecision(allowed=True, retry_after_s=0.0, tokens_left=tokens - 1)
        self._buckets[tenant] = (tokens, at)
        return RateDecision(
            allowed=False, retry_after_s=(1 - tokens) / rate_per_s, tokens_left=tokens
        )
