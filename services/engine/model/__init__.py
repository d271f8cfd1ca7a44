"""The engine's model: the architecture registry, config parsing, weight loading, the
paged-KV forward pass and its ops.

Module map: docs/engine-model.md; adding an architecture: docs/adding-an-architecture.md.
The forward contract lives in `causal_lm.py` (ForwardBatch, ModelOutput) and `attention.py`
(AttentionMetadata, KVCache); the primitive ops (plain-torch references and the dispatch to
`services.engine.kernels`) in `ops.py`.
"""

from services.engine.model.attention import (
    AttentionMetadata,
    KVCache,
    allocate_kv_cache,
    build_metadata,
    kv_cache_bytes_per_page,
)
from services.engine.model.causal_lm import CausalLM, ForwardBatch, ModelOutput
from services.engine.model.config import ModelConfig
from services.engine.model.dummy import init_dummy_weights, load_dummy_model
from services.engine.model.loader import default_dtype, load_model
from services.engine.model.registry import (
    SUPPORTED_ARCHITECTURES,
    build_model,
    parse_model_config,
    resolve,
)

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "AttentionMetadata",
    "CausalLM",
    "ForwardBatch",
    "KVCache",
    "ModelConfig",
    "ModelOutput",
    "allocate_kv_cache",
    "build_metadata",
    "build_model",
    "default_dtype",
    "init_dummy_weights",
    "kv_cache_bytes_per_page",
    "load_dummy_model",
    "load_model",
    "parse_model_config",
    "resolve",
]
