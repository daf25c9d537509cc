"""Every example of docs/client.md runs as it is against a running system."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.e2e.harness import System, started_system
from tests.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "client.md").read_text(),
                      re.DOTALL)


@pytest.fixture
def system(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys (Celery's too) afterwards
) -> Iterator[System]:
    with started_system(tmp_path, config="[policy]\nmean_service_s = 0.5\n", concurrency=4,
                        database_url=pg_url, redis_url=redis_server.url,
                        key_prefix=key_prefix) as running:
        yield running


def test_the_doc_has_its_examples() -> None:
    assert len(EXAMPLES) >= 6


def test_every_example_of_the_client_doc_runs(system: System) -> None:
    client = system.tenant("lab", "standard")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    env.update(TIERQ_API_URL=system.url,
               TIERQ_API_KEY=client.headers["Authorization"].removeprefix("Bearer "))
    for number, code in enumerate(EXAMPLES, 1):
        ran = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=120, check=False)
        assert ran.returncode == 0, f"example {number}:\n{code}\n{ran.stdout}\n{ran.stderr}"
        assert ran.stdout.strip(), f"example {number} printed nothing"
