"""Progress reports in Redis: the last one of each running job, and a hint to listeners.

A report is one round trip (``SET`` with a day's TTL, and a ``PUBLISH`` on the pool's
``progressed`` channel, pipelined); no SQL. Readers take a job's report only when it is of
the job's current attempt (a retry starts from nothing). Best effort: a report that cannot
be written is dropped, never raised into the handler.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import redis

from jobs.core.progress import Report
from jobs.index.keys import IndexKeys

logger = logging.getLogger("tierq.progress")

# A report outlives its job's run by this much at most (the ending keeps the last in SQL).
KEEP_S = 86400


def write(client: redis.Redis, prefix: str, job_id: str, report: Report) -> bool:
    """Store ``report`` as the job's latest and say so; False when Redis refused."""
    keys = IndexKeys(prefix)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.set(keys.progress(job_id), json.dumps(report.to_dict()), ex=KEEP_S)
        pipe.publish(keys.progress_reported, job_id)
        pipe.execute()
    except redis.RedisError:
        logger.warning("progress.write_failed", exc_info=True,
                       extra={"event": "progress.write_failed", "job_id": job_id})
        return False
    return True


def read(client: redis.Redis, prefix: str, attempts: Mapping[str, int]) -> dict[str, Report]:
    """The latest report of each job of ``attempts`` (job id → its current attempt) that
    has one for that attempt; one round trip."""
    ids = list(attempts)
    if not ids:
        return {}
    keys = IndexKeys(prefix)
    raw = client.mget([keys.progress(job_id) for job_id in ids])
    found: dict[str, Report] = {}
    for job_id, value in zip(ids, raw, strict=True):
        report = _decode(value)
        if report is not None and report.attempt == attempts[job_id]:
            found[job_id] = report
    return found


def _decode(value: object) -> Report | None:
    if value is None:
        return None
    try:
        data = json.loads(value.decode() if isinstance(value, bytes) else str(value))
    except ValueError:
        return None
    return Report.from_dict(data)
