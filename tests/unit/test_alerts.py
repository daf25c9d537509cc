"""The alerting rules (deploy/prometheus/alerts.yml) pass ``promtool check rules`` and their
unit tests (deploy/prometheus/alerts_test.yml, ``promtool test rules``): a case that fires
each alert and one that must not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

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


def test_a_broken_rule_file_fails_the_unit_tests(tmp_path: Path) -> None:
    """The suite can fail: the same tests against rules that sum a fleet-wide counter over
    replicas (a double count) do not pass."""
    broken = ALERTS.read_text().replace("max without (instance) (", "sum without (instance) (")
    assert broken != ALERTS.read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    (tmp_path / "alerts_test.yml").write_text(ALERTS_TEST.read_text())
    tested = run("test", "rules", str(tmp_path / "alerts_test.yml"))
    assert tested.returncode != 0
    assert "count a fleet-wide counter once" in tested.stdout + tested.stderr
