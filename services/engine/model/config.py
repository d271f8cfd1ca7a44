"""ModelConfig: the frozen, validated view of a checkpoint's config.json the engine runs on.

Parsing accepts both config layouts in the wild: the older `rope_theta` + `rope_scaling`
({"type"|"rope_type": ...}) and transformers 5's `rope_parameters` dict. Architectures outside
`SUPPORTED_ARCHITECTURES` are refused with an `UnsupportedError` naming the architecture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.common.errors import UnsupportedError, ValidationError

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True, slots=True)
class ArchitectureTraits:
    """How one supported architecture differs from plain Llama."""

    qkv_bias: bool | None  # None: follow config `attention_bias`
    o_bias: bool | None    # None: follow config `attention_bias`
    qk_norm: bool          # RMSNorm over head_dim on q and k before rotary (Qwen3)
    mlp_bias_key: str = ""  # config key enabling MLP biases ("" = never)


SUPPORTED_ARCHITECTURES: dict[str, ArchitectureTraits] = {
    "LlamaForCausalLM": ArchitectureTraits(None, None, qk_norm=False, mlp_bias_key="mlp_bias"),
    "MistralForCausalLM": ArchitectureTraits(False, False, qk_norm=False),
    "Qwen2ForCausalLM": ArchitectureTraits(True, False, qk_norm=False),
    "Qwen3ForCausalLM": ArchitectureTraits(None, None, qk_norm=True),
}


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
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rope: RopeConfig = field(default_factory=RopeConfig)
    sliding_window: int | None = None   # when set, contexts are capped to it (see max_context)
    torch_dtype: str = "float32"        # checkpoint dtype

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
        if self.rope.rope_type not in ROPE_TYPES:
            raise UnsupportedError(
                f"rope type {self.rope.rope_type!r} is not supported (supported: "
                f"{', '.join(ROPE_TYPES)})", param="rope_scaling")
        if self.rope.partial_rotary_factor != 1.0:
            raise UnsupportedError("partial rotary embeddings are not supported",
                                   param="partial_rotary_factor")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def max_context(self) -> int:
        """Longest sequence this engine runs exactly like the reference model.

        Rope scaling stretches the range as vLLM reads it: linear and dynamic multiply
        max_position_embeddings by the factor, yarn covers original length x factor, llama3
        configs already state the stretched length. Sliding-window attention is not
        implemented: within the window it equals full attention, so the context is capped to
        the window instead of silently diverging past it.
        """
        limit = self.max_position_embeddings
        rope = self.rope
        if rope.rope_type in ("linear", "dynamic"):
            limit = int(limit * rope.factor)
        elif rope.rope_type == "yarn":
            limit = max(limit, int(rope.original_max_position_embeddings * rope.factor))
        if self.sliding_window:
            return min(limit, self.sliding_window)
        return limit

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token per element byte (multiply by the dtype's itemsize)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelConfig:
        """Parse config.json; unsupported architectures and features raise UnsupportedError."""
        architectures = config.get("architectures") or []
        architecture = architectures[0] if architectures else ""
        traits = SUPPORTED_ARCHITECTURES.get(architecture)
        if traits is None:
            raise UnsupportedError(
                f"architecture {architecture or '(none)'!r} is not supported by the Helios engine "
                f"(supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})",
                param="architectures")
        act = config.get("hidden_act", config.get("hidden_activation", "silu"))
        if act != "silu":
            raise UnsupportedError(f"{architecture}: activation {act!r} is not supported "
                                   "(only silu)", param="hidden_act")
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            head_dim = int(config.get("head_dim") or hidden // heads)
            attention_bias = bool(config.get("attention_bias", False))
            return cls(
                architecture=architecture,
                model_type=str(config.get("model_type", "")),
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(config["intermediate_size"]),
                num_hidden_layers=int(config["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=head_dim,
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                qkv_bias=attention_bias if traits.qkv_bias is None else traits.qkv_bias,
                o_bias=attention_bias if traits.o_bias is None else traits.o_bias,
                mlp_bias=bool(config.get(traits.mlp_bias_key, False))
                if traits.mlp_bias_key else False,
                qk_norm=traits.qk_norm,
                rope=_parse_rope(config),
                sliding_window=_sliding_window(config),
                torch_dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError(f"config.json for {architecture} is malformed: {exc!r}",
                                  param="config.json") from exc


def _sliding_window(config: dict[str, Any]) -> int | None:
    window = config.get("sliding_window")
    if not window:
        return None
    if config.get("model_type") in ("qwen2", "qwen3"):
        # Qwen only slides when asked to, and only on layers listed as sliding.
        layer_types = config.get("layer_types") or []
        if not config.get("use_sliding_window") and "sliding_attention" not in layer_types:
            return None
    return int(window)


def _parse_rope(config: dict[str, Any]) -> RopeConfig:
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
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
