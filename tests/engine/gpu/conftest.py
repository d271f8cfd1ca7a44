"""GPU-only engine tests (`@pytest.mark.gpu`): skipped where torch sees no CUDA device."""

from __future__ import annotations

import os

import pytest

from tests.gpu_cache import release_cached_gpu_memory  # noqa: F401 (autouse)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(skip)
