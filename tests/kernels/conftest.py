"""Kernel tests: on a CUDA machine they run the compiled kernels; elsewhere the small cases run
through Triton's CPU interpreter (TRITON_INTERPRET=1, set here before any kernel module is
imported) and the `gpu`-marked cases are skipped. Without triton everything here is skipped."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from tests.gpu_cache import release_cached_gpu_memory  # noqa: F401 (autouse)

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
INTERPRETED = HAS_TRITON and not HAS_CUDA

if INTERPRETED:
    # tests/conftest.py sets this before anything imports triton (Triton reads it when
    # triton.language and each kernel are defined); set here too for runs rooted elsewhere
    os.environ["TRITON_INTERPRET"] = "1"
    from tests.kernels.interpreter import (
        interpreter_active,
        patch_scalar_index,
        reload_kernel_modules,
    )

    patch_scalar_index()
    reload_kernel_modules()  # in case a module collected earlier imported them compiled-mode
    INTERPRETER_BROKEN = not interpreter_active()
else:
    INTERPRETER_BROKEN = False

collect_ignore = [] if HAS_TRITON else [
    name for name in os.listdir(os.path.dirname(__file__)) if name.endswith(".py") and name != "conftest.py"
]


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture
def dot_dtype() -> torch.dtype:
    """Operand dtype for kernels that use tl.dot: bf16 on the GPU, fp16 in the interpreter."""
    from tests.kernels.interpreter import DOT_DTYPE

    return DOT_DTYPE if INTERPRETED else torch.bfloat16


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    """A generator seeded from the test id, so each case draws its own fresh inputs."""
    import zlib

    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA device")
    late = pytest.mark.skip(
        reason="triton.language was imported before TRITON_INTERPRET=1 was set (see tests/conftest.py)"
    )
    here = os.path.dirname(__file__)
    for item in items:
        if not str(item.path).startswith(here):
            continue
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)
        elif INTERPRETER_BROKEN and item.path.name != "test_package.py":
            item.add_marker(late)
