"""Start a test process whose wall clock is off: the environment that does it.

``skew_env(seconds)`` puts ``tests/faults/skew`` first on ``PYTHONPATH``; its
``sitecustomize`` shifts ``time.time`` and ``time.time_ns`` at interpreter start (see there).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKEW_DIR = Path(__file__).resolve().parent / "skew"
SKEW_ENV = "TIERQ_TEST_CLOCK_SKEW_S"


def skew_env(skew_s: float) -> dict[str, str]:
    """The environment that shifts a new process's ``time.time()`` by ``skew_s``."""
    return {SKEW_ENV: str(skew_s), "PYTHONPATH": f"{SKEW_DIR}{os.pathsep}{ROOT}"}
