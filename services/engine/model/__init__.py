"""The engine's model: config parsing, weight loading, the paged-KV forward pass and its ops.

Module map: docs/engine-model.md. The forward contract lives in `attention.py`; the primitive
ops (plain-torch references and the dispatch to `services.engine.kernels`) in `ops.py`.
"""

from services.engine.model.attention import (
    AttentionMetadata,
    KVCache,
    allocate_kv_cache,
    build_metadata,
    kv_cache_bytes_per_page,
)
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from services.engine.model.dummy import init_dummy_weights, load_dummy_model
from services.engine.model.loader import default_dtype, load_model

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "AttentionMetadata",
    "CausalLM",
    "KVCache",
    "ModelConfig",
    "allocate_kv_cache",
    "build_metadata",
    "default_dtype",
    "init_dummy_weights",
    "kv_cache_bytes_per_page",
    "load_dummy_model",
    "load_model",
]
