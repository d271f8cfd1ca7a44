"""The service topology a deployment describes, comparable with `helios run`'s.

A `Topology` is the four services' settings exactly as their containers would see them (the
image's HELIOS_* ENV overlaid by compose's `environment` or the pod's `env`, plus any arguments
after `helios serve NAME`) and a map from the host names callers dial to the service behind
each. From it follow each service's loaded config (the service's own `load_config`, so a bad
value fails here as it would in the container) and the call graph: every `*_address` setting
resolved to the service listening there.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.deploy import dockerfiles
from tests.deploy.tools import Rendered, pod_spec

SERVICES = dockerfiles.SERVICES
METRICS_PORT = 9100    # every gRPC service's /metrics port in a container (HELIOS_METRICS_LISTEN)
HELIOS_PREFIX = "HELIOS_"
NOT_A_FIELD = {"HELIOS_CONFIG", "HELIOS_CACHE_DIR"}   # read by the loader / assets, not fields


def config_class(service: str) -> type:
    if service == "gateway":
        from gateway.config import GatewayConfig
        return GatewayConfig
    if service == "frontend":
        from services.frontend.config import FrontendConfig
        return FrontendConfig
    if service == "imageprep":
        from services.imageprep.config import ImagePrepConfig
        return ImagePrepConfig
    from services.engine.config import EngineConfig
    return EngineConfig


@dataclass(frozen=True)
class ServiceSpec:
    service: str                     # gateway, frontend, imageprep or engine
    argv: tuple[str, ...]            # flags after `helios serve SERVICE`
    env: Mapping[str, str]           # the HELIOS_* variables the process sees

    def unknown_settings(self) -> list[str]:
        """HELIOS_* variables that name no setting of this service (silently ignored)."""
        fields = {HELIOS_PREFIX + f.name.upper() for f in dataclasses.fields(config_class(self.service))}
        return sorted(set(self.env) - fields - NOT_A_FIELD)

    def config(self) -> Any:
        from services.common.config import load_config

        return load_config(config_class(self.service), list(self.argv), env=dict(self.env),
                           section=self.service)


@dataclass(frozen=True)
class Edge:
    caller: str
    setting: str                     # the caller's *_address field
    callee: str


@dataclass(frozen=True)
class Topology:
    services: Mapping[str, ServiceSpec]
    hosts: Mapping[str, str]          # host name a caller dials -> service behind it
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)  # service -> compose
                                      # service or Deployment that runs it

    def configs(self) -> dict[str, Any]:
        return {name: spec.config() for name, spec in self.services.items()}

    def listen_address(self, service: str, config: Any) -> tuple[str, int | None]:
        if service == "gateway":
            return config.host, config.port
        if config.listen.startswith("unix://"):
            return config.listen, None
        host, port = config.listen.rsplit(":", 1)
        return host, int(port)

    def metrics_address(self, service: str, config: Any) -> tuple[str, int] | None:
        """Where `service` serves Prometheus /metrics: the gateway on its HTTP port, a gRPC
        service on `metrics_listen` (None when that is off)."""
        if service == "gateway":
            return config.host, config.port
        if not config.metrics_listen:
            return None
        host, port = config.metrics_listen.rsplit(":", 1)
        return host, int(port)

    def edges(self) -> set[Edge]:
        """Every configured `*_address` resolved to its service; a wrong port is an error."""
        configs = self.configs()
        edges = set()
        for caller, config in configs.items():
            for field in dataclasses.fields(config):
                address = getattr(config, field.name)
                if not field.name.endswith("_address") or not address:
                    continue
                edges.add(Edge(caller, field.name, self.resolve(address, configs)))
        return edges

    def resolve(self, address: str, configs: Mapping[str, Any]) -> str:
        if address.startswith("unix://"):
            owners = [n for n, c in configs.items() if getattr(c, "listen", None) == address]
            if len(owners) != 1:
                raise AssertionError(f"no service listens on {address}")
            return owners[0]
        host, port = address.rsplit(":", 1)
        if host not in self.hosts:
            raise AssertionError(f"{address}: no service answers to {host!r}")
        callee = self.hosts[host]
        _, listen_port = self.listen_address(callee, configs[callee])
        if int(port) != listen_port:
            raise AssertionError(f"{address}: {callee} listens on {listen_port}, not {port}")
        return callee


# ---- from `helios run` ---------------------------------------------------------------------------

def from_launcher(runtime_dir: Path, model: str = "/models/core") -> Topology:
    from services.cli.launcher import Launcher, RunOptions

    launcher = Launcher(RunOptions(model=model, runtime_dir=str(runtime_dir)))
    services = {}
    for name in SERVICES:
        command = launcher._command(name)
        serve = command.index("serve")
        assert command[serve + 1] == name
        services[name] = ServiceSpec(name, tuple(command[serve + 2:]), {})
    return Topology(services, {})


# ---- from an image's Dockerfile ------------------------------------------------------------------

def image_service(dockerfile: Path, target: str | None) -> tuple[str, dict[str, str]]:
    """(service, HELIOS_* ENV) of an image whose entrypoint is `[tini --] helios serve SERVICE`."""
    stage = dockerfiles.stage(dockerfile, target)
    entry = list(stage.entrypoint)
    if entry[:2] == ["tini", "--"]:
        entry = entry[2:]
    if entry[:2] != ["helios", "serve"] or len(entry) != 3 or entry[2] not in SERVICES:
        raise AssertionError(f"{dockerfile.name} ({target or 'default'}): entrypoint "
                             f"{stage.entrypoint} is not `helios serve SERVICE`")
    env = {k: v for k, v in stage.env.items() if k.startswith(HELIOS_PREFIX)}
    return entry[2], env


# ---- from docker/compose.yaml --------------------------------------------------------------------

def from_compose(project: Mapping[str, Any]) -> Topology:
    services: dict[str, ServiceSpec] = {}
    hosts: dict[str, str] = {}
    sources: dict[str, str] = {}
    for compose_name, svc in project["services"].items():
        build = svc.get("build")
        if not build or "helios serve" in str(svc.get("entrypoint", "")):
            continue
        dockerfile = Path(build["context"]) / build["dockerfile"]
        stage = dockerfiles.stage(dockerfile, build.get("target"))
        if "helios" not in stage.entrypoint:
            continue   # not a service image (the demo-model copy job)
        if svc.get("entrypoint"):
            raise AssertionError(f"{compose_name} overrides the image's entrypoint")
        service, env = image_service(dockerfile, build.get("target"))
        if service in services:
            raise AssertionError(f"two compose services run {service} in one profile")
        env.update({k: str(v) for k, v in (svc.get("environment") or {}).items()
                    if k.startswith(HELIOS_PREFIX)})
        services[service] = ServiceSpec(service, tuple(svc.get("command") or ()), env)
        sources[service] = compose_name
        hosts[compose_name] = service
        for network in (svc.get("networks") or {}).values():
            for alias in (network or {}).get("aliases", []):
                hosts[alias] = service
    return Topology(services, hosts, sources)


# ---- from the rendered chart ---------------------------------------------------------------------

def image_of(container: Mapping[str, Any]) -> tuple[Path, str | None]:
    """The Dockerfile and target that build this container's image."""
    reference = container["image"].rsplit("/", 1)[-1]
    repository, tag = reference.split(":", 1)
    if not repository.startswith("helios-"):
        raise KeyError(repository)
    name = repository.removeprefix("helios-")
    if name == "demo-model":
        return dockerfiles.dockerfile_of("engine"), "demo-model"
    if name == "engine":
        return dockerfiles.dockerfile_of("engine"), ("engine-cpu" if tag.endswith("-cpu") else None)
    return dockerfiles.dockerfile_of(name), None


def container_env(container: Mapping[str, Any], rendered: Rendered) -> dict[str, str]:
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = item["valueFrom"]["secretKeyRef"]
        try:
            secret = rendered.get("Secret", ref["name"])
        except KeyError:   # a Secret the user manages (auth.existingSecret)
            env[item["name"]] = f"<{ref['name']}/{ref['key']}>"
            continue
        env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    return env


def from_chart(rendered: Rendered) -> Topology:
    services: dict[str, ServiceSpec] = {}
    hosts: dict[str, str] = {}
    sources: dict[str, str] = {}
    for workload in rendered.workloads():
        for container in pod_spec(workload)["containers"]:
            try:
                dockerfile, target = image_of(container)
            except KeyError:
                continue   # not a Helios image (redis)
            if container.get("command"):
                raise AssertionError(f"{container['name']} overrides the image's entrypoint")
            service, env = image_service(dockerfile, target)
            env.update({k: v for k, v in container_env(container, rendered).items()
                        if k.startswith(HELIOS_PREFIX)})
            services[service] = ServiceSpec(service, tuple(container.get("args", ())), env)
            sources[service] = workload["metadata"]["name"]
            labels = workload["spec"]["selector"]["matchLabels"]
            for svc in rendered.of_kind("Service"):
                selector = svc["spec"].get("selector", {})
                if selector and all(labels.get(k) == v for k, v in selector.items()):
                    hosts[svc["metadata"]["name"]] = service
    return Topology(services, hosts, sources)


def default_port(service: str) -> int:
    """The port a service listens on when nothing configures it (its config's default)."""
    defaults: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(config_class(service))}
    if service == "gateway":
        return int(defaults["port"])
    return int(str(defaults["listen"]).rsplit(":", 1)[1])
