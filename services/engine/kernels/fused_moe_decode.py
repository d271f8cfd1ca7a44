"""The fused MoE at a few tokens (decode): two launches where fused_moe.py's sorted path
takes four.

    out = run_decode(x, w_gate_up, w_down, router_logits, topk_weights, topk_ids, top_k,
                     renormalize, ...)          # fused_moe._run's arguments; T <= DECODE_TOKENS

At batch 1 the sorted path's row blocks each hold one real row (the k selected experts, one
block each), and two of its four launches are bookkeeping: the one-program route + align
kernel (5.7 of the 32.4 us a Qwen3-30B-A3B layer's experts took on an H200, RESULTS.md
2026-12-02) and the top-k sum. Here each (token, expert) slot is its own program row and
nothing is sorted:

1. `_decode_gate_up_kernel`, grid (T * k, I / BLOCK_N): program (slot, n) routes its token in
   registers (moe_common.softmax_topk_rows: the align kernel's picks and weights, bit for
   bit), or reads the slot's given expert, and computes act(gate) * up for BLOCK_N columns
   of I as CUDA-core dot products over the expert's weight rows (streamed once, the next
   K step's tiles loaded before this one's products, as skinny_linear's one-row kernel).
   Program (slot, 0) stores the slot's weight and expert (the caller's topk tensors) and
   counts the slot in the expert load when its token is real. With a norm weight (`NORM`:
   model/moe.py's forward_residual) x is the residual stream and each program normalizes
   its token's row first, as the rms_norm kernel does, so the layer launches no norm.
2. `_decode_down_kernel`, grid (T, H / BLOCK_N): program (token, n) takes its token's k
   slots end to end as one reduction of k * I: each column of a K step reads its slot's
   expert's down weights and the slot's intermediate value times its routing weight
   (sum_j W_j (w_j h_j), so one weight pipeline runs across the experts), then adds the
   slots' weighted biases and rounds once: the sorted path's top-k sum without its launch
   (the same sum, rounded in another order).

Tiles: `plan_decode` (gate/up as skinny_linear's gated one-row projection, down its own
from a sweep). A slot reads its whole expert even when another token of the step chose the
same one, so past one token the path is taken only while T * k <= E / 8 (Qwen3-30B-A3B's 8 of 128: up
to 2 tokens; gpt-oss-20b's 4 of 32: 1). On an H100 (RESULTS.md 2026-12-07, thirteenth
session) a call took 34.5 against the sorted path's 40.1 us at Qwen3-30B-A3B T = 1, 63.3
against 66.8 at T = 2, and 115.7 against 112.2 at T = 4 (32 slots of 128 experts); gpt-oss
80.7 against 82.2 at T = 1, 155.4 against 151.4 at T = 2. MXFP4 experts take the sorted
path. `HELIOS_MOE_DECODE=0` sends every call there, `=1` every call of up to DECODE_TOKENS
tokens here (the A/B switches of benchmarks/bench_fused_moe.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from services.engine.kernels.common import cdiv, env_choice, next_power_of_2, sm_count
from services.engine.kernels.moe_common import expert_activation, softmax_topk_rows
from services.engine.kernels.norm import row_rstd
from services.engine.kernels.skinny_linear import LinearPlan, plan_linear

DECODE_TOKENS = 4
COLLISION_SHARE = 8     # the decode path while the slots are at most 1/8 of the experts


def decode_path(num_tokens: int, top_k: int, num_experts: int, mxfp4: bool) -> bool:
    """Whether a call takes the decode kernels: dense experts, at most DECODE_TOKENS tokens,
    and one token, or few enough slots that two tokens rarely pick one expert (each such
    pair reads the expert twice). HELIOS_MOE_DECODE: "auto" (unset; this rule), "0" (never:
    the sorted path), "1" (every call of at most DECODE_TOKENS tokens)."""
    mode = env_choice("HELIOS_MOE_DECODE", ("auto", "0", "1"))
    if mxfp4 or mode == "0" or not 0 < num_tokens <= DECODE_TOKENS:
        return False
    return mode == "1" or num_tokens == 1 or \
        num_tokens * top_k * COLLISION_SHARE <= num_experts


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """The two launches' tiles: gate/up per (slot, column block), down per (token, column
    block) over the token's slots end to end."""
    gate_up: LinearPlan
    down: LinearPlan


def plan_decode(hidden: int, inter: int, top_k: int, num_sms: int) -> DecodePlan:
    """gate/up: skinny_linear's one-row tiling of a gated projection, per slot. down: 8
    output features x 1024 of the slots' span, 4 warps. From bench_fused_moe.py's decode
    sweep at T = 1 on an H100 (RESULTS.md 2026-12-07, fifteenth session; 29 gate/up and 38
    down tilings): the gated tiling (8 x 256, 4 warps) was within 1.3% of the best gate/up
    at both shapes; for down, 8 x 1024 w4 took Qwen3-30B-A3B's call from 34.8 to 33.5 us
    (plain skinny_linear's 16 x 1024 w8) and gpt-oss-20b's from 78.0 to 73.2 (its 8 x 512
    w4): the span is k * I long (6,144 and 11,520), so the longer K step pays."""
    span = top_k * inter
    return DecodePlan(plan_linear(inter, hidden, 1, num_sms, gated=True),
                      LinearPlan(block_n=8, block_k=min(next_power_of_2(span), 1024),
                                 num_warps=4))


@triton.jit
def _gate_up_tiles(g_rows, u_rows, k, cmask, hidden):
    """The gate and up weight tiles [BN, BK] of reduction columns k (zero past `hidden` and
    outside cmask)."""
    mask = cmask[:, None] & (k < hidden)[None, :]
    g = tl.load(g_rows + k[None, :], mask=mask, other=0.0)
    u = tl.load(u_rows + k[None, :], mask=mask, other=0.0)
    return g, u


@triton.jit(do_not_specialize_on_alignment=["num_real_ptr"])   # a view: query_start_loc[-1:]
def _decode_gate_up_kernel(
    x_ptr, norm_w_ptr, logits_ptr, w_ptr, bias_ptr, out_ptr, weights_ptr, ids_ptr, load_ptr,
    num_real_ptr, num_experts, hidden, inter, eps, stride_x, stride_logits, stride_we,
    stride_wn, stride_out, limit, alpha,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, ROUTE: tl.constexpr,
    RENORMALIZE: tl.constexpr, COUNT: tl.constexpr, ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr, NORM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # NORM: x is the layer's residual stream; each program normalizes its token's row as
    # the rms_norm kernel does (1/rms in fp32, x * 1/rms * g rounded to x's dtype)
    slot = tl.program_id(0)
    pid_n = tl.program_id(1)
    token = slot // TOP_K
    if ROUTE:
        experts = tl.arange(0, E_PAD)
        logits = tl.load(logits_ptr + token.to(tl.int64) * stride_logits + experts[None, :],
                         mask=(experts < num_experts)[None, :],
                         other=-float("inf")).to(tl.float32)                 # [1, E_PAD]
        values, picks = softmax_topk_rows(logits, experts, TOP_K, K_PAD, E_PAD, RENORMALIZE)
        mine = tl.arange(0, K_PAD)[None, :] == slot % TOP_K
        expert = tl.sum(tl.where(mine, picks, 0))
        if pid_n == 0:
            tl.store(weights_ptr + slot, tl.sum(tl.where(mine, values, 0.0)))
            tl.store(ids_ptr + slot, expert)
    else:
        expert = tl.load(ids_ptr + slot)
    if COUNT:       # each real token's slot once, by its first column block
        tl.atomic_add(load_ptr + expert, 1,
                      mask=(pid_n == 0) & (token < tl.load(num_real_ptr)))
    expert = expert.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < inter
    ks = tl.arange(0, BLOCK_K)
    g_rows = w_ptr + expert * stride_we + cols.to(tl.int64)[:, None] * stride_wn   # [BN, 1]
    u_rows = g_rows + inter * stride_wn
    x_row = x_ptr + token.to(tl.int64) * stride_x
    g_next, u_next = _gate_up_tiles(g_rows, u_rows, ks, cmask, hidden)
    act_dtype = x_ptr.dtype.element_ty
    rstd = 1.0
    if NORM:
        rstd = row_rstd(x_row, x_row, x_row, hidden, eps, False, False, BLOCK_K)
    acc_gate = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k = k0 + ks
        a = tl.load(x_row + k, mask=k < hidden, other=0.0).to(tl.float32)
        if NORM:
            gain = tl.load(norm_w_ptr + k, mask=k < hidden, other=0.0).to(tl.float32)
            a = (a * rstd * gain).to(act_dtype).to(tl.float32)
        g, u = g_next, u_next
        g_next, u_next = _gate_up_tiles(g_rows, u_rows, k + BLOCK_K, cmask, hidden)
        acc_gate += g.to(tl.float32) * a[None, :]
        acc_up += u.to(tl.float32) * a[None, :]
    gate = tl.sum(acc_gate, axis=1)
    up = tl.sum(acc_up, axis=1)
    if HAS_BIAS:
        bias = bias_ptr + expert * 2 * inter + cols
        gate += tl.load(bias, mask=cmask, other=0.0).to(tl.float32)
        up += tl.load(bias + inter, mask=cmask, other=0.0).to(tl.float32)
    y = expert_activation(gate, up, limit, alpha, ACTIVATION)
    tl.store(out_ptr + slot.to(tl.int64) * stride_out + cols,
             y.to(out_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _slots_step(h_ptr, w_ptr, weights_ptr, ids_ptr, first, k, span, cols, cmask, inter,
                stride_h, stride_we, stride_wn):
    """One K step over a token's slots laid end to end (slot j's intermediate row at
    [j * inter, (j + 1) * inter) of the span): the routing-weighted activations fp32 [BK]
    and the down weights [BN, BK] of each column's expert."""
    live = k < span
    j = k // inter
    within = k - j * inter
    slot = first + j
    expert = tl.load(ids_ptr + slot, mask=live, other=0).to(tl.int64)
    w = tl.load(w_ptr + expert[None, :] * stride_we + cols.to(tl.int64)[:, None] * stride_wn
                + within[None, :], mask=cmask[:, None] & live[None, :], other=0.0)
    a = tl.load(h_ptr + slot * stride_h + within, mask=live, other=0.0).to(tl.float32)
    return a * tl.load(weights_ptr + slot, mask=live, other=0.0), w


@triton.jit
def _decode_down_kernel(
    h_ptr, w_ptr, bias_ptr, weights_ptr, ids_ptr, out_ptr, hidden, inter, stride_h,
    stride_we, stride_wn, stride_out,
    TOP_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # one dot product over the token's k slots end to end: sum_j w_j (W_j h_j) as
    # sum_j W_j (w_j h_j), the weights streamed through one pipeline across the experts
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < hidden
    ks = tl.arange(0, BLOCK_K)
    first = token * TOP_K
    span = TOP_K * inter
    a_next, w_next = _slots_step(h_ptr, w_ptr, weights_ptr, ids_ptr, first, ks, span, cols,
                                 cmask, inter, stride_h, stride_we, stride_wn)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, span, BLOCK_K):
        a, w = a_next, w_next
        a_next, w_next = _slots_step(h_ptr, w_ptr, weights_ptr, ids_ptr, first,
                                     k0 + BLOCK_K + ks, span, cols, cmask, inter, stride_h,
                                     stride_we, stride_wn)
        acc += w.to(tl.float32) * a[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        for j in tl.static_range(TOP_K):
            expert = tl.load(ids_ptr + first + j).to(tl.int64)
            y += tl.load(weights_ptr + first + j) * tl.load(
                bias_ptr + expert * hidden + cols, mask=cmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=cmask)


def run_decode(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
               router_logits: torch.Tensor | None, topk_weights: torch.Tensor,
               topk_ids: torch.Tensor, top_k: int, renormalize: bool,
               gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None,
               activation: str, limit: float, alpha: float,
               expert_tokens: torch.Tensor | None, num_real_tokens: torch.Tensor | None,
               norm_weight: torch.Tensor | None = None, eps: float = 0.0,
               plan: DecodePlan | None = None) -> torch.Tensor:
    """fused_moe._run's contract at T <= DECODE_TOKENS (dense expert matrices): with
    `router_logits` it fills topk_weights / topk_ids, else it reads them. With
    `norm_weight`, x is the residual stream and the experts see rms_norm(x) * g. `plan`
    overrides plan_decode's tiles."""
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = w_gate_up.shape
    inter = two_inter // 2
    slots = num_tokens * top_k
    out = torch.empty_like(x)
    hidden_rows = torch.empty(slots, inter, dtype=x.dtype, device=x.device)
    plan = plan or plan_decode(hidden, inter, top_k, sm_count(x.device))
    up_plan, down_plan = plan.gate_up, plan.down
    route = router_logits is not None
    logits = router_logits if router_logits is not None else topk_weights
    count = expert_tokens is not None
    _decode_gate_up_kernel[(slots, cdiv(inter, up_plan.block_n))](
        x, norm_weight if norm_weight is not None else x, logits, w_gate_up,
        gate_up_bias if gate_up_bias is not None else w_gate_up,
        hidden_rows, topk_weights, topk_ids, expert_tokens if count else topk_ids,
        num_real_tokens if count else topk_ids, num_experts, hidden, inter, float(eps),
        x.stride(0), logits.stride(0), w_gate_up.stride(0), w_gate_up.stride(1),
        hidden_rows.stride(0), float(limit), float(alpha),
        TOP_K=top_k, K_PAD=next_power_of_2(top_k), E_PAD=next_power_of_2(num_experts),
        ROUTE=route, RENORMALIZE=renormalize, COUNT=count, ACTIVATION=activation,
        HAS_BIAS=gate_up_bias is not None, NORM=norm_weight is not None,
        BLOCK_N=up_plan.block_n, BLOCK_K=up_plan.block_k, num_warps=up_plan.num_warps)
    _decode_down_kernel[(num_tokens, cdiv(hidden, down_plan.block_n))](
        hidden_rows, w_down, down_bias if down_bias is not None else w_down, topk_weights,
        topk_ids, out, hidden, inter, hidden_rows.stride(0), w_down.stride(0),
        w_down.stride(1), out.stride(0),
        TOP_K=top_k, HAS_BIAS=down_bias is not None, BLOCK_N=down_plan.block_n,
        BLOCK_K=down_plan.block_k, num_warps=down_plan.num_warps)
    return out
