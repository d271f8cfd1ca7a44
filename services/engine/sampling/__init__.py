"""Batched sampling: validated SamplingParams, per-step SamplingBatch tensors, the Sampler.

Module map: docs/engine-model.md. Seeded randomness is counter-based (random_stream.py): a row's
draw depends only on its seed, its output position and the token id.
"""

from services.engine.sampling.batch import SamplingBatch, SamplingRow
from services.engine.sampling.params import SamplingParams, choice_seed
from services.engine.sampling.sampler import Sampler, SamplerOutput

__all__ = ["Sampler", "SamplerOutput", "SamplingBatch", "SamplingParams", "SamplingRow",
           "choice_seed"]
