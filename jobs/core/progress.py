"""A running job's progress, as its handler reports it (``ctx.progress``).

Pure: the value, its limits and its JSON form. Reports live in Redis while the job runs
(``jobs.index.progress``, no SQL write per report) and the last one is stored with the
ending; a job's body shows it as ``progress``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from jobs.core.text import storable_text

# A message longer than this is cut (it is a line in a progress bar, not a log).
MAX_MESSAGE = 200
# Reports of one job reach Redis at most this often; the latest one always does.
REPORT_EVERY_S = 0.25


@dataclass(frozen=True, kw_only=True)
class Report:
    """``fraction`` done (0–1), an optional ``message``, when it was made (``at``, epoch
    seconds) and by which attempt."""

    fraction: float
    message: str | None
    at: float
    attempt: int

    @classmethod
    def make(cls, fraction: float, message: str | None, *, at: float, attempt: int) -> Report:
        """A report from what a handler passed; ``ValueError`` for a fraction that is not a
        number from 0 to 1."""
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ValueError(f"progress: fraction must be a number from 0 to 1, not {fraction!r}")
        value = float(fraction)
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise ValueError(f"progress: fraction must be from 0 to 1, not {fraction!r}")
        # The last report is stored with the job's ending: its text must never be why that
        # ending (and the result it carries) is refused.
        text = None if message is None else storable_text(str(message), MAX_MESSAGE)
        return cls(fraction=value, message=text, at=at, attempt=attempt)

    def to_dict(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "message": self.message, "at": self.at,
                "attempt": self.attempt}

    @classmethod
    def from_dict(cls, data: Any) -> Report | None:
        """The report stored as ``to_dict`` made it; None for anything else."""
        if not isinstance(data, dict):
            return None
        try:
            message = data.get("message")
            return cls(fraction=float(data["fraction"]), at=float(data["at"]),
                       attempt=int(data["attempt"]),
                       message=None if message is None else str(message))
        except (KeyError, TypeError, ValueError):
            return None
