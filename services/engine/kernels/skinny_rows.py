"""The tl.dot kernel of `skinny_linear` for steps of 2 to `MAX_ROWS` token rows (a
verification's pending token and drafts, small decode batches), and the epilogue it shares
with fp8_layers' W8A8 kernel. `skinny_linear` plans (`plan_rows`) and
launches it (`launch`); the module docstring there says why it looks as it does.
"""

from __future__ import annotations

import triton
import triton.language as tl

from services.engine.kernels.activation import gated_activation
from services.engine.kernels.pdl import let_next_launch, wait_only


@triton.jit
def row_tile(rows, n_out, w_ptr, up_offset, stride_w, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A rows kernel's program tile (here and fp8_layers' W8A8 one): its token rows m and
    output features n with their masks, the K offsets of one step, and the pointers to its
    BLOCK_N weight rows (and, for a gated weight, their up rows)."""
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_w               # [BN, 1]
    return (m, m < rows, n, n < n_out, tl.arange(0, BLOCK_K), w_rows,
            w_rows + up_offset * stride_w)


@triton.jit
def _skinny_rows_kernel(
    x_ptr, res_ptr, norm_w_ptr, w_ptr, b_ptr, out_ptr, res_out_ptr, ws_ptr,
    rows, n_out, k_dim, up_offset, eps,
    stride_x, stride_r, stride_w, stride_o, stride_ro, stride_ws,
    NORM: tl.constexpr, RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
    W_SCALE: tl.constexpr, SCALE_BLOCK: tl.constexpr,
):
    # The few-rows twin of _skinny_linear_kernel: each program streams its BLOCK_N weight rows
    # once for BLOCK_M token rows, tl.dot of the weight tile with the transposed row tile (the
    # weights are the MMA's wide side), the weight tiles pipelined NUM_STAGES deep by Triton
    # (asynchronous copies into shared memory). One pass over K: the norm's 1/rms, known only
    # at the end, scales the fp32 sums, so the MMA takes (x [+ residual]) * g rounded to the
    # input dtype where the unfused norm rounds (x [+ residual]) * g / rms: the same rounding
    # step, at a different point (the residual sum and gate / up round as unfused).
    # W_SCALE "channel" / "block": e4m3 weights (fp8_layers.py), each tile converted to the
    # activations' dtype (exact) for the MMA; a row's scale multiplies its sums at the end,
    # a 128x128 block's scale each K step's partial sums (BLOCK_K divides SCALE_BLOCK)
    pid_n = tl.program_id(0)
    m, m_mask, n, n_mask, kk, w_rows, up_rows = row_tile(
        rows, n_out, w_ptr, up_offset, stride_w, BLOCK_M, BLOCK_N, BLOCK_K)
    # PDL: wait first; the next kernel launches once this one has its sums (pdl.py)
    wait_only(PDL)
    act_dtype = x_ptr.dtype.element_ty
    m64 = m.to(tl.int64)[:, None]                                      # [BM, 1]
    x_rows = x_ptr + m64 * stride_x
    r_rows = res_ptr + m64 * stride_r
    sum_sq = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in tl.range(0, k_dim, BLOCK_K, num_stages=NUM_STAGES):
        k = k0 + kk
        k_mask = k < k_dim
        mk_mask = m_mask[:, None] & k_mask[None, :]
        w_mask = n_mask[:, None] & k_mask[None, :]
        a = tl.load(x_rows + k[None, :], mask=mk_mask, other=0.0)
        if NORM:
            a = a.to(tl.float32)
            if RESIDUAL:
                r = tl.load(r_rows + k[None, :], mask=mk_mask, other=0.0).to(tl.float32)
                a = (a + r).to(act_dtype)
                if pid_n == 0:
                    tl.store(res_out_ptr + m64 * stride_ro + k[None, :], a, mask=mk_mask)
                a = a.to(tl.float32)
            sum_sq += a * a
            g = tl.load(norm_w_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
            a = (a * g[None, :]).to(act_dtype)        # the row's 1/rms scales the sums below
        a_t = tl.trans(a)                                              # [BK, BM]
        w = tl.load(w_rows + k[None, :], mask=w_mask, other=0.0)
        if W_SCALE != "none":
            w = w.to(act_dtype)
        if DOT_PRECISION == "ieee":  # fp32 operands (exact products of 16-bit ones)
            w = w.to(tl.float32)
            a_t = a_t.to(tl.float32)
        if W_SCALE == "block":
            kb = k0 // SCALE_BLOCK
            s_w = tl.load(ws_ptr + (n // SCALE_BLOCK) * stride_ws + kb, mask=n_mask, other=0.0)
            acc += tl.dot(w, a_t, input_precision=DOT_PRECISION) * s_w[:, None]
        else:
            acc = tl.dot(w, a_t, acc, input_precision=DOT_PRECISION)
        if ACTIVATION != "none":
            u = tl.load(up_rows + k[None, :], mask=w_mask, other=0.0)
            if W_SCALE != "none":
                u = u.to(act_dtype)
            if DOT_PRECISION == "ieee":
                u = u.to(tl.float32)
            if W_SCALE == "block":
                s_u = tl.load(ws_ptr + ((n + up_offset) // SCALE_BLOCK) * stride_ws + kb,
                              mask=n_mask, other=0.0)
                acc_up += tl.dot(u, a_t, input_precision=DOT_PRECISION) * s_u[:, None]
            else:
                acc_up = tl.dot(u, a_t, acc_up, input_precision=DOT_PRECISION)
    let_next_launch(PDL)
    if W_SCALE == "channel":
        acc = acc * tl.load(ws_ptr + n, mask=n_mask, other=0.0)[:, None]
        if ACTIVATION != "none":
            acc_up = acc_up * tl.load(ws_ptr + up_offset + n, mask=n_mask, other=0.0)[:, None]
    if NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=1) / k_dim + eps)   # [BM]
        acc = acc * rstd[None, :]
        acc_up = acc_up * rstd[None, :]
    store_row_tiles(acc, acc_up, b_ptr, out_ptr, n, n_mask, m, m_mask, up_offset, stride_o,
                    act_dtype, HAS_BIAS, ACTIVATION)


@triton.jit
def store_row_tiles(acc, acc_up, b_ptr, out_ptr, n, n_mask, m, m_mask, up_offset, stride_o,
                    act_dtype: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """The rows kernels' epilogue (here and fp8_layers' W8A8 one): the fp32 sums [BN, BM] of
    output features n by token rows m, plus the bias; with a gated ACTIVATION, act(gate) * up
    over the gate (acc) and up (acc_up) halves, each rounded to the activations' dtype as the
    unfused path rounds them; stored transposed into out [rows, n_out]."""
    y = acc
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    if ACTIVATION != "none":
        up = acc_up
        if HAS_BIAS:
            up += tl.load(b_ptr + up_offset + n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        y = gated_activation(y.to(act_dtype).to(tl.float32), up.to(act_dtype).to(tl.float32),
                             ACTIVATION)
    out = out_ptr + m.to(tl.int64)[None, :] * stride_o + n[:, None]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])
