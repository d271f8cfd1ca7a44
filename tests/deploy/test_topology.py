"""Compose and the chart describe the same topology as `helios run`, and it really serves.

The static checks load every service's settings with the service's own config loader and
resolve each `*_address` to the service behind it; the live checks start the compose `cpu`
profile and the chart's rendering as local processes with exactly those settings (images'
left-out packages unimportable) and wait for the gateway's /health, which is 200 only once the
whole chain is SERVING.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.deploy import dockerfiles, localrun, scrapes, topology
from tests.deploy.tools import pod_spec, render_chart

pytestmark = pytest.mark.timeout(240)


def _edges(topo: topology.Topology) -> set[tuple[str, str, str]]:
    return {(e.caller, e.setting, e.callee) for e in topo.edges()}


@pytest.fixture(scope="module")
def launcher_edges(tmp_path_factory) -> set[tuple[str, str, str]]:
    return _edges(topology.from_launcher(tmp_path_factory.mktemp("run")))


def test_launcher_topology_is_the_documented_one(launcher_edges):
    assert launcher_edges == {
        ("gateway", "frontend_address", "frontend"),
        ("frontend", "engine_address", "engine"),
        ("frontend", "imageprep_address", "imageprep"),
        ("engine", "imageprep_address", "imageprep"),
    }


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_compose_matches_helios_run(profile, compose_gpu, compose_cpu, launcher_edges):
    topo = topology.from_compose(compose_gpu if profile == "gpu" else compose_cpu)
    assert set(topo.services) == set(dockerfiles.SERVICES)
    assert _edges(topo) == launcher_edges
    for name, spec in topo.services.items():
        assert spec.unknown_settings() == [], f"{name}: settings it does not have"
    configs = topo.configs()
    assert configs["frontend"].model == configs["engine"].model, "one core for both"


def test_chart_matches_helios_run(scenario, launcher_edges):
    name, rendered = scenario
    topo = topology.from_chart(rendered)
    assert set(topo.services) == set(dockerfiles.SERVICES), name
    assert _edges(topo) == launcher_edges, name
    for service, spec in topo.services.items():
        assert spec.unknown_settings() == [], f"{name}/{service}: settings it does not have"
    configs = topo.configs()
    assert configs["frontend"].model == configs["engine"].model


def test_ports_agree_everywhere(compose_gpu, compose_cpu, renders):
    """A service listens on the same port in its image, compose, the chart and its own default."""
    topologies = {"compose gpu": topology.from_compose(compose_gpu),
                  "compose cpu": topology.from_compose(compose_cpu),
                  **{f"chart {k}": topology.from_chart(v) for k, v in renders.items()}}
    documented = {"gateway": 8000, "frontend": 50051, "engine": 50052, "imageprep": 50053}
    for service, expected in documented.items():
        assert topology.default_port(service) == expected, f"{service}'s own default changed"
        for where, topo in topologies.items():
            config = topo.services[service].config()
            assert topo.listen_address(service, config) == ("0.0.0.0", expected), (where, service)
        for target in ((None, "engine-cpu") if service == "engine" else (None,)):
            stage = dockerfiles.stage(dockerfiles.dockerfile_of(service), target)
            assert stage.exposed[0] == expected, (service, target)


def test_metrics_ports_agree_everywhere(compose_gpu, compose_cpu, renders):
    """Prometheus finds every service at the same place in its image, compose and the chart:
    the gateway on its HTTP port, each gRPC service on port 9100 (HELIOS_METRICS_LISTEN,
    EXPOSEd by its image, `expose`d in compose, the container and Service port `metrics`)."""
    topologies = {"compose gpu": topology.from_compose(compose_gpu),
                  "compose cpu": topology.from_compose(compose_cpu),
                  **{f"chart {k}": topology.from_chart(v) for k, v in renders.items()}}
    expected = {s: ("0.0.0.0", topology.METRICS_PORT) for s in ("frontend", "imageprep", "engine")}
    expected["gateway"] = ("0.0.0.0", topology.default_port("gateway"))
    for where, topo in topologies.items():
        for service, config in topo.configs().items():
            assert topo.metrics_address(service, config) == expected[service], (where, service)
    for service in ("frontend", "imageprep", "engine"):
        for target in ((None, "engine-cpu") if service == "engine" else (None,)):
            stage = dockerfiles.stage(dockerfiles.dockerfile_of(service), target)
            assert topology.METRICS_PORT in stage.exposed, (service, target)
        for project in (compose_gpu, compose_cpu):
            name = topology.from_compose(project).sources[service]
            assert str(topology.METRICS_PORT) in project["services"][name]["expose"], name
        for scenario, rendered in renders.items():
            workload = rendered.get("Deployment", f"helios-{service}")
            container = pod_spec(workload)["containers"][0]
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert ports["metrics"] == topology.METRICS_PORT, (scenario, service)
            svc = rendered.get("Service", f"helios-{service}")
            (port,) = [p for p in svc["spec"]["ports"] if p["name"] == "metrics"]
            assert (port["port"], port["targetPort"]) == (topology.METRICS_PORT, "metrics")


@pytest.mark.slow
def test_compose_cpu_profile_serves(tmp_path, compose_cpu, demo_models, redis_url):
    topo = topology.from_compose(compose_cpu)
    images = {s: s for s in topo.services}     # each service runs its own image's packages
    with localrun.run_locally(topo, tmp_path, models_dir=demo_models, redis_url=redis_url,
                              images=images) as deployment:
        deployment.processes["gateway"].wait_http(deployment.url + "/health", timeout=120)
        # Every Helios target of docker/prometheus.yml answers with its service's own metrics.
        for target in scrapes.prometheus_targets():
            service = topo.hosts.get(target.host)
            if service is None:
                continue   # Envoy
            port = deployment.ports[service] if service == "gateway" else \
                deployment.metrics_ports[service]
            families = scrapes.scrape(f"http://127.0.0.1:{port}{target.path}")
            assert scrapes.helios_service_of(families) == {service}, (target, sorted(families))
        # The healthchecks compose runs inside each container pass against the live services.
        for service in dockerfiles.SERVICES:
            check = compose_cpu["services"][topo.sources[service]]["healthcheck"]["test"]
            result = subprocess.run(localrun.python_command(check),
                                    env={"PATH": "/usr/bin:/bin", **deployment.env[service]},
                                    capture_output=True, text=True, timeout=30)
            assert result.returncode == 0, (service, result.stderr, deployment.output())
        # Compose stops containers with SIGTERM: each drains and exits 0 (gateway first).
        for service in reversed(localrun.START_ORDER):
            assert deployment.processes[service].terminate() == 0, deployment.output()


@pytest.mark.slow
def test_chart_serves_with_redis_and_auth(tmp_path, demo_models, redis_url):
    rendered = render_chart({"redis": {"enabled": True}, "auth": {"apiKey": "sk-test"},
                             "metrics": {"serviceMonitor": {"enabled": True}}})
    topo = topology.from_chart(rendered)
    configs = topo.configs()
    assert configs["gateway"].api_key == "sk-test"
    assert configs["gateway"].redis_url.endswith("/0")
    assert configs["imageprep"].redis_url.endswith("/1")
    with localrun.run_locally(topo, tmp_path, models_dir=demo_models, redis_url=redis_url,
                              images={s: s for s in topo.services}) as deployment:
        gateway = deployment.processes["gateway"]
        gateway.wait_http(deployment.url + "/health", timeout=120)   # open without the key
        assert httpx.get(deployment.url + "/metrics").status_code == 200   # open too
        # The ServiceMonitor's endpoints reach every service's own metrics, each once.
        # (component, container port) -> where that port is served here
        local = {("gateway", configs["gateway"].port): deployment.ports["gateway"]}
        local.update({(s, topology.METRICS_PORT): p for s, p in deployment.metrics_ports.items()})
        monitored = scrapes.service_monitor_targets(rendered)
        assert sorted(m.component for m in monitored) == sorted(dockerfiles.SERVICES)
        for m in monitored:
            families = scrapes.scrape(f"http://127.0.0.1:{local[m.component, m.container_port]}"
                                      f"{m.path}")
            assert scrapes.helios_service_of(families) == {m.component}, m
        # `helm test`'s pod passes against it
        (pod,) = [o for o in rendered.of_kind("Pod")
                  if o["metadata"]["annotations"].get("helm.sh/hook") == "test"]
        script = pod["spec"]["containers"][0]["command"][-1].replace(
            "helios-gateway:80", f"127.0.0.1:{deployment.ports['gateway']}")
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0, result.stderr
        for service in reversed(localrun.START_ORDER):
            assert deployment.processes[service].terminate() == 0, deployment.output()
