"""helm/helios: lints, renders with Helm's own library, validates against the Kubernetes schemas,
and keeps its invariants in every scenario (tests/deploy/conftest.py SCENARIOS)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.deploy import topology
from tests.deploy.conftest import SCENARIOS
from tests.deploy.tools import (
    CHART,
    Rendered,
    component,
    containers,
    lint_chart,
    pod_spec,
    render_chart,
    validate_kubernetes,
)

HELIOS = ("gateway", "frontend", "imageprep", "engine")


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _workload(rendered: Rendered, name: str) -> dict[str, Any]:
    return next(w for w in rendered.workloads() if component(w) == name)


def _main(rendered: Rendered, name: str) -> dict[str, Any]:
    return pod_spec(_workload(rendered, name))["containers"][0]


# ---- Helm and Kubernetes ---------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_lints_clean(name):
    report = lint_chart(SCENARIOS[name])
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]   # warnings and errors
    assert serious == [], serious


def test_every_object_is_valid_kubernetes(scenario):
    name, rendered = scenario
    problems = [validate_kubernetes(o) for o in rendered.objects if o["kind"] != "ServiceMonitor"]
    assert [p for p in problems if p] == [], name


def test_valid_for_the_newest_kubernetes_too(renders):
    import kubernetes_validate

    newest = kubernetes_validate.latest_version()
    problems = [validate_kubernetes(o, newest) for o in renders["everything"].objects
                if o["kind"] != "ServiceMonitor"]
    assert [p for p in problems if p] == [], newest


def test_validation_is_real(renders):
    """The schemas catch a misspelt field, so a clean result means something."""
    import copy

    engine = copy.deepcopy(next(w for w in renders["default"].workloads()
                                if component(w) == "engine"))
    pod_spec(engine)["containers"][0]["readinessProb"] = {}
    assert "readinessProb" in (validate_kubernetes(engine) or "")


def test_objects_are_unique_and_namespaced_by_release(scenario):
    _, rendered = scenario
    keys = [(o["kind"], o["metadata"]["name"]) for o in rendered.objects]
    assert len(keys) == len(set(keys))
    assert all(o["metadata"]["name"].startswith("helios") for o in rendered.objects)
    other = render_chart(SCENARIOS[scenario[0]], release="staging")
    assert {o["metadata"]["name"] for o in other.objects}.isdisjoint(
        {o["metadata"]["name"] for o in rendered.objects} - {"helios"})


# ---- values.schema.json documents and checks every value -------------------------------------

def _leaves(values: Any, path: tuple[str, ...] = ()):
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from _leaves(value, (*path, key))
    else:
        yield path


def _schema_at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node = schema
    for key in path:
        properties = node.get("properties", {})
        if key in properties:
            node = properties[key]
        elif isinstance(node.get("additionalProperties"), dict) or (node.get("type") == "object" \
                and "properties" not in node):
            return node   # a free-form map (resources, env, volume ...) documented as a whole
        else:
            return None
    return node


def test_schema_documents_every_value():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in _leaves(values):
        node = _schema_at(schema, path)
        assert node is not None, f"{'.'.join(path)} is not in values.schema.json"
        assert node.get("description"), f"{'.'.join(path)} has no description"
    # ... and every object in the schema is closed, so a misspelt value is an error, not ignored
    def closed(node: dict[str, Any], where: str) -> None:
        if "properties" in node and where not in ("podSecurityContext", "securityContext"):
            assert node.get("additionalProperties") is False, f"{where} accepts unknown keys"
        for key, child in node.get("properties", {}).items():
            closed(child, f"{where}.{key}".lstrip("."))
    closed(schema, "")


@pytest.mark.parametrize("bad, message", [
    ({"gateway": {"replicaz": 3}}, "replicaz"),
    ({"engine": {"gpu": {"count": 0}}}, "count"),
    ({"podSecurityContext": {"runAsNonRoot": False}}, "runAsNonRoot"),
    ({"redis": {"url": "redis://cache:6379/3"}}, "url"),
    ({"logLevel": "verbose"}, "logLevel"),
    ({"gateway": {"env": {"MAX_ACTIVE": 3}}}, "MAX_ACTIVE"),
    ({"model": {"path": "/data/core"}}, "path"),
])
def test_schema_rejects_bad_values(bad, message):
    with pytest.raises(Exception, match=message):
        render_chart(bad)


def test_real_model_without_a_volume_is_refused():
    with pytest.raises(Exception, match="model.volume is required"):
        render_chart({"model": {"demo": {"enabled": False}}})


# ---- pods: non-root, probes, drain, resources -------------------------------------------------

def test_no_container_runs_as_root(scenario):
    name, rendered = scenario
    for workload in rendered.workloads():
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        assert pod["securityContext"].get("runAsUser", 0) != 0
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        assert pod["enableServiceLinks"] is False, "HELIOS_PORT=tcp://... would break the gateway"
        for container in containers(workload):
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, (name, container["name"])
            assert security["readOnlyRootFilesystem"] is True, (name, container["name"])
            assert security["capabilities"]["drop"] == ["ALL"], (name, container["name"])
            assert container["securityContext"].get("runAsUser", 1) != 0


def test_every_container_has_resources(scenario):
    _, rendered = scenario
    for workload in rendered.workloads():
        for container in containers(workload):
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), container["name"]
            assert "memory" in resources["limits"], container["name"]


def test_probes_follow_health_semantics(scenario):
    name, rendered = scenario
    gateway = _main(rendered, "gateway")
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert "tcpSocket" in gateway["livenessProbe"]
    for service in ("frontend", "imageprep", "engine"):
        container = _main(rendered, service)
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
        assert container["readinessProbe"]["grpc"]["port"] == port, (name, service)
        # NOT_SERVING (an upstream down, a drain, a load) must never restart the process
        assert "tcpSocket" in container["livenessProbe"], (name, service)
    startup = _main(rendered, "engine")["startupProbe"]
    assert "grpc" in startup
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "long model loads"


def test_termination_grace_outlasts_prestop_and_drain(scenario):
    name, rendered = scenario
    for service in HELIOS:
        pod = pod_spec(_workload(rendered, service))
        container = pod["containers"][0]
        pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        drain = float(_env(container)["HELIOS_GRACE_PERIOD_S"])
        assert pre_stop > 0
        assert pod["terminationGracePeriodSeconds"] > pre_stop + drain + 5, (name, service)
    engine = _main(rendered, "engine")
    assert float(_env(engine)["HELIOS_GRACE_PERIOD_S"]) >= 30, "generations need time to finish"


def test_model_volume_is_shared_and_read_only(scenario):
    name, rendered = scenario
    demo = SCENARIOS[name].get("model", {}).get("demo", {}).get("enabled", True)
    volumes = []
    for service in ("frontend", "engine"):
        pod = pod_spec(_workload(rendered, service))
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "models")
        assert mount == {"name": "models", "mountPath": "/models", "readOnly": True}
        volume = next(v for v in pod["volumes"] if v["name"] == "models")
        volumes.append(volume)
        inits = pod.get("initContainers", [])
        if demo:
            assert volume == {"name": "models", "emptyDir": {}}
            assert [c["image"].rsplit("/", 1)[-1].split(":")[0] for c in inits] == \
                ["helios-demo-model"]
            assert inits[0]["volumeMounts"] == [{"name": "models", "mountPath": "/target"}]
        else:
            assert "emptyDir" not in volume and inits == []
    assert volumes[0] == volumes[1]


# ---- the engine as a GPU workload -------------------------------------------------------------

def test_engine_on_the_cpu_by_default(renders):
    engine = _main(renders["default"], "engine")
    assert engine["image"].endswith("-cpu")
    assert _env(engine)["HELIOS_DEVICE"] == "cpu"
    assert "nvidia.com/gpu" not in json.dumps(engine["resources"])
    assert engine["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    assert "nodeSelector" not in pod_spec(_workload(renders["default"], "engine"))


@pytest.mark.parametrize("name, count", [("gpu", 2), ("everything", 1)])
def test_engine_gpu_workload(renders, name, count):
    workload = _workload(renders[name], "engine")
    pod = pod_spec(workload)
    engine = pod["containers"][0]
    assert not engine["image"].endswith("-cpu")
    assert _env(engine)["HELIOS_DEVICE"] == "cuda"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == count
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == count
    assert engine["resources"]["requests"]["memory"] == "32Gi", "engine.gpu.resources apply"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        pod["tolerations"]
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    # an update replaces an engine in place instead of waiting for a spare GPU
    assert workload["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def test_images_follow_registry_and_tag(renders):
    images = {c["image"] for w in renders["everything"].workloads() for c in containers(w)}
    assert images == {"registry.example.com/llm/helios-gateway:1.2.3",
                      "registry.example.com/llm/helios-frontend:1.2.3",
                      "registry.example.com/llm/helios-imageprep:1.2.3",
                      "registry.example.com/llm/helios-engine:1.2.3", "redis:7.4-alpine"}
    defaults = {c["image"] for w in renders["default"].workloads() for c in containers(w)}
    assert "helios-engine:0.1.0-cpu" in defaults and "helios-demo-model:0.1.0" in defaults


# ---- Services, scaling, disruption ------------------------------------------------------------

def _selects(selector: dict[str, str], workload: dict[str, Any]) -> bool:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector.items())


def test_services_reach_their_pods(scenario):
    name, rendered = scenario
    for service in rendered.of_kind("Service"):
        targets = [w for w in rendered.workloads() if _selects(service["spec"]["selector"], w)]
        assert len(targets) == 1, (name, service["metadata"]["name"])
        port_names = {p["name"] for c in pod_spec(targets[0])["containers"]
                      for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names
            if port["name"] == "grpc":
                assert port["appProtocol"] == "kubernetes.io/h2c"
    # engine replicas are visible to the frontend one by one (per-request routing over gRPC)
    assert rendered.get("Service", "helios-engine")["spec"]["clusterIP"] == "None"
    assert "clusterIP" not in rendered.get("Service", "helios-frontend")["spec"]
    outside = [s["metadata"]["name"] for s in rendered.of_kind("Service")
               if s["spec"]["type"] != "ClusterIP"]
    assert outside in ([], ["helios-gateway"])


def test_replicas(renders):
    rendered = renders["replicas"]
    wanted = SCENARIOS["replicas"]
    for service in HELIOS:
        assert _workload(rendered, service)["spec"]["replicas"] == wanted[service]["replicas"]


def test_autoscaling_for_stateless_tiers(renders):
    rendered = renders["autoscaling"]
    hpas = {h["spec"]["scaleTargetRef"]["name"]: h for h in rendered.of_kind("HorizontalPodAutoscaler")}
    assert set(hpas) == {"helios-gateway", "helios-frontend", "helios-imageprep"}
    for name, hpa in hpas.items():
        workload = rendered.get("Deployment", name)
        assert "replicas" not in workload["spec"], "the HPA owns replicas"
        assert hpa["spec"]["minReplicas"] == 2 and hpa["spec"]["maxReplicas"] == 6
    assert renders["default"].of_kind("HorizontalPodAutoscaler") == []


def test_disruption_budgets_cover_every_tier(scenario):
    _, rendered = scenario
    covered = set()
    for pdb in rendered.of_kind("PodDisruptionBudget"):
        matches = [w for w in rendered.workloads()
                   if _selects(pdb["spec"]["selector"]["matchLabels"], w)]
        assert len(matches) == 1
        covered.add(component(matches[0]))
        assert pdb["spec"]["maxUnavailable"] >= 1   # never blocks a node drain outright
    assert covered == set(HELIOS)


# ---- network policy: only the gateway from outside, each service from its callers ---------------

def ingress_rules(rendered: Rendered, target: str, port: str) -> list[dict[str, Any]]:
    """The NetworkPolicy ingress rules that open `port` (a container port name) of `target`'s
    pods; a rule without `ports` opens every port."""
    workload = _workload(rendered, target)
    policies = [p for p in rendered.of_kind("NetworkPolicy")
                if _selects(p["spec"]["podSelector"]["matchLabels"], workload)]
    assert policies, f"no NetworkPolicy selects {target}: it is open to everyone"
    return [rule for policy in policies for rule in policy["spec"]["ingress"]
            if "ports" not in rule or any(p["port"] == port for p in rule["ports"])]


def _allowed_callers(rendered: Rendered, target: str, port: str) -> tuple[set[str], bool]:
    """(release components allowed in, whether anyone may connect) on `target`'s `port`;
    peers other than the release's own pods (metrics.networkPolicy.from) are ignored here."""
    callers: set[str] = set()
    anyone = False
    for rule in ingress_rules(rendered, target, port):
        if "from" not in rule:
            anyone = True
        for peer in rule.get("from", []):
            if set(peer) != {"podSelector"}:
                continue
            labels = peer["podSelector"]["matchLabels"]
            callers |= {component(w) for w in rendered.workloads() if _selects(labels, w)}
    return callers, anyone


def test_network_policies_follow_the_call_graph(scenario):
    name, rendered = scenario
    edges = topology.from_chart(rendered).edges()
    for service in ("frontend", "imageprep", "engine"):
        rules = ingress_rules(rendered, service, "grpc")
        assert all(set(peer) == {"podSelector"} for r in rules for peer in r.get("from", [])), \
            f"{name}: {service}'s API is open beyond its callers"
        callers, anyone = _allowed_callers(rendered, service, "grpc")
        assert not anyone, f"{name}: {service} is reachable from outside"
        assert callers == {e.caller for e in edges if e.callee == service}, (name, service)
    callers, anyone = _allowed_callers(rendered, "gateway", "http")
    restricted = SCENARIOS[name].get("gateway", {}).get("networkPolicy", {}).get("from")
    assert anyone is not bool(restricted) and not callers, "the gateway is the way in"
    if any(component(w) == "redis" for w in rendered.workloads()):
        callers, anyone = _allowed_callers(rendered, "redis", "redis")
        assert not anyone and callers == {"gateway", "imageprep"}
        assert all(set(peer) == {"podSelector"}
                   for r in ingress_rules(rendered, "redis", "redis") for peer in r["from"])


# ---- auth, Redis (metrics and the dashboard: test_chart_metrics.py) --------------------------

def test_api_key_lives_in_a_secret(renders):
    secret = renders["auth"].get("Secret", "helios-auth")
    gateway_env = _env(_main(renders["auth"], "gateway"))
    assert gateway_env["HELIOS_API_KEY"] == {
        "secretKeyRef": {"name": "helios-auth", "key": "api-key"}}
    assert "sk-helios-test" not in json.dumps(_workload(renders["auth"], "gateway"))
    assert set(secret["data"]) == {"api-key"}
    existing = _env(_main(renders["existing-secret"], "gateway"))
    assert existing["HELIOS_API_KEY"] == {"secretKeyRef": {"name": "llm-keys", "key": "token"}}
    assert renders["existing-secret"].of_kind("Secret") == []
    assert "HELIOS_API_KEY" not in _env(_main(renders["default"], "gateway"))


def test_redis(renders):
    rendered = renders["redis"]
    assert rendered.get("Deployment", "helios-redis")
    assert rendered.get("Service", "helios-redis")["spec"]["ports"][0]["port"] == 6379
    assert _env(_main(rendered, "gateway"))["HELIOS_REDIS_URL"] == "redis://helios-redis:6379/0"
    assert _env(_main(rendered, "imageprep"))["HELIOS_REDIS_URL"] == "redis://helios-redis:6379/1"
    external = renders["external-redis"]
    assert _env(_main(external, "gateway"))["HELIOS_REDIS_URL"] == "redis://redis.cache.svc:6379/0"
    assert not any(component(w) == "redis" for w in external.workloads())
    assert "HELIOS_REDIS_URL" not in _env(_main(renders["default"], "gateway"))


def test_notes_tell_how_to_reach_it(renders):
    assert "port-forward svc/helios-gateway" in renders["default"].notes
    assert "helios-demo" in renders["default"].notes
    assert "/models/qwen3-8b" in renders["gpu"].notes


def test_helm_test_checks_health_through_the_service(renders):
    (pod,) = [o for o in renders["default"].of_kind("Pod")
              if o["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    (container,) = pod["spec"]["containers"]
    script = container["command"][-1]
    assert "http://helios-gateway:80/health" in script
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["restartPolicy"] == "Never"
    # the script really checks: run it against a server that answers 503
    import http.server
    import subprocess
    import sys
    import threading

    class Unhealthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unhealthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        local = script.replace("helios-gateway:80", f"127.0.0.1:{server.server_port}")
        result = subprocess.run([sys.executable, "-c", local], capture_output=True, timeout=30)
        assert result.returncode != 0
    finally:
        server.shutdown()
