"""helm/helios observability: every pod's /metrics where the ServiceMonitor (or annotation
discovery) looks, NetworkPolicies that let only the configured scrapers in, and the Grafana
dashboard ConfigMap carrying dashboards/helios.json byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.deploy import scrapes, topology
from tests.deploy.conftest import SCENARIOS
from tests.deploy.test_chart import HELIOS, _main, _workload, ingress_rules
from tests.deploy.tools import CHART, Rendered, pod_spec, render_chart

GRPC = ("frontend", "imageprep", "engine")
MONITORING = [{"namespaceSelector": {"matchLabels": {
    "kubernetes.io/metadata.name": "monitoring"}}}]
DASHBOARD = CHART / "dashboards" / "helios.json"


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_every_grpc_service_serves_metrics_on_its_named_port(scenario):
    name, rendered = scenario
    for service in GRPC:
        container = _main(rendered, service)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert _env(container)["HELIOS_METRICS_LISTEN"] == f"0.0.0.0:{ports['metrics']}"
        assert ports["metrics"] == topology.METRICS_PORT, (name, service)
    assert "HELIOS_METRICS_UPSTREAMS" not in _env(_main(rendered, "gateway")), \
        "each pod is scraped on its own: the gateway must not append the others' metrics"


@pytest.mark.parametrize("name", ["everything", "observability"])
def test_service_monitor_scrapes_each_service_once(renders, name):
    rendered = renders[name]
    (monitor,) = rendered.of_kind("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}
    interval = SCENARIOS[name]["metrics"]["serviceMonitor"].get("interval", "15s")
    assert {e["interval"] for e in monitor["spec"]["endpoints"]} == {interval}
    targets = scrapes.service_monitor_targets(rendered)
    found = {t.component: (t.port_name, t.container_port, t.path) for t in targets}
    assert len(targets) == len(found) == 4, targets
    gateway_port = _main(rendered, "gateway")["ports"][0]["containerPort"]
    assert found["gateway"] == ("http", gateway_port, "/metrics")
    for service in GRPC:
        assert found[service] == ("metrics", topology.METRICS_PORT, "/metrics")
    if name == "everything":
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert renders["default"].of_kind("ServiceMonitor") == []


def test_metrics_port_follows_the_value():
    rendered = render_chart({"metrics": {"port": 9400, "serviceMonitor": {"enabled": True}}})
    for service in GRPC:
        assert _env(_main(rendered, service))["HELIOS_METRICS_LISTEN"] == "0.0.0.0:9400"
    ports = {t.component: t.container_port for t in scrapes.service_monitor_targets(rendered)}
    assert [ports[s] for s in GRPC] == [9400] * 3


def test_scrape_annotations(renders):
    rendered = renders["observability"]
    for service in HELIOS:
        template = _workload(rendered, service)["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        port = topology.default_port("gateway") if service == "gateway" else topology.METRICS_PORT
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port), service
        assert annotations["prometheus.io/path"] == "/metrics"
        served = {p["containerPort"] for p in pod_spec(_workload(rendered, service))
                  ["containers"][0]["ports"]}
        assert port in served
    for service in HELIOS:
        annotations = _workload(renders["default"], service)["spec"]["template"]["metadata"] \
            .get("annotations", {})
        assert not any(k.startswith("prometheus.io/") for k in annotations)


# ---- NetworkPolicies: scrapers reach the metrics ports, nothing else changes -------------------

def _peers(rendered: Rendered, service: str, port: str) -> list[dict[str, Any]]:
    return [peer for rule in ingress_rules(rendered, service, port)
            for peer in rule.get("from", [{"anyone": True}])]


def test_scrapers_reach_the_metrics_ports(renders):
    for name, scrapers in (("default", MONITORING),
                           ("observability",
                            SCENARIOS["observability"]["metrics"]["networkPolicy"]["from"])):
        rendered = renders[name]
        for service in GRPC:
            assert _peers(rendered, service, "metrics") == scrapers, (name, service)
            # the scrapers get the metrics port only: the gRPC API stays closed to them
            assert all(p not in _peers(rendered, service, "grpc") for p in scrapers)
    # a gateway restricted to the ingress controller still lets Prometheus scrape it
    gateway = _peers(renders["observability"], "gateway", "http")
    assert gateway == [*SCENARIOS["observability"]["gateway"]["networkPolicy"]["from"],
                       *SCENARIOS["observability"]["metrics"]["networkPolicy"]["from"]]
    assert _peers(renders["default"], "gateway", "http") == [{"anyone": True}]


def test_no_scrapers_closes_the_metrics_ports():
    rendered = render_chart({"metrics": {"networkPolicy": {"from": []}}})
    for service in GRPC:
        assert _peers(rendered, service, "metrics") == [], service
    assert render_chart({"networkPolicy": {"enabled": False}}).of_kind("NetworkPolicy") == []


# ---- the Grafana dashboard ConfigMap ----------------------------------------------------------

def test_dashboard_config_map_ships_the_one_dashboard(renders):
    (config_map,) = renders["everything"].of_kind("ConfigMap")
    assert config_map["metadata"]["name"] == "helios-dashboard"
    assert config_map["metadata"]["namespace"] == "llm"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {"helios.json": DASHBOARD.read_text()}
    assert json.loads(config_map["data"]["helios.json"])["uid"] == "helios"
    assert renders["default"].of_kind("ConfigMap") == []


def test_dashboard_config_map_placement(renders):
    (config_map,) = renders["observability"].of_kind("ConfigMap")
    assert config_map["metadata"]["namespace"] == "grafana"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Helios"}
    # a sidecar watching another label: Helm merges maps, so null drops the default one
    relabelled = render_chart({"metrics": {"grafanaDashboard": {
        "enabled": True, "labels": {"dashboards": "helios", "grafana_dashboard": None}}}})
    (config_map,) = relabelled.of_kind("ConfigMap")
    assert config_map["metadata"]["labels"]["dashboards"] == "helios"
    assert "grafana_dashboard" not in config_map["metadata"]["labels"]


def test_dashboard_fits_a_config_map():
    # Kubernetes caps a ConfigMap at 1 MiB; the sidecar reads it whole
    assert DASHBOARD.stat().st_size < 512 * 1024


@pytest.mark.parametrize("bad, message", [
    ({"metrics": {"port": 0}}, "port"),
    ({"metrics": {"grafanaDashboard": {"enabled": "yes"}}}, "enabled"),
    ({"metrics": {"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}}}, "grafana_dashboard"),
    ({"metrics": {"networkPolicy": {"from": {"namespaceSelector": {}}}}}, "from"),
    ({"metrics": {"scrapeAnotations": True}}, "scrapeAnotations"),
])
def test_schema_rejects_bad_metrics_values(bad, message):
    with pytest.raises(Exception, match=message):
        render_chart(bad)


def test_notes_say_where_metrics_are(renders):
    assert "port 9100" in renders["default"].notes
    assert "ServiceMonitor" not in renders["default"].notes
    notes = renders["observability"].notes
    assert "ServiceMonitor helios " in notes
    assert "ConfigMap helios-dashboard in namespace grafana" in notes
