"""The alerting rules (deploy/prometheus/alerts.yml) pass ``promtool check rules`` and their
unit tests (deploy/prometheus/alerts_test.yml, ``promtool test rules``): a case that fires
each alert and one that must not; the rules over a pool's figures keep two pools apart."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_grafana import pool_grouping

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
ALERTS_TEST = PROMETHEUS / "alerts_test.yml"
# The seed's alarms, each with the rule that raises it.
ALARMS = {
    "TierqStarvation": "oldest queued age above the tier's guarantee",
    "TierqCapsTooTight": "utilisation below 1 while jobs queue",
    "TierqCapacityRejections": "capacity rejections rising: a capacity need",
    "TierqTenantLimitRejections": "tenant_limit rejections rising: a customer conversation",
    "TierqJobsAbandoned": "abandoned jobs rising",
}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: apt-get install prometheus (Debian's package has "
                    "/usr/bin/promtool)", pytrace=False)
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_promtool_checks_the_rules() -> None:
    checked = run("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_the_rule_unit_tests_pass() -> None:
    tested = run("test", "rules", str(ALERTS_TEST))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_each_alert_has_a_case_that_fires_it_and_one_that_does_not() -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    names = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    assert set(ALARMS) <= names
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert fired == names, f"no firing case for {names - fired}"
    assert quiet == names, f"no quiet case for {names - quiet}"


def test_the_pool_alerts_aggregate_and_match_by_pool_and_name_it() -> None:
    """Every alarm reads a pool's figures and keeps the pool label: it aggregates by pool
    (never over pools), compares two families on the pool too, and a summary that names the
    tier names the pool."""
    rules = {rule["alert"]: rule for group in yaml.safe_load(ALERTS.read_text())["groups"]
             for rule in group["rules"]}
    for name, rule in rules.items():
        keeps, merges = pool_grouping(rule["expr"])
        assert not merges, f"{name} merges pools: {merges}"
        assert keeps is not False, name
        if name in ALARMS:
            assert keeps, f"{name} drops the pool label"
        summary = rule["annotations"]["summary"]
        if "$labels.tier" in summary:
            assert "$labels.pool" in summary, name
    assert "on (pool, tier)" in rules["TierqStarvation"]["expr"]


def broken_rules_fail(tmp_path: Path, broken: str) -> str:
    """Runs alerts_test.yml against ``broken`` rules: it must fail; its report."""
    assert broken != ALERTS.read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    (tmp_path / "alerts_test.yml").write_text(ALERTS_TEST.read_text())
    tested = run("test", "rules", str(tmp_path / "alerts_test.yml"))
    assert tested.returncode != 0
    return tested.stdout + tested.stderr


def test_a_broken_rule_file_fails_the_unit_tests(tmp_path: Path) -> None:
    """The suite can fail: the same tests against rules that sum a fleet-wide counter over
    replicas (a double count) do not pass."""
    broken = ALERTS.read_text().replace("max without (instance) (", "sum without (instance) (")
    assert "count a fleet-wide counter once" in broken_rules_fail(tmp_path, broken)


def test_rules_that_merge_pools_fail_the_unit_tests(tmp_path: Path) -> None:
    """Per tier over every pool (one pool's room hiding another's starvation, two pools'
    refusals added up) does not pass either."""
    broken = ALERTS.read_text().replace("(pool, tier)", "(tier)")
    report = broken_rules_fail(tmp_path, broken)
    assert "starvation fires for the pool whose tier waits too long" in report
    assert "count each pool's refusals on their own" in report
