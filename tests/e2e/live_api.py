"""One ``tierq api`` process of its own (SQLite file, Redis key prefix) for a test module."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from jobs.store.migrate import upgrade
from tests.e2e.harness import System, running, system_env
from tests.services import RedisServer, delete_prefixed


@contextlib.contextmanager
def live_api(workdir: Path, redis_server: RedisServer, config: str = "") -> Iterator[System]:
    """The API alone (no dispatcher, no worker) on a migrated SQLite file in ``workdir``,
    with ``config`` as its TOML file; its Redis keys are deleted afterwards."""
    database_url = f"sqlite:///{workdir / 'tierq.db'}"
    upgrade(database_url)
    (workdir / "tierq.toml").write_text(config)
    prefix = f"{{tierq-test-{uuid.uuid4().hex[:12]}}}:"
    env = system_env(database_url=database_url, redis_url=redis_server.url, key_prefix=prefix,
                     extra={"TIERQ_CONFIG": str(workdir / "tierq.toml")})
    client = redis_server.client()
    try:
        with running(System(env=env, workdir=workdir)) as system:
            system.start_api()
            yield system
    finally:
        delete_prefixed(client, prefix)
        client.close()
