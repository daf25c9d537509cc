"""The policy of the built-in defaults, whatever ``TIERQ_*`` the test process has."""

from __future__ import annotations

import os

from jobs.core.policy import Policy
from jobs.process.settings import load_settings


def default_policy() -> Policy:
    saved = {k: v for k, v in os.environ.items() if k.startswith("TIERQ_")}
    for name in saved:
        del os.environ[name]
    try:
        return load_settings().build_policy()
    finally:
        os.environ.update(saved)
