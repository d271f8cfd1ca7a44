"""Fixtures: tiny checkpoints (built once per session), engine and reference models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engine.model.checkpoints import SPECS, build_checkpoint, load_reference


@pytest.fixture(scope="session")
def checkpoint_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: build_checkpoint(spec, root / name) for name, spec in SPECS.items()}


@pytest.fixture(scope="session")
def engine_models(checkpoint_dirs: dict[str, Path]) -> dict[str, Any]:
    from services.common.core import open_model
    from services.engine.model import load_model

    return {name: load_model(open_model(path)) for name, path in checkpoint_dirs.items()}


@pytest.fixture(scope="session")
def reference_models(checkpoint_dirs: dict[str, Path]) -> dict[str, Any]:
    return {name: load_reference(path) for name, path in checkpoint_dirs.items()}
