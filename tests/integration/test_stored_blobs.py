"""Blobs against real SQL (SQLite and PostgreSQL) and a real directory: a blob is pruned once
no job names it and its grace has passed, never under a writer; a result larger than
``result_inline_bytes`` is kept in the blob store and handed out through a link.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy.orm import Session

from jobs.blobs.records import BLOB_GRACE_S, prune_blobs, store_blob
from jobs.blobs.store import BlobStore, digest
from jobs.client.http import Client
from jobs.core.domain import NewJob
from jobs.core.ids import new_job_id
from jobs.core.states import Status
from jobs.dispatch.retention import Retention
from jobs.execution.attempt import execute
from jobs.index.redis_index import RedisIndex
from jobs.process.runtime import Runtime
from jobs.process.settings import load_settings
from jobs.store import blobs as blobs_sql
from jobs.store import jobs as jobs_sql
from jobs.store import tenants as tenants_sql
from jobs.store.engine import make_engine, make_sessionmaker
from tests.integration.api_harness import auth, make_settings, running_api
from tests.services import RedisServer
from workers.handlers import default_registry

pytestmark = pytest.mark.integration

T0 = 1_800_000_000.0
TIERS = {"standard": {"base_priority": 0, "max_wait_s": 60, "tenant_share": 0.5,
                      "retention_s": 100}}


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(str(tmp_path / "blobs"))


@pytest.fixture
def runtime(db_url: str, redis_client: redis.Redis, key_prefix: str,
            tmp_path: Path) -> Iterator[Runtime]:
    settings = load_settings(database_url=db_url, key_prefix=key_prefix, tiers=TIERS,
                             blob_url=str(tmp_path / "blobs"), result_inline_bytes=1024,
                             policy={"pool_concurrency": 2})
    engine = make_engine(db_url)
    yield Runtime(settings=settings, policy=settings.build_policy(), engine=engine,
                  sessions=make_sessionmaker(engine), redis=redis_client,
                  index=RedisIndex(redis_client, key_prefix))
    engine.dispose()


def tenant(runtime: Runtime) -> str:
    with runtime.sessions.begin() as s:
        return tenants_sql.create_tenant(s, name="acme", tier="standard", api_key_hash="acme",
                                        now=T0).id


def insert(session: Session, tenant_id: str, *, at: float, blob: str | None = None,
           kind: str = "echo", payload: dict[str, Any] | None = None) -> str:
    new = NewJob(id=new_job_id(at), tenant_id=tenant_id, tier="standard", kind=kind,
                 payload=payload or {}, order_key=at, enqueued_at=at, blob=blob)
    jobs_sql.insert_job(session, new)
    return new.id


def finish(session: Session, job_id: str, *, at: float, **fields: Any) -> None:
    src = Status.QUEUED
    for dst in (Status.DISPATCHED, Status.RUNNING, Status.SUCCEEDED):
        extra = fields if dst is Status.SUCCEEDED else {}
        assert jobs_sql.transition(session, job_id, src=src, attempt=1, dst=dst, now=at,
                                     **extra)
        src = dst


def test_only_blobs_no_job_names_are_pruned_and_only_after_the_grace(
    runtime: Runtime, store: BlobStore
) -> None:
    sessions = runtime.sessions
    kept = store_blob(sessions, store, b"a document a job reads", now=T0)
    result = store_blob(sessions, store, b'{"a result": "kept as a blob"}', now=T0)
    orphan = store_blob(sessions, store, b"an upload whose job never committed", now=T0)
    young = store_blob(sessions, store, b"an upload whose job is on its way", now=T0 + 50)
    owner = tenant(runtime)
    with sessions.begin() as s:
        insert(s, owner, at=T0, blob=kept)
        finish(s, insert(s, owner, at=T0), at=T0, result=None, result_blob=result)

    assert prune_blobs(sessions, store, now=T0 + BLOB_GRACE_S - 1) == 0
    assert prune_blobs(sessions, store, now=T0 + BLOB_GRACE_S + 1) == 1

    assert not store.exists(orphan)
    assert all(store.exists(sha) for sha in (kept, result, young))
    with sessions() as s:
        assert blobs_sql.blob_size(s, orphan) is None
        assert blobs_sql.blob_size(s, young) == len(b"an upload whose job is on its way")


def test_a_blob_goes_with_the_last_job_that_names_it(runtime: Runtime, store: BlobStore) -> None:
    """Retention prunes the jobs past their tier's period, then the blobs they named."""
    sessions = runtime.sessions
    shared = store_blob(sessions, store, b"the same file, uploaded twice", now=T0)
    owner = tenant(runtime)
    with sessions.begin() as s:
        first = insert(s, owner, at=T0, blob=shared)
        finish(s, first, at=T0, result={"ok": 1})
        second = insert(s, owner, at=T0 + 500, blob=shared)
        finish(s, second, at=T0 + 500, result={"ok": 2})
    retention = Retention(sessions, runtime.policy, blobs=store)

    later = T0 + BLOB_GRACE_S + 200  # the first job is past 100 s of retention, not the second
    stats = retention.run_once(T0 + 450)
    assert stats.pruned == {"standard": 1} and stats.blobs == 0
    stats = retention.run_once(later)
    assert stats.pruned == {"standard": 1} and stats.blobs == 1
    assert not store.exists(shared)


def test_a_writer_never_loses_its_blob_to_a_pruner_that_holds_it(
    runtime: Runtime, store: BlobStore
) -> None:
    """The pruner took the row and deleted the bytes; an upload of the same bytes waits for
    its commit, records the blob afresh and writes the bytes again."""
    sessions = runtime.sessions
    data = b"pruned and uploaded again at the same moment"
    sha = store_blob(sessions, store, data, now=T0)
    written = threading.Event()

    def upload() -> None:
        store_blob(sessions, store, data, now=T0 + BLOB_GRACE_S + 5)
        written.set()

    with sessions.begin() as s:
        assert blobs_sql.take_unreferenced_blobs(s, before=T0 + 1, limit=10) == [sha]
        store.delete(sha)
        writer = threading.Thread(target=upload)
        writer.start()
        assert not written.wait(0.5), "the writer did not wait for the pruner's row"
        blobs_sql.forget_blobs(s, [sha])
    writer.join(10)

    assert written.is_set() and store.exists(sha)
    assert prune_blobs(sessions, store, now=T0 + BLOB_GRACE_S + 6) == 0  # recorded afresh


def test_a_large_result_is_kept_as_a_blob_and_handed_out_through_a_link(
    db_url: str, redis_server: RedisServer, key_prefix: str, tmp_path: Path
) -> None:
    settings = make_settings(db_url, redis_server.url, key_prefix).model_copy(update={
        "blob_url": str(tmp_path / "blobs"), "result_inline_bytes": 1024})
    big = {"rows": [{"i": i, "text": "x" * 40} for i in range(100)]}
    small = {"rows": 1}
    with running_api(settings) as client:
        key = client.tenant_key("acme", "standard")
        runtime = client.runtime
        ids = []
        for payload in (big, small):
            response = client.post("/v1/jobs", json={"kind": "echo", "payload": payload},
                                   headers=auth(key))
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
            leases = runtime.index.dispatch(1, now=runtime.clock(), lease_ttl_s=30)
            with runtime.sessions.begin() as s:
                assert jobs_sql.claim(s, [lease.job_id for lease in leases],
                                        now=runtime.clock())
            assert execute(runtime, default_registry(""), ids[-1], 1,
                           worker_id="w@test") == "succeeded"
        big_id, small_id = ids

        linked = client.get(f"/v1/jobs/{big_id}/result", headers=auth(key)).json()
        encoded = json.dumps(big, separators=(",", ":")).encode()
        assert linked["result"] is None
        assert linked["result_url"] == f"/v1/jobs/{big_id}/result/blob"
        assert linked["result_bytes"] == len(encoded)
        blob = client.get(linked["result_url"], headers=auth(key))
        assert blob.status_code == 200 and blob.headers["content-type"] == "application/json"
        assert blob.json() == big
        assert BlobStore(str(tmp_path / "blobs")).get(digest(encoded)) == encoded

        inline = client.get(f"/v1/jobs/{small_id}/result", headers=auth(key)).json()
        assert inline["result"] == small and inline["result_url"] is None
        missing = client.get(f"/v1/jobs/{small_id}/result/blob", headers=auth(key))
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
        other = client.tenant_key("other", "standard")
        assert client.get(linked["result_url"], headers=auth(other)).status_code == 404

        with Client(str(client.base_url), key) as api:
            assert api.result(big_id)["result"] == big


def test_an_upload_records_its_blob_and_its_job_names_it(
    db_url: str, redis_server: RedisServer, key_prefix: str, tmp_path: Path
) -> None:
    settings = make_settings(db_url, redis_server.url, key_prefix).model_copy(update={
        "blob_url": str(tmp_path / "blobs")})
    text = b"A short note.\nIt is uploaded now and embedded later.\n"
    with running_api(settings) as client:
        key = client.tenant_key("acme", "standard")
        response = client.post("/v1/documents", files={"file": ("note.txt", text)},
                               headers=auth(key))
        assert response.status_code == 202, response.text
        body = response.json()
        runtime = client.runtime
        with runtime.sessions() as s:
            job = jobs_sql.get_job(s, body["id"])
            assert job is not None and job.blob == body["document"]["sha256"] == digest(text)
            assert blobs_sql.blob_size(s, digest(text)) == len(text)
        # Named by a queued job: kept, however old.
        assert prune_blobs(runtime.sessions, BlobStore(str(tmp_path / "blobs")),
                           now=runtime.clock() + 10 * BLOB_GRACE_S) == 0
