"""deploy/grafana: the dashboard JSON parses, each panel's PromQL parses and reads metrics
/metrics exports (tests/integration/test_fleet_metrics.py checks the same names against a
real scrape), keeps two pools' series apart, and compose starts Grafana provisioned with the
compose Prometheus and it."""

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
# The families of jobs/fleet/metrics.py without a ``pool`` label; every other tierq family is
# labelled with its pool (the histograms' _bucket, _count and _sum included).
UNPOOLED = frozenset({"tierq_backend_up", "tierq_jobs_pruned_total", "tierq_jobs_abandoned_total"})


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


def pool_grouping(expr: str) -> tuple[bool | None, list[str]]:
    """Whether the series ``expr`` yields keep the ``pool`` label (None: it reads no pool's
    family), and each place where it merges pools: an aggregation over a pool's series that
    is neither ``by`` pool nor ``without`` it, or two pools' series matched on labels
    without the pool (``on (tier)``, ``ignoring (pool)``)."""
    merges: list[str] = []
    return _pooled(promql_parser.parse(expr), merges), merges


def _either(found: list[bool | None]) -> bool | None:
    return True if True in found else False if False in found else None


def _pooled(node: Any, merges: list[str]) -> bool | None:
    parser = promql_parser
    if isinstance(node, parser.VectorSelector):
        name = node.name or ""
        return True if name.startswith("tierq_") and name not in UNPOOLED else None
    if isinstance(node, parser.MatrixSelector):
        return _pooled(node.vector_selector, merges)
    if isinstance(node, parser.ParenExpr | parser.UnaryExpr | parser.SubqueryExpr):
        return _pooled(node.expr, merges)
    if isinstance(node, parser.Call):
        return _either([_pooled(arg, merges) for arg in node.args])
    if isinstance(node, parser.AggregateExpr):
        inner, grouping = _pooled(node.expr, merges), node.modifier
        if not inner:
            return inner
        kept = grouping is not None and (
            ("pool" in grouping.labels) == (grouping.type == parser.AggModifierType.By))
        if not kept:
            merges.append(f"{node.op}{f' {grouping}' if grouping else ''} over pools")
        return kept
    if isinstance(node, parser.BinaryExpr):
        lhs, rhs = _pooled(node.lhs, merges), _pooled(node.rhs, merges)
        op, matching = str(node.op), node.modifier.matching if node.modifier else None
        keeps_pool = matching is None or (
            ("pool" in matching.labels) == (matching.type == parser.LabelModifierType.Include))
        if lhs and rhs and not keeps_pool:
            merges.append(f"{op} {matching} across pools")
        if op in ("and", "unless"):
            return lhs
        if op == "or":
            return _either([lhs, rhs])
        card = node.modifier.card if node.modifier else None
        if card == parser.VectorMatchCardinality.ManyToOne:
            return lhs
        if card == parser.VectorMatchCardinality.OneToMany:
            return rhs
        side = lhs if lhs is not None else rhs  # one to one: on/ignoring decide the labels
        return side and keeps_pool if side is not None else None
    return None  # a number or string literal


def test_pool_grouping_finds_what_merges_pools() -> None:
    assert pool_grouping("max by (pool) (tierq_pool_utilisation)") == (True, [])
    assert pool_grouping("max without (instance) (tierq_pool_utilisation)") == (True, [])
    assert pool_grouping("min by (backend) (tierq_backend_up)") == (None, [])
    assert pool_grouping('count(up{job="tierq-api"} == 1)') == (None, [])
    for merged in ("max(tierq_pool_utilisation)", "max by (tier) (tierq_queue_depth)",
                   "max without (pool) (tierq_queue_depth)",
                   "histogram_quantile(0.5, sum by (tier, le) ("
                   "rate(tierq_dispatch_latency_seconds_bucket[5m])))",
                   "max by (pool, tier) (tierq_queue_oldest_age_seconds) > on (tier) "
                   "max by (pool, tier) (tierq_queue_max_wait_seconds)",
                   "max by (pool) (tierq_pool_utilisation) < 1 "
                   "and on () max by (pool) (tierq_pool_capacity) > 0"):
        keeps, merges = pool_grouping(merged)
        assert merges and keeps is not None, merged
    assert pool_grouping(
        "max by (pool, tier) (tierq_queue_oldest_age_seconds) > on (pool, tier) "
        "max by (pool, tier) (tierq_queue_max_wait_seconds)") == (True, [])


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


def test_no_panel_merges_two_pools_and_each_pools_legend_names_it() -> None:
    """Every pool's figures are its own series (aggregated by pool, never over pools), and
    the legend of each names its pool; figures without a pool name none."""
    pooled = 0
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            keeps, merges = pool_grouping(target["expr"])
            assert not merges, f"{panel['title']}: {target['expr']} merges pools: {merges}"
            named = "{{pool}}" in target["legendFormat"]
            assert named == bool(keeps), f"{panel['title']}: {target['legendFormat']!r}"
            pooled += bool(keeps)
    assert pooled >= 15


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
