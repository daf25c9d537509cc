"""Log lines (``jobs.process.logs``): JSON with the stable keys when stderr is not a terminal (a
container), readable text on a terminal, either one forced by ``TIERQ_LOG_FORMAT``."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import subprocess
import sys

import pytest

from jobs.core.errors import ConfigError
from jobs.process.logs import STABLE_KEYS, JsonFormatter, TextFormatter, chosen_format

pytestmark = pytest.mark.unit

FIELDS = {"event": "job.succeeded", "job_id": "j-1", "tenant": "t-1", "tier": "free",
          "attempt": 2, "duration_s": 1.25, "worker_id": "w@host", "error": None}


def record(**extra: object) -> logging.LogRecord:
    made = logging.LogRecord("tierq.worker", logging.INFO, __file__, 1, "job.succeeded", None,
                             None)
    made.__dict__.update(extra)
    return made


def test_json_lines_carry_the_stable_keys_first() -> None:
    line = json.loads(JsonFormatter().format(record(**FIELDS)))
    assert list(line)[:3] == ["ts", "level", "logger"]
    assert list(line)[3:3 + len(STABLE_KEYS)] == list(STABLE_KEYS)
    assert line == {**line, **FIELDS, "level": "info", "logger": "tierq.worker"}
    assert line["ts"].endswith("+00:00") and "message" not in line  # it only repeats event


def test_json_keeps_a_message_that_is_not_the_event_and_the_traceback() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failing = record(event="job.release_failed", job_id="j-2")
        failing.msg, failing.exc_info = "could not release %s", sys.exc_info()
        failing.args = ("j-2",)
    line = json.loads(JsonFormatter().format(failing))
    assert line["event"] == "job.release_failed" and line["message"] == "could not release j-2"
    assert "RuntimeError: boom" in line["exc"]
    plain = json.loads(JsonFormatter().format(logging.LogRecord(
        "uvicorn.error", logging.INFO, __file__, 1, "Started server process", None, None)))
    assert plain["event"] == "Started server process"  # a library's line: its message


def test_text_lines_read_as_words_and_key_values() -> None:
    formatter = TextFormatter()
    text = formatter.format(record(**FIELDS))
    assert " INFO tierq.worker job.succeeded job_id=j-1 tenant=t-1 tier=free attempt=2 " \
           "duration_s=1.25 worker_id=w@host" in text
    assert "error=" not in text and "{" not in text


def test_the_format_follows_the_terminal_unless_told() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert chosen_format(Terminal(), env={}) == "text"
    assert chosen_format(io.StringIO(), env={}) == "json"
    assert chosen_format(Terminal(), env={"TIERQ_LOG_FORMAT": "json"}) == "json"
    assert chosen_format(io.StringIO(), env={"TIERQ_LOG_FORMAT": "Text"}) == "text"
    with pytest.raises(ConfigError, match="TIERQ_LOG_FORMAT"):
        chosen_format(io.StringIO(), env={"TIERQ_LOG_FORMAT": "xml"})


PROGRAM = """
import logging
from jobs.process.logs import configure_logging
configure_logging()
logging.getLogger("tierq.worker").info("job.succeeded", extra={
    "event": "job.succeeded", "job_id": "j-1", "tenant": "t-1", "tier": "free",
    "attempt": 1, "duration_s": 0.5})
"""


def test_a_process_logs_json_into_a_pipe_and_text_onto_a_terminal() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TIERQ_LOG_FORMAT"}
    piped = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                           check=True, timeout=30, env=env)
    line = json.loads(piped.stderr.strip())
    assert {key: line[key] for key in STABLE_KEYS} == {
        "event": "job.succeeded", "job_id": "j-1", "tenant": "t-1", "tier": "free",
        "attempt": 1, "duration_s": 0.5}

    main, secondary = pty.openpty()
    try:
        subprocess.run([sys.executable, "-c", PROGRAM], stderr=secondary, check=True,
                       timeout=30, env=env, stdout=subprocess.DEVNULL)
        shown = os.read(main, 4096).decode()
    finally:
        os.close(main)
        os.close(secondary)
    assert "INFO tierq.worker job.succeeded job_id=j-1" in shown and "{" not in shown

    forced = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                            check=True, timeout=30, env={**env, "TIERQ_LOG_FORMAT": "text"})
    assert "job.succeeded job_id=j-1 tenant=t-1 tier=free attempt=1 duration_s=0.5" in (
        forced.stderr)
