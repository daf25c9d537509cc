"""One contract for the token bucket: the Lua script in Redis and the in-memory twin decide the
same sequences the same way."""

from __future__ import annotations

import threading

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.index.keys import IndexKeys
from jobs.index.rate_limit import MemoryRateLimiter, RateDecision, RateLimiter

pytestmark = pytest.mark.integration

Limiter = RateLimiter | MemoryRateLimiter


@pytest.fixture(params=["memory", "redis"])
def limiter(request: pytest.FixtureRequest) -> Limiter:
    if request.param == "memory":
        return MemoryRateLimiter()
    client: redis.Redis = request.getfixturevalue("redis_client")
    return RateLimiter(client, request.getfixturevalue("key_prefix"))


def test_a_burst_then_one_token_per_interval(limiter: Limiter) -> None:
    taken = [limiter.take("acme", rate_per_s=2, burst=3, now=1000.0) for _ in range(4)]
    assert [d.allowed for d in taken] == [True, True, True, False]
    assert [d.tokens_left for d in taken] == [2, 1, 0, 0]
    assert taken[3].retry_after_s == pytest.approx(0.5)
    assert limiter.take("acme", rate_per_s=2, burst=3, now=1000.25).retry_after_s == (
        pytest.approx(0.25))
    assert limiter.take("acme", rate_per_s=2, burst=3, now=1000.5).allowed
    assert limiter.take("other", rate_per_s=2, burst=3, now=1000.5).allowed


def test_a_lowered_burst_caps_the_tokens_at_once(limiter: Limiter) -> None:
    assert limiter.take("acme", rate_per_s=1, burst=10, now=0.0).tokens_left == 9
    assert limiter.take("acme", rate_per_s=1, burst=2, now=0.0).tokens_left == 1


def test_a_clock_behind_adds_nothing_and_moves_nothing_back(limiter: Limiter) -> None:
    assert limiter.take("acme", rate_per_s=1, burst=1, now=50.0).allowed
    behind = limiter.take("acme", rate_per_s=1, burst=1, now=40.0)
    assert not behind.allowed and behind.retry_after_s == pytest.approx(1.0)
    assert limiter.take("acme", rate_per_s=1, burst=1, now=51.0).allowed


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rate=st.sampled_from([0.25, 0.5, 1.0, 2.0, 10.0]),
    burst=st.integers(1, 5),
    gaps=st.lists(st.sampled_from([0.0, 0.05, 0.125, 0.5, 1.0, 3.0]), min_size=1, max_size=25),
)
def test_redis_and_the_twin_agree(
    redis_client: redis.Redis, key_prefix: str, rate: float, burst: int, gaps: list[float]
) -> None:
    real, twin = RateLimiter(redis_client, key_prefix), MemoryRateLimiter()
    redis_client.delete(IndexKeys(key_prefix).rate_bucket("t"))
    now = 1_700_000_000.0
    for gap in gaps:
        now += gap
        got: RateDecision = real.take("t", rate_per_s=rate, burst=burst, now=now)
        want = twin.take("t", rate_per_s=rate, burst=burst, now=now)
        assert got.allowed == want.allowed
        assert got.retry_after_s == pytest.approx(want.retry_after_s, abs=1e-6)
        assert got.tokens_left == pytest.approx(want.tokens_left, abs=1e-6)


def test_concurrent_takes_never_hand_out_more_than_the_bucket_holds(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    limiter = RateLimiter(redis_client, key_prefix)
    allowed: list[bool] = []

    def take() -> None:
        for _ in range(10):
            allowed.append(limiter.take("t", rate_per_s=1e-3, burst=7, now=5000.0).allowed)

    threads = [threading.Thread(target=take) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert allowed.count(True) == 7


def test_the_bucket_key_expires_once_it_would_be_full_again(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    RateLimiter(redis_client, key_prefix).take("t", rate_per_s=2, burst=4, now=10.0)
    ttl_ms = redis_client.pttl(IndexKeys(key_prefix).rate_bucket("t"))
    # One token short of full at 2/s: 0.5 s, plus a second's margin.
    assert 0 < ttl_ms <= 1500
