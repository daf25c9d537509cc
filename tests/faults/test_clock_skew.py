"""The clock-skew set-up the chaos soak relies on really shifts a new process's clock.

Python imports ``sitecustomize`` only from ``sys.path`` as it is at start-up, so these start
real interpreters with the soak's environment (``skew_env``) and read their clocks: the
shift must show in ``time.time()`` and ``time.time_ns()``, and not in ``CLOCK_REALTIME``,
which the ``tracked`` trace keeps true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.faults.clock_skew import SKEW_ENV, skew_env

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

PROBE = """
import json, time
true = time.clock_gettime(time.CLOCK_REALTIME)
print(json.dumps({
    "time": time.time() - true,
    "time_ns": time.time_ns() / 1e9 - true,
}))
"""


def clock_offsets(env: dict[str, str]) -> dict[str, float]:
    base = {k: v for k, v in os.environ.items() if k not in (SKEW_ENV, "PYTHONPATH")}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
        timeout=30, check=True,
    )
    offsets: dict[str, float] = json.loads(result.stdout)
    return offsets


@pytest.mark.parametrize("skew_s", [120.0, -120.0])
def test_a_skewed_process_sees_its_clock_shifted(skew_s: float) -> None:
    offsets = clock_offsets(skew_env(skew_s))
    assert offsets == pytest.approx(dict.fromkeys(offsets, skew_s), abs=1.0)


def test_without_the_variable_the_clock_is_true() -> None:
    env = skew_env(0.0)
    offsets = clock_offsets({"PYTHONPATH": env["PYTHONPATH"]})
    assert offsets == pytest.approx(dict.fromkeys(offsets, 0.0), abs=1.0)
