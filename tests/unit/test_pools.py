"""Pools: which pool runs a kind, the scope of one pool's SQL reads, and their configuration."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.core.errors import ConfigError
from jobs.core.pools import DEFAULT_POOL, KindScope, Pools, PoolSpec, pool_prefix
from jobs.process.settings import load_settings
from workers.broker import broker_names
from workers.main import pool_and_celery_pool

KINDS = st.sampled_from(["echo", "sleep", "document.embed", "eval.similarity", "a", "b", "c"])


def _pools(assignment: dict[str, str]) -> Pools:
    by_pool: dict[str, set[str]] = {}
    for kind, pool in assignment.items():
        by_pool.setdefault(pool, set()).add(kind)
    return Pools({name: PoolSpec(name=name, kinds=frozenset(kinds))
                  for name, kinds in by_pool.items()})


@given(st.dictionaries(KINDS, st.sampled_from(["gpu", "cpu", "big-gpu"])), KINDS)
def test_every_kind_is_in_exactly_one_pool_and_its_scope_covers_it_alone(
    assignment: dict[str, str], kind: str
) -> None:
    pools = _pools(assignment)
    owner = pools.pool_of(kind)
    assert owner == assignment.get(kind, DEFAULT_POOL)
    covering = [name for name in pools.names if pools.scope(name).covers(kind)]
    assert covering == [owner]


def test_one_pool_has_no_scope_and_keeps_the_root_prefix() -> None:
    pools = Pools()
    assert pools.names == (DEFAULT_POOL,)
    assert not pools.pooled
    assert pools.scope(DEFAULT_POOL).everything
    assert pool_prefix("{tierq}:", DEFAULT_POOL) == "{tierq}:"
    assert pool_prefix("{tierq}:", "gpu") == "{tierq}:pool:gpu:"  # the same hash tag


def test_a_kind_in_two_pools_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="'echo' is in both 'a' and 'b'"):
        Pools({"a": PoolSpec(name="a", kinds=frozenset({"echo"})),
               "b": PoolSpec(name="b", kinds=frozenset({"echo"}))})


@pytest.mark.parametrize(("name", "why"), [
    ("GPU", "lower-case"), ("gpu pool", "lower-case"), ("prefork", "Celery execution pool"),
])
def test_a_pool_name_that_cannot_be_a_key_or_names_a_celery_pool_is_refused(
    name: str, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        Pools({name: PoolSpec(name=name, kinds=frozenset({"echo"}))})


def test_the_default_pool_lists_no_kinds() -> None:
    with pytest.raises(ValueError, match="takes every kind no other pool names"):
        Pools({"default": PoolSpec(name="default", kinds=frozenset({"echo"}))})


def test_the_kinds_a_worker_runs_are_its_pools_among_its_handlers() -> None:
    pools = _pools({"document.embed": "gpu", "eval.similarity": "gpu"})
    known = ["echo", "sleep", "document.embed", "eval.similarity"]
    assert pools.kinds_of("gpu", known) == ["document.embed", "eval.similarity"]
    assert pools.kinds_of(DEFAULT_POOL, known) == ["echo", "sleep"]
    assert pools.scope(DEFAULT_POOL) == KindScope(exclude=frozenset(
        {"document.embed", "eval.similarity"}))


def test_settings_read_pools_and_give_each_its_own_figures(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path) -> None:
    config = tmp_path / "tierq.toml"
    config.write_text('[policy]\nmean_service_s = 2.0\n'
                      '[pools.gpu]\nkinds = ["document.embed"]\nconcurrency = 4\n'
                      'mean_service_s = 30.0\n')
    monkeypatch.setenv("TIERQ_CONFIG", str(config))
    settings = load_settings()
    assert settings.pool_set().names == ("default", "gpu")
    gpu, default = settings.pool_policy("gpu"), settings.pool_policy("default")
    assert (gpu.pool_concurrency, gpu.mean_service_s) == (4, 30.0)
    assert (default.pool_concurrency, default.mean_service_s) == (None, 2.0)
    assert settings.pool_prefix("gpu") == "{tierq}:pool:gpu:"
    joined = load_settings(pool="gpu")
    assert joined.pool_prefix() == "{tierq}:pool:gpu:"


def test_settings_refuse_a_worker_pool_not_configured() -> None:
    with pytest.raises(ConfigError, match="no pool 'gpu' is configured; configured: default"):
        load_settings(pool="gpu")


def test_the_default_pools_queues_keep_their_names_and_another_pools_carry_its_own() -> None:
    redis_names = broker_names("redis://x", "{tierq}:", "gpu")
    assert redis_names.queue("free") == "pool.gpu.tier.free"
    assert broker_names("redis://x", "{tierq}:").queue("free") == "tier.free"
    amqp = broker_names("amqp://x", "{tierq}:", "gpu")
    assert amqp.queue("premium") == "tierq.pool.gpu.tier.premium"


@pytest.mark.parametrize(("pool", "celery_pool", "expected"), [
    (None, None, (None, "threads")),
    ("gpu", None, ("gpu", "threads")),
    ("gpu", "prefork", ("gpu", "prefork")),
    ("prefork", None, (None, "prefork")),  # the older spelling of --celery-pool
    (None, "solo", (None, "solo")),
])
def test_pool_names_the_tierq_pool_and_celery_pool_celerys(
    pool: str | None, celery_pool: str | None, expected: tuple[str | None, str]
) -> None:
    assert pool_and_celery_pool(pool, celery_pool) == expected


def test_up_starts_a_worker_per_pool_it_is_given() -> None:
    from jobs.local.up import UpOptions, app_children

    children = app_children(UpOptions(concurrency=3, pools=("default", "gpu")), {})
    workers = {child.name: child.argv[child.argv.index("worker"):] for child in children
               if "worker" in child.argv}
    assert workers == {
        "worker": ["worker", "--concurrency", "3", "--pool", "default"],
        "worker-gpu": ["worker", "--concurrency", "3", "--pool", "gpu"],
    }
