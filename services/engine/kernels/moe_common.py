"""Triton helpers both fused-MoE paths share (fused_moe.py's sorted path, fused_moe_decode.py
at a few tokens): the router's softmax top-k over a tile of rows, and the experts'
activation. One copy, so both paths pick the same experts with the same weights."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softmax_topk_rows(logits, experts, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                      E_PAD: tl.constexpr, RENORMALIZE: tl.constexpr):
    """fp32 logits [ROWS, E_PAD] (-inf past the experts) -> (probabilities fp32
    [ROWS, K_PAD], expert ids int32 [ROWS, K_PAD]): softmax over the experts, then the k
    largest (the lowest id first among equals), renormalized over the k when RENORMALIZE;
    columns past TOP_K hold zeros."""
    top = tl.max(logits, axis=1)
    probs = tl.exp(logits - top[:, None])
    probs = probs / tl.sum(probs, axis=1)[:, None]
    kcol = tl.arange(0, K_PAD)
    values = tl.zeros([logits.shape[0], K_PAD], tl.float32)
    picks = tl.zeros([logits.shape[0], K_PAD], tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(probs, axis=1)
        pick = tl.min(tl.where(probs == best[:, None], experts[None, :], E_PAD), axis=1)
        values = tl.where(kcol[None, :] == j, best[:, None], values)
        picks = tl.where(kcol[None, :] == j, pick[:, None], picks)
        probs = tl.where(experts[None, :] == pick[:, None], -1.0, probs)
    if RENORMALIZE:
        values = values / tl.sum(values, axis=1)[:, None]
    return values, picks


@triton.jit
def expert_activation(gate, up, limit, alpha, ACTIVATION: tl.constexpr):
    """act(gate) * up in fp32: "silu", or gpt-oss's clamped "swiglu_oai"."""
    if ACTIVATION == "swiglu_oai":
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        y = (up + 1.0) * (gate / (1.0 + tl.exp(-alpha * gate)))
    else:
        tl.static_assert(ACTIVATION == "silu", "fused_moe: silu or swiglu_oai")
        y = gate / (1.0 + tl.exp(-gate)) * up
    return y
