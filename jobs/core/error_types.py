"""Why an attempt or a job ended badly, as a client may branch on it (``error_type``).

``error`` is a sentence for people; this is its class, one of a documented list
(docs/api.md, "Run-time limit"), stored beside it in the job's row.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorType(StrEnum):
    """Why a job ended badly (docs/api.md, "Attempts, starts and how a job ended")."""

    HANDLER_ERROR = "handler_error"  # the handler raised an error that is not retryable
    TIMED_OUT = "timed_out"  # the attempt ran past its run-time limit (timeout_s)
    LEASE_LOST = "lease_lost"  # its worker stopped renewing the lease, and no start remains
    STARTS_EXHAUSTED = "starts_exhausted"  # a retryable error on the last start allowed
    DEADLINE = "deadline"  # a retry could not start before the job's max_wait_s
    RESULT_UNSTORABLE = "result_unstorable"  # a result that is not JSON, or SQL refused it
