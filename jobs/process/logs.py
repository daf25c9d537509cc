"""Log lines of every tierq process: one JSON object a line in containers, readable text in a
terminal.

Each line is one event, named by a stable ``event`` key (``job.started``,
``lease.expired.requeued``; ``docs/operations.md`` lists them), with the stable keys
``job_id``, ``tenant``, ``tier``, ``attempt`` and ``duration_s`` where they apply, passed as
``extra=`` by the caller. Other extras (``worker_id``, ``reason``, ``error``, ...) follow.

- JSON (``TIERQ_LOG_FORMAT=json``, and the default when stderr is not a terminal, as in a
  container): ``{"ts": "<RFC 3339, UTC>", "level": "info", "logger": "tierq.worker",
  "event": "job.succeeded", "job_id": "...", ..., "message": "..."}``. ``message`` is left
  out when it only repeats the event; a traceback goes in ``exc``.
- text (``TIERQ_LOG_FORMAT=text``, and the default on a terminal):
  ``<time> <level> <logger> <event> key=value ...``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from jobs.core.errors import ConfigError

# The keys every consumer may rely on, in this order, first on every line that has them.
STABLE_KEYS = ("event", "job_id", "tenant", "tier", "attempt", "duration_s")
FORMAT_ENV = "TIERQ_LOG_FORMAT"
Format = Literal["json", "text"]

# What a LogRecord carries by itself: anything else came in through ``extra=``.
_RECORD_KEYS = frozenset(
    [*logging.LogRecord("", 0, "", 0, "", None, None).__dict__, "message", "asctime",
     "taskName", "color_message"]
)


def extras(record: logging.LogRecord) -> dict[str, Any]:
    """The record's structured fields: the stable keys first, then the others by name."""
    found = {k: v for k, v in record.__dict__.items() if k not in _RECORD_KEYS}
    ordered = {key: found.pop(key) for key in STABLE_KEYS if key in found}
    return {**ordered, **dict(sorted(found.items()))}


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        fields = extras(record)
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": fields.pop("event", None) or message,
        }
        line.update((key, _plain(value)) for key, value in fields.items())
        if message != line["event"]:
            line["message"] = message
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``<time> <level> <logger> <message> key=value ...``: the fields stay readable."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        fields = extras(record)
        if fields.get("event") == record.getMessage():
            del fields["event"]
        pairs = [f"{key}={value}" for key, value in fields.items() if value is not None]
        return " ".join([text, *pairs])


def chosen_format(stream: TextIO, env: Mapping[str, str] | None = None) -> Format:
    """``TIERQ_LOG_FORMAT`` when set (json or text); else text on a terminal, JSON otherwise."""
    wanted = (os.environ if env is None else env).get(FORMAT_ENV, "").strip().lower()
    if wanted in ("json", "text"):
        return "json" if wanted == "json" else "text"
    if wanted:
        raise ConfigError(f"{FORMAT_ENV}: must be json or text, got {wanted!r}")
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def formatter_for(fmt: Format) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure_logging(level: str = "INFO", *, stream: TextIO | None = None) -> None:
    """Log to ``stream`` (stderr) in the chosen format, once per process: a root logger that
    already has handlers (a test's, an embedding program's) is left as it is."""
    root = logging.getLogger()
    if not root.handlers:
        out = stream if stream is not None else sys.stderr
        handler = logging.StreamHandler(out)
        handler.setFormatter(formatter_for(chosen_format(out)))
        root.addHandler(handler)
    root.setLevel(level.upper())
