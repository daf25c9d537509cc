"""The one exception root of tierq. The API maps each class to its status and ``type``.

::

    TierqError
    ├── ConfigError                  impossible configuration (names the field)
    ├── InvalidRequest               400/422 invalid_request
    │   └── UnknownKind
    ├── Unauthorized                 401 unauthorized
    ├── Forbidden                    403 forbidden
    ├── NotFound                     404 not_found
    ├── JobNotFinished               202 on /result while the job runs
    ├── JobFailed                    409 job_failed
    ├── IdempotencyConflict          409 idempotency_conflict: a key reused for other work
    ├── JobGone                      410 job_cancelled / job_expired / job_gone (pruned)
    ├── PayloadTooLarge              413 payload_too_large
    ├── UnsupportedMediaType         415 unsupported_media_type: a document no handler reads
    ├── Refused                      429: nothing was accepted
    │   ├── CapacityExceeded         capacity: the tier is at its bound (ours to fix)
    │   └── TenantLimitExceeded      tenant_limit: this tenant's quota, rate or cap (theirs)
    ├── Unavailable                  503 unavailable: SQL or Redis cannot be reached
    ├── IllegalTransition            a state change not in jobs.core.states.TRANSITIONS
    ├── NotLeader                    (jobs.index.base) a fenced index call from a deposed leader
    └── JobFailedError               (workers.tasks) ends a failed job's Celery task in FAILURE
"""

from __future__ import annotations

from typing import Any


class TierqError(Exception):
    """Root of every error tierq raises on purpose."""

    type: str = "internal"
    status: int = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class ConfigError(TierqError):
    type = "config"


class InvalidRequest(TierqError):
    type = "invalid_request"
    status = 422


class UnknownKind(InvalidRequest):
    pass


class Unauthorized(TierqError):
    type = "unauthorized"
    status = 401


class Forbidden(TierqError):
    type = "forbidden"
    status = 403


class NotFound(TierqError):
    type = "not_found"
    status = 404


class JobNotFinished(TierqError):
    type = "not_finished"
    status = 202


class JobFailed(TierqError):
    type = "job_failed"
    status = 409


class JobNotEnded(TierqError):
    """A retry asked of a job that has not ended: the job itself may still succeed."""

    type = "job_not_ended"
    status = 409


class IdempotencyConflict(TierqError):
    """The key names a job of another kind or payload: answering with that job would hand
    the client a result of work it did not ask for."""

    type = "idempotency_conflict"
    status = 409


class JobGone(TierqError):
    status = 410

    def __init__(self, message: str, *, type: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.type = type


class PayloadTooLarge(TierqError):
    type = "payload_too_large"
    status = 413


class UnsupportedMediaType(TierqError):
    type = "unsupported_media_type"
    status = 415


class Refused(TierqError):
    """Admission said no; the job left nothing behind."""

    status = 429

    def __init__(
        self,
        message: str,
        *,
        tier: str,
        retry_after_s: int,
        queue_position: int,
        **details: Any,
    ) -> None:
        super().__init__(message, **details)
        self.tier = tier
        self.retry_after_s = max(1, retry_after_s)
        self.queue_position = queue_position


class CapacityExceeded(Refused):
    type = "capacity"


class TenantLimitExceeded(Refused):
    type = "tenant_limit"


class Unavailable(TierqError):
    type = "unavailable"
    status = 503

    def __init__(self, message: str, *, retry_after_s: int = 2, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after_s = retry_after_s


class IllegalTransition(TierqError):
    type = "illegal_transition"
