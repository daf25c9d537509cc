"""deploy/grafana: the dashboard JSON parses, each panel's PromQL parses and reads metrics
/metrics exports (tests/integration/test_fleet_metrics.py checks the same names against a
real scrape), and compose starts Grafana provisioned with the compose Prometheus and it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from tests.unit.test_compose import environment, exposed_metrics, mounted, services

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "tierq.json"
HISTOGRAMS = ("tierq_queue_wait_seconds", "tierq_dispatch_latency_seconds")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries() -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard()["panels"]
            for target in panel.get("targets", [])]


def known_metrics() -> set[str]:
    names = exposed_metrics()
    for name in HISTOGRAMS:
        assert name in names
        names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    return names | {"up"}


def test_the_dashboard_parses_and_every_panel_reads_metrics_that_exist() -> None:
    board = dashboard()
    assert board["uid"] == "tierq" and board["panels"]
    queries = panel_queries()
    assert len(queries) >= 10
    known = known_metrics()
    for title, expr in queries:
        promql_parser.parse(expr)  # raises on a syntax error
        used = set(re.findall(r"\btierq_[a-z_]+", expr))
        if re.search(r"\bup\{", expr):
            used.add("up")
        assert used, f"{title}: reads no metric"
        assert used <= known, f"{title}: unknown {used - known}"


def test_the_dashboard_shows_what_the_dashboard_page_shows() -> None:
    """The page's figures: per tier queued against the bound, the oldest job against the
    tier's wait, recent waits, refusals by cause, the tenant cap; the pool's jobs in flight
    against capacity, its utilisation and service rate."""
    exprs = " ".join(expr for _, expr in panel_queries())
    for name in ("tierq_queue_depth", "tierq_queue_bound", "tierq_queue_oldest_age_seconds",
                 "tierq_queue_max_wait_seconds", "tierq_queue_wait_recent_seconds",
                 "tierq_rejections_total", "tierq_tenant_cap", "tierq_pool_inflight",
                 "tierq_pool_capacity", "tierq_pool_utilisation", "tierq_pool_service_rate"):
        assert name in exprs, name


def test_every_panel_uses_the_provisioned_data_source() -> None:
    (source,) = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"]
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"], panel["title"]


def test_compose_starts_grafana_provisioned_with_prometheus_and_the_dashboard() -> None:
    grafana = services()["grafana"]
    provisioning = mounted(grafana, "/etc/grafana/provisioning")
    assert provisioning == GRAFANA / "provisioning"
    (source,) = yaml.safe_load(
        (provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "prometheus" in services() and "9090" in " ".join(services()["prometheus"]["ports"])
    (provider,) = yaml.safe_load(
        (provisioning / "dashboards" / "tierq.yml").read_text())["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    assert mounted(grafana, f"{path}/tierq.json") == DASHBOARD
    env = environment(grafana)
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == f"{path}/tierq.json"
    # View-only, nothing to log in with, on the host's loopback only.
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert env["GF_AUTH_DISABLE_LOGIN_FORM"] == "true"
    assert not any("PASSWORD" in name for name in env)
    assert all(port.startswith("127.0.0.1:") for port in grafana["ports"])
