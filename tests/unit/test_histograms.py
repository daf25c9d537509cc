"""The histogram helpers (``jobs.core.histograms``): an observation's bucket, stored counts made
cumulative, and ``histogram_quantile`` as Prometheus computes it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from jobs.core.histograms import (
    INF,
    WAIT_BUCKETS_S,
    StartFigures,
    bucket_of,
    cumulative,
    histogram_quantile,
)
from tests.unit.test_alerts import run

pytestmark = pytest.mark.unit


def test_a_value_falls_in_the_first_bucket_at_or_above_it() -> None:
    assert bucket_of(0.0, WAIT_BUCKETS_S) == "0.1"
    assert bucket_of(0.1, WAIT_BUCKETS_S) == "0.1"  # le: less than or equal
    assert bucket_of(0.10001, WAIT_BUCKETS_S) == "0.25"
    assert bucket_of(5, WAIT_BUCKETS_S) == "5.0"
    assert bucket_of(600.5, WAIT_BUCKETS_S) == INF


def test_stored_counts_become_cumulative_buckets() -> None:
    hist = cumulative({"0.1": 2, "5.0": 3, INF: 1, "sum": 42.5}, WAIT_BUCKETS_S)
    counts = dict(hist.buckets)
    assert counts["0.1"] == 2 and counts["2.5"] == 2 and counts["5.0"] == 5
    assert counts[INF] == 6 == hist.count and hist.sum == 42.5
    assert [label for label, _ in hist.buckets][-1] == INF
    assert cumulative({}, WAIT_BUCKETS_S).count == 0


def test_histogram_quantile_interpolates_as_prometheus_does() -> None:
    inf = math.inf
    buckets = [(1.0, 10.0), (2.0, 30.0), (5.0, 40.0), (inf, 40.0)]
    assert histogram_quantile(0.25, buckets) == pytest.approx(1.0)  # rank 10: the first's top
    assert histogram_quantile(0.5, buckets) == pytest.approx(1.5)  # rank 20: half into (1, 2]
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.4)  # the first starts at 0
    assert histogram_quantile(0.9, buckets) == pytest.approx(3.8)  # 6/10 into (2, 5]
    # A rank in +Inf: the highest finite bound.
    assert histogram_quantile(0.99, [(1.0, 1.0), (inf, 10.0)]) == 1.0
    assert histogram_quantile(0.5, [(1.0, 0.0), (inf, 0.0)]) is None
    with pytest.raises(ValueError, match="Inf"):
        histogram_quantile(0.5, [(1.0, 1.0)])


def test_a_start_passes_its_buckets_and_values_to_the_script() -> None:
    args = StartFigures(wait_s=3.0, dispatch_s=0.02).script_args()
    assert args == ["5.0", "3.0", "0.025", "0.02", "300.0", "2048"]
    late = StartFigures(wait_s=-0.5).script_args()  # hosts' clocks: never a negative wait
    assert late[:4] == ["0.1", "0.0", "", ""]


def test_the_helper_agrees_with_prometheus_on_the_rate_of_the_wait_histogram(
    tmp_path: Path,
) -> None:
    """promtool evaluates histogram_quantile(rate()) over two samples of the same buckets the
    helper reads: the answers must be the ones the helper computes."""
    # Counts well above the increase, so that Prometheus extrapolates every bucket alike
    # (a series near 0 is extrapolated less: it cannot have been negative).
    before = {"0.1": 100, "0.5": 102, "2.5": 102, "30.0": 105, INF: 105}
    after = {"0.1": 104, "0.5": 114, "2.5": 120, "30.0": 130, INF: 131}
    series = [{"series": f'tierq_queue_wait_seconds_bucket{{tier="free",le="{le}"}}',
               "values": f"{before[le]} {after[le]}"} for le in before]
    rates = [(float(le), (after[le] - before[le]) / 60) for le in before]
    cases = []
    for q in (0.5, 0.9, 0.99):
        expected = histogram_quantile(q, rates)
        assert expected is not None
        cases.append({
            "expr": f"histogram_quantile({q}, rate(tierq_queue_wait_seconds_bucket[2m]))",
            "eval_time": "1m",
            "exp_samples": [{"labels": '{tier="free"}', "value": expected}],
        })
    (tmp_path / "rules.yml").write_text("groups: []\n")
    (tmp_path / "quantiles_test.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": cases}],
    }))
    tested = run("test", "rules", str(tmp_path / "quantiles_test.yml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr
