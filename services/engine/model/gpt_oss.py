"""gpt-oss: `GptOssForCausalLM` (gpt-oss-20b, gpt-oss-120b).

How it differs from the Llama family:
- attention sinks: a learned logit per query head in every softmax's denominator (no value
  behind it), `self_attn.sinks` [Hq], passed to `ops.paged_attention`;
- layers alternate sliding-window (`sliding_window`, 128) and full attention (`layer_types`,
  by default even layers slide), all with one YaRN rope (`rope_parameters` /
  `rope_scaling`: factor 32 over 4096 positions, `truncate: false`); q/k/v/o biases;
- the MLP is a mixture of experts: a router with a bias picks the top-k logits per token and
  weights the chosen experts by the softmax over those k logits; each expert is a clamped
  SwiGLU with biases (`fused_experts(..., activation="swiglu_oai")`, limit 7, alpha 1.702).

Checkpoints store the experts fused: `mlp.experts.gate_up_proj` [E, H, 2I] with gate and up
interleaved along the last dim (gate at even columns), `down_proj` [E, I, H], and biases
`gate_up_proj_bias` [E, 2I] (interleaved too), `down_proj_bias` [E, H]. The loaders here turn
them into the MoE layout (`w_gate_up` [E, 2I, H]: gate rows then up rows; `w_down` [E, H, I]).
The released checkpoints keep the expert matrices as MXFP4 (`quantization_config.quant_method:
mxfp4`: `*_blocks` + `*_scales`, in [E, rows, K / 32, ...] with the output rows first); they
are dequantized at load to the model dtype (`mxfp4.py`: exact in bf16), or with the engine
setting `mxfp4_experts: keep` kept packed (expert_weights.py's `Mxfp4Experts`, rows
de-interleaved) for the fused-MoE kernel to dequantize tile by tile.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from services.common.errors import UnsupportedError
from services.engine.model import ops
from services.engine.model.architecture import Architecture
from services.engine.model.attention import AttentionMetadata
from services.engine.model.config import (
    LayerAttention,
    ModelConfig,
    MoEConfig,
    activation,
    layer_types,
    malformed,
    parse_rope,
    shape_fields,
)
from services.engine.model.expert_weights import Mxfp4Experts
from services.engine.model.layers import Attention, RMSNorm
from services.engine.model.layers.weights import WeightShapeError, load_whole, parameter
from services.engine.model.moe import MoECausalLM, SparseMoeBlock, topk_softmax
from services.engine.model.mxfp4 import GROUP, dequantize_mxfp4

NAME = "GptOssForCausalLM"
DEFAULT_THETA = 150_000.0
# transformers' GptOssConfig defaults when a config states no rope
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}


def _check_quantization(config: Mapping[str, Any], hidden: int, inter: int) -> None:
    """Only MXFP4 experts (`quant_method: mxfp4`) are read; they need K % 32 == 0."""
    quant = config.get("quantization_config")
    if not quant:
        return
    method = str(quant.get("quant_method", "")) if isinstance(quant, Mapping) else ""
    if method != "mxfp4":
        raise UnsupportedError(f"{NAME}: quantization {method or quant!r} is not supported "
                               "(supported: mxfp4 experts, dequantized at load)",
                               param="quantization_config")
    if hidden % GROUP or inter % GROUP:
        raise UnsupportedError(f"{NAME}: MXFP4 experts need hidden_size and "
                               f"intermediate_size to be multiples of {GROUP}",
                               param="quantization_config")


def parse_gpt_oss(config: Mapping[str, Any]) -> ModelConfig:
    fields = shape_fields(config, NAME)
    fields["rms_norm_eps"] = float(config.get("rms_norm_eps", 1e-5))
    count = fields["num_hidden_layers"]
    window = int(config.get("sliding_window") or 0)
    types = layer_types(config, count) or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(count)]
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or DEFAULT_ROPE)
    rope = parse_rope(params, config, default_theta=DEFAULT_THETA)
    layers = tuple(LayerAttention(window if kind == "sliding_attention" else 0, rope)
                   for kind in types)
    bias = bool(config.get("attention_bias", True))
    try:
        moe = MoEConfig(
            num_experts=int(config.get("num_local_experts") or config["num_experts"]),
            top_k=int(config.get("num_experts_per_tok", 4)),
            intermediate_size=fields["intermediate_size"], sparse_layers=(True,) * count,
            renormalize=True, activation="swiglu_oai", expert_bias=True, router_bias=True,
            swiglu_limit=float(config.get("swiglu_limit", 7.0)),
            swiglu_alpha=float(config.get("swiglu_alpha", 1.702)))
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(NAME, exc) from exc
    _check_quantization(config, fields["hidden_size"], fields["intermediate_size"])
    return ModelConfig(**fields, layers=layers, qkv_bias=bias, o_bias=bias,
                       activation=activation(config, NAME), moe=moe)


# ---------------------------------------------------------------------------------------------
# Expert weights: gpt-oss's fused layout (dense or MXFP4) -> the MoE layout


DENSE = "dense"                    # a dense expert tensor: covers both MXFP4 shards
MXFP4_SHARDS = ("blocks", "scales")


def _deinterleave_rows(t: torch.Tensor) -> torch.Tensor:
    """[..., 2I, X] with gate at even rows, up at odd -> gate rows then up rows (dim -2)."""
    return torch.cat((t[..., 0::2, :], t[..., 1::2, :]), dim=-2)


def _check(tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != expected:
        raise WeightShapeError(tuple(tensor.shape), expected)


def _expert_matrix_loader(transposed: Callable[[torch.Tensor], torch.Tensor],
                          rows: Callable[[torch.Tensor], torch.Tensor]
                          ) -> Callable[[nn.Parameter, torch.Tensor, str | None], None]:
    """The loader of an expert matrix, the parameter [E, R, K] (R output rows).

    Shard "dense": the checkpoint's [E, K, R] tensor (x @ W), mapped by `transposed`. Shards
    "blocks" / "scales": the MXFP4 halves of the [E, R, K] matrix (rows in the checkpoint's
    order, mapped by `rows`); whichever comes second completes the pair, dequantized one
    expert at a time (bounded host memory) straight into the parameter."""

    def load(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
        experts, out_rows, cols = param.shape
        if shard == DENSE:
            _check(tensor, (experts, cols, out_rows))
            param.data.copy_(transposed(tensor))
            return
        if shard not in MXFP4_SHARDS:
            raise KeyError(f"no shard {shard!r} (shards: {DENSE}, blocks, scales)")
        expected = (experts, out_rows, cols // GROUP)
        _check(tensor, (*expected, GROUP // 2) if shard == "blocks" else expected)
        pending: dict[str, torch.Tensor] = getattr(param, "mxfp4_pending", {})
        pending[shard] = tensor
        param.mxfp4_pending = pending                       # type: ignore[attr-defined]
        if len(pending) < len(MXFP4_SHARDS):
            return
        blocks, scales = pending["blocks"], pending["scales"]
        for e in range(experts):
            param.data[e].copy_(rows(dequantize_mxfp4(blocks[e], scales[e], torch.float32)))
        param.mxfp4_pending = {}                            # type: ignore[attr-defined]

    return load


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _packed_loader(rows: Callable[[torch.Tensor], torch.Tensor], blocks: bool
                   ) -> Callable[[nn.Parameter, torch.Tensor, str | None], None]:
    """The loader of a kept MXFP4 half (mxfp4_experts: keep): the checkpoint's `*_blocks`
    [E, R, K/32, 16] into the parameter [E, R, K/2], or `*_scales` [E, R, K/32], rows
    reordered by `rows` (gate_up: gate rows then up rows)."""

    def load(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
        experts, out_rows, width = param.shape
        expected = (experts, out_rows, width // (GROUP // 2), GROUP // 2) if blocks else \
            (experts, out_rows, width)
        _check(tensor, expected)
        for e in range(experts):        # one expert at a time: bounded host memory
            param.data[e].copy_(rows(tensor[e].reshape(out_rows, width)))

    return load


def _interleaved_bias_loader(param: nn.Parameter, tensor: torch.Tensor, shard: str | None
                             ) -> None:
    _check(tensor, tuple(param.shape))
    param.data.copy_(torch.cat((tensor[:, 0::2], tensor[:, 1::2]), dim=1))


def _set_loader(param: nn.Parameter | None, loader: Callable[..., None],
                shards: tuple[str | None, ...], covers: Mapping[str, tuple[str | None, ...]]
                ) -> None:
    assert param is not None
    param.weight_loader = loader                            # type: ignore[attr-defined]
    param.weight_shards = shards                            # type: ignore[attr-defined]
    param.weight_shard_covers = dict(covers)                # type: ignore[attr-defined]


class GptOssMoeBlock(SparseMoeBlock):
    """The sparse block with gpt-oss's routing (the top-k logits, softmax over those k) and
    its checkpoint layout (the router is `mlp.router` there; the block's `gate` here). The
    softmax is monotone, so that routing is softmax top-k renormalized up to rounding: on
    CUDA the fused kernel routes it (`fused_routing`, renormalize is set)."""

    def __init__(self, config: ModelConfig, moe: MoEConfig, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__(config, moe, device=device, dtype=dtype)
        experts = self.experts
        if isinstance(experts, Mxfp4Experts):       # kept packed: rows reordered, no decode
            for name, rows in (("w_gate_up", _deinterleave_rows), ("w_down", _same)):
                _set_loader(getattr(experts, f"{name}_blocks"), _packed_loader(rows, True),
                            (None,), {})
                _set_loader(getattr(experts, f"{name}_scales"), _packed_loader(rows, False),
                            (None,), {})
        else:
            covers = {DENSE: MXFP4_SHARDS}
            _set_loader(experts.w_gate_up, _expert_matrix_loader(
                lambda t: _deinterleave_rows(t.transpose(1, 2)), _deinterleave_rows),
                MXFP4_SHARDS, covers)
            _set_loader(experts.w_down, _expert_matrix_loader(
                lambda t: t.transpose(1, 2), _same), MXFP4_SHARDS, covers)
        _set_loader(experts.gate_up_bias, _interleaved_bias_loader, (None,), {})
        _set_loader(experts.down_bias, load_whole, (None,), {})

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = ops.linear(x, self.gate.weight, self.gate.bias, out_dtype=torch.float32)
        return topk_softmax(logits, self.top_k)


class GptOssDecoderLayer(nn.Module):
    """Pre-norm: norm -> attention (with sinks), add; norm -> mixture of experts, add (the adds
    deferred into the next norm)."""

    def __init__(self, config: ModelConfig, layer_index: int, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        assert config.moe is not None
        self.eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, self.eps, device=device, dtype=dtype)
        self.self_attn = Attention(config, layer_index, device=device, dtype=dtype)
        self.self_attn.sinks = parameter(config.num_attention_heads, device=device, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, self.eps, device=device,
                                                dtype=dtype)
        self.mlp = GptOssMoeBlock(config, config.moe, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        attn = self.self_attn
        qkv, residual = ops.norm_linear(x, residual, self.input_layernorm.weight, self.eps,
                                        attn.qkv_proj.weight, attn.qkv_proj.bias)
        out = attn(qkv, positions, cos_sin_cache, k_cache, v_cache, meta)          # [T, H]
        return self.mlp.forward_residual(out, residual, self.post_attention_layernorm.weight,
                                         self.eps, meta.query_start_loc[-1:])


# checkpoint expert tensors: <block>.experts.<projection><suffix>
_EXPERT_TENSOR = re.compile(
    r"^(.*\.mlp\.experts\.)(gate_up_proj|down_proj)(_bias|_blocks|_scales)?$")
_EXPERT_PARAMS = {"gate_up_proj": "w_gate_up", "down_proj": "w_down"}
_BIAS_PARAMS = {"gate_up_proj": "gate_up_bias", "down_proj": "down_bias"}
_SHARDS = {None: DENSE, "_blocks": "blocks", "_scales": "scales"}


class GptOssForCausalLM(MoECausalLM):
    layer_class = GptOssDecoderLayer

    def checkpoint_target(self, name: str) -> tuple[str, str | None] | None:
        match = _EXPERT_TENSOR.match(name)
        if match is not None:
            prefix, projection, suffix = match.groups()
            if suffix == "_bias":
                return prefix + _BIAS_PARAMS[projection], None
            moe = self.config.moe
            if moe is not None and moe.expert_format == "mxfp4":    # kept: its own parameter
                return prefix + _EXPERT_PARAMS[projection] + (suffix or "_dense"), None
            return prefix + _EXPERT_PARAMS[projection], _SHARDS[suffix]
        return super().checkpoint_target(name.replace(".mlp.router.", ".mlp.gate."))

    def checkpoint_name(self, param_name: str, shard: str | None) -> str:
        prefix, _, leaf = param_name.rpartition(".")
        for projection, param in _EXPERT_PARAMS.items():
            if leaf == param:
                return f"{prefix}.{projection}" + (f"_{shard}" if shard in MXFP4_SHARDS else "")
            if leaf in (f"{param}_blocks", f"{param}_scales"):
                return f"{prefix}.{projection}{leaf[len(param):]}"
            if leaf == _BIAS_PARAMS[projection]:
                return f"{prefix}.{projection}_bias"
        return super().checkpoint_name(param_name, shard).replace(".mlp.gate.", ".mlp.router.")


ARCHITECTURES = (Architecture(NAME, GptOssForCausalLM, parse_gpt_oss),)
