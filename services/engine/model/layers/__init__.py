"""Shared layers the architecture families build from: parameters with their own weight
loaders (`weights.py`), linear and packed linear projections, RMSNorm, embeddings, attention
over the paged KV cache (full or sliding window), the gated MLP and the pre-norm decoder
layer of the Llama family."""

from services.engine.model.layers.attention import Attention
from services.engine.model.layers.decoder import PreNormDecoderLayer
from services.engine.model.layers.embedding import Embedding
from services.engine.model.layers.linear import Linear, PackedLinear, PaddedLinear
from services.engine.model.layers.mlp import GatedMLP
from services.engine.model.layers.norm import RMSNorm

__all__ = ["Attention", "Embedding", "GatedMLP", "Linear", "PackedLinear",
           "PaddedLinear",
           "PreNormDecoderLayer", "RMSNorm"]
