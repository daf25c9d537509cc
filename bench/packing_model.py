"""What packing can gain for ``eval.similarity`` on this machine, without tierq: the handler
called directly, one item per call (``run_many`` of one, as an unpacked run calls it) and in
runs of ``max_items_per_run``, one after another on one thread. The ratio of the two is the
model's own batching gain: the ceiling of the scheduler-to-scheduler figure when the model
is what the slots spend their time on (a CPU), whatever the scheduler saves.

Run as its own process (``OMP_NUM_THREADS`` set by the caller, torch loaded here only);
prints ``{"alone_per_s": ..., "packed_per_s": ...}``.

    OMP_NUM_THREADS=1 .venv/bin/python bench/packing_model.py [--items 256]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from packing_phases import eval_payloads

from workers.handlers import JobContext
from workers.model_handlers import SimilarityHandler


def items_per_s(handler: SimilarityHandler, payloads: list[dict[str, Any]], size: int) -> float:
    """Items per second through ``run_many`` in runs of ``size``."""
    contexts = [JobContext(job_id=f"j{i}", attempt=1, tenant_id="t", kind=handler.kind)
                for i in range(len(payloads))]
    began = time.perf_counter()
    for start in range(0, len(payloads), size):
        outcomes = handler.run_many(contexts[start:start + size], payloads[start:start + size])
        if any(isinstance(outcome, Exception) for outcome in outcomes):
            raise RuntimeError(f"an item failed: {outcomes}")
    return len(payloads) / (time.perf_counter() - began)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=256, help="items timed each way")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    handler = SimilarityHandler()
    handler.setup()
    warm = 2 * handler.max_items_per_run
    validated = [handler.validate(p) for p in eval_payloads(warm + 2 * args.items, args.seed)]
    items_per_s(handler, validated[:warm], 8)  # the model's first passes are slower
    alone = items_per_s(handler, validated[warm:warm + args.items], 1)
    packed = items_per_s(handler, validated[warm + args.items:], handler.max_items_per_run)
    print(json.dumps({"alone_per_s": alone, "packed_per_s": packed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
