"""Batched sampling: validated SamplingParams, per-step SamplingBatch tensors, the Sampler.

Module map: docs/engine-model.md. Seeded randomness is counter-based (random_stream.py): a row's
draw depends only on its seed, its output position and the token id.

The tensor side (batch, sampler: torch) is imported on first use, so the engine servicer, which
only validates SamplingParams, starts without importing torch (the core imports it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from services.engine.sampling.params import SamplingParams, choice_seed

if TYPE_CHECKING:
    from services.engine.sampling.batch import SamplingBatch, SamplingRow
    from services.engine.sampling.sampler import Sampler, SamplerOutput

_TENSOR_SIDE = {"SamplingBatch": "batch", "SamplingRow": "batch", "Sampler": "sampler",
                "SamplerOutput": "sampler"}

__all__ = ["Sampler", "SamplerOutput", "SamplingBatch", "SamplingParams", "SamplingRow",
           "choice_seed"]


def __getattr__(name: str) -> Any:
    module = _TENSOR_SIDE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
