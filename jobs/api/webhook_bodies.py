"""What a webhook delivery carries as ``data``: the job's body as ``GET /v1/jobs/<id>``
shows it (with its result when it succeeded with one kept inline), or the batch's as
``GET /v1/batches/<id>`` does, read when the try is made (``type`` and ``timestamp`` say
what happened and when; a late try of ``job.started`` may show the job already ended)."""

from __future__ import annotations

from typing import Any

from jobs.admission.estimates import Progress
from jobs.api.batch_schemas import BatchResponse
from jobs.api.schemas import JobResponse
from jobs.core.progress import Report
from jobs.core.states import Status
from jobs.process.runtime import Runtime
from jobs.service import batches
from jobs.store import batches as batches_sql
from jobs.store import jobs as jobs_sql
from jobs.store.webhooks import Event


def render(runtime: Runtime, event: Event) -> dict[str, Any] | None:
    """The event's ``data``; None when its job or batch is gone (pruned)."""
    if event.job_id is None:
        with runtime.sessions() as session:
            batch = batches_sql.get_batch(session, event.batch_id or "")
        if batch is None:
            return None
        return BatchResponse.of(batches.progress(runtime, batch)).model_dump(mode="json")
    with runtime.sessions() as session:
        job = jobs_sql.get_job(session, event.job_id)
    if job is None:
        return None
    body = JobResponse.of(Progress(job=job, report=Report.from_dict(job.progress))).model_dump(
        mode="json")
    if job.status is Status.SUCCEEDED and job.result_blob is None:
        body["result"] = job.result
    return body
