"""Shift this process's wall clock by ``TIERQ_TEST_CLOCK_SKEW_S`` seconds (tests only).

A host whose clock is minutes off, without touching the product or the machine: put this
directory first on a process's ``PYTHONPATH`` and Python imports this module at start-up,
before any other code, so every later ``time.time()`` and ``time.time_ns()`` (including
defaults bound at import, such as ``clock=time.time``) reads the shifted clock.

``datetime.now()`` is left alone: ``datetime`` is a C type whose methods cannot be replaced,
and a subclass put in its place would not match the instances C libraries create (psycopg's
timestamps), which breaks ``isinstance`` checks. tierq takes its times from ``time.time``.
``time.monotonic`` and ``time.clock_gettime`` are left alone too: the first measures
intervals, and the second lets test code in this process read the true time.
"""

from __future__ import annotations

import os
import time

SKEW_ENV = "TIERQ_TEST_CLOCK_SKEW_S"


def _install(skew_s: float) -> None:
    real_time, real_time_ns = time.time, time.time_ns
    skew_ns = int(skew_s * 1e9)

    def skewed_time() -> float:
        return real_time() + skew_s

    def skewed_time_ns() -> int:
        return real_time_ns() + skew_ns

    time.time = skewed_time
    time.time_ns = skewed_time_ns


_skew = float(os.environ.get(SKEW_ENV) or 0)
if _skew:
    _install(_skew)
