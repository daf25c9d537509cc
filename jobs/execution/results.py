"""Where a succeeded job's result is kept: inline in its row, or in the blob store when large.

Apart from ``jobs.execution.attempt`` so that the attempt only decides *that* a result is
recorded; this is the one place a worker writes to the blob store. A store is waited for at
most ``result_store_timeout_s``: the recording of an outcome is bounded (the attempt's
heartbeat renews its lease meanwhile, past the handler's run-time limit), and a store that
hangs must not hold the slot for ever.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from jobs.blobs.records import store_blob
from jobs.blobs.store import BlobStore, store_url
from jobs.core.domain import Job
from jobs.execution.running import log_job
from jobs.process.runtime import Runtime


def result_fields(
    runtime: Runtime, encoded: str, *, clock: Callable[[], float], job: Job, worker_id: str
) -> dict[str, Any]:
    """The result inline, or, when larger than ``result_inline_bytes``, stored in the
    blob store (recorded first: ``jobs.blobs.records``) and named by ``result_blob``. A
    blob store that fails, or has not stored it within ``result_store_timeout_s``, keeps it
    inline: a result in hand is never thrown away."""
    settings = runtime.settings
    data = encoded.encode()
    if len(data) <= settings.result_inline_bytes:
        return {"result": json.loads(encoded)}
    timeout_s = settings.result_store_timeout_s
    try:
        store = blob_store(store_url(settings))
        sha256 = _store_within(runtime, store, data, now=clock(), timeout_s=timeout_s)
    except Exception:
        log_job(logging.WARNING, "job.result_blob_failed", job, worker_id=worker_id,
                exc_info=True, bytes=len(data))
        return {"result": json.loads(encoded)}
    if sha256 is None:
        log_job(logging.WARNING, "job.result_blob_late", job, worker_id=worker_id,
                bytes=len(data), timeout_s=timeout_s)
        return {"result": json.loads(encoded)}
    return {"result": None, "result_blob": sha256}


def _store_within(
    runtime: Runtime, store: BlobStore, data: bytes, *, now: float, timeout_s: float
) -> str | None:
    """``store_blob`` on a thread of its own, waited for at most ``timeout_s``: the digest,
    or None when it has not finished by then (raises the store's error). Unfinished, it runs
    on; a blob it stores late is named by no job, and pruned after its grace
    (``jobs.blobs.records``)."""
    stored: Future[str] = Future()

    def store_it() -> None:
        try:
            stored.set_result(store_blob(runtime.sessions, store, data, now=now))
        except BaseException as exc:
            stored.set_exception(exc)

    threading.Thread(target=store_it, name="result-store", daemon=True).start()
    try:
        return stored.result(timeout=timeout_s)
    except TimeoutError:
        if not stored.done():
            return None
        return stored.result()  # done at the deadline, or the store's own TimeoutError


@functools.lru_cache(maxsize=4)
def blob_store(url: str) -> BlobStore:
    """One store per URL and process: results are written where documents are read."""
    return BlobStore(url)
