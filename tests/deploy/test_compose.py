"""docker/compose.yaml: valid for Docker Compose v2 in both profiles, GPU only where it belongs,
real healthchecks, drains that fit their stop grace, only Envoy published (Prometheus and Grafana
on loopback), Prometheus scraping every Helios service where it serves /metrics, and Envoy's
config (docker/envoy.yaml) agreeing with compose. Grafana's provisioning: tests/deploy/
test_dashboard.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy import scrapes, topology
from tests.deploy.tools import REPO, compose, compose_binary

ENVOY_CONFIG = REPO / "docker" / "envoy.yaml"
PROMETHEUS_CONFIG = REPO / "docker" / "prometheus.yml"


def _seconds(duration: str) -> float:
    total = 0.0
    for value, unit in re.findall(r"([\d.]+)(ms|h|m|s)", duration):
        total += float(value) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def _gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return [d for d in reservations.get("devices", []) if "gpu" in d.get("capabilities", [])]


def test_validates_in_both_profiles_and_with_settings():
    for args, env in (((), {}), (("--profile=cpu",), {}),
                      ((), {"HELIOS_MODEL": "qwen3-8b", "HELIOS_MODELS_DIR": "/srv/cores",
                            "HELIOS_GPUS": "all", "HELIOS_API_KEY": "k", "HELIOS_TAG": "1.2"})):
        result = compose(*args, "config", "--quiet", env=env)
        assert result.returncode == 0, result.stderr


def test_a_broken_file_is_caught(tmp_path):
    """The validator is real: an unknown key fails `docker compose config`."""
    broken = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    broken["services"]["gateway"]["healthcheck"]["retrys"] = 3
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = subprocess.run([str(compose_binary()), "-f", str(path), "config", "--quiet"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0 and "retrys" in result.stderr, result.stderr
    del broken["services"]["gateway"]["healthcheck"]["retrys"]
    path.write_text(yaml.safe_dump(broken))
    result = subprocess.run([str(compose_binary()), "-f", str(path), "config", "--quiet"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_profiles(compose_gpu, compose_cpu):
    assert set(compose_gpu["services"]) == {"envoy", "gateway", "frontend", "imageprep",
                                            "engine", "redis", "prometheus", "grafana"}
    assert set(compose_cpu["services"]) == {"envoy", "gateway", "frontend-cpu", "imageprep",
                                            "engine-cpu", "demo-model", "redis", "prometheus",
                                            "grafana"}
    (device,) = _gpu_devices(compose_gpu["services"]["engine"])
    assert device["driver"] == "nvidia" and device["count"] == 1
    assert all(not _gpu_devices(s) for s in compose_cpu["services"].values()), "cpu needs no GPU"
    assert [n for n, s in compose_gpu["services"].items() if _gpu_devices(s)] == ["engine"]


def test_only_the_edge_is_published(compose_gpu, compose_cpu):
    for project in (compose_gpu, compose_cpu):
        published = {n: s["ports"] for n, s in project["services"].items() if s.get("ports")}
        assert set(published) == {"envoy", "prometheus", "grafana"}
        for monitoring in ("prometheus", "grafana"):
            assert all(p.get("host_ip") == "127.0.0.1" for p in published[monitoring])


def test_nothing_runs_as_root(compose_gpu, compose_cpu):
    for project in (compose_gpu, compose_cpu):
        for name, service in project["services"].items():
            user = str(service.get("user", ""))
            assert user and user.split(":")[0] not in ("0", "root"), name
            assert service.get("cap_drop") == ["ALL"], name
            assert "no-new-privileges:true" in service.get("security_opt", []), name


def test_healthchecks_and_stop_grace(compose_gpu, compose_cpu):
    for project in (compose_gpu, compose_cpu):
        topo = topology.from_compose(project)
        for service, name in topo.sources.items():
            definition = project["services"][name]
            script = "\n".join(definition["healthcheck"]["test"])
            if service == "gateway":
                assert "/health" in script
            else:
                assert "HealthCheckRequest" in script and "SERVING" in script, name
            drain = float(topo.services[service].env["HELIOS_GRACE_PERIOD_S"])
            assert _seconds(definition["stop_grace_period"]) > drain + 5, name
            assert definition["read_only"] is True, name
        engine = project["services"][topo.sources["engine"]]
        assert _seconds(engine["healthcheck"]["start_period"]) >= 600, "long model loads"
        redis = project["services"]["redis"]
        assert redis["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]


def test_model_volumes(compose_gpu, compose_cpu):
    mounts = {}
    for name in ("frontend", "engine"):
        (volume,) = compose_gpu["services"][name]["volumes"]
        assert volume["type"] == "bind" and volume["target"] == "/models" and volume["read_only"]
        mounts[name] = volume["source"]
        (volume,) = compose_cpu["services"][f"{name}-cpu"]["volumes"]
        assert (volume["type"], volume["source"], volume["target"], volume["read_only"]) == \
            ("volume", "demo-models", "/models", True)
        assert compose_cpu["services"][f"{name}-cpu"]["depends_on"]["demo-model"]["condition"] \
            == "service_completed_successfully"
    assert mounts["frontend"] == mounts["engine"] == str(REPO / "docker" / "models")
    (volume,) = compose_cpu["services"]["demo-model"]["volumes"]
    assert (volume["source"], volume["target"]) == ("demo-models", "/target")


def test_prometheus_scrapes_services_that_exist(compose_gpu, compose_cpu):
    targets = scrapes.prometheus_targets()
    for project in (compose_gpu, compose_cpu):
        topo = topology.from_compose(project)
        for target in targets:
            compose_name = topo.sources.get(topo.hosts.get(target.host, ""), target.host)
            assert compose_name in project["services"], target
            assert str(target.port) in project["services"][compose_name].get("expose", []), target


def test_prometheus_scrapes_every_helios_service_once(compose_gpu, compose_cpu):
    """Each service is a target exactly where it serves /metrics (the gateway on its HTTP port,
    the gRPC services on HELIOS_METRICS_LISTEN), and the gateway does not also append the
    others' metrics (HELIOS_METRICS_UPSTREAMS is `helios run`'s mode): nothing counts twice."""
    targets = scrapes.prometheus_targets()
    for project in (compose_gpu, compose_cpu):
        topo = topology.from_compose(project)
        configs = topo.configs()
        for service, config in configs.items():
            host, port = topo.metrics_address(service, config) or ("", 0)
            assert host == "0.0.0.0", (service, "metrics must be reachable from Prometheus")
            if service != "gateway":
                assert port == topology.METRICS_PORT, service
            scraped = [t for t in targets if topo.hosts.get(t.host) == service]
            assert [(t.port, t.path) for t in scraped] == [(port, "/metrics")], service
            assert scraped[0].job == f"helios-{service}"
        assert configs["gateway"].metrics_upstreams == ()


# ---- docker/envoy.yaml (written with the gateway) ------------------------------------------------

def _envoy() -> dict[str, Any]:
    assert ENVOY_CONFIG.is_file(), "compose mounts docker/envoy.yaml: it must exist"
    return yaml.safe_load(ENVOY_CONFIG.read_text())


def _walk(node: Any):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def test_envoy_listener_is_the_published_port(compose_gpu):
    envoy = _envoy()
    listener_ports = {listener["address"]["socket_address"]["port_value"]
                      for listener in envoy["static_resources"]["listeners"]}
    published = {int(p["target"]) for p in compose_gpu["services"]["envoy"]["ports"]}
    assert published <= listener_ports


def test_envoy_routes_to_the_gateway(compose_gpu):
    envoy = _envoy()
    endpoints = {(n["socket_address"]["address"], n["socket_address"]["port_value"])
                 for n in _walk(envoy["static_resources"]["clusters"]) if "socket_address" in n}
    assert endpoints == {("gateway", topology.default_port("gateway"))}, endpoints
    # SSE streams run for minutes: no route may cut them at Envoy's 15 s default
    routes = [n for n in _walk(envoy) if "route" in n and isinstance(n["route"], dict)
              and "cluster" in n["route"]]
    assert routes
    for route in routes:
        timeout = _seconds(route["route"].get("timeout", "15s"))   # 0s: no limit
        assert timeout == 0 or timeout >= 600, route


def test_gateway_outlives_envoys_idle_upstream_connections():
    """Envoy reuses an idle pooled connection to the gateway for up to its idle_timeout; the
    gateway must not close it first (a close racing a reuse fails that request)."""
    from gateway.config import GatewayConfig

    envoy = _envoy()
    idle = [_seconds(n["idle_timeout"]) for n in _walk(envoy["static_resources"]["clusters"])
            if "idle_timeout" in n]
    assert idle, "the gateway cluster should bound its idle pooled connections"
    assert GatewayConfig().keep_alive_s > max(idle)


def test_envoy_admin_is_scraped():
    envoy = _envoy()
    admin_port = envoy.get("admin", {}).get("address", {}).get("socket_address", {}) \
        .get("port_value")
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    envoy_targets = [t for job in config["scrape_configs"] if job["job_name"] == "envoy"
                     for g in job["static_configs"] for t in g["targets"]]
    assert envoy_targets == [f"envoy:{admin_port}"]


def test_dot_env_documents_every_variable():
    """Every ${VARIABLE} compose reads is documented in docker/.env."""
    text = (REPO / "docker" / "compose.yaml").read_text()
    used = set(re.findall(r"\$\{(\w+)", text))
    documented = set(re.findall(r"^#?\s*(\w+)=", (REPO / "docker" / ".env").read_text(), re.M))
    assert used - documented == set()
    assert Path(REPO / "docker" / ".env").read_text().count("COMPOSE_PROFILES=gpu") == 1
