"""Where a succeeded job's result is kept: inline in its row, or in the blob store when large.

Apart from ``jobs.execution.attempt`` so that the attempt only decides *that* a result is
recorded; this is the one place a worker writes to the blob store.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
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
    blob store that fails keeps it inline: a result in hand is never thrown away."""
    settings = runtime.settings
    data = encoded.encode()
    if len(data) <= settings.result_inline_bytes:
        return {"result": json.loads(encoded)}
    try:
        store = blob_store(store_url(settings))
        sha256 = store_blob(runtime.sessions, store, data, now=clock())
    except Exception:
        log_job(logging.WARNING, "job.result_blob_failed", job, worker_id=worker_id,
                exc_info=True, bytes=len(data))
        return {"result": json.loads(encoded)}
    return {"result": None, "result_blob": sha256}


@functools.lru_cache(maxsize=4)
def blob_store(url: str) -> BlobStore:
    """One store per URL and process: results are written where documents are read."""
    return BlobStore(url)
