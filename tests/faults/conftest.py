"""Fixtures of the fault tests: servers of their own, and a tierq system on them.

- ``fault_pg``: a throwaway PostgreSQL (started), stopped and removed afterwards;
- ``fault_redis``: a throwaway Redis (started, no persistence), likewise;
- ``fault_system``: a factory of ``tests.e2e.harness.System`` whose processes use those two
  servers, a short lease TTL, and the test handlers (``crash``, ``tracked``, ...). Every
  system it built is stopped afterwards; on failure, its processes' logs are printed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobs.store.migrate import upgrade
from tests.e2e.harness import System, system_env
from tests.faults.handlers import RUN_LOG_ENV
from tests.faults.servers import ThrowawayPostgres, ThrowawayRedis

ROOT = Path(__file__).resolve().parents[2]
LEASE_TTL_S = 2.0
HANDLERS = "tests.handlers_for_tests:HANDLERS,tests.faults.handlers:HANDLERS"
BASE_CONFIG = """
[policy]
lease_ttl_s = {lease_ttl_s}
mean_service_s = 0.5
"""

SystemFactory = Callable[..., System]


@pytest.fixture
def fault_pg() -> Iterator[ThrowawayPostgres]:
    server = ThrowawayPostgres()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def fault_redis() -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def run_log(tmp_path: Path) -> Path:
    """The ``tracked`` handler's trace file (see ``tests.faults.handlers``)."""
    return tmp_path / "runs.log"


@pytest.fixture
def fault_system(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    fault_pg: ThrowawayPostgres,
    fault_redis: ThrowawayRedis,
    run_log: Path,
) -> Iterator[SystemFactory]:
    """``fault_system(config="", redis=None, lease_ttl_s=LEASE_TTL_S)``: a migrated database
    on ``fault_pg``, the given Redis (default: the ``fault_redis`` fixture), and
    ``BASE_CONFIG`` plus ``config`` (TOML appended to it) in ``TIERQ_CONFIG``. Start its
    processes with ``System.start*``."""
    built: list[System] = []

    def build(
        config: str = "", redis: ThrowawayRedis | None = None, lease_ttl_s: float = LEASE_TTL_S
    ) -> System:
        server = redis if redis is not None else fault_redis
        database_url = fault_pg.create_database()
        upgrade(database_url)
        workdir = tmp_path / f"system-{len(built)}"
        workdir.mkdir()
        config_file = workdir / "tierq.toml"
        config_file.write_text(BASE_CONFIG.format(lease_ttl_s=lease_ttl_s) + config)
        env = system_env(
            database_url=database_url,
            redis_url=server.url,
            key_prefix="{tierq}:",
            extra={
                "TIERQ_CONFIG": str(config_file),
                "TIERQ_HANDLERS": HANDLERS,
                RUN_LOG_ENV: str(run_log),
                "PYTHONPATH": str(ROOT),
            },
        )
        system = System(env=env, workdir=workdir)
        built.append(system)
        return system

    yield build
    failed = getattr(request.node, "rep_call", None)
    for system in built:
        if failed is not None and failed.failed:
            sys.stderr.write(system.logs())
        system.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the test item, so fixtures can tell a failed test."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
