"""What the H200 compiler makes of kernel launches, on any machine (no GPU: Triton's compiler
and ptxas for sm_90, tests/kernels/sm90_compile.py).

    python benchmarks/sm90_report.py moe     # fused-MoE GEMMs at gpt-oss-20b, bf16 vs MXFP4
    python benchmarks/sm90_report.py fp8     # batch-1 skinny linears at Qwen3-8B, bf16 vs FP8
    python benchmarks/sm90_report.py attention   # decode tiles: pages, stages, page prefetch

`moe`: registers, spilled loads, shared memory, tensor-core instructions and global-load
widths at T = 1, 64 and 2048 tokens (MXFP4: experts kept, `mxfp4_experts: keep`).
`fp8`: the batch-1 gate/up projection (norm + SiLU fused) with bf16 and with FP8 weights
(per-channel scales; the default one-row kernel, with and without HELIOS_E4M3_UNPACK=cast,
then HELIOS_FP8_SKINNY=tensor-cores and w8a8): the instructions of each kernel's K loop against the weight bytes a thread streams in
one K step, i.e. what the kernel issues per weight byte.
`attention`: the Qwen3-8B decode tile over bf16 and FP8 pages at 2-4 stages, with the page
numbers loaded in the tile or an iteration ahead (`AttentionPlan.prefetch_pages`):
registers, shared memory, the loop's `async_wait` counts, the programs an SM holds (registers,
shared memory and warps; 65,536 registers and 228 KB a multiprocessor) and the K/V bytes each
program keeps in flight (one tile while every wait is for all copies).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def moe() -> None:
    from tests.kernels.sm90_compile import compile_launch, gpt_oss_moe_launches, report

    print("T     format  kernel           regs  spills  shared  MMA            global loads")
    for tokens in (1, 64, 2048):
        for fmt in ("bf16", "mxfp4"):
            for launch in gpt_oss_moe_launches(fmt, tokens):
                name = launch.fn.fn.__name__
                r = report(f"T={tokens}", compile_launch(launch))
                print(f"{tokens:<6}{fmt:<8}{name:<17}{r.registers:>4}{r.local_loads:>8}"
                      f"{r.shared_bytes:>8}  {r.mma!s:<15}{r.global_loads}")


def fp8() -> None:
    import dataclasses

    import torch

    from services.common.quantization import Fp8Scheme
    from services.engine.kernels.fp8_layers import fp8_norm_linear
    from services.engine.kernels.skinny_linear import norm_linear
    from services.engine.model.fp8 import Fp8Weight
    from tests.kernels.sm90_compile import capture_launches, compile_launch, report, sass

    hidden, inter = 4096, 12288                       # Qwen3-8B
    x = torch.zeros(1, hidden, dtype=torch.bfloat16)
    norm = torch.ones(hidden, dtype=torch.bfloat16)
    fp8_weight = Fp8Weight(torch.zeros(2 * inter, hidden, dtype=torch.float8_e4m3fn),
                           torch.ones(2 * inter), Fp8Scheme("online", "channel", "token"))
    from services.engine.kernels import fp8_layers

    with capture_launches() as launches:
        norm_linear(x, x, norm, 1e-6, torch.zeros(2 * inter, hidden, dtype=torch.bfloat16),
                    None, activation="silu")
        fp8_norm_linear(x, x, norm, 1e-6, fp8_weight, None, "silu")
        for mode in ("TENSOR_CORES", "W8A8"):          # HELIOS_FP8_SKINNY's two other kernels
            setattr(fp8_layers, mode, True)
            fp8_norm_linear(x, x, norm, 1e-6, fp8_weight, None, "silu")
            setattr(fp8_layers, mode, False)
    print("weights     kernel total  K loop  weight bytes a thread a K step  K loop a byte"
          "  K loop's top opcodes")
    # the default FP8 launch twice: as on CUDA (E4M3_PTX, fp8_unpack.py) and with the plain
    # cast (HELIOS_E4M3_UNPACK=cast; what a CPU capture records)
    launches.insert(2, launches[1])
    formats = ("bf16", "fp8", "fp8 cast", "fp8 tc", "fp8 w8a8")
    for fmt, itemsize, launch in zip(formats, (2, 1, 1, 1, 1), launches, strict=True):
        if "PDL" in launch.fn.arg_names:
            launch = dataclasses.replace(launch, kwargs={**launch.kwargs, "PDL": True})
        if fmt == "fp8":
            launch = dataclasses.replace(launch, kwargs={**launch.kwargs, "E4M3_PTX": True})
        compiled = compile_launch(launch)
        report(fmt, compiled)
        lines = [(int(m.group(1), 16), m.group(2), line) for line in sass(compiled).splitlines()
                 if (m := re.search(r"/\*([0-9a-f]{4})\*/\s+(?:@!?U?P\w\s+)?([A-Z0-9_]+)",
                                    line))]
        loop = k_loop(lines)
        ops = collections.Counter(op for _, op, _ in loop)
        threads = 32 * launch.kwargs["num_warps"]
        step_bytes = 2 * launch.kwargs["BLOCK_N"] * launch.kwargs["BLOCK_K"] * itemsize
        per_thread = step_bytes / threads
        print(f"{fmt:<12}{len(lines):>12}{len(loop):>8}{per_thread:>32.0f}"
              f"{len(loop) / per_thread:>15.2f}  {ops.most_common(6)}")
    print("(SASS of the batch-1 gate/up launch; the K loop is its last loop, the one streaming\n"
          " the weights: gate and up tiles of BLOCK_N x BLOCK_K a step. fp8: the e4m3 words\n"
          " converted by PTX (fp8_unpack.py), fp8 cast: HELIOS_E4M3_UNPACK=cast; fp8 tc / w8a8:\n"
          " HELIOS_FP8_SKINNY=tensor-cores / w8a8, 16-row tiles)")


def programs_per_sm(registers: int, shared_bytes: int, warps: int) -> int:
    """Resident programs an sm_90 multiprocessor holds: registers are allocated per warp in
    units of 256 (a thread's count rounded up to 8), shared memory with 1 KB reserved a
    program, at most 64 warps and 32 programs."""
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = 65536 // (per_warp * warps)
    by_shared = (228 * 1024) // (shared_bytes + 1024) if shared_bytes else 32
    return min(by_registers, by_shared, 64 // warps, 32)


def attention() -> None:

    import torch

    from tests.kernels.sm90_compile import (
        attention_variant,
        compile_launch,
        qwen3_8b_decode_attention,
        report,
    )

    print("pages  prefetch  stages  block_n  warps  cap  regs  spills  shared  waits      "
          "programs/SM  K/V in flight a program")
    for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):     # Qwen3-8B's tile at b256
        decode = qwen3_8b_decode_attention(256, 1536, kv_dtype)
        for prefetch, stages, block_n, warps, cap in (
                (False, 2, 64, 4, 0), (False, 3, 64, 4, 0), (True, 3, 64, 4, 0),
                (True, 3, 64, 4, 128), (True, 4, 64, 4, 0), (True, 3, 64, 8, 0),
                (True, 3, 128, 4, 0), (True, 3, 128, 8, 0), (True, 4, 32, 4, 0)):
            launch = attention_variant(decode, prefetch, stages, cap, BLOCK_N=block_n,
                                       num_warps=warps)
            r = report("decode", compile_launch(launch))
            tiles = max(r.async_waits) // 2 + 1 if r.async_waits else 1   # K and V a tile
            tile_bytes = 2 * block_n * 128 * kv_dtype.itemsize
            print(f"{'fp8' if kv_dtype.itemsize == 1 else 'bf16':<7}{prefetch!s:<10}{stages:<8}"
                  f"{block_n:<9}{warps:<7}{cap or '-':<5}{r.registers:<6}{r.local_loads:<8}"
                  f"{r.shared_bytes:<8}"
                  f"{','.join(map(str, sorted(set(r.async_waits)))):<11}"
                  f"{programs_per_sm(r.registers, r.shared_bytes, warps):<13}"
                  f"{tiles} x {tile_bytes // 1024} KB")


def k_loop(lines: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The instructions of the last loop (a backward branch's target up to the branch)."""
    loops = []
    for address, op, line in lines:
        if op == "BRA" and (target := re.search(r"0x([0-9a-f]+)", line.split("BRA")[1])):
            start = int(target.group(1), 16)
            if start < address:
                loops.append((start, address))
    start, end = loops[-1]
    return [entry for entry in lines if start <= entry[0] <= end]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("moe", "fp8", "attention"))
    {"moe": moe, "fp8": fp8, "attention": attention}[parser.parse_args().what]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
