"""Sliding-window decode attention on one GPU: `paged_attention(..., sliding_window=W)` at
Qwen3-8B heads (32 q / 8 kv, D=128, pages of 16) for a few (batch, context) points and windows
W = 0 (full), 4096, 1024, 512; each result checked against SDPA over the window's positions.

    python benchmarks/bench_window_attention.py [--out DIR]
    python benchmarks/bench_window_attention.py --smoke   # tiny shapes, the CPU interpreter

Timing, input rotation and output files as benchmarks/bench_kernels.py (whose decode sets it
uses, with kernel_timing.py's timer): `tb_s` counts the K/V bytes of the positions a window reads, `of_full` is the
time over the same launch at W = 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from bench_kernels import ROOT, DecodeSets
from kernel_timing import BF16, HK, D, Timer, num_sets, rel_error, table


def bench_window(device: torch.device, timer: Timer, points: list[tuple[int, int]],
                 windows: list[int], dtype: torch.dtype, max_sets: int) -> list[dict]:
    """Sliding-window decode attention (`sliding_window=W`; 0 = full) at each (batch, ctx):
    the time follows the positions a window reads (min(W, ctx) per row)."""
    from services.engine.kernels.attention import paged_attention

    gen = torch.Generator().manual_seed(1)
    scale = D**-0.5
    rows = []
    for batch, ctx in points:
        per_set = 2 * batch * ctx * HK * D * 2
        sets = DecodeSets(batch, ctx, num_sets(per_set, max_sets), device, gen, dtype)
        k, v = sets.gathered(0)
        full_us = None
        for window in windows:
            def run(sets: DecodeSets = sets, window: int = window) -> None:
                for s in range(sets.n):
                    paged_attention(sets.qs[s], sets.k_cache, sets.v_cache, sets.metas[s], scale,
                                    window, out=sets.outs[s], scratch=sets.scratch)

            t = timer(run, sets.n)
            full_us = t * 1e6 if window == 0 else full_us
            seen = min(window, ctx) if window else ctx
            ref = F.scaled_dot_product_attention(sets.qs[0][:, :, None, :], k[:, :, ctx - seen:],
                                                 v[:, :, ctx - seen:], scale=scale,
                                                 enable_gqa=True)[:, :, 0]
            paged_attention(sets.qs[0], sets.k_cache, sets.v_cache, sets.metas[0], scale, window,
                            out=sets.outs[0])
            read = 2 * batch * seen * HK * D * 2
            rows.append(dict(batch=batch, ctx=ctx, window=window, us=t * 1e6,
                             of_full=(t * 1e6 / full_us) if full_us else 1.0,
                             tb_s=read / t / 1e12, rel_err_vs_sdpa=rel_error(sets.outs[0], ref)))
        del sets, k, v
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "out"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (checks the script itself)")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.smoke:
        print("bench_window_attention: no CUDA device; skipped (use --smoke to check the script)")
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = BF16
    if device.type == "cpu":  # smoke run through Triton's interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from tests.kernels.interpreter import DOT_DTYPE, patch_scalar_index

        patch_scalar_index()
        dtype = DOT_DTYPE
    timer = Timer(device, replays=3 if args.smoke else 15)
    points = [(2, 40)] if args.smoke else [(1, 32768), (64, 8192), (256, 2048)]
    windows = [0, 16] if args.smoke else [0, 4096, 1024, 512]
    rows = bench_window(device, timer, points, windows, dtype, 1 if args.smoke else 16)
    text = table(rows, ["batch", "ctx", "window", "us", "of_full", "tb_s", "rel_err_vs_sdpa"])
    print("sliding-window decode attention (window 0 = full; tb_s over the positions read)")
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_window_attention.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
