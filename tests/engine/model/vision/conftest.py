"""Fixtures: the tiny Qwen-VL checkpoints (built once per session), loaded through the
engine's real loader and as transformers models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engine.model.vision.checkpoints import SPECS, build_checkpoint, load_reference


@pytest.fixture(scope="session")
def vl_checkpoint_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vl-checkpoints")
    return {name: build_checkpoint(spec, root / name) for name, spec in SPECS.items()}


@pytest.fixture(scope="session")
def vl_engine_models(vl_checkpoint_dirs: dict[str, Path]) -> dict[str, Any]:
    from services.common.core import open_model
    from services.engine.model import load_model

    return {name: load_model(open_model(path)) for name, path in vl_checkpoint_dirs.items()}


@pytest.fixture(scope="session")
def vl_reference_models(vl_checkpoint_dirs: dict[str, Path]) -> dict[str, Any]:
    return {name: load_reference(SPECS[name], path) for name, path in vl_checkpoint_dirs.items()}
