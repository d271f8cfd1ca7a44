"""What Prometheus is told to scrape, in compose (docker/prometheus.yml) and in the chart (the
rendered ServiceMonitor), and what a scrape returns (prometheus_client's own text parser)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.tools import REPO, Rendered, pod_spec

PROMETHEUS_CONFIG = REPO / "docker" / "prometheus.yml"


@dataclass(frozen=True)
class Target:
    job: str
    host: str
    port: int
    path: str


def prometheus_targets(path: Path = PROMETHEUS_CONFIG) -> list[Target]:
    """Every static target of docker/prometheus.yml."""
    config = yaml.safe_load(path.read_text())
    targets = []
    for job in config["scrape_configs"]:
        for group in job["static_configs"]:
            for target in group["targets"]:
                host, port = target.rsplit(":", 1)
                targets.append(Target(job["job_name"], host, int(port),
                                      job.get("metrics_path", "/metrics")))
    return targets


@dataclass(frozen=True)
class MonitoredPort:
    service: str              # the Kubernetes Service
    component: str            # gateway, frontend, imageprep, engine
    port_name: str            # the Service port the ServiceMonitor endpoint names
    container_port: int       # where Prometheus connects on the pod
    path: str


def service_monitor_targets(rendered: Rendered) -> list[MonitoredPort]:
    """The (Service, port) pairs the release's ServiceMonitor selects, as the Prometheus
    Operator resolves them: Services in the release namespace matching its selector, each
    endpoint whose `port` names one of the Service's ports, scraped on the pod's target port."""
    (monitor,) = rendered.of_kind("ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    found = []
    for service in rendered.of_kind("Service"):
        labels = service["metadata"].get("labels", {})
        if not all(labels.get(k) == v for k, v in selector.items()):
            continue
        component = labels["app.kubernetes.io/component"]
        workload = next(w for w in rendered.workloads()
                        if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v
                               for k, v in service["spec"]["selector"].items()))
        container_ports = {p["name"]: p["containerPort"]
                           for c in pod_spec(workload)["containers"] for p in c.get("ports", [])}
        ports = {p["name"]: p for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            if endpoint["port"] not in ports:
                continue
            target = ports[endpoint["port"]]["targetPort"]
            number = container_ports[target] if isinstance(target, str) else target
            found.append(MonitoredPort(service["metadata"]["name"], component,
                                       endpoint["port"], number, endpoint.get("path", "/metrics")))
    return found


@dataclass(frozen=True)
class Family:
    name: str                 # without _total (prometheus_client's convention for counters)
    type: str                 # counter, gauge, histogram, summary, untyped
    samples: frozenset[str]   # sample names seen (name_total, name_bucket, ...)
    labels: frozenset[str]    # label names seen on any sample (le excluded)


def parse_families(text: str) -> dict[str, Family]:
    families = {}
    for family in text_string_to_metric_families(text):
        samples = frozenset(s.name for s in family.samples)
        labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
        families[family.name] = Family(family.name, family.type, samples, labels)
    return families


def scrape(url: str) -> dict[str, Family]:
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    return parse_families(response.text)


def series_names(families: Mapping[str, Family]) -> dict[str, Family]:
    """Every series name a query may select, mapped to its family: counters as name_total,
    histograms as name_bucket/_sum/_count, gauges as their name (also when a family has no
    sample yet, e.g. a labelled counter nothing has incremented)."""
    suffixes: dict[str, tuple[str, ...]] = {
        "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("", "_sum", "_count"), "gauge": ("",), "untyped": ("",)}
    names: dict[str, Family] = {}
    for family in families.values():
        for suffix in suffixes.get(family.type, ("",)):
            names[family.name + suffix] = family
    return names


def helios_service_of(families: Mapping[str, Any]) -> set[str]:
    """The Helios services whose own metrics a scrape contains (by their uptime gauge)."""
    return {name.removeprefix("helios_").removesuffix("_uptime_seconds")
            for name in families if name.startswith("helios_")
            and name.endswith("_uptime_seconds")}
