"""Fixtures for the deployment checks: compose projects per profile, chart renderings per
scenario (each rendered once per session; Helm's library renders in milliseconds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.tools import Rendered, compose_config, render_chart

# Value sets the chart is rendered with: the defaults, then each feature switched on, then all.
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "gpu": {
        "engine": {"gpu": {"enabled": True, "count": 2}},
        "model": {"demo": {"enabled": False}, "path": "/models/qwen3-8b",
                  "volume": {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}},
    },
    "replicas": {"gateway": {"replicas": 3}, "frontend": {"replicas": 4},
                 "imageprep": {"replicas": 2}, "engine": {"replicas": 2}},
    "autoscaling": {name: {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6}}
                    for name in ("gateway", "frontend", "imageprep")},
    "redis": {"redis": {"enabled": True}},
    "external-redis": {"redis": {"url": "redis://redis.cache.svc:6379"}},
    "auth": {"auth": {"apiKey": "sk-helios-test"}},
    "existing-secret": {"auth": {"existingSecret": "llm-keys", "existingSecretKey": "token"}},
    "observability": {
        "metrics": {"serviceMonitor": {"enabled": True, "interval": "30s"},
                    "scrapeAnnotations": True,
                    "networkPolicy": {"from": [{"namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": "observability"}}, "podSelector": {
                        "matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]},
                    "grafanaDashboard": {"enabled": True, "namespace": "grafana",
                                         "annotations": {"grafana_folder": "Helios"}}},
        "gateway": {"networkPolicy": {"from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "ingress-nginx"}}}]}},
    },
    "everything": {
        "image": {"registry": "registry.example.com/llm", "tag": "1.2.3"},
        "engine": {"gpu": {"enabled": True}, "replicas": 2},
        "model": {"demo": {"enabled": False}, "path": "/models/llama",
                  "volume": {"nfs": {"server": "nfs.example.com", "path": "/cores"}}},
        "gateway": {"autoscaling": {"enabled": True},
                    "service": {"type": "LoadBalancer", "port": 443, "annotations": {}},
                    "ingress": {"enabled": True, "className": "nginx",
                                "hosts": [{"host": "llm.example.com", "paths": ["/"]}],
                                "tls": [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}]},
                    "env": {"HELIOS_MAX_ACTIVE": 128}},
        "frontend": {"autoscaling": {"enabled": True}},
        "imageprep": {"autoscaling": {"enabled": True}},
        "redis": {"enabled": True},
        "auth": {"apiKey": "sk-helios-test"},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
                    "grafanaDashboard": {"enabled": True}},
    },
}


@pytest.fixture(scope="session")
def renders() -> dict[str, Rendered]:
    return {name: render_chart(values) for name, values in SCENARIOS.items()}


@pytest.fixture(scope="session", params=sorted(SCENARIOS))
def scenario(request, renders) -> tuple[str, Rendered]:
    return request.param, renders[request.param]


@pytest.fixture(scope="session")
def compose_gpu() -> dict[str, Any]:
    return compose_config()


@pytest.fixture(scope="session")
def compose_cpu() -> dict[str, Any]:
    return compose_config("cpu")


@pytest.fixture
def demo_models(tmp_path: Path, demo_core: Path) -> Path:
    """A local stand-in for the /models volume: helios-demo -> the cached demo core."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "helios-demo").symlink_to(demo_core, target_is_directory=True)
    return models
