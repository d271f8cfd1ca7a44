"""Weights into L2 ahead of the kernel that reads them (an experiment: HELIOS_L2_PREFETCH=1).

    kernel[grid](..., *prefetch_args(target, device, rows), **kwargs)   # target: a tensor or None
    # in the kernel, before its wait for the previous kernel:
    prefetch_l2(prefetch_ptr, prefetch_bytes, part, parts, PREFETCH_L2)

Why: a batch-1 decode step alternates phases that stream weights (the projections, the
experts) with phases that barely touch DRAM (the attention prologue, attention and its split
reduction: about 12 us a layer at Qwen3-30B-A3B on an H100, RESULTS.md 2026-12-07), and its
small projections run at 2.0 TB/s where the large ones reach 2.6-2.8 (load latency, not
bandwidth, bounds them). A kernel of the chain can issue `cp.async.bulk.prefetch.L2` (sm_90:
fire-and-forget, no registers, no shared memory) for the weights a later kernel reads, so
DRAM streams them while the GPU is otherwise latency-bound, and the later kernel's loads hit
L2. Correctness does not depend on it: a prefetch is a hint, and the bytes stay where they
are. The hooks: the decode attention kernel prefetches the layer's o_proj weight, the
one-row gate/up kernel (`skinny_linear.py`, bf16 or e4m3) the down projection's, and the
fused MoE's decode gate/up programs their expert's down-projection rows
(`fused_moe_decode.py`).

Each program of the issuing kernel takes chunks `part, part + parts, ...` of CHUNK bytes of
the target's [ptr, ptr + nbytes) and one thread issues them (`%tid.x == 0`). Targets must be
contiguous and 16-byte aligned (the instruction's rule; `prefetch_args` skips any other) and
are capped at `MAX_BYTES` (L2 is 50 MB on the H100 and H200; the rest would only evict the front).

On only where PDL is (CUDA graphs of steps of at most 16 rows on sm_90, kernels/pdl.py) and
HELIOS_L2_PREFETCH=1; the constexpr off compiles each kernel exactly as before. Triton's
interpreter has no inline PTX, so the CPU tests check the plumbing and the sm_90 compile
(tests/kernels/test_l2_prefetch.py). Not yet measured on a GPU (benchmarks/gpu/
pending_benches.txt `l2_prefetch_b1`).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from services.common.errors import ValidationError

CHUNK = 32 * 1024                  # bytes a prefetch instruction covers
MAX_BYTES = 24 * 1024 * 1024       # at most this much of one target (about half of L2)


@triton.jit
def prefetch_l2(ptr, nbytes, part, parts, PREFETCH_L2: tl.constexpr,
                CHUNK_BYTES: tl.constexpr = CHUNK):
    """Issue L2 prefetches of chunks part, part + parts, ... of [ptr, ptr + nbytes), one
    thread of the program issuing them. Nothing without PREFETCH_L2."""
    if PREFETCH_L2:
        base = ptr.to(tl.pointer_type(tl.int8))
        for chunk in range(part, tl.cdiv(nbytes, CHUNK_BYTES), parts):
            start = tl.cast(chunk, tl.int64) * CHUNK_BYTES
            size = tl.minimum(nbytes - start, CHUNK_BYTES)
            tl.inline_asm_elementwise(
                "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
                "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r", [base + start, tl.cast(size, tl.int32)], dtype=tl.int32,
                is_pure=False, pack=1)


@functools.cache
def switched_on() -> bool:
    """HELIOS_L2_PREFETCH=1 turns the prefetches on (off by default until measured). Read
    once (`switched_on.cache_clear()` re-reads it)."""
    value = os.environ.get("HELIOS_L2_PREFETCH", "0").strip()
    if value not in ("0", "1"):
        raise ValidationError(f"HELIOS_L2_PREFETCH={value!r}: expected 0 or 1")
    return value == "1"


def prefetch_args(target: torch.Tensor | None, device: torch.device, rows: int,
                  dummy: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    """(ptr, nbytes, PREFETCH_L2) for a kernel launch in a step of `rows` token rows: the
    target's first min(its bytes, MAX_BYTES) when the prefetch is on there, else the dummy
    pointer, 0 and False. A target the instruction cannot take (not contiguous, not 16-byte
    aligned) is not prefetched: a hint never fails a launch."""
    from services.engine.kernels.pdl import launch_options

    if target is None or not switched_on() or not launch_options(device, rows)["PDL"]:
        return dummy, 0, False
    if not target.is_contiguous() or target.data_ptr() % 16:
        return dummy, 0, False
    nbytes = min(target.numel() * target.element_size(), MAX_BYTES) // 16 * 16
    return target, nbytes, nbytes > 0
