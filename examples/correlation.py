"""Put an evaluation run's results next to its labels: per item and over the whole set.

    tierq batch submit examples/sts-mini.jsonl --kind eval.similarity --wait
    tierq batch results <batch id> > results.jsonl
    python examples/correlation.py examples/sts-mini.jsonl results.jsonl

Each line of the data file is one item of the batch (``{"pairs": [...], "labels": [...]}``);
each line of the results is ``{"index": i, "status": ..., "result": {"scores", "spearman"}}``.
The Spearman correlation over all pairs is computed here from the scores the workers sent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from workers.model_handlers import spearman


def main(data_path: str, results_path: str) -> int:
    items = [json.loads(line) for line in Path(data_path).read_text().splitlines() if line]
    results = {}
    for line in Path(results_path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            results[row["index"]] = row
    scores: list[float] = []
    labels: list[float] = []
    print(f"{'item':>4}  {'pairs':>5}  {'status':<10}  spearman")
    for index, item in enumerate(items):
        row = results.get(index, {"status": "missing"})
        result = row.get("result") or {}
        rho = result.get("spearman")
        shown = "-" if rho is None else f"{rho:.3f}"
        print(f"{index:>4}  {len(item['pairs']):>5}  {row['status']:<10}  {shown}")
        if row["status"] == "succeeded":
            scores.extend(result["scores"])
            labels.extend(item["labels"])
    overall = spearman(scores, labels) if scores else None
    print(f"pairs scored: {len(scores)} of {sum(len(i['pairs']) for i in items)}")
    print("spearman over all pairs: " + ("-" if overall is None else f"{overall:.3f}"))
    return 0 if overall is not None and len(scores) == len(labels) else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
