"""A worker's registration with no worker process behind it: the live slots a test's
dispatcher fills, for tests that play the workers' part by hand. No lease is taken into
slots that are not there (``dispatch`` cuts a configured capacity to the live workers'), so a
test that dispatches on a configured ``pool_concurrency`` registers these first."""

from __future__ import annotations

import pytest

from jobs.index.base import DispatchIndex
from jobs.process.runtime import Runtime

STAND_IN = "stand-in@tests"
# Live on Redis's clock and on every virtual clock the tests drive (an epoch near now).
LIVE_S = 1e9


def register_stand_in(index: DispatchIndex, slots: int = 1000) -> None:
    """Live slots, more than any configured capacity of the tests: the capacity decides."""
    index.register_worker(STAND_IN, slots=slots, ttl_s=LIVE_S)


def register_stand_ins(runtime: Runtime) -> None:
    """A stand-in in each pool of ``runtime`` whose capacity is configured (a pool sized by
    its live workers keeps the ones its test registers)."""
    for pool in runtime.every_pool():
        if pool.policy.pool_concurrency:
            register_stand_in(pool.index)


def stand_ins_for(request: pytest.FixtureRequest) -> None:
    """For an autouse fixture: stand-ins in the pools of the test's ``runtime`` or API
    ``client``, whichever it uses."""
    for name in ("runtime", "client"):
        if name in request.fixturenames:
            found = request.getfixturevalue(name)
            register_stand_ins(found if isinstance(found, Runtime) else found.runtime)
