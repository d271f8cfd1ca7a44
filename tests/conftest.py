"""Shared fixtures: the demo core (built once per machine, cached) and tokenizer assets."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_core() -> Path:
    from services.cli.demo_model import demo_core as build

    return build()


@pytest.fixture(scope="session")
def demo_model_dir(demo_core: Path) -> Path:
    from services.common.assets import cache_root

    return cache_root() / "demo" / "model-seed0"


@pytest.fixture
def redis_url(tmp_path):
    """URL of a fresh real redis-server on loopback, stopped after the test."""
    from tests.support.redis_server import RedisServer

    with RedisServer.start(tmp_path / "redis") as server:
        yield server.url
