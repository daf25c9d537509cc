"""The packing bench's GPU-like handler: a run of ``n`` items holds its slot ``a + b × n``
seconds, as a device does a batch: a fixed cost per pass and a small one per item.

It sleeps (a handler waiting on its device spends no CPU), so every CPU second the bench
counts in tierq's processes is the scheduler's own. ``a`` and ``b`` come from the
environment (``BENCH_PACK_FIXED_S``, ``BENCH_PACK_PER_ITEM_S``), read at each run so that
the API, which only validates, never needs them.

Loaded by the bench's tierq processes through
``TIERQ_HANDLERS=bench.packing_handlers:HANDLERS`` with the repository root on their
``PYTHONPATH``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from workers.handlers import JobCancelled, JobContext, check_run

KIND = "bench.pack"
FIXED_ENV = "BENCH_PACK_FIXED_S"
PER_ITEM_ENV = "BENCH_PACK_PER_ITEM_S"


def pass_seconds(items: int) -> float:
    """How long one pass over ``items`` items holds the slot."""
    return float(os.environ.get(FIXED_ENV, "0.05")) + float(
        os.environ.get(PER_ITEM_ENV, "0.002")) * items


class PackedSleep:
    """Holds its slot as a device pass over its run's items; each item's result is its
    index in the payload, so the bench can tell every item ran."""

    kind = KIND
    max_items_per_run = 32

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"i": int(payload["i"])}

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        time.sleep(pass_seconds(1))
        return {"i": payload["i"]}

    def run_many(self, contexts: list[JobContext], payloads: list[dict[str, Any]]) -> list[Any]:
        wanted = set(check_run(contexts))
        time.sleep(pass_seconds(len(wanted)))
        return [{"i": payload["i"]} if i in wanted
                else JobCancelled(f"job {contexts[i].job_id} was cancelled")
                for i, payload in enumerate(payloads)]


HANDLERS = [PackedSleep()]
