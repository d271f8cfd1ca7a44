"""The fused mixture-of-experts MLP: route, sort by expert, two grouped GEMMs, the top-k sum.

    out = fused_experts(x, w_gate_up, w_down, topk_weights, topk_ids, *, gate_up_bias=None,
                        down_bias=None, activation="silu", limit=7.0, alpha=1.702)
    out, weights, ids = fused_moe_routed(x, router_logits, w_gate_up, w_down, top_k,
                                         renormalize, ...)   # routes too

Shapes and semantics are `services/engine/model/moe.py`'s (x [T, H], w_gate_up [E, 2I, H],
w_down [E, H, I], topk [T, k]). The expert matrices are tensors in x's dtype, or both MXFP4
(model/mxfp4.py's `Mxfp4Weight`: blocks uint8 [E, N, K/2] and E8M0 scales [E, N, K/32]; the
GEMM kernels then load a quarter of the bytes and dequantize each tile exactly in registers,
kernels/mxfp4_tile.py, before the tensor-core dot). One token (or a few, while their slots
are at most an eighth of the experts) with dense expert matrices takes fused_moe_decode.py's
two launches; otherwise four, none of them reading a value on the host:

1. `_route_align_kernel`, one program: (with `fused_moe_routed`) softmax top-k of the router logits,
   renormalized or not; a histogram of the T*k (token, expert) slots per expert; each
   expert's rows padded to a multiple of BLOCK_M; the slots scattered to their expert's rows
   (an atomic cursor per expert: the order inside an expert is arbitrary, the sum is not);
   unused rows hold the sentinel T*k; the expert of every BLOCK_M-row block (E past the last
   one); optionally the per-expert count of real rows added to a load counter.
   The row buffer is bounded by T*k + min(T*k, E) * (BLOCK_M - 1): at most min(T*k, E)
   experts are used and each pads by at most BLOCK_M - 1 rows, so every size is a function
   of the host shapes (a CUDA graph captures it at each decode capacity).
2. `_gate_up_kernel`, grid (row blocks, I / BLOCK_N): each program loads its block's expert id
   (blocks past the used rows return at once), gathers its BLOCK_M token rows of x, and
   multiplies them by that expert's gate and up rows (two accumulators), then adds the biases
   and applies the activation (silu or gpt-oss's clamped swiglu) in fp32; the [T*k, I]
   intermediate is stored in x's dtype. At batch 1 only the k selected experts' weights are
   read: there are k row blocks.
3. `_down_kernel`, grid (row blocks, H / BLOCK_N): the intermediate rows times the expert's
   down projection, + bias, times the slot's routing weight (fp32 [T*k, H]).
4. `_topk_sum_kernel`: out[t] = sum over the k slots of token t, one rounding to x's dtype.

Variants: token counts are not specialized (`do_not_specialize`); what depends on T is
plan_moe's (the tier's tiles; the routing kernel's rows, chunk and warps by powers of two),
so a model meets a handful of variants. `variant_token_counts` names the first T of each and
the engine runs them at start-up, so no step compiles while serving (a first compile there
stalled serving for seconds on the H200).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from services.common.errors import ValidationError
from services.engine.kernels.common import cdiv, check_float, next_power_of_2
from services.engine.kernels.fused_moe_decode import (
    DECODE_TOKENS,
    DecodePlan,
    decode_path,
    run_decode,
)
from services.engine.kernels.moe_common import expert_activation, softmax_topk_rows
from services.engine.kernels.mxfp4_tile import mxfp4_tile
from services.engine.model.expert_weights import MOE_ACTIVATIONS


@dataclass(frozen=True, slots=True)
class MoEPlan:
    """Tile sizes of one call, from host shapes only."""

    block_m: int
    block_n1: int        # gate/up: output columns (of I) per program
    block_k1: int
    block_n2: int        # down: output columns (of H) per program
    block_k2: int
    num_warps: int
    num_stages: int
    max_rows: int        # sorted-row buffer: T*k + min(T*k, E) * (block_m - 1)
    max_blocks: int
    route_rows: int = 1      # the route + align kernel: token rows a routing iteration reads
    route_chunk: int = 16    # its slots / rows an iteration handles
    route_warps: int = 4

    @property
    def variant(self) -> tuple[int, ...]:
        """What selects a compiled variant of the kernels (token counts do not)."""
        return (self.block_m, self.block_n1, self.block_k1, self.block_n2, self.block_k2,
                self.num_warps, self.num_stages, self.route_rows, self.route_chunk,
                self.route_warps)


DECODE_ROWS_PER_EXPERT = 16    # plan_moe's tiers, by slots per expert (T * k / E)
MID_ROWS_PER_EXPERT = 64


def variant_token_counts(max_tokens: int, top_k: int, num_experts: int, hidden: int,
                         inter: int, mxfp4: bool = False) -> tuple[int, ...]:
    """The smallest token count of each kernel variant a call can meet up to max_tokens
    (the decode kernels at a few tokens, fused_moe_decode.py; then plan_moe's tiers and the
    routing kernel's power-of-two row and chunk sizes). The kernels take token counts
    unspecialized, so one call at each of these compiles every variant a model's steps can
    meet (model/moe.py's warm-up)."""
    firsts: dict[tuple[int, ...], int] = {}
    for tokens in range(1, max_tokens + 1):
        key = (0,) if decode_path(tokens, top_k, num_experts, mxfp4) else \
            plan_moe(tokens, top_k, num_experts, hidden, inter).variant
        firsts.setdefault(key, tokens)
    return tuple(sorted(firsts.values()))


def plan_moe(num_tokens: int, top_k: int, num_experts: int, hidden: int, inter: int,
             tiles: tuple[int, int, int, int, int, int, int] | None = None) -> MoEPlan:
    """Tiles by rows per expert; `tiles` (block_m, n1, k1, n2, k2, warps, stages) overrides
    them (a benchmark's sweep)."""
    slots = num_tokens * top_k
    per_expert = slots / num_experts
    if tiles is not None:
        block_m, n1, k1, n2, k2, warps, stages = tiles
    elif per_expert <= DECODE_ROWS_PER_EXPERT:   # decode: a few rows per expert, bandwidth
        # -bound
        block_m, n1, k1, n2, k2, warps, stages = 16, 32, 128, 32, 128, 4, 4
    elif per_expert <= MID_ROWS_PER_EXPERT:
        block_m, n1, k1, n2, k2, warps, stages = 32, 64, 64, 64, 64, 4, 3
    else:                      # prefill: tensor-core tiles
        block_m, n1, k1, n2, k2, warps, stages = 64, 64, 64, 128, 64, 8, 3
    k1 = min(k1, max(16, next_power_of_2(hidden)))
    k2 = min(k2, max(16, next_power_of_2(inter)))
    n1 = min(n1, max(16, next_power_of_2(inter)))
    n2 = min(n2, max(16, next_power_of_2(hidden)))
    max_rows = slots + min(slots, num_experts) * (block_m - 1)
    return MoEPlan(block_m, n1, k1, n2, k2, warps, stages, max_rows, cdiv(max_rows, block_m),
                   route_rows=min(64, next_power_of_2(num_tokens)),
                   route_chunk=min(1024, max(16, next_power_of_2(max(slots, max_rows)))),
                   route_warps=4 if num_tokens <= 64 else 8)


@triton.jit(do_not_specialize=["num_tokens", "max_rows", "max_blocks"],   # one variant a tier
            do_not_specialize_on_alignment=["num_real_ptr"])   # a view: query_start_loc[-1:]
def _route_align_kernel(
    logits_ptr, stride_logits, weights_ptr, ids_ptr, sorted_ptr, block_expert_ptr,
    num_rows_ptr, cursor_ptr, load_ptr, num_real_ptr,
    num_tokens, num_experts, max_rows, max_blocks,
    TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, ROUTE: tl.constexpr, COUNT: tl.constexpr,
    BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, K_PAD: tl.constexpr, CHUNK: tl.constexpr,
    ROWS: tl.constexpr, BLOCKS: tl.constexpr,
):
    experts = tl.arange(0, E_PAD)
    live = experts < num_experts
    num_slots = num_tokens * TOP_K
    if ROUTE:
        # softmax over the experts, then the top k (lowest id first among equals)
        kcol = tl.arange(0, K_PAD)
        for row0 in range(0, num_tokens, ROWS):
            rows = row0 + tl.arange(0, ROWS)
            rmask = rows < num_tokens
            logits = tl.load(logits_ptr + rows[:, None].to(tl.int64) * stride_logits
                             + experts[None, :], mask=rmask[:, None] & live[None, :],
                             other=-float("inf")).to(tl.float32)
            logits = tl.where(rmask[:, None], logits, tl.where(live[None, :], 0.0, logits))
            values, picks = softmax_topk_rows(logits, experts, TOP_K, K_PAD, E_PAD,
                                              RENORMALIZE)
            out = rows[:, None] * TOP_K + kcol[None, :]
            omask = rmask[:, None] & (kcol[None, :] < TOP_K)
            tl.store(weights_ptr + out, values, mask=omask)
            tl.store(ids_ptr + out, picks, mask=omask)
        tl.debug_barrier()
    # rows per expert, padded to BLOCK_M; real rows (tokens below num_real) for the load
    counts = tl.zeros([E_PAD], tl.int32)
    real_counts = tl.zeros([E_PAD], tl.int32)
    num_real = num_tokens
    if COUNT:
        num_real = tl.load(num_real_ptr)
    for slot0 in range(0, num_slots, CHUNK):
        slots = slot0 + tl.arange(0, CHUNK)
        smask = slots < num_slots
        ids = tl.load(ids_ptr + slots, mask=smask, other=0)
        counts += tl.histogram(ids, E_PAD, mask=smask)
        if COUNT:
            real_counts += tl.histogram(ids, E_PAD, mask=smask & (slots // TOP_K < num_real))
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    tl.store(cursor_ptr + experts, ends - padded)
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    if COUNT:
        load = tl.load(load_ptr + experts, mask=live, other=0)
        tl.store(load_ptr + experts, load + real_counts.to(tl.int64), mask=live)
    for block0 in range(0, max_blocks, BLOCKS):
        blocks = block0 + tl.arange(0, BLOCKS)
        first_row = blocks * BLOCK_M
        before = (ends[None, :] <= first_row[:, None]) & live[None, :]
        tl.store(block_expert_ptr + blocks, tl.sum(before.to(tl.int32), axis=1),
                 mask=blocks < max_blocks)
    for row0 in range(0, max_rows, CHUNK):
        rows = row0 + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + rows, tl.full([CHUNK], 0, tl.int32) + num_slots,
                 mask=rows < max_rows)
    tl.debug_barrier()
    for slot0 in range(0, num_slots, CHUNK):
        slots = slot0 + tl.arange(0, CHUNK)
        smask = slots < num_slots
        ids = tl.load(ids_ptr + slots, mask=smask, other=0)
        rows = tl.atomic_add(cursor_ptr + ids, 1, mask=smask)
        tl.store(sorted_ptr + rows, slots, mask=smask)


@triton.jit(do_not_specialize=["num_slots"])
def _gate_up_kernel(
    x_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, sorted_ptr, block_expert_ptr, num_rows_ptr,
    num_slots, hidden, inter, packed_k, stride_x, stride_we, stride_wn, stride_wse, stride_wsn,
    stride_out, limit, alpha,
    TOP_K: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, MXFP4: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    if block * BLOCK_M >= tl.load(num_rows_ptr):
        return
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    slots = tl.load(sorted_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = slots < num_slots
    tokens = (slots // TOP_K).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < inter
    ks = tl.arange(0, BLOCK_K)
    # MXFP4: the K range's bytes (two values each) and its scales (one per 32 values)
    kw = tl.arange(0, BLOCK_K // 2) if MXFP4 else ks
    kg = tl.arange(0, BLOCK_K // 32 if MXFP4 else 1)
    a_ptrs = x_ptr + tokens[:, None] * stride_x + ks[None, :]
    g_ptrs = w_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + kw[:, None]
    u_ptrs = g_ptrs + inter * stride_wn
    gs_ptrs = ws_ptr + expert * stride_wse + cols[None, :].to(tl.int64) * stride_wsn + kg[:, None]
    us_ptrs = gs_ptrs + inter * stride_wsn
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        kmask = k0 + ks < hidden
        a = tl.load(a_ptrs, mask=valid[:, None] & kmask[None, :], other=0.0)
        if MXFP4:
            # packed_k = hidden / 2 as an argument: its divisibility by 16 (the JIT's hint)
            # lets the byte loads be 16 wide; hidden // 2 computed here allowed 8
            wmask = (k0 // 2 + kw < packed_k)[:, None] & cmask[None, :]
            smask = (k0 // 32 + kg < hidden // 32)[:, None] & cmask[None, :]
            b_gate = mxfp4_tile(tl.load(g_ptrs, mask=wmask, other=0),
                                tl.load(gs_ptrs, mask=smask, other=0),
                                BLOCK_K, BLOCK_N).to(a.dtype)
            b_up = mxfp4_tile(tl.load(u_ptrs, mask=wmask, other=0),
                              tl.load(us_ptrs, mask=smask, other=0),
                              BLOCK_K, BLOCK_N).to(a.dtype)
            gs_ptrs += BLOCK_K // 32
            us_ptrs += BLOCK_K // 32
        else:
            wmask = kmask[:, None] & cmask[None, :]
            b_gate = tl.load(g_ptrs, mask=wmask, other=0.0)
            b_up = tl.load(u_ptrs, mask=wmask, other=0.0)
        acc_gate = tl.dot(a, b_gate, acc_gate, input_precision=PRECISION)
        acc_up = tl.dot(a, b_up, acc_up, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K // 2 if MXFP4 else BLOCK_K
        u_ptrs += BLOCK_K // 2 if MXFP4 else BLOCK_K
    if HAS_BIAS:
        bias = bias_ptr + expert * 2 * inter + cols
        acc_gate += tl.load(bias, mask=cmask, other=0.0).to(tl.float32)[None, :]
        acc_up += tl.load(bias + inter, mask=cmask, other=0.0).to(tl.float32)[None, :]
    y = expert_activation(acc_gate, acc_up, limit, alpha, ACTIVATION)
    out = out_ptr + slots[:, None].to(tl.int64) * stride_out + cols[None, :]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=valid[:, None] & cmask[None, :])


@triton.jit(do_not_specialize=["num_slots"])
def _down_kernel(
    h_ptr, w_ptr, ws_ptr, bias_ptr, weights_ptr, out_ptr, sorted_ptr, block_expert_ptr,
    num_rows_ptr, num_slots, hidden, inter, packed_k, stride_h, stride_we, stride_wn,
    stride_wse, stride_wsn, stride_out,
    HAS_BIAS: tl.constexpr, MXFP4: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    if block * BLOCK_M >= tl.load(num_rows_ptr):
        return
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    slots = tl.load(sorted_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = slots < num_slots
    rows = slots.to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < hidden
    ks = tl.arange(0, BLOCK_K)
    kw = tl.arange(0, BLOCK_K // 2) if MXFP4 else ks        # as in _gate_up_kernel
    kg = tl.arange(0, BLOCK_K // 32 if MXFP4 else 1)
    a_ptrs = h_ptr + rows[:, None] * stride_h + ks[None, :]
    b_ptrs = w_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + kw[:, None]
    s_ptrs = ws_ptr + expert * stride_wse + cols[None, :].to(tl.int64) * stride_wsn + kg[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        kmask = k0 + ks < inter
        a = tl.load(a_ptrs, mask=valid[:, None] & kmask[None, :], other=0.0)
        if MXFP4:
            b = mxfp4_tile(
                tl.load(b_ptrs, mask=(k0 // 2 + kw < packed_k)[:, None] & cmask[None, :],
                        other=0),
                tl.load(s_ptrs, mask=(k0 // 32 + kg < inter // 32)[:, None] & cmask[None, :],
                        other=0),
                BLOCK_K, BLOCK_N).to(a.dtype)
            s_ptrs += BLOCK_K // 32
        else:
            b = tl.load(b_ptrs, mask=kmask[:, None] & cmask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K // 2 if MXFP4 else BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * hidden + cols, mask=cmask,
                       other=0.0).to(tl.float32)[None, :]
    weight = tl.load(weights_ptr + slots, mask=valid, other=0.0)
    acc = acc * weight[:, None]
    out = out_ptr + rows[:, None] * stride_out + cols[None, :]
    tl.store(out, acc, mask=valid[:, None] & cmask[None, :])


@triton.jit
def _topk_sum_kernel(y_ptr, out_ptr, hidden, stride_out, TOP_K: tl.constexpr,
                     BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (token * TOP_K + j) * hidden + cols, mask=mask, other=0.0)
    tl.store(out_ptr + token * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _packed(weight: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A weight's data and, for MXFP4 (model/mxfp4.py's Mxfp4Weight: blocks [E, N, K/2],
    scales [E, N, K/32]), its scales; a dense weight [E, N, K] has none."""
    scales = getattr(weight, "scales", None)
    return (weight.blocks, scales) if scales is not None else (weight, None)


def _check(x: torch.Tensor, w_gate_up: Any, w_down: Any, top_k: int,
           activation: str, gate_up_bias: torch.Tensor | None,
           down_bias: torch.Tensor | None) -> None:
    check_float("fused_moe x", x)
    if x.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValidationError("fused_moe: x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I]")
    num_experts, two_inter, hidden = w_gate_up.shape
    if (hidden != x.shape[1] or two_inter % 2
            or tuple(w_down.shape) != (num_experts, hidden, two_inter // 2)):
        raise ValidationError(f"fused_moe: shapes x {tuple(x.shape)}, w_gate_up "
                              f"{tuple(w_gate_up.shape)}, w_down {tuple(w_down.shape)} disagree")
    if w_gate_up.dtype != x.dtype or w_down.dtype != x.dtype:
        raise ValidationError("fused_moe: weights and x must share a dtype")
    (gate_up, gate_up_scales), (down, down_scales) = _packed(w_gate_up), _packed(w_down)
    if (gate_up_scales is None) != (down_scales is None):
        raise ValidationError("fused_moe: both expert matrices MXFP4, or neither")
    for name, t in (("x", x), ("w_gate_up", gate_up), ("w_down", down),
                    ("w_gate_up scales", gate_up_scales), ("w_down scales", down_scales)):
        if t is not None and t.stride(-1) != 1:
            raise ValidationError(f"fused_moe: {name} needs a contiguous last dim")
    if not 1 <= top_k <= num_experts:
        raise ValidationError(f"fused_moe: top_k {top_k} of {num_experts} experts")
    if activation not in MOE_ACTIVATIONS:
        raise ValidationError(f"unknown expert activation {activation!r} "
                              f"(known: {MOE_ACTIVATIONS})")
    if gate_up_bias is not None and tuple(gate_up_bias.shape) != (num_experts, two_inter):
        raise ValidationError(f"fused_moe: gate_up_bias {tuple(gate_up_bias.shape)}")
    if down_bias is not None and tuple(down_bias.shape) != (num_experts, hidden):
        raise ValidationError(f"fused_moe: down_bias {tuple(down_bias.shape)}")


def _run(x: torch.Tensor, w_gate_up: Any, w_down: Any,
         router_logits: torch.Tensor | None, topk_weights: torch.Tensor,
         topk_ids: torch.Tensor, top_k: int, renormalize: bool,
         gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None, activation: str,
         limit: float, alpha: float, expert_tokens: torch.Tensor | None,
         num_real_tokens: torch.Tensor | None, plan: MoEPlan | DecodePlan | None = None,
         norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = w_gate_up.shape
    inter = two_inter // 2
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    count = expert_tokens is not None
    if count and num_real_tokens is None:
        raise ValidationError("fused_moe: expert_tokens needs num_real_tokens")
    mxfp4 = _packed(w_gate_up)[1] is not None
    if isinstance(plan, DecodePlan) or (                                 # two launches
            plan is None and decode_path(num_tokens, top_k, num_experts, mxfp4)):
        if isinstance(plan, DecodePlan) and (mxfp4 or num_tokens > DECODE_TOKENS):
            raise ValidationError(f"fused_moe: a DecodePlan runs dense experts at up to "
                                  f"{DECODE_TOKENS} tokens, not {num_tokens}"
                                  f"{' (MXFP4)' if mxfp4 else ''}")
        return run_decode(x, w_gate_up, w_down, router_logits, topk_weights, topk_ids, top_k,
                          renormalize, gate_up_bias, down_bias, activation, limit, alpha,
                          expert_tokens, num_real_tokens, norm_weight, eps, plan)
    if norm_weight is not None:     # the sorted path reads normed rows
        from services.engine.kernels.norm import rms_norm

        x = rms_norm(x, norm_weight, eps)
    plan = plan or plan_moe(num_tokens, top_k, num_experts, hidden, inter)
    slots = num_tokens * top_k
    device = x.device
    sorted_rows = torch.empty(plan.max_rows, dtype=torch.int32, device=device)
    block_expert = torch.empty(plan.max_blocks, dtype=torch.int32, device=device)
    meta = torch.empty(1 + next_power_of_2(num_experts), dtype=torch.int32, device=device)
    num_rows, cursor = meta[:1], meta[1:]
    logits = router_logits if router_logits is not None else topk_weights
    route = router_logits is not None
    _route_align_kernel[(1,)](
        logits, logits.stride(0),
        topk_weights, topk_ids, sorted_rows, block_expert, num_rows, cursor,
        expert_tokens if count else num_rows, num_real_tokens if count else num_rows,
        num_tokens, num_experts, plan.max_rows, plan.max_blocks,
        TOP_K=top_k, RENORMALIZE=renormalize, ROUTE=route, COUNT=count,
        BLOCK_M=plan.block_m, E_PAD=next_power_of_2(num_experts),
        K_PAD=next_power_of_2(top_k),
        CHUNK=plan.route_chunk, ROWS=plan.route_rows, BLOCKS=32, num_warps=plan.route_warps)
    # fp32 operands multiply exactly (the CPU-parity runs); bf16/fp16 on tensor cores
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    hidden_rows = torch.empty(slots, inter, dtype=x.dtype, device=device)
    (gate_up, gate_up_scales), (down, down_scales) = _packed(w_gate_up), _packed(w_down)
    gate_up_scales = gate_up if gate_up_scales is None else gate_up_scales
    down_scales = down if down_scales is None else down_scales
    _gate_up_kernel[(plan.max_blocks, cdiv(inter, plan.block_n1))](
        x, gate_up, gate_up_scales, gate_up_bias if gate_up_bias is not None else gate_up,
        hidden_rows, sorted_rows, block_expert, num_rows, slots, hidden, inter, hidden // 2,
        x.stride(0),
        gate_up.stride(0), gate_up.stride(1), gate_up_scales.stride(0),
        gate_up_scales.stride(1), hidden_rows.stride(0), float(limit), float(alpha),
        TOP_K=top_k, ACTIVATION=activation, HAS_BIAS=gate_up_bias is not None, MXFP4=mxfp4,
        PRECISION=precision, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n1, BLOCK_K=plan.block_k1,
        num_warps=plan.num_warps, num_stages=plan.num_stages)
    partial = torch.empty(slots, hidden, dtype=torch.float32, device=device)
    _down_kernel[(plan.max_blocks, cdiv(hidden, plan.block_n2))](
        hidden_rows, down, down_scales, down_bias if down_bias is not None else down,
        topk_weights, partial, sorted_rows, block_expert, num_rows, slots, hidden, inter,
        inter // 2, hidden_rows.stride(0), down.stride(0), down.stride(1), down_scales.stride(0),
        down_scales.stride(1), partial.stride(0), HAS_BIAS=down_bias is not None, MXFP4=mxfp4,
        PRECISION=precision, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n2,
        BLOCK_K=plan.block_k2, num_warps=plan.num_warps, num_stages=plan.num_stages)
    block = min(1024, next_power_of_2(hidden))
    _topk_sum_kernel[(num_tokens, cdiv(hidden, block))](
        partial, out, hidden, out.stride(0), TOP_K=top_k, BLOCK=block, num_warps=4)
    return out


def fused_experts(x: torch.Tensor, w_gate_up: Any, w_down: Any,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                  gate_up_bias: torch.Tensor | None = None,
                  down_bias: torch.Tensor | None = None, activation: str = "silu",
                  limit: float = 7.0, alpha: float = 1.702,
                  expert_tokens: torch.Tensor | None = None,
                  num_real_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """moe.fused_experts on the GPU (topk_weights f32 [T, k], topk_ids int32 [T, k]). With
    `expert_tokens` (int64 [E]) the slots of tokens below `num_real_tokens` (int32 [1]) are
    added to it per expert."""
    top_k = topk_ids.shape[1] if topk_ids.dim() == 2 else 0
    _check(x, w_gate_up, w_down, top_k, activation, gate_up_bias, down_bias)
    if topk_ids.shape != (x.shape[0], top_k) or topk_weights.shape != topk_ids.shape:
        raise ValidationError(f"fused_moe: topk ids {tuple(topk_ids.shape)} / weights "
                              f"{tuple(topk_weights.shape)} for {x.shape[0]} tokens")
    return _run(x, w_gate_up, w_down, None, topk_weights.float().contiguous(),
                topk_ids.to(torch.int32).contiguous(), top_k, False, gate_up_bias, down_bias,
                activation, limit, alpha, expert_tokens, num_real_tokens)


def fused_moe_routed(x: torch.Tensor, router_logits: torch.Tensor, w_gate_up: Any,
              w_down: Any, top_k: int, renormalize: bool, *,
              gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
              activation: str = "silu", limit: float = 7.0, alpha: float = 1.702,
              expert_tokens: torch.Tensor | None = None,
              num_real_tokens: torch.Tensor | None = None,
              plan: MoEPlan | DecodePlan | None = None,
              norm_weight: torch.Tensor | None = None, eps: float = 0.0
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Routing fused in: softmax top-k of router_logits [T, E] (moe.softmax_topk) in the
    align kernel, then the experts. -> (out [T, H], topk_weights, topk_ids). `plan`
    overrides plan_moe's tiles, or with a `DecodePlan` takes the decode kernels with those
    (benchmarks/bench_fused_moe.py's sweeps). With `norm_weight` (and `eps`), x is the
    residual stream and the experts take rms_norm(x) * norm_weight:
    the decode kernels normalize each row themselves (no norm launch), the sorted path
    runs the norm kernel first."""
    _check(x, w_gate_up, w_down, top_k, activation, gate_up_bias, down_bias)
    if tuple(router_logits.shape) != (x.shape[0], w_gate_up.shape[0]):
        raise ValidationError(f"fused_moe: router logits {tuple(router_logits.shape)}")
    weights = torch.empty(x.shape[0], top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(x.shape[0], top_k, dtype=torch.int32, device=x.device)
    if norm_weight is not None and tuple(norm_weight.shape) != (x.shape[1],):
        raise ValidationError(f"fused_moe: norm weight {tuple(norm_weight.shape)} for rows "
                              f"of {x.shape[1]}")
    out = _run(x, w_gate_up, w_down, router_logits, weights, ids, top_k, renormalize,
               gate_up_bias, down_bias, activation, limit, alpha, expert_tokens,
               num_real_tokens, plan, norm_weight, eps)
    return out, weights, ids
