"""A result made within the run-time limit is recorded however slowly it is stored, on a real
worker process whose blob store is slow at a seam the code owns (an fsspec filesystem,
``tests.slow_store``): the limit bounds the handler, not the recording of its outcome. A store
that hangs is given up on at ``result_store_timeout_s``, and the result is kept in the row."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobs.blobs.store import BlobStore
from jobs.core.domain import Tenant
from jobs.core.states import Status
from jobs.process.runtime import Runtime
from tests import slow_store
from tests.integration.worker_procs import (
    Worker,
    finished,
    send,
    wait_for,
    worker_env,
    worker_starter,
)
from tests.services import RedisServer
from workers.publisher import CeleryPublisher

pytestmark = pytest.mark.integration

LIMIT_S = 0.3  # each job's timeout_s: its handler returns at once, well within it
GRACE_S = 1.0  # policy.timeout_grace_s: the overrun would come LIMIT_S + GRACE_S in
STORE_TIMEOUT_S = 2.0  # result_store_timeout_s
SLOW_S = 1.6  # a store slower than the limit and its grace, within its own deadline
BYTES = 4096  # a result larger than result_inline_bytes (1024 here)


@pytest.fixture
def delay_file(tmp_path: Path) -> Path:
    return tmp_path / "store-delay"


@pytest.fixture
def blob_url(tmp_path: Path) -> str:
    return f"slowfile://{tmp_path / 'blobs'}"


@pytest.fixture
def env(pg_url: str, redis_server: RedisServer, key_prefix: str, delay_file: Path,
        blob_url: str) -> dict[str, str]:
    return worker_env(pg_url, redis_server.url, key_prefix,
                      TIERQ_HANDLERS="tests.slow_store:HANDLERS",
                      TIERQ_BLOB_URL=blob_url,
                      TIERQ_RESULT_INLINE_BYTES="1024",
                      TIERQ_RESULT_STORE_TIMEOUT_S=str(STORE_TIMEOUT_S),
                      TIERQ_POLICY__TIMEOUT_GRACE_S=str(GRACE_S),
                      **{slow_store.DELAY_ENV: str(delay_file)})


@pytest.fixture
def start_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with worker_starter(env, tmp_path) as start:
        yield start


def test_a_result_made_in_time_is_recorded_however_slow_its_store(
    runtime: Runtime, publisher: CeleryPublisher, start_worker: Callable[..., Worker],
    tenant: Tenant, delay_file: Path, blob_url: str,
) -> None:
    worker = start_worker(1, "threads")
    wait_for(lambda: runtime.index.pool_capacity(now=time.time()) == 1, worker)

    delay_file.write_text(str(SLOW_S))
    slow = send(runtime, publisher, tenant, "large.result", payload={"bytes": BYTES},
                timeout_s=LIMIT_S)
    stored = wait_for(lambda: finished(runtime, slow.id), worker)
    assert (stored.status, stored.error_type, stored.starts) == (Status.SUCCEEDED, None, 1)
    assert stored.result_blob is not None  # stored after the limit and its grace had passed
    assert json.loads(BlobStore(blob_url).get(stored.result_blob)) == {
        "job": slow.id, "text": "x" * BYTES}
    assert wait_for(lambda: runtime.index.inflight() == 0, worker)

    delay_file.write_text("3600")  # a store that hangs: given up on at its deadline
    hung = send(runtime, publisher, tenant, "large.result", payload={"bytes": BYTES},
                timeout_s=LIMIT_S)
    kept = wait_for(lambda: finished(runtime, hung.id), worker)
    assert (kept.status, kept.error_type, kept.starts) == (Status.SUCCEEDED, None, 1)
    assert kept.result_blob is None  # kept in its row instead
    assert kept.result == {"job": hung.id, "text": "x" * BYTES}
    assert wait_for(lambda: runtime.index.inflight() == 0, worker)
    assert worker.popen.poll() is None  # no process was ended for it
