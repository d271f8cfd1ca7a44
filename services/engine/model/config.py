"""ModelConfig: the frozen, validated view of a checkpoint's config.json the engine runs on.

The fields are what the shared layers need (shapes, biases, norms, activation, per-layer
attention kinds); each architecture family's module (`llama.py`, `qwen.py`, `gemma3.py`)
parses its config.json into one with the helpers here, and the registry (`registry.py`)
chooses the family by the `architectures` entry. Rope parameters are read from both layouts
in the wild: the older `rope_theta` + `rope_scaling` ({"type"|"rope_type": ...}) and
transformers 5's `rope_parameters` dict (per layer type where a model has several).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import UnsupportedError, ValidationError
from services.common.quantization import Fp8Scheme

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
ACTIVATIONS = ("silu", "gelu_tanh")   # the gated MLP's activation (ops.gated_activation)
# config.json spellings -> the engine's activation names
_ACTIVATION_NAMES = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                     "gelu_tanh": "gelu_tanh"}


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters, normalised from either config layout."""

    rope_type: str = "default"       # one of ROPE_TYPES
    theta: float = 10000.0
    factor: float = 1.0              # linear/dynamic/llama3/yarn scale
    original_max_position_embeddings: int = 0   # llama3/yarn (0: max_position_embeddings)
    low_freq_factor: float = 1.0     # llama3
    high_freq_factor: float = 4.0    # llama3
    beta_fast: float = 32.0          # yarn
    beta_slow: float = 1.0           # yarn
    attention_factor: float | None = None  # yarn cos/sin scale (None: derived from factor)
    mscale: float = 0.0              # yarn (DeepSeek style), 0 = unset
    mscale_all_dim: float = 0.0      # yarn, 0 = unset
    truncate: bool = True            # yarn: floor/ceil the correction range
    partial_rotary_factor: float = 1.0


@dataclass(frozen=True, slots=True)
class LayerAttention:
    """How one decoder layer attends: its window and its rotary embedding."""

    sliding_window: int = 0          # 0: full causal attention; W > 0: the last W positions
    rope: RopeConfig = field(default_factory=RopeConfig)

    @property
    def kind(self) -> str:
        return "sliding" if self.sliding_window else "full"


@dataclass(frozen=True, slots=True)
class MoEConfig:
    """A mixture-of-experts model's sparse MLPs (services/engine/model/moe.py runs them)."""

    num_experts: int
    top_k: int                           # experts per token (num_experts_per_tok)
    intermediate_size: int               # each expert's (moe_intermediate_size)
    sparse_layers: tuple[bool, ...]      # per decoder layer: True = experts, False = dense MLP
    renormalize: bool = True             # top-k probabilities renormalized to sum 1
    activation: str = "silu"             # moe.MOE_ACTIVATIONS ("swiglu_oai": gpt-oss)
    expert_bias: bool = False            # gate/up and down biases per expert (gpt-oss)
    router_bias: bool = False
    swiglu_limit: float = 7.0            # "swiglu_oai" clamp
    swiglu_alpha: float = 1.702          # "swiglu_oai" sigmoid scale
    expert_format: str = "dense"         # "mxfp4": expert matrices kept packed (mxfp4.py)

    def __post_init__(self) -> None:
        if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
            raise ValidationError(f"config.json: {self.top_k} experts per token out of "
                                  f"{self.num_experts}", param="num_experts_per_tok")
        if self.intermediate_size < 1:
            raise ValidationError("config.json: the experts' intermediate size must be >= 1",
                                  param="moe_intermediate_size")

    @property
    def num_sparse_layers(self) -> int:
        return sum(self.sparse_layers)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything the forward pass needs to know about the model's shape."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    layers: tuple[LayerAttention, ...]   # one per decoder layer, in order
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False               # RMSNorm over head_dim on q and k before rotary
    activation: str = "silu"            # the gated MLP's activation (ACTIVATIONS)
    query_scale: float = 0.0            # attention softmax scale (0: head_dim ** -0.5)
    embedding_multiplier: float = 1.0   # input embeddings are scaled by this (Gemma: sqrt(H))
    final_logit_softcap: float = 0.0    # logits = cap * tanh(logits / cap) when > 0
    torch_dtype: str = "float32"        # checkpoint dtype
    quantization: Fp8Scheme | None = None   # FP8 decoder projections (quantization.py)
    moe: MoEConfig | None = None        # mixture-of-experts MLPs (None: every MLP dense)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValidationError(f"config.json: {name} must be >= 1", param=name)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValidationError(
                f"config.json: num_attention_heads ({self.num_attention_heads}) is not a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})",
                param="num_key_value_heads")
        if self.head_dim % 2:
            raise ValidationError("config.json: head_dim must be even for rotary embeddings",
                                  param="head_dim")
        if self.moe is not None and len(self.moe.sparse_layers) != self.num_hidden_layers:
            raise ValidationError(f"config.json: {len(self.moe.sparse_layers)} sparse-layer "
                                  f"flags for {self.num_hidden_layers} layers",
                                  param="mlp_only_layers")
        if len(self.layers) != self.num_hidden_layers:
            raise ValidationError(f"config.json: {len(self.layers)} layer types for "
                                  f"{self.num_hidden_layers} layers", param="layer_types")
        if self.activation not in ACTIVATIONS:
            raise UnsupportedError(f"activation {self.activation!r} is not supported",
                                   param="hidden_act")
        for layer in self.layers:
            if layer.sliding_window < 0:
                raise ValidationError("config.json: sliding_window must be >= 0",
                                      param="sliding_window")
            if layer.rope.rope_type not in ROPE_TYPES:
                raise UnsupportedError(
                    f"rope type {layer.rope.rope_type!r} is not supported (supported: "
                    f"{', '.join(ROPE_TYPES)})", param="rope_scaling")
            if layer.rope.partial_rotary_factor != 1.0:
                raise UnsupportedError("partial rotary embeddings are not supported",
                                       param="partial_rotary_factor")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        return self.query_scale or self.head_dim ** -0.5

    @property
    def rope(self) -> RopeConfig:
        """The rotary embedding of the full-attention layers (the context's reach)."""
        full = [layer.rope for layer in self.layers if not layer.sliding_window]
        return (full or [self.layers[0].rope])[0]

    @property
    def ropes(self) -> tuple[RopeConfig, ...]:
        """The distinct rotary embeddings, in first-use order (one cos/sin table each)."""
        return tuple(dict.fromkeys(layer.rope for layer in self.layers))

    @property
    def sliding_window(self) -> int:
        """The largest window of any sliding layer (0: every layer attends fully)."""
        return max((layer.sliding_window for layer in self.layers), default=0)

    @property
    def max_context(self) -> int:
        """Longest sequence this engine runs exactly like the reference model.

        Rope scaling stretches the range as vLLM reads it: linear and dynamic multiply
        max_position_embeddings by the factor, yarn covers original length x factor, llama3
        configs already state the stretched length. Sliding-window layers attend to their
        window at any length, so they do not limit it.
        """
        limit = self.max_position_embeddings
        rope = self.rope
        if rope.rope_type in ("linear", "dynamic"):
            limit = int(limit * rope.factor)
        elif rope.rope_type == "yarn":
            limit = max(limit, int(rope.original_max_position_embeddings * rope.factor))
        return limit

    @classmethod
    def from_dict(cls, config: Mapping[str, Any], quantization: str = "",
                  mxfp4_experts: str = "dequantize") -> ModelConfig:
        """Parse config.json through the registry (registry.parse_model_config)."""
        from services.engine.model.registry import parse_model_config

        return parse_model_config(config, quantization, mxfp4_experts)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token per element byte (multiply by the dtype's itemsize). Every layer
        keeps the whole context, sliding ones included (their pages past the window are kept,
        not freed: a sliding layer's share of this is what a windowed pool would save)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim


# ---------------------------------------------------------------------------------------------
# Parsing helpers the family modules share


def activation(config: Mapping[str, Any], architecture: str, default: str = "silu") -> str:
    """The gated MLP's activation from `hidden_act` / `hidden_activation`."""
    raw = config.get("hidden_activation") or config.get("hidden_act") or default
    name = _ACTIVATION_NAMES.get(str(raw))
    if name is None:
        raise UnsupportedError(f"{architecture}: activation {raw!r} is not supported "
                               f"(supported: {', '.join(sorted(_ACTIVATION_NAMES))})",
                               param="hidden_act")
    return name


def shape_fields(config: Mapping[str, Any], architecture: str) -> dict[str, Any]:
    """The fields every decoder-only config states the same way, as ModelConfig kwargs."""
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        return {
            "architecture": architecture,
            "model_type": str(config.get("model_type", "")),
            "vocab_size": int(config["vocab_size"]),
            "hidden_size": hidden,
            "intermediate_size": int(config["intermediate_size"]),
            "num_hidden_layers": int(config["num_hidden_layers"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(config.get("num_key_value_heads") or heads),
            "head_dim": int(config.get("head_dim") or hidden // heads),
            "rms_norm_eps": float(config.get("rms_norm_eps", 1e-6)),
            "max_position_embeddings": int(config.get("max_position_embeddings", 4096)),
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
            "torch_dtype": str(config.get("torch_dtype") or config.get("dtype") or "float32"),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(architecture, exc) from exc


def malformed(architecture: str, exc: Exception) -> ValidationError:
    return ValidationError(f"config.json for {architecture} is malformed: {exc!r}",
                           param="config.json")


def layer_types(config: Mapping[str, Any], num_layers: int) -> list[str] | None:
    """`layer_types` ("full_attention" / "sliding_attention" per layer) when stated."""
    types = config.get("layer_types")
    if types is None:
        return None
    if len(types) != num_layers:
        raise ValidationError(f"config.json: {len(types)} layer_types for {num_layers} layers",
                              param="layer_types")
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise UnsupportedError(f"layer type {unknown[0]!r} is not supported (supported: "
                               "full_attention, sliding_attention)", param="layer_types")
    return list(types)


def parse_rope(params: Mapping[str, Any], config: Mapping[str, Any],
               default_theta: float = 10000.0) -> RopeConfig:
    """One rope parameter dict (`rope_scaling` / `rope_parameters[...]`) -> RopeConfig."""
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    theta = params.get("rope_theta", config.get("rope_theta", default_theta))
    max_pos = int(config.get("max_position_embeddings", 4096))
    factor = params.get("factor")
    if rope_type in ("linear", "dynamic", "llama3") and factor is None:
        raise ValidationError(f"rope type {rope_type!r} needs a `factor`", param="rope_scaling")
    original = config.get("original_max_position_embeddings") or params.get(
        "original_max_position_embeddings") or max_pos
    if rope_type == "yarn" and factor is None:
        factor = max_pos / original
    attention_factor = params.get("attention_factor")
    return RopeConfig(
        rope_type=rope_type,
        theta=float(theta),
        factor=float(factor if factor is not None else 1.0),
        original_max_position_embeddings=int(original),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=None if attention_factor is None else float(attention_factor),
        mscale=float(params.get("mscale") or 0.0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
        truncate=bool(params.get("truncate", True)),
        partial_rotary_factor=float(params.get("partial_rotary_factor",
                                               config.get("partial_rotary_factor", 1.0))),
    )


def single_rope(config: Mapping[str, Any]) -> RopeConfig:
    """The one rope of a model whose layers all share it (either config layout)."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    return parse_rope(params, config)
