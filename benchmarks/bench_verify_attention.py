"""Paged attention for verification steps (a few query tokens per sequence) on one GPU: the
launch plan's query tile swept at the Qwen3-8B attention shape.

    python benchmarks/bench_verify_attention.py [--out DIR]
    python benchmarks/bench_verify_attention.py --smoke     # tiny run, any machine

A speculative verification feeds w = 1 + drafts tokens per sequence. Each case is B sequences
of w query tokens at context `ctx`, launched as a verification graph launches them: the
metadata's max_seq_len is the graph's context limit (2048 here), not the sequences' length.
Variants: the default plan (`plan_attention`), and `block_q` = q tokens per program (one
tile of max(16, q x group) rows), from one token per program (the decode tiling, the KV
range read once per token) to the whole run in one tile. Timing and input rotation as in
kernel_timing.py (CUDA-graph replays, sets larger than the L2); each variant's output is
checked against the default's. Writes verify_attention.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.kernel_timing import HK, HQ, PAGE, Timer, num_sets, rel_error, table  # noqa: E402

D = 128
LIMIT = 2048            # the verification graph's context limit (its max_seq_len)


class VerifySets:
    """`n` independent steps of `batch` sequences x `width` query tokens at `ctx` positions
    (the step's own keys included) over one page pool."""

    def __init__(self, batch: int, width: int, ctx: int, n: int, device: torch.device,
                 dtype: torch.dtype, limit: int) -> None:
        from services.engine.kernels.attention import AttentionScratch
        from services.engine.model.attention import AttentionMetadata

        gen = torch.Generator().manual_seed(batch * 1000 + width)
        pages_per_seq = -(-ctx // PAGE)
        num_pages = n * batch * pages_per_seq
        self.k_cache = torch.randn(num_pages, PAGE, HK, D, device=device, dtype=dtype)
        self.v_cache = torch.randn(num_pages, PAGE, HK, D, device=device, dtype=dtype)
        order = torch.randperm(num_pages, generator=gen).to(device).to(torch.int32)
        tokens = batch * width
        self.metas, self.qs, self.outs = [], [], []
        for s in range(n):
            table_ = order[s * batch * pages_per_seq:(s + 1) * batch * pages_per_seq]
            self.metas.append(AttentionMetadata(
                query_start_loc=torch.arange(batch + 1, dtype=torch.int32,
                                             device=device) * width,
                seq_lens=torch.full((batch,), ctx, dtype=torch.int32, device=device),
                page_table=table_.view(batch, pages_per_seq).contiguous(),
                slot_mapping=torch.zeros(tokens, dtype=torch.int64, device=device),
                max_query_len=width, max_seq_len=limit))
            self.qs.append(torch.randn(tokens, HQ, D, device=device, dtype=dtype))
            self.outs.append(torch.empty(tokens, HQ, D, device=device, dtype=dtype))
        self.scratch = AttentionScratch.allocate(tokens, HQ, D, device)
        self.n = n


def bench(device: torch.device, timer: Timer, cases: list[tuple[int, int, int]],
          dtype: torch.dtype, max_sets: int, limit: int) -> list[dict]:
    from services.engine.kernels.attention import launch, plan_attention
    from services.engine.kernels.common import sm_count

    scale = D ** -0.5
    rows: list[dict] = []
    for batch, width, ctx in cases:
        sets = VerifySets(batch, width, ctx, num_sets(4 * batch * ctx * HK * D, max_sets),
                          device, dtype, limit)

        max_splits = sets.scratch.max_splits(batch * width, HQ, D)
        variants = {}
        for name, tile in [("default", None)] + [(f"q{q}", q)
                                                 for q in sorted({1, 2, 4, width, 8, 16})]:
            variants[name] = plan_attention(
                num_tokens=batch * width, num_seqs=batch, num_q_heads=HQ, num_kv_heads=HK,
                head_dim=D, max_query_len=width, max_seq_len=limit, num_sms=sm_count(device),
                max_splits=max_splits, query_tile=tile)
        reference = None
        for name, p in variants.items():
            def run(sets: VerifySets = sets, p: Any = p) -> None:
                for s in range(sets.n):
                    launch(sets.qs[s], sets.k_cache, sets.v_cache, sets.metas[s], scale,
                           sets.outs[s], p, sets.scratch)

            row = dict(batch=batch, width=width, ctx=ctx, variant=name, block_q=p.block_q,
                       block_m=p.block_m, splits=p.num_splits, blocks=p.num_blocks)
            try:
                row["us"] = timer(run, sets.n) * 1e6
                launch(sets.qs[0], sets.k_cache, sets.v_cache, sets.metas[0], scale,
                       sets.outs[0], p, sets.scratch)
                if reference is None:
                    reference = sets.outs[0].clone()
                row["rel_err_vs_default"] = rel_error(sets.outs[0], reference)
            except Exception as exc:   # a plan that does not compile or fit: report it, go on
                row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            rows.append(row)
        del sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT",
                                                                        "benchmarks/out")))
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.smoke:
        print("no CUDA device: running the smoke cases on the CPU", flush=True)
        args.smoke = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    if device.type == "cpu":       # through Triton's interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from tests.kernels.interpreter import DOT_DTYPE, patch_scalar_index

        patch_scalar_index()
        dtype = DOT_DTYPE
    timer = Timer(device, replays=3 if args.smoke else 20)
    if args.smoke:
        cases, limit = [(1, 3, 40)], 64
    else:
        cases = [(b, w, c) for b in (1, 4, 16) for w in (3, 5) for c in (320, 1024)]
        cases += [(32, 5, 1024), (1, 7, 1024)]
        limit = LIMIT
    rows = bench(device, timer, cases, dtype, 1 if args.smoke else 16, limit)
    print(table(rows, ["batch", "width", "ctx", "variant", "block_q", "block_m", "splits",
                       "us", "rel_err_vs_default", "error"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verify_attention.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
