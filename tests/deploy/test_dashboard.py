"""The Grafana dashboard (helm/helios/dashboards/helios.json, written by
docker/grafana/dashboard.py): valid dashboard JSON laid out on Grafana's grid, PromQL that parses
and cannot silently match nothing, every metric it selects present in a real `helios run --demo`
scrape, every query answered by a real Prometheus scraping that run, and compose's Grafana
provisioning pointing at the one copy of it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.deploy import prometheus_server, promql, scrapes
from tests.deploy.tools import CHART, REPO
from tests.support.processes import HeliosRun

DASHBOARD = CHART / "dashboards" / "helios.json"
GENERATOR = REPO / "docker" / "grafana" / "dashboard.py"
PROVISIONING = REPO / "docker" / "grafana" / "provisioning"
# Labels Prometheus attaches to every scraped series (static configs, ServiceMonitors).
TARGET_LABELS = {"namespace", "job", "instance", "service", "pod", "container", "endpoint"}
# What an operator must see (the list), by metric family.
REQUIRED = {
    "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:kv_cache_usage_perc",
    "helios_engine_slots_live", "helios_engine_slots_free", "helios_engine_slots_retiring",
    "helios_engine_pages_reusable", "helios_engine_pages_cached", "helios_engine_pages_retiring",
    "vllm:prefix_cache_hits", "vllm:prefix_cache_queries", "helios_engine_prefix_reused_tokens",
    "helios_engine_launches", "helios_engine_requests_admitted",
    "helios_engine_requests_completed", "helios_engine_requests_cancelled",
    "helios_engine_requests_failed", "helios_engine_requests_rejected",
    "helios_gateway_requests", "helios_gateway_admission_capacity",
    "helios_gateway_active_requests", "helios_gateway_admission_rejected",
    "helios_frontend_active_requests", "helios_frontend_workers", "helios_frontend_workers_busy",
    "helios_imageprep_pending_images", "helios_imageprep_memory_cache_bytes",
    "helios_imageprep_memory_cache_images", "helios_imageprep_memory_cache_hits",
}


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(where, PromQL, legend) for every panel target and every variable's series selector."""
    found = [(f"panel {p['title']!r} {t['refId']}", t["expr"], t.get("legendFormat", ""))
             for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"variable {variable['name']}",
                          promql.label_values_selector(variable["query"]["query"]), ""))
    return found


def _variables(dashboard: dict[str, Any]) -> dict[str, str]:
    """Each dashboard variable as Grafana substitutes its "All" value."""
    values = {}
    for variable in dashboard["templating"]["list"]:
        values[variable["name"]] = variable.get("allValue") or variable["name"]
    return values


# ---- the file ----------------------------------------------------------------------------------

def test_json_is_the_generators_output():
    sys.path.insert(0, str(GENERATOR.parent))
    try:
        spec = importlib.util.spec_from_file_location("helios_dashboard", GENERATOR)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(GENERATOR.parent))
    assert module.OUTPUT == DASHBOARD
    assert DASHBOARD.read_text() == module.render(), \
        "stale: run python docker/grafana/dashboard.py"


def test_dashboard_model():
    dashboard = _dashboard()
    assert (dashboard["uid"], dashboard["title"]) == ("helios", "Helios")
    assert dashboard["id"] is None, "provisioned and sidecar dashboards carry no database id"
    assert dashboard["schemaVersion"] >= 39
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            assert panel["gridPos"]["w"] == 24 and panel["panels"] == []
            continue
        title = panel["title"]
        assert panel["type"] in ("timeseries", "stat"), title
        assert panel["description"], f"{title}: say what it shows"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), title
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"].strip(), title
        assert panel["fieldConfig"]["defaults"]["unit"], title
    for where, expr, _ in _queries(dashboard):
        undefined = promql.used_variables(expr) - set(variables) - set(promql.BUILTINS)
        assert not undefined, (where, undefined)


def test_panels_tile_the_grid():
    """Every panel lies inside Grafana's 24 columns, none overlaps another, and each row's
    panels sit below it and above the next row."""
    taken: dict[tuple[int, int], str] = {}
    rows = []
    for panel in _dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[x, y]}"
                taken[x, y] = panel["title"]
        if panel["type"] == "row":
            rows.append(grid["y"])
        else:
            assert rows and grid["y"] > rows[-1], f"{panel['title']} is above its row"
    assert rows == sorted(rows)


def test_every_query_parses_and_can_match():
    dashboard = _dashboard()
    variables = _variables(dashboard)
    problems = []
    for where, expr, legend in _queries(dashboard):
        analysis = promql.analyse(expr, variables, legend)
        problems += [f"{where}: {p}" for p in analysis.problems]
        for selector in analysis.selectors:
            labels = dict(selector.matchers)
            if not where.startswith("panel"):
                continue
            if labels.get("namespace") != ".*":   # "$namespace", substituted
                problems.append(f"{where}: {selector.name} ignores the namespace variable")
            if selector.name.startswith("vllm:") and "model_name" not in labels:
                problems.append(f"{where}: {selector.name} ignores the model variable")
    assert problems == []


def test_the_checks_catch_mistakes():
    """The PromQL checks are real: each classic dashboard mistake is reported."""
    variables = {"namespace": ".*"}
    for expr, legend, expected in (
        ("sum(rate(helios_engine_slots_live[5m]))", "", "not a counter"),
        ("histogram_quantile(0.9, sum(rate(x_bucket[5m])))", "", "by (le)"),
        ("sum(rate(a_total[5m])) / sum by (kind) (rate(b_total[5m]))", "", "different labels"),
        ("rate(a_total[5m]) / rate(b_total[5m])", "", "different labels"),
        ("sum(rate(a_total[5m]))", "{{kind}}", "legend"),
    ):
        problems = promql.analyse(expr, variables, legend).problems
        assert any(expected in p for p in problems), (expr, problems)
    with pytest.raises(ValueError):
        promql.analyse("sum(rate(a_total[5m])", variables)
    with pytest.raises(KeyError):
        promql.substitute('x{namespace=~"$nowhere"}', variables)


def test_dashboard_covers_what_operators_need():
    dashboard = _dashboard()
    variables = _variables(dashboard)
    used = {s.name for _, expr, legend in _queries(dashboard)
            for s in promql.analyse(expr, variables, legend).selectors}
    families = {name.removesuffix(suffix) for name in used
                for suffix in ("_total", "_bucket", "_sum", "_count", "") if name.endswith(suffix)}
    assert sorted(REQUIRED - families) == []


# ---- against a real scrape ---------------------------------------------------------------------

CHAT = {"model": "helios-demo", "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4, "ignore_eos": True}


def _traffic(run: HeliosRun) -> None:
    """One chat completion and one request for a model that does not exist."""
    assert httpx.post(run.url + "/v1/chat/completions", json=CHAT, timeout=120) \
        .status_code == 200
    missing = httpx.post(run.url + "/v1/chat/completions",
                         json={**CHAT, "model": "no-such-model"}, timeout=60)
    assert missing.status_code == 404


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus, started before the demo so its first scrapes come sooner (None when
    Debian's prometheus package is missing)."""
    if prometheus_server.binary() is None:
        yield None
        return
    with prometheus_server.run_prometheus(tmp_path_factory.mktemp("prometheus")) as server:
        yield server


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, demo_core, prometheus):
    with HeliosRun.start_demo(tmp_path_factory.mktemp("dashboard")) as run:
        if prometheus is not None:
            prometheus.scrape(run.url.removeprefix("http://"))
        _traffic(run)
        yield run


@pytest.fixture(scope="module")
def demo_scrape(demo_run) -> dict[str, scrapes.Family]:
    """The gateway's /metrics of `helios run --demo` (every service's metrics, one scrape)."""
    return scrapes.scrape(demo_run.url + "/metrics")


def test_every_query_selects_metrics_a_real_scrape_exposes(demo_scrape):
    dashboard = _dashboard()
    variables = _variables(dashboard)
    series = scrapes.series_names(demo_scrape)
    assert scrapes.helios_service_of(demo_scrape) == {"gateway", "frontend", "engine",
                                                      "imageprep"}
    problems = []
    for where, expr, legend in _queries(dashboard):
        analysis = promql.analyse(expr, variables, legend)
        selected = []
        for selector in analysis.selectors:
            family = series.get(selector.name)
            if family is None:
                problems.append(f"{where}: {selector.name} is not in the scrape")
                continue
            selected.append(family)
            if selector.in_rate and family.type not in ("counter", "histogram"):
                problems.append(f"{where}: rate() over {selector.name}, a {family.type}")
            if family.samples:
                unknown = {k for k, _ in selector.matchers} - family.labels - TARGET_LABELS
                if unknown:
                    problems.append(f"{where}: {selector.name} has no label {sorted(unknown)}")
        # labels the query groups by or names in its legend exist on what it selects
        if selected and all(f.samples for f in selected) and analysis.output_labels:
            have = set().union(*(f.labels for f in selected)) | TARGET_LABELS
            if not analysis.output_labels <= have:
                problems.append(f"{where}: groups by {sorted(analysis.output_labels - have)}, "
                                "which no selected series has")
    assert problems == []


def test_scrape_check_is_real(demo_scrape):
    series = scrapes.series_names(demo_scrape)
    assert "vllm:generation_tokens_total" in series
    assert "vllm:generation_tokens" not in series, "counters are selected as name_total"
    assert "vllm:time_to_first_token_seconds_bucket" in series
    assert "vllm:time_to_first_token_seconds" not in series
    assert series["helios_engine_slots_live"].type == "gauge"
    assert {"route", "status"} <= series["helios_gateway_requests_total"].labels


@pytest.mark.skipif(prometheus_server.binary() is None,
                    reason="needs Debian's prometheus package (.ci/run installs it)")
def test_every_query_runs_in_a_real_prometheus(demo_run, demo_scrape, prometheus):
    """Prometheus scrapes the demo's gateway every second, with traffic between scrapes; then
    every query runs as Grafana sends it. Prometheus accepts each one, and each query over
    series the scrape has returns data (an empty panel here is a broken panel)."""
    dashboard = _dashboard()
    prometheus.wait_for_samples("helios_gateway_uptime_seconds", 2)
    _traffic(demo_run)
    prometheus.wait_for_samples("helios_gateway_uptime_seconds", 4)
    variables = {**_variables(dashboard), "__rate_interval": "20s"}
    series = scrapes.series_names(demo_scrape)
    empty = []
    for where, expr, legend in _queries(dashboard):
        result = prometheus.query(promql.substitute(expr, variables))["result"]  # raises if refused
        selectors = promql.analyse(expr, variables, legend).selectors
        # empty is fine only for a filter on a label value the traffic never produced
        # (status="429") or a family with no sample yet (no admission refusal happened)
        unfiltered = all(value == ".*" for s in selectors for _, value in s.matchers)
        sampled = all(series.get(s.name) and series[s.name].samples for s in selectors)
        if not result and unfiltered and sampled:
            empty.append(where)
    assert empty == []
    assert prometheus.query("sum(rate(helios_engine_no_such_metric_total[20s]))")["result"] == []
    with pytest.raises(AssertionError, match="parse error"):
        prometheus.query("sum(rate(helios_engine_generation_tokens_total[20s])")


@pytest.mark.skipif(prometheus_server.binary("promtool") is None,
                    reason="needs Debian's prometheus package (.ci/run installs it)")
def test_compose_prometheus_config_is_valid(tmp_path):
    """promtool accepts docker/prometheus.yml, and rejects it with a misspelt key."""
    import subprocess

    def check(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run([prometheus_server.binary("promtool") or "", "check", "config",
                               str(path)], capture_output=True, text=True, timeout=60)

    result = check(scrapes.PROMETHEUS_CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "prometheus.yml"
    broken.write_text(scrapes.PROMETHEUS_CONFIG.read_text().replace("metrics_path:",
                                                                    "metric_path:", 1))
    assert check(broken).returncode != 0


# ---- compose provisions it ---------------------------------------------------------------------

def _mounts(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["target"]: v for v in service.get("volumes", [])}


def test_compose_provisions_the_one_dashboard(compose_gpu, compose_cpu):
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "helios.yaml").read_text())
    prometheus = yaml.safe_load((REPO / "docker" / "prometheus.yml").read_text())
    for project in (compose_gpu, compose_cpu):
        grafana = project["services"]["grafana"]
        mounts = _mounts(grafana)
        assert Path(mounts["/etc/grafana/provisioning"]["source"]) == PROVISIONING
        assert all(m.get("read_only") for t, m in mounts.items() if t.startswith("/etc/"))
        (provider,) = providers["providers"]
        folder = provider["options"]["path"]
        assert Path(mounts[folder]["source"]) == DASHBOARD.parent, \
            "compose mounts the chart's copy: one file, no drift"
        home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
        assert home == f"{folder}/{DASHBOARD.name}"
        (source,) = datasources["datasources"]
        host, port = source["url"].removeprefix("http://").rsplit(":", 1)
        assert host in project["services"] and port in project["services"][host]["expose"]
        assert source["type"] == "prometheus" and source["isDefault"] is True
        # $__rate_interval covers at least one scrape only if Grafana knows the interval
        assert source["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]
        assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
        assert grafana["read_only"] is True
        # with a read-only root, plugin preinstall must be off or the datasource plugin may go
        assert grafana["environment"]["GF_PLUGINS_PREINSTALL_DISABLED"] == "true"
        assert grafana["environment"]["GF_LOG_MODE"] == "console"
