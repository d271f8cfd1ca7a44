"""An autouse fixture for the GPU test folders (tests/kernels, tests/engine/gpu): at each
test's end the memory it freed goes back to the driver. pytest-xdist's workers share one GPU,
and a worker that sat between tests on ~7 GiB of cached blocks left the gpt-oss-shape tests
beside it out of memory on an 80 GB H100 (2026-12-06)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def release_cached_gpu_memory() -> Iterator[None]:
    yield
    import torch

    if torch.cuda.is_available():
        gc.collect()            # an engine's graphs and pools, dropped by the test, freed now
        torch.cuda.empty_cache()
