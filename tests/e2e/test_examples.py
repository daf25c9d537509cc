"""The example evaluation run of examples/README.md, step by step, against `tierq up`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import drain, free_port, start_up, stop_up

pytestmark = [pytest.mark.e2e, pytest.mark.models, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run(cwd: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180, check=False)


def test_the_evaluation_example_runs_and_prints_a_correlation(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    tierq = [sys.executable, "-m", "jobs.cli"]
    up, printed = start_up(tmp_path, env, "--port", str(free_port()), "--concurrency", "2")
    done = drain(up, printed)
    try:
        created = run(tmp_path, env, *tierq, "tenants", "create", "lab", "--tier", "standard")
        key = re.search(r"tq_[A-Za-z0-9_-]+", created.stdout)
        assert key, created.stdout + created.stderr
        env["TIERQ_API_KEY"] = key.group(0)

        submitted = run(tmp_path, env, *tierq, "batch", "submit",
                        str(EXAMPLES / "sts-mini.jsonl"), "--kind", "eval.similarity", "--wait")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        batch = re.search(r"batch (\S+)\s+tier", submitted.stdout)
        assert batch, submitted.stdout
        assert "finished: 6 succeeded" in submitted.stderr, submitted.stderr

        results = run(tmp_path, env, *tierq, "batch", "results", batch.group(1))
        assert results.returncode == 0, results.stderr
        (tmp_path / "results.jsonl").write_text(results.stdout)

        report = run(ROOT, env, sys.executable, str(EXAMPLES / "correlation.py"),
                     str(EXAMPLES / "sts-mini.jsonl"), str(tmp_path / "results.jsonl"))
        assert report.returncode == 0, report.stdout + report.stderr
        sys.stdout.write(report.stdout)  # the run's table, kept in the test's output
        assert "pairs scored: 48 of 48" in report.stdout
        overall = re.search(r"spearman over all pairs: (-?[0-9.]+)", report.stdout)
        assert overall and float(overall.group(1)) > 0.8, report.stdout
    finally:
        stop_up(up)  # type: ignore[arg-type]
        done()
