"""W8A8 e4m3 GEMMs: y [M, N] = (a * a_scale) @ (w * w_scale)^T + bias, float32 accumulation.

    rowwise_mm(a e4m3 [M, K], a_scale [M, 1] | [1, 1], w e4m3 [N, K], w_scale [N], bias,
               out_dtype)                       # per-token (or static) x per-channel scales
    block_mm(a e4m3 [M, K], a_scale [M, ceil(K/128)], w e4m3 [N, K],
             w_scale [ceil(N/128), ceil(K/128)], bias, out_dtype)   # 1x128 x 128x128 blocks

Rowwise: decode-sized batches (at most `TRITON_MAX_ROWS` = 64 rows) take the Triton kernel
below, larger ones `torch._scaled_mm` (cuBLASLt's FP8 GEMM with row-wise scales, sm_89+; the
signature `_scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
use_fast_accum=False)` is the same on torch 2.11 and 2.13) where it applies: bf16 output,
K and N multiples of 16 (M is padded to a multiple of 16, which cuBLASLt's row-wise kernels
ask for). Measured on an H100 at the Qwen3-8B projections (benchmarks/RESULTS.md, 2026-12-06
seventh session): at M = 64 the split Triton kernel took 11.7 / 9.8 / 39.0 / 26.8 us for
qkv / o / gate_up / down against _scaled_mm's 14.9 / 13.2 / 43.3 / 33.0; at M = 256
_scaled_mm won (13.9 / 13.0 / 52.5 / 32.7 against 13.6 / 13.1 / 56.1 / 38.4 at best).
HELIOS_FP8_GEMM=scaled_mm or =triton forces one (default "auto"). Block-wise: the Triton
kernel with BLOCK_K = 128, each K step's partial product scaled by its activation group's
and weight block's scales before accumulating (N tiles of at most 128 columns stay inside
one weight block row). Both Triton variants are one kernel (`BLOCKWISE` constexpr); tiles
64 x 128 x 128 (M <= 64) or 128 x 128 x 128, 3 stages.
Where the output tiles do not cover the SMs (decode batches: a 64-row down_proj at the
Qwen3-8B shape has 32 tiles for 132 SMs) the K dimension is split (`split_k`): each split
writes a float32 partial, and a second kernel adds them in a fixed order (deterministic,
unlike atomics), then the bias and the cast. The partials' traffic (8 bytes an output a
split: written, then read) is held to half the weight's bytes, which caps the splits at
K / (16 M): at M = 256 the split doubled qkv's time (22.7 against 13.6 us) and o_proj's
went from 13.1 to 16.6 us, while down_proj (K three times larger) still gained. At M = 64
the split took down_proj from 47.2 to 26.8 us. HELIOS_FP8_SPLIT_K=off turns it off.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from services.common.errors import ValidationError
from services.engine.kernels.common import cdiv, env_choice, sm_count

BLOCK = 128   # the block-wise format's block (and group) size


@triton.jit(do_not_specialize=["num_splits"])     # a runtime count: no variant per split
def _fp8_gemm_kernel(
    a_ptr, w_ptr, out_ptr, bias_ptr, as_ptr, ws_ptr,
    m_dim, n_dim, k_dim, k_per_split, num_splits,
    stride_am, stride_wn, stride_om, stride_asm, stride_wsn,
    BLOCKWISE: tl.constexpr, A_SCALAR: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SCALE_BLOCK: tl.constexpr,
):
    # num_splits > 1: program (tile, s) sums K columns [s * k_per_split, (s + 1) *
    # k_per_split) and writes its scaled float32 partial to out_ptr[s] ([splits, M, N]);
    # _split_k_sum adds the partials in order (deterministic), the bias and the cast
    pid = tl.program_id(0)
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, k_dim)
    grid_m = tl.cdiv(m_dim, BLOCK_M)
    grid_n = tl.cdiv(n_dim, BLOCK_N)
    # grouped ordering: GROUP_M row tiles share each weight tile while it is in L2
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    m_mask = m < m_dim
    n_mask = n < n_dim
    a_rows = a_ptr + m.to(tl.int64)[:, None] * stride_am
    w_cols = w_ptr + n.to(tl.int64)[None, :] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + kk
        k_mask = k < k_hi
        a = tl.load(a_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_cols + k[:, None], mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if BLOCKWISE:
            kb = k0 // SCALE_BLOCK
            a_s = tl.load(as_ptr + m * stride_asm + kb, mask=m_mask, other=0.0)
            w_s = tl.load(ws_ptr + (n // SCALE_BLOCK) * stride_wsn + kb, mask=n_mask, other=0.0)
            acc += tl.dot(a, w) * a_s[:, None] * w_s[None, :]
        else:
            acc = tl.dot(a, w, acc)
    if not BLOCKWISE:
        if A_SCALAR:
            a_s = tl.load(as_ptr)
            acc = acc * a_s
        else:
            a_s = tl.load(as_ptr + m * stride_asm, mask=m_mask, other=0.0)
            acc = acc * a_s[:, None]
        w_s = tl.load(ws_ptr + n, mask=n_mask, other=0.0)
        acc = acc * w_s[None, :]
    if HAS_BIAS:  # noqa: SIM102 (a constexpr branch around a runtime one)
        if num_splits == 1:
            acc += tl.load(bias_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out_ptr += tl.program_id(1).to(tl.int64) * m_dim * stride_om     # split s's partial
    out = out_ptr + m.to(tl.int64)[:, None] * stride_om + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["m_dim", "num_splits"])    # one variant for every step
def _split_k_sum(part_ptr, bias_ptr, out_ptr, m_dim, n_dim, stride_om, num_splits,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[row] = sum over s of part[s, row] (in order) + bias, cast to out's dtype."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < n_dim
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for s in range(0, num_splits):
        acc += tl.load(part_ptr + (s * m_dim + row) * n_dim + n, mask=n_mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + n, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def _check(a: torch.Tensor, w: torch.Tensor) -> None:
    for name, t in (("a", a), ("w", w)):
        if t.dtype != torch.float8_e4m3fn or t.dim() != 2 or t.stride(-1) != 1:
            raise ValidationError(f"{name}: expected a row-major float8_e4m3fn matrix, got "
                                  f"{t.dtype} {tuple(t.shape)} strides {t.stride()}")
    if a.shape[1] != w.shape[1]:
        raise ValidationError(f"w {tuple(w.shape)} does not take rows of {a.shape[1]}")


@functools.cache
def split_k_enabled() -> bool:
    """HELIOS_FP8_SPLIT_K=off: never split K (the same-run before of the split; read once)."""
    return env_choice("HELIOS_FP8_SPLIT_K", ("on", "off")) == "on"


def split_k(tiles: int, k_steps: int, sms: int, m_dim: int, k_dim: int) -> int:
    """K splits for an [m_dim, K] x [K, N] GEMM of `tiles` output tiles and `k_steps` K steps:
    enough programs to cover the SMs once where the tiles alone do not (a decode batch's
    down_proj at the Qwen3-8B shape: 32 tiles of 64 x 128), each split at least 4 K steps
    long, and the float32 partials' traffic (splits x M x N x 8 bytes) at most half the
    weight's (N x K bytes): at most K / (16 M) splits."""
    if tiles >= sms or not split_k_enabled():
        return 1
    return max(1, min(cdiv(sms, tiles), k_steps // 4, k_dim // (16 * max(m_dim, 1))))


def triton_mm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
              bias: torch.Tensor | None, out_dtype: torch.dtype, *, blockwise: bool,
              splits: int | None = None) -> torch.Tensor:
    """The Triton W8A8 GEMM (rowwise or block-wise scales, see the module docstring); K split
    `splits` ways (default `split_k`'s choice), the partials summed in a second kernel."""
    _check(a, w)
    m_dim, k_dim = a.shape
    n_dim = w.shape[0]
    out = torch.empty((m_dim, n_dim), dtype=out_dtype, device=a.device)
    if m_dim == 0 or n_dim == 0:
        return out
    block_m = 64 if m_dim <= 64 else 128
    block_n = 128
    a_scale = a_scale.float()
    w_scale = w_scale.float()
    tiles = cdiv(m_dim, block_m) * cdiv(n_dim, block_n)
    k_steps = cdiv(k_dim, BLOCK)
    if splits is None:
        splits = split_k(tiles, k_steps, sm_count(a.device), m_dim, k_dim)
    steps_per_split = cdiv(k_steps, max(1, min(splits, k_steps)))
    splits = cdiv(k_steps, steps_per_split)       # no empty split
    target = out if splits == 1 else torch.empty((splits, m_dim, n_dim), dtype=torch.float32,
                                                 device=a.device)
    _fp8_gemm_kernel[(tiles, splits)](
        a, w, target, bias if bias is not None else out, a_scale, w_scale,
        m_dim, n_dim, k_dim, steps_per_split * BLOCK, splits,
        a.stride(0), w.stride(0), n_dim if splits > 1 else out.stride(0), a_scale.stride(0),
        w_scale.stride(0) if blockwise else 1,
        BLOCKWISE=blockwise, A_SCALAR=a_scale.numel() == 1 and not blockwise,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK,
        GROUP_M=8, SCALE_BLOCK=BLOCK, num_warps=4 if block_m == 64 else 8, num_stages=3,
    )
    if splits > 1:
        _split_k_sum[(m_dim, cdiv(n_dim, 1024))](
            target, bias if bias is not None else out, out, m_dim, n_dim, out.stride(0),
            splits, HAS_BIAS=bias is not None, BLOCK_N=1024, num_warps=4)
    return out


TRITON_MAX_ROWS = 64   # "auto": the Triton kernel up to this many rows, _scaled_mm above


@functools.cache
def gemm_backend() -> str:
    """HELIOS_FP8_GEMM: "auto" (default: the Triton kernel for at most TRITON_MAX_ROWS rows,
    torch._scaled_mm above, where it applies), "scaled_mm" or "triton" (read once;
    `gemm_backend.cache_clear()` re-reads it)."""
    return env_choice("HELIOS_FP8_GEMM", ("auto", "scaled_mm", "triton"))


def uses_triton(m_dim: int) -> bool:
    """Whether a rowwise GEMM of m_dim rows takes the Triton kernel under HELIOS_FP8_GEMM."""
    backend = gemm_backend()
    return backend == "triton" or (backend == "auto" and m_dim <= TRITON_MAX_ROWS)


def scaled_mm_applies(a: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> bool:
    return (a.is_cuda and out_dtype == torch.bfloat16 and a.shape[1] % 16 == 0
            and w.shape[0] % 16 == 0 and hasattr(torch, "_scaled_mm"))


def rowwise_mm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16
               ) -> torch.Tensor:
    """Per-token (a_scale [M, 1]) or static (a_scale [1, 1]) x per-channel (w_scale [N])."""
    _check(a, w)
    if uses_triton(a.shape[0]) or not scaled_mm_applies(a, w, out_dtype):
        return triton_mm(a, a_scale, w, w_scale, bias, out_dtype, blockwise=False)
    m_dim = a.shape[0]
    padded = cdiv(max(m_dim, 1), 16) * 16
    scale_a = a_scale.float().expand(m_dim, 1)
    if padded != m_dim:
        a = torch.nn.functional.pad(a.view(torch.uint8), (0, 0, 0, padded - m_dim)).view(
            torch.float8_e4m3fn)
        scale_a = torch.nn.functional.pad(scale_a, (0, 0, 0, padded - m_dim), value=1.0)
    out = torch._scaled_mm(a, w.t(), scale_a=scale_a.contiguous(),
                           scale_b=w_scale.float().reshape(1, -1).contiguous(),
                           bias=bias, out_dtype=out_dtype)
    return out[:m_dim] if padded != m_dim else out


def block_mm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
             bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16
             ) -> torch.Tensor:
    """Activation groups of 128 (a_scale [M, K/128]) x 128x128 weight blocks."""
    _check(a, w)
    k_blocks = cdiv(a.shape[1], BLOCK)
    if a_scale.shape != (a.shape[0], k_blocks) or \
            w_scale.shape != (cdiv(w.shape[0], BLOCK), k_blocks):
        raise ValidationError(f"block scales {tuple(a_scale.shape)} / {tuple(w_scale.shape)} "
                              f"do not match a {tuple(a.shape)} and w {tuple(w.shape)}")
    return triton_mm(a, a_scale, w, w_scale, bias, out_dtype, blockwise=True)
