"""A blob store whose writes are slow, or hang, for tests of what a worker does meanwhile.

fsspec's local filesystem under a protocol of its own, ``slowfile://<dir>`` (the blob store
takes any fsspec URL: ``blob_url``): each write first waits the seconds written in the file
that ``SLOW_STORE_DELAY_FILE`` names (none, or no such file: no wait). Importing this module
registers the protocol; a worker loads it with
``TIERQ_HANDLERS=tests.slow_store:HANDLERS``, which also brings the handler whose result is
large enough to be kept in the blob store.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from workers.handlers import Handler, JobContext

DELAY_ENV = "SLOW_STORE_DELAY_FILE"


def delay_s() -> float:
    name = os.environ.get(DELAY_ENV)
    if not name:
        return 0.0
    try:
        return float(Path(name).read_text())
    except (OSError, ValueError):
        return 0.0


class SlowFileSystem(LocalFileSystem):
    protocol = ("slowfile",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, auto_mkdir=True, **kwargs)

    def pipe_file(self, path: str, value: bytes, *args: Any, **kwargs: Any) -> None:
        time.sleep(delay_s())
        super().pipe_file(path, value, *args, **kwargs)


fsspec.register_implementation("slowfile", SlowFileSystem, clobber=True)


class LargeResultHandler:
    """Returns at once a result of ``payload["bytes"]`` characters and its job's id (one
    blob per job: the store writes no bytes it holds already): more than a row keeps inline,
    so the worker stores it in the blob store."""

    kind = "large.result"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return dict(payload)

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        return {"job": ctx.job_id, "text": "x" * int(payload["bytes"])}


HANDLERS: list[Handler] = [LargeResultHandler()]
