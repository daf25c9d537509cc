"""``/v1/documents``: upload a file now, fetch what a handler made of it later.

The file's type is told from its bytes (``jobs.core.content_type``): a type no handler reads is
refused (415) before anything is stored. The bytes go to the blob store by sha256, then a job
``{"blob": "<sha256>"}`` of ``kind`` is submitted through the one submit path, so a document
job is admitted, bounded and aged like any other. The payload is validated before the blob
is written: a refused kind leaves nothing behind.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Response, UploadFile
from pydantic import BaseModel, ConfigDict, Field

from jobs.admission import submit
from jobs.api.deps import BlobStoreDep, RuntimeDep, TenantDep, ValidatorDep, refuse_unknown_query
from jobs.api.errors import error_responses
from jobs.api.schemas import MAX_WAIT_LIMIT_S, TIMEOUT, SubmitResponse
from jobs.api.webhook_schemas import webhook_of_fields
from jobs.blobs.records import store_blob
from jobs.blobs.store import digest
from jobs.core import content_type
from jobs.core.errors import PayloadTooLarge, UnsupportedMediaType
from jobs.core.policy import MAX_TIMEOUT_S
from jobs.core.webhooks import MAX_URL_LENGTH
from jobs.process.runtime import Runtime

router = APIRouter(prefix="/v1/documents", tags=["documents"],
                   dependencies=[Depends(refuse_unknown_query)])

DEFAULT_KIND = "document.embed"
# Room for the multipart envelope (boundaries, part headers, the small form fields) on top
# of the file itself, in the request body limit of this route.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


class DocumentForm(BaseModel):
    """The multipart form of an upload."""

    model_config = ConfigDict(extra="forbid")

    file: UploadFile = Field(description="the document: PDF, UTF-8 text or markdown")
    kind: str = Field(default=DEFAULT_KIND, min_length=1, max_length=100,
                      description="the job kind to run on it")
    max_wait_s: float | None = Field(
        default=None, gt=0, le=MAX_WAIT_LIMIT_S, allow_inf_nan=False,
        description="expire the job if it has not started within this many seconds")
    timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False, description=TIMEOUT)
    webhook_url: str | None = Field(
        default=None, min_length=1, max_length=MAX_URL_LENGTH,
        description="POST the job's events there (docs/api.md, Webhooks)")
    webhook_events: str | None = Field(
        default=None, max_length=100,
        description="the webhook's events, comma-separated: started, completed (default: "
                    "completed)")


class DocumentInfo(BaseModel):
    """The document as stored in the blob store."""

    sha256: str = Field(description="the file's sha256: its name in the blob store")
    bytes: int = Field(description="the file's size")
    content_type: str = Field(description="its type, told from its bytes")


class DocumentSubmitResponse(SubmitResponse):
    """The job submitted for the document, and the document as stored."""

    document: DocumentInfo = Field(description="the stored file")


@router.post(
    "",
    status_code=202,
    response_model=DocumentSubmitResponse,
    summary="Upload a document and submit a job for it",
    description="Store the file (multipart field `file`) in the blob store and submit a job "
    "of `kind` (default document.embed) with payload {\"blob\": \"<sha256>\"}: 202 with the "
    "job and the stored document. 413 over the configured size, 415 for a type no handler "
    "reads (PDF, UTF-8 text and markdown are read; the type is told from the bytes).",
    responses={
        202: {"description": "stored, and its job accepted and queued",
              "headers": {"Location": {"description": "/v1/jobs/<id>",
                                       "schema": {"type": "string"}}}},
        **error_responses("invalid_request", "unauthorized", "forbidden", "payload_too_large",
                          "unsupported_media_type", "capacity", "tenant_limit", "unavailable"),
    },
)
def upload_document(
    form: Annotated[DocumentForm, Form(media_type="multipart/form-data")],
    tenant: TenantDep,
    runtime: RuntimeDep,
    validator: ValidatorDep,
    store: BlobStoreDep,
    response: Response,
) -> DocumentSubmitResponse:
    data = _read_limited(form.file, runtime)
    detected = content_type.detect(data, form.file.filename)
    if detected is None:
        raise UnsupportedMediaType(
            "the file is not a type any handler reads (PDF, UTF-8 text or markdown)",
            readable=list(content_type.READABLE),
        )
    payload = validator.validate(form.kind, {"blob": digest(data)})
    sha256 = store_blob(runtime.sessions, store, data, now=runtime.clock())
    submitted = submit.submit(
        runtime, validator, tenant,
        submit.Submission(kind=form.kind, payload=payload, max_wait_s=form.max_wait_s,
                          blob=sha256, timeout_s=form.timeout_s, webhook=webhook_of_fields(
                              form.webhook_url, form.webhook_events, where="body")),
    )
    job_id = submitted.progress.job.id
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    base = SubmitResponse.of(submitted.progress)
    return DocumentSubmitResponse(
        **{name: getattr(base, name) for name in SubmitResponse.model_fields},
        document=DocumentInfo(sha256=sha256, bytes=len(data), content_type=detected),
    )


def _read_limited(file: UploadFile, runtime: Runtime) -> bytes:
    limit = runtime.settings.api.max_document_bytes
    data = file.file.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(f"the document is over the limit of {limit} bytes",
                              limit_bytes=limit)
    return data
