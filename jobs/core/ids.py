"""Identifiers. Job ids are time-ordered (UUID version 7 layout), so the dispatch index's
tie-break on equal order keys (byte order of ids) follows arrival order."""

from __future__ import annotations

import os
import time
import uuid

from jobs.core.cadence import COMMITTING_S, UNCOMMITTED_GRACE_S


def new_job_id(now: float | None = None) -> str:
    """A UUIDv7: 48 bits of Unix milliseconds, then random bits."""
    ms = int((time.time() if now is None else now) * 1000) & ((1 << 48) - 1)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | rand
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return str(uuid.UUID(int=value))


def first_id_at(at: float) -> str:
    """The least job id made at or after ``at``: ids compare as their times do."""
    ms = max(0, int(at * 1000)) & ((1 << 48) - 1)
    return str(uuid.UUID(int=ms << 80))


def new_tenant_id() -> str:
    return str(uuid.uuid4())


def created_at(job_id: str) -> float:
    """Seconds since the epoch at which a (UUIDv7) job id was made; 0 for other ids."""
    try:
        return (uuid.UUID(job_id).int >> 80) / 1000
    except ValueError:
        return 0.0


def may_be_uncommitted(job_id: str, now: float) -> bool:
    """A job SQL does not show may still be a submit whose commit is on its way (its index
    entry is written first)."""
    return now - created_at(job_id) < UNCOMMITTED_GRACE_S


def may_be_committing(job_id: str, now: float) -> bool:
    """A job made so recently that its submit's transaction may be open still."""
    return now - created_at(job_id) < COMMITTING_S
