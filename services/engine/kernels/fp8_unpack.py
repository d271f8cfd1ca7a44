"""e4m3 weights to float32 in registers, four bytes an instruction pair (the batch-1 kernels).

Why: Triton's own `w.to(tl.float32)` of a float8e4nv tile, compiled for sm_90, takes each
loaded byte out of its 32-bit word (PRMT), then glues bytes back into pairs (LOP3 + IMAD) for
the hardware's pair conversion: 2 instructions a weight byte that convert nothing. The batch-1
FP8 projection issues 6.9 instructions a weight byte against bf16's 2.2 (RESULTS.md
2026-12-06, sixth session), enough to make it issue-bound below its bandwidth limit.
`weight_f32` hands the conversion whole 32-bit words (four weights), each half going to
`cvt.rn.f16x2.e4m3x2` as it lies (the lower byte to the lower half) and each f16 to float32:
the same values as Triton's cast, bit for bit (every e4m3 value is exact in f16), without the
byte shuffling.

Host side: `hardware_e4m3(tensor)` says whether a launch takes this path (a CUDA tensor on
sm_89 or newer, where the PTX conversion exists, in rows of whole aligned words); Triton's
interpreter (CPU tensors) and older GPUs keep the plain cast, chosen by the kernel's constexpr.
`HELIOS_E4M3_UNPACK=cast` keeps the plain cast on CUDA too (the benchmarks' before).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from services.engine.kernels.common import env_choice


@triton.jit
def load_weights(rows, k0, k_dim, n_mask, BLOCK_K: tl.constexpr, E4M3_PTX: tl.constexpr):
    """The weight tile of columns [k0, k0 + BLOCK_K) of `rows` ([BN, 1] pointers to each row's
    first weight), zero past k_dim and outside n_mask: with E4M3_PTX as [BN, BLOCK_K // 4]
    32-bit words of four e4m3 weights (k_dim and the row stride multiples of 4), otherwise
    the [BN, BLOCK_K] weights themselves."""
    if E4M3_PTX:
        # k0 is a multiple of BLOCK_K; with k_dim // 4 the mask is whole for each 4 words,
        # so a thread's words load 16 bytes at a time
        kw = tl.max_contiguous(tl.multiple_of(k0 // 4 + tl.arange(0, BLOCK_K // 4),
                                              BLOCK_K // 4), BLOCK_K // 4)
        mask = n_mask[:, None] & (kw < k_dim // 4)[None, :]
        return tl.load(rows.to(tl.pointer_type(tl.int32)) + kw[None, :], mask=mask, other=0)
    else:
        k = k0 + tl.arange(0, BLOCK_K)
        mask = n_mask[:, None] & (k < k_dim)[None, :]
        return tl.load(rows + k[None, :], mask=mask, other=0.0)


@triton.jit
def weight_f32(tile, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, E4M3_PTX: tl.constexpr):
    """A `load_weights` tile as [BLOCK_N, BLOCK_K] float32: e4m3 words through the PTX pair
    conversion with E4M3_PTX; otherwise the plain cast (bf16 or float32 weights, e4m3 in the
    interpreter)."""
    if E4M3_PTX:
        w0, w1, w2, w3 = tl.inline_asm_elementwise(
            """
            {
            .reg .b16 lo, hi, f0, f1, f2, f3;
            .reg .b32 h01, h23;
            mov.b32 {lo, hi}, $4;
            cvt.rn.f16x2.e4m3x2 h01, lo;
            cvt.rn.f16x2.e4m3x2 h23, hi;
            mov.b32 {f0, f1}, h01;
            mov.b32 {f2, f3}, h23;
            cvt.f32.f16 $0, f0;
            cvt.f32.f16 $1, f1;
            cvt.f32.f16 $2, f2;
            cvt.f32.f16 $3, f3;
            }
            """,
            "=r,=r,=r,=r,r", [tile], dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True, pack=1)
        # [..., r, s] = weight 2r + s of each word (its byte 2r + s, the lower byte first)
        return tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), [BLOCK_N, BLOCK_K])
    else:
        return tile.to(tl.float32)


@functools.cache
def _sm89(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


@functools.cache
def _switched_to_cast() -> bool:
    return env_choice("HELIOS_E4M3_UNPACK", ("ptx", "cast")) == "cast"


def hardware_e4m3(weight: torch.Tensor) -> bool:
    """Whether a kernel may read the e4m3 `weight` as words and convert it with
    `weight_f32`'s PTX: on CUDA (sm_89 or newer), rows of whole, aligned words."""
    return (weight.is_cuda and weight.dtype == torch.float8_e4m3fn and not _switched_to_cast()
            and weight.shape[-1] % 4 == 0 and weight.stride(0) % 4 == 0
            and weight.data_ptr() % 4 == 0
            and _sm89(weight.device.index if weight.device.index is not None
                      else torch.cuda.current_device()))
