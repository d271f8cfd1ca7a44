"""Mixture-of-experts MLPs: routing, the fused experts op, the `Experts` module and its weights.

    weights, ids = softmax_topk(router_logits, k, renormalize=True)   # f32 [T, k], i32 [T, k]
    out = fused_experts(x, w_gate_up, w_down, weights, ids)           # [T, H]
    #   out[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t])
    #   expert_e(x) = (act(x @ w_gate_up[e, :I].T (+b), x @ w_gate_up[e, I:].T (+b))) @ w_down[e].T (+b)

Shapes: T tokens, H hidden, E experts, I each expert's intermediate size, k experts per token.
`w_gate_up` is [E, 2I, H] (rows [0:I] the gate, [I:2I] the up projection), `w_down` [E, H, I];
optional biases [E, 2I] and [E, H] (the down bias is added inside the expert, so it is scaled
by the routing weight). Activations (MOE_ACTIVATIONS): "silu" is silu(gate) * up; "swiglu_oai"
is gpt-oss's clamped SwiGLU: gate.clamp(max=limit), up.clamp(-limit, limit),
(up + 1) * gate * sigmoid(alpha * gate).

`fused_experts` dispatches to the Triton fused-MoE kernel (`services.engine.kernels.
fused_experts`, docs/kernels.md) when x is on CUDA and the kernels are available
(`HELIOS_KERNELS=torch` forces the reference); elsewhere `reference_fused_experts` runs:
per expert, its selected tokens only (reads the routing on the host), or, while a CUDA graph
is being captured, every expert over every token masked by the routing (no host reads).

The experts' parameters (`Experts`, dense, or `Mxfp4Experts`), the checkpoint layouts
(per-expert or fused expert tensors) and their loaders are `expert_weights.py`'s;
`expert_checkpoint_target` maps a checkpoint name onto the `Experts` parameters.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.model import ops
from services.engine.model.attention import AttentionMetadata
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.expert_weights import (
    FUSED,
    MOE_ACTIVATIONS,
    Experts,
    Mxfp4Experts,
    expert_checkpoint_target,
)
from services.engine.model.layers import Attention, GatedMLP, Linear, RMSNorm

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Routing


def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen-MoE / Mixtral routing: softmax over the experts (float32), the top k; with
    `renormalize` the k probabilities are divided by their sum. -> (f32 [T, k], int32 [T, k])."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def topk_softmax(router_logits: torch.Tensor, top_k: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss routing: the top k logits, softmax over those k (float32; equal to
    `softmax_topk(..., renormalize=True)` up to rounding)."""
    values, ids = torch.topk(router_logits.float(), top_k, dim=-1)
    return torch.softmax(values, dim=-1), ids.to(torch.int32)


# ---------------------------------------------------------------------------------------------
# The experts op


def expert_activation(gate_up: torch.Tensor, activation: str, limit: float = 7.0,
                      alpha: float = 1.702) -> torch.Tensor:
    """gate_up [N, 2I] (gate then up) -> [N, I], computed in float32, cast back."""
    inter = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :inter].float(), gate_up[..., inter:].float()
    if activation == "silu":
        out = F.silu(gate) * up
    elif activation == "swiglu_oai":
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        out = (up + 1.0) * (gate * torch.sigmoid(gate * alpha))
    else:
        raise ValueError(f"unknown expert activation {activation!r} (known: {MOE_ACTIVATIONS})")
    return out.to(gate_up.dtype)


def _expert(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
            gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None,
            activation: str, limit: float, alpha: float) -> torch.Tensor:
    """One expert over rows x [N, H] -> [N, H] (weights of that expert: [2I, H], [H, I])."""
    hidden = expert_activation(F.linear(x, w_gate_up, gate_up_bias), activation, limit, alpha)
    return F.linear(hidden, w_down, down_bias)


def check_experts_call(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                       topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: str
                       ) -> None:
    """Shape checks shared by the reference and the kernel wrapper (host metadata only)."""
    if x.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValueError("fused_experts: x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I]")
    num_experts, two_inter, hidden = w_gate_up.shape
    if (hidden != x.shape[1] or two_inter % 2 or
            tuple(w_down.shape) != (num_experts, hidden, two_inter // 2)):
        raise ValueError(f"fused_experts: shapes x {tuple(x.shape)}, w_gate_up "
                         f"{tuple(w_gate_up.shape)}, w_down {tuple(w_down.shape)} disagree")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"fused_experts: topk ids {tuple(topk_ids.shape)} / weights "
                         f"{tuple(topk_weights.shape)} for {x.shape[0]} tokens")
    if activation not in MOE_ACTIVATIONS:
        raise ValueError(f"unknown expert activation {activation!r} (known: {MOE_ACTIVATIONS})")


def reference_fused_experts(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                            topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                            gate_up_bias: torch.Tensor | None = None,
                            down_bias: torch.Tensor | None = None, activation: str = "silu",
                            limit: float = 7.0, alpha: float = 1.702) -> torch.Tensor:
    """The plain-torch fused_experts: [T, H] in x's dtype, accumulated in float32."""
    check_experts_call(x, w_gate_up, w_down, topk_weights, topk_ids, activation)
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return dense_fused_experts(x, w_gate_up, w_down, topk_weights, topk_ids,
                                   gate_up_bias=gate_up_bias, down_bias=down_bias,
                                   activation=activation, limit=limit, alpha=alpha)
    num_experts = w_gate_up.shape[0]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    present = torch.bincount(ids.flatten(), minlength=num_experts).nonzero().flatten().tolist()
    for e in present:
        rows, slots = (ids == e).nonzero(as_tuple=True)
        y = _expert(x[rows], w_gate_up[e], w_down[e],
                    None if gate_up_bias is None else gate_up_bias[e],
                    None if down_bias is None else down_bias[e], activation, limit, alpha)
        out.index_add_(0, rows, y.float() * topk_weights[rows, slots, None].float())
    return out.to(x.dtype)


def dense_fused_experts(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                        topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                        gate_up_bias: torch.Tensor | None = None,
                        down_bias: torch.Tensor | None = None, activation: str = "silu",
                        limit: float = 7.0, alpha: float = 1.702) -> torch.Tensor:
    """The reference without host reads (a CUDA graph captures it): every expert over every
    token, each token's output the routing-weighted sum of its selected experts' (E times
    the work: the torch fallback of a captured step only)."""
    num_experts = w_gate_up.shape[0]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    combine = torch.zeros(x.shape[0], num_experts, dtype=torch.float32, device=x.device)
    combine.scatter_add_(1, topk_ids.long(), topk_weights.float())
    for e in range(num_experts):
        y = _expert(x, w_gate_up[e], w_down[e],
                    None if gate_up_bias is None else gate_up_bias[e],
                    None if down_bias is None else down_bias[e], activation, limit, alpha)
        weight = combine[:, e:e + 1]
        out += torch.where(weight > 0, weight * y.float(), 0.0)
    return out.to(x.dtype)


@functools.cache
def _kernel(name: str = "fused_experts") -> Callable[..., Any] | None:
    """services.engine.kernels.<name> (fused_experts, fused_moe_routed), unless
    HELIOS_KERNELS=torch or it is absent."""
    if os.environ.get("HELIOS_KERNELS", "").strip().lower() == "torch":
        return None
    try:
        kernels = importlib.import_module("services.engine.kernels")
        fn = getattr(kernels, name, None)
    except Exception:  # a broken kernel module must not take the engine down
        log.exception("the fused-MoE kernel failed to import; using the torch reference")
        return None
    return fn if callable(fn) else None


def fused_experts(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                  gate_up_bias: torch.Tensor | None = None,
                  down_bias: torch.Tensor | None = None, activation: str = "silu",
                  limit: float = 7.0, alpha: float = 1.702) -> torch.Tensor:
    """x [T, H] -> sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]) [T, H] (x's dtype).

    topk_weights: float32 [T, k], normalized as the model wants; topk_ids: int32 [T, k]."""
    kernel = _kernel("fused_experts") if x.is_cuda else None
    fn = kernel or reference_fused_experts
    return fn(x, w_gate_up, w_down, topk_weights, topk_ids, gate_up_bias=gate_up_bias,
              down_bias=down_bias, activation=activation, limit=limit, alpha=alpha)


# ---------------------------------------------------------------------------------------------
# Expert load (GetLoad, the dashboard) and expert weight bytes (memory accounting)


@dataclass(frozen=True, slots=True)
class ExpertLoad:
    """Tokens routed to each expert since start (real rows; summed over the sparse layers)."""

    tokens: tuple[int, ...]
    layers: int          # sparse layers
    top_k: int


def _load_counters(model: nn.Module) -> list[torch.Tensor]:
    """Every sparse block's `expert_tokens` counter (int64 [E]), in module order."""
    counters = (getattr(m, "expert_tokens", None) for m in model.modules())
    return [c for c in counters if isinstance(c, torch.Tensor)]


def expert_load(model: nn.Module) -> ExpertLoad | None:
    """The model's expert load (one device read: off the hot path); None for dense models."""
    counters = _load_counters(model)
    config = getattr(model, "config", None)
    if not counters or config is None or config.moe is None:
        return None
    total = torch.stack(counters).sum(dim=0).tolist()
    return ExpertLoad(tuple(int(v) for v in total), len(counters), config.moe.top_k)


def reset_expert_load(model: nn.Module) -> None:
    """Zero the counters in place (after graph capture and warm-up, whose forwards count;
    the captured graphs keep the same buffers)."""
    with torch.inference_mode():   # the counters are inference tensors (made at load)
        for counter in _load_counters(model):
            counter.zero_()


def warm_up_experts(model: nn.Module, max_tokens: int) -> None:
    """`warm_up` of one sparse block of each kind and shape (the others compile nothing
    new); a no-op for dense models and off CUDA."""
    seen: set[tuple[Any, ...]] = set()
    with torch.inference_mode():
        for module in model.modules():
            if isinstance(module, SparseMoeBlock):
                experts = module.experts
                key = (type(module), tuple(experts.w_gate_up.shape), experts.w_gate_up.dtype,
                       experts.gate_up_bias is not None, experts.activation)
                if key not in seen:
                    seen.add(key)
                    module.warm_up(max_tokens)


def expert_weight_bytes(model: nn.Module) -> int:
    """Bytes of every `Experts` module's weights and biases (the bulk of an MoE model)."""
    return sum(p.numel() * p.element_size() for m in model.modules()
               if isinstance(m, Experts) for p in m.parameters())


# ---------------------------------------------------------------------------------------------
# The sparse MLP block and the MoE model base


class SparseMoeBlock(nn.Module):
    """Router (`gate`: [E, H], bias when configured) -> top-k routing -> the experts."""

    # On CUDA the fused kernel routes (softmax over the experts, the top k, renormalized when
    # `renormalize`): a family whose `route` is not that, up to rounding, sets this False
    fused_routing = True

    def __init__(self, config: ModelConfig, moe: MoEConfig, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.top_k, self.renormalize = moe.top_k, moe.renormalize
        self.gate = Linear(config.hidden_size, moe.num_experts, bias=moe.router_bias,
                           device=device, dtype=dtype)
        experts = Mxfp4Experts if moe.expert_format == "mxfp4" else Experts
        self.experts = experts(moe.num_experts, config.hidden_size, moe.intermediate_size,
                               bias=moe.expert_bias, activation=moe.activation,
                               limit=moe.swiglu_limit, alpha=moe.swiglu_alpha, device=device,
                               dtype=dtype)
        # tokens routed to each expert, cumulative (real rows only); read by expert_load()
        self.expert_tokens: torch.Tensor
        self.register_buffer("expert_tokens", torch.zeros(moe.num_experts, dtype=torch.int64,
                                                          device=device), persistent=False)

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.gate.weight, self.gate.bias, out_dtype=torch.float32)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return softmax_topk(self.router_logits(x), self.top_k, self.renormalize)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """x [T, H] (normed) -> [T, H]; adds the real rows' (those before
        query_start_loc[-1]: padding rows come after) routing to `expert_tokens`."""
        return self.mix(x, meta.query_start_loc[-1:])

    def warm_up(self, max_tokens: int) -> None:
        """Run the expert kernels once at the first token count of each of their variants
        up to max_tokens (kernels/fused_moe.variant_token_counts), so every variant a step
        can meet compiles at start-up rather than in a step while serving. What these runs
        count is cleared by `reset_expert_load` after start-up."""
        weight = self.experts.w_gate_up
        if not weight.is_cuda or _kernel() is None:
            return
        from services.engine.kernels.fused_moe import variant_token_counts

        num_experts, two_inter, hidden = weight.shape
        mxfp4 = getattr(weight, "scales", None) is not None
        norm = torch.ones(hidden, dtype=weight.dtype, device=weight.device)
        for tokens in variant_token_counts(max_tokens, self.top_k, num_experts, hidden,
                                           two_inter // 2, mxfp4):
            x = torch.zeros(tokens, hidden, dtype=weight.dtype, device=weight.device)
            self.mix(x, torch.tensor([tokens], dtype=torch.int32, device=weight.device))
        # the decode token counts again with the norm fused in (forward_residual's path: the
        # router's norm_linear variants and the experts' NORM variant)
        from services.engine.kernels.fused_moe_decode import DECODE_TOKENS

        for tokens in range(1, min(max_tokens, DECODE_TOKENS) + 1):
            x = torch.zeros(tokens, hidden, dtype=weight.dtype, device=weight.device)
            if self._folding_kernel(x) is not None:
                self.forward_residual(x, torch.zeros_like(x), norm, 1e-6, torch.tensor(
                    [tokens], dtype=torch.int32, device=weight.device))

    def _expert_kwargs(self, num_real: torch.Tensor) -> dict[str, Any]:
        experts = self.experts
        return dict(gate_up_bias=experts.gate_up_bias, down_bias=experts.down_bias,
                    activation=experts.activation, limit=experts.limit, alpha=experts.alpha,
                    expert_tokens=self.expert_tokens, num_real_tokens=num_real)

    def _folding_kernel(self, x: torch.Tensor) -> Callable[..., Any] | None:
        """fused_moe_routed where forward_residual folds the norm into the router and the
        experts (CUDA kernels routing in the kernel, a call the decode kernels take), else
        None."""
        routed = _kernel("fused_moe_routed") if x.is_cuda and self.fused_routing else None
        if routed is None:
            return None
        from services.engine.kernels.fused_moe_decode import decode_path

        weight = self.experts.w_gate_up
        mxfp4 = getattr(weight, "scales", None) is not None
        return routed if decode_path(x.shape[0], self.top_k, weight.shape[0], mxfp4) else None

    def forward_residual(self, x: torch.Tensor, residual: torch.Tensor,
                         norm_weight: torch.Tensor, eps: float, num_real: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sparse sublayer from the attention's output: the experts over
        rms_norm(x + residual) * norm_weight -> (out, new residual). Where the decode kernels
        run (fused_moe_decode.py), the norm rides in launches that are there anyway: the
        router's norm_linear adds the residual and normalizes (float32 logits), and the
        experts' gate/up kernel normalizes its rows itself, so no norm kernel launches;
        elsewhere the norm kernel, then `mix`."""
        routed = self._folding_kernel(x)
        if routed is not None:
            experts = self.experts
            logits, residual = ops.norm_linear(x, residual, norm_weight, eps,
                                               self.gate.weight, self.gate.bias,
                                               out_dtype=torch.float32)
            out, _, _ = routed(
                residual, logits, experts.w_gate_up, experts.w_down, self.top_k,
                self.renormalize, norm_weight=norm_weight, eps=eps,
                **self._expert_kwargs(num_real))
            return out, residual
        normed, residual = ops.fused_add_rms_norm(x, residual, norm_weight, eps)
        return self.mix(normed, num_real), residual

    def mix(self, x: torch.Tensor, num_real: torch.Tensor) -> torch.Tensor:
        """forward's work, with the real-row count (int32 [1]) given."""
        experts = self.experts
        kw = self._expert_kwargs(num_real)
        routed = _kernel("fused_moe_routed") if x.is_cuda and self.fused_routing else None
        if routed is not None:   # routing, counting and both GEMMs (fused_moe.py: 2-4 launches)
            out, _, _ = routed(x, self.router_logits(x), experts.w_gate_up, experts.w_down,
                               self.top_k, self.renormalize, **kw)
            return out
        weights, ids = self.route(x)      # a family's own routing runs in torch
        kernel = _kernel("fused_experts") if x.is_cuda else None
        if kernel is not None:
            return kernel(x, experts.w_gate_up, experts.w_down, weights, ids, **kw)
        real = (torch.arange(x.shape[0], device=x.device) < num_real).to(torch.int64)
        self.expert_tokens.index_add_(0, ids.flatten().long(),
                                      real.repeat_interleave(ids.shape[1]))
        return fused_experts(x, experts.w_gate_up, experts.w_down, weights, ids,
                             gate_up_bias=experts.gate_up_bias, down_bias=experts.down_bias,
                             activation=experts.activation, limit=experts.limit,
                             alpha=experts.alpha)


class MoEDecoderLayer(nn.Module):
    """A pre-norm decoder layer whose MLP is a `SparseMoeBlock` or, where the config says the
    layer is dense, the gated MLP (layers/decoder.py's call: residual add deferred)."""

    def __init__(self, config: ModelConfig, layer_index: int, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, self.eps, device=device, dtype=dtype)
        self.self_attn = Attention(config, layer_index, device=device, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, self.eps, device=device,
                                                dtype=dtype)
        moe = config.moe
        self.sparse = moe is not None and moe.sparse_layers[layer_index]
        self.mlp: nn.Module = (
            SparseMoeBlock(config, moe, device=device, dtype=dtype) if moe and self.sparse
            else GatedMLP(config, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        attn = self.self_attn
        qkv, residual = ops.norm_linear(x, residual, self.input_layernorm.weight, self.eps,
                                        attn.qkv_proj.weight, attn.qkv_proj.bias)
        x = attn(qkv, positions, cos_sin_cache, k_cache, v_cache, meta)
        norm = self.post_attention_layernorm.weight
        if self.sparse:
            return cast(SparseMoeBlock, self.mlp).forward_residual(
                x, residual, norm, self.eps, meta.query_start_loc[-1:])
        mlp = cast(GatedMLP, self.mlp)
        activation, residual = ops.norm_linear(
            x, residual, norm, self.eps, mlp.gate_up_proj.weight, mlp.gate_up_proj.bias,
            activation=mlp.activation)
        return mlp(activation), residual


class MoECausalLM(CausalLM):
    """A CausalLM with sparse MLP blocks: expert checkpoint names and the expert load."""

    layer_class: ClassVar[Callable[..., nn.Module]] = MoEDecoderLayer
    # the block that holds router + experts in checkpoints (Mixtral: block_sparse_moe)
    moe_block_name: ClassVar[str] = "mlp"
    # canonical per-expert checkpoint names, for "checkpoint lacks tensor ..." messages
    expert_projection_names: ClassVar[dict[str, str]] = {
        "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}

    def moe_blocks(self) -> list[SparseMoeBlock]:
        return [m for m in self.modules() if isinstance(m, SparseMoeBlock)]

    def expert_load(self) -> list[int]:
        """Tokens routed to each expert since start, summed over the sparse layers (one
        device read: call it off the hot path)."""
        blocks = self.moe_blocks()
        if not blocks:
            return []
        return torch.stack([b.expert_tokens for b in blocks]).sum(dim=0).tolist()

    def checkpoint_target(self, name: str) -> tuple[str, str | None] | None:
        for prefix, replacement in self.checkpoint_prefixes.items():
            if name.startswith(prefix):
                name = replacement + name[len(prefix):]
                break
        if self.moe_block_name != "mlp":
            name = name.replace(f".{self.moe_block_name}.", ".mlp.")
        expert = expert_checkpoint_target(name)
        if expert is not None:
            return expert
        return super().checkpoint_target(name)

    def checkpoint_name(self, param_name: str, shard: str | None) -> str:
        head, marker, tensor = param_name.rpartition(".experts.")
        if not marker or shard is None or shard == FUSED:
            name = super().checkpoint_name(param_name, shard)
        else:
            expert, _, part = shard.partition(".")
            part = part or "down"
            kind = "weight" if tensor.startswith("w_") else "bias"
            name = (f"{head}.experts.{expert}.{self.expert_projection_names[part]}.{kind}")
        if self.moe_block_name != "mlp":
            name = name.replace(".mlp.", f".{self.moe_block_name}.")
        return name
