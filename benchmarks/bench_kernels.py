"""Kernel benchmarks on one GPU: paged decode attention, prefill attention, the fused ops.

    python benchmarks/bench_kernels.py [--out DIR] [--sections decode,sweep,prefill,ops]
    python benchmarks/bench_kernels.py --smoke   # tiny shapes, any machine (interpreter on CPU)

Decode attention runs at Qwen3-8B shapes (32 query heads, 8 KV heads, D=128, pages of 16) for
batch 1/16/64/256 and context 128..8k: achieved bandwidth (KV + q + out bytes over the median
time) against the 4.27 TB/s copy limit of an H200, and the time of torch SDPA on the same KV
gathered into contiguous tensors. `--kv-dtype fp8` puts the pages in e4m3 (the engine's FP8 KV
cache; bandwidth counts their bytes), with `--decode-batches`, `--decode-ctxs` and
`--sweep-points` for the shapes of a serving level; `--sections mixed_sweep` times C=256's mixed step
(a 2048-token chunk beside 256 decode rows) with and without the page prefetch. Prefill attention reports TFLOP/s (causal FLOPs only)
against SDPA's flash path. The fused ops report GB/s of their ideal bytes against torch eager
(the model's reference ops) and torch.compile of the same references.

Timing: each measured call is captured in a CUDA graph (several times over rotating input sets
when one set would sit in the 60 MB L2) and the graph is replayed; the figure is the median
replay time over the calls in it. Results: a table on stdout, JSON and a markdown summary
under --out (default $OUT, else benchmarks/out/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.fused_ops_timing import bench_ops  # noqa: E402
from benchmarks.kernel_timing import (  # noqa: E402
    BF16,
    COPY_LIMIT,
    HK,
    HQ,
    PAGE,
    D,
    Timer,
    measure_copy,
    num_sets,
    rel_error,
    table,
)

# ---- decode attention -----------------------------------------------------------------------


class DecodeSets:
    """`n` independent decode batches of `batch` sequences of `ctx` tokens over one page pool."""

    def __init__(self, batch: int, ctx: int, n: int, device: torch.device, gen: torch.Generator,
                 dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> None:
        from services.engine.kernels.attention import AttentionScratch
        from services.engine.model.attention import AttentionMetadata

        pages_per_seq = -(-ctx // PAGE)
        num_pages = n * batch * pages_per_seq
        # the pages in the query's dtype, or e4m3 (--kv-dtype fp8: the engine's FP8 KV cache)
        kv_dtype = kv_dtype or dtype
        self.k_cache = torch.randn(num_pages, PAGE, HK, D, device=device, dtype=dtype).to(kv_dtype)
        self.v_cache = torch.randn(num_pages, PAGE, HK, D, device=device, dtype=dtype).to(kv_dtype)
        order = torch.randperm(num_pages, generator=gen).to(device).to(torch.int32)
        self.metas, self.qs, self.outs = [], [], []
        for s in range(n):
            table = order[s * batch * pages_per_seq : (s + 1) * batch * pages_per_seq]
            self.metas.append(AttentionMetadata(
                query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
                seq_lens=torch.full((batch,), ctx, dtype=torch.int32, device=device),
                page_table=table.view(batch, pages_per_seq).contiguous(),
                slot_mapping=torch.zeros(batch, dtype=torch.int64, device=device),
                max_query_len=1, max_seq_len=ctx,
            ))
            self.qs.append(torch.randn(batch, HQ, D, device=device, dtype=dtype))
            self.outs.append(torch.empty(batch, HQ, D, device=device, dtype=dtype))
        self.scratch = AttentionScratch.allocate(batch, HQ, D, device)
        self.n, self.batch, self.ctx = n, batch, ctx

    def gathered(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Set s's KV as contiguous [B, Hk, ctx, D] tensors (what SDPA reads)."""
        table = self.metas[s].page_table.long()
        dtype = self.qs[s].dtype
        k = self.k_cache[table].flatten(1, 2)[:, : self.ctx].transpose(1, 2).to(dtype)
        v = self.v_cache[table].flatten(1, 2)[:, : self.ctx].transpose(1, 2).to(dtype)
        return k.contiguous(), v.contiguous()

    def bytes_per_call(self) -> int:
        return (kv_bytes(self.batch, self.ctx, self.k_cache.dtype)
                + 2 * self.batch * HQ * D * self.qs[0].element_size())


def kv_bytes(batch: int, ctx: int, dtype: torch.dtype) -> int:
    """The K and V pages `batch` sequences of `ctx` positions hold, in `dtype`."""
    return 2 * batch * ctx * HK * D * dtype.itemsize


def bench_decode(device: torch.device, timer: Timer, batches: list[int], ctxs: list[int],
                 dtype: torch.dtype, max_sets: int, kv_dtype: torch.dtype | None = None
                 ) -> list[dict]:
    from services.engine.kernels.attention import paged_attention

    gen = torch.Generator().manual_seed(0)
    scale = D**-0.5
    rows = []
    for batch in batches:
        for ctx in ctxs:
            per_set = kv_bytes(batch, ctx, kv_dtype or dtype)
            sets = DecodeSets(batch, ctx, num_sets(per_set, max_sets), device, gen, dtype,
                              kv_dtype)

            def run(sets: DecodeSets = sets) -> None:
                for s in range(sets.n):
                    paged_attention(sets.qs[s], sets.k_cache, sets.v_cache, sets.metas[s], scale,
                                    out=sets.outs[s], scratch=sets.scratch)

            t = timer(run, sets.n)
            k, v = sets.gathered(0)
            q4 = sets.qs[0][:, :, None, :]  # [B, Hq, 1, D]
            ref = F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)[:, :, 0]
            paged_attention(sets.qs[0], sets.k_cache, sets.v_cache, sets.metas[0], scale, out=sets.outs[0])
            err = rel_error(sets.outs[0], ref)
            sdpa_sets = max(1, min(sets.n, 4))
            gathered = [sets.gathered(s) for s in range(sdpa_sets)]

            def run_sdpa(gathered: list = gathered, qs: list = sets.qs) -> None:
                for s, (k, v) in enumerate(gathered):
                    F.scaled_dot_product_attention(qs[s][:, :, None, :], k, v, scale=scale, enable_gqa=True)

            t_sdpa = timer(run_sdpa, len(gathered))
            bw = sets.bytes_per_call() / t
            rows.append(dict(batch=batch, ctx=ctx, sets=sets.n, us=t * 1e6, tb_s=bw / 1e12,
                             frac_limit=bw / COPY_LIMIT, sdpa_us=t_sdpa * 1e6,
                             speedup_vs_sdpa=t_sdpa / t, rel_err_vs_sdpa=err))
            del sets, gathered
            torch.cuda.empty_cache() if device.type == "cuda" else None
    return rows


def timed(row: dict, timer: Timer, run: Callable[[], Any], work: float, unit: str,
          calls: int = 1) -> dict:
    """`row` with the median `us` a call and `unit` (work / s / 1e12: bytes for tb_s, FLOPs
    for tflops), or `error` where the plan does not compile or fit (reported; the sweep goes
    on)."""
    try:
        t = timer(run, calls)
        row.update(us=t * 1e6, **{unit: work / t / 1e12})
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return row


def bench_decode_sweep(device: torch.device, timer: Timer, points: list[tuple[int, int]],
                       dtype: torch.dtype, max_sets: int, only: set[str] | None = None,
                       kv_dtype: torch.dtype | None = None) -> list[dict]:
    """Time launch plans around the default one at a few (batch, ctx) points."""
    from services.engine.kernels.attention import launch, plan_attention
    from services.engine.kernels.common import cdiv, sm_count

    gen = torch.Generator().manual_seed(1)
    scale = D**-0.5
    rows = []
    for batch, ctx in points:
        sets = DecodeSets(batch, ctx, num_sets(kv_bytes(batch, ctx, kv_dtype or dtype), max_sets),
                          device, gen, dtype, kv_dtype)
        engine = plan_attention(num_tokens=batch, num_seqs=batch, num_q_heads=HQ, num_kv_heads=HK,
                                head_dim=D, max_query_len=1, max_seq_len=ctx,
                                num_sms=sm_count(device),
                                kv_itemsize=(kv_dtype or dtype).itemsize)
        # the variants below vary the 2-stage tile without the prefetch; "default" is what
        # the engine launches for these pages (the prefetch over FP8 pages: decode_prefetch)
        base = replace(engine, prefetch_pages=False, num_stages=2, max_registers=0)

        def splits(plan: Any, n: int, ctx: int = ctx) -> Any:
            n = max(1, min(64, n))
            split_len = cdiv(cdiv(ctx, n), plan.block_n) * plan.block_n
            return replace(plan, num_splits=cdiv(ctx, split_len), split_len=split_len)

        variants = {
            "default": engine,
            "noprefetch": base,
            "nosplit": splits(base, 1),
            "splits/2": splits(base, base.num_splits // 2),
            "splits*2": splits(base, base.num_splits * 2),
            "n128": splits(replace(base, block_n=128), base.num_splits),
            "w2": replace(base, num_warps=2),
            # FP8 pages: a 64-position tile is half a bf16 one's bytes; deeper or wider tiles
            # keep as many bytes in flight
            "s3": replace(base, num_stages=3),
            "n128s3": splits(replace(base, block_n=128, num_stages=3), base.num_splits),
            "w8": replace(base, num_warps=8),
            # page numbers an iteration ahead: the K/V copies double-buffered from 3 stages
            "p3": replace(base, prefetch_pages=True, num_stages=3),
            "p4": replace(base, prefetch_pages=True, num_stages=4),
            "p3w8": replace(base, prefetch_pages=True, num_stages=3, num_warps=8),
            # FP8 pages: p3 at 152 registers holds 3 programs an SM, capped at 128 (no spill) 4
            "p3r128": replace(base, prefetch_pages=True, num_stages=3, max_registers=128),
            "pn128s3": splits(replace(base, block_n=128, prefetch_pages=True, num_stages=3),
                              base.num_splits),
            "pn32s4": splits(replace(base, block_n=32, prefetch_pages=True, num_stages=4),
                             base.num_splits),
        }
        if engine == base:
            del variants["noprefetch"]
        for name, plan in variants.items():
            if only is not None and name not in only:
                continue

            def run(sets: DecodeSets = sets, plan: Any = plan) -> None:
                for s in range(sets.n):
                    launch(sets.qs[s], sets.k_cache, sets.v_cache, sets.metas[s], scale, sets.outs[s],
                           plan, sets.scratch)

            row = dict(batch=batch, ctx=ctx, variant=name, block_n=plan.block_n, warps=plan.num_warps,
                       stages=plan.num_stages, splits=plan.num_splits, prefetch=plan.prefetch_pages)
            rows.append(timed(row, timer, run, sets.bytes_per_call(), "tb_s", sets.n))
        del sets
    return rows


# ---- prefill attention ----------------------------------------------------------------------


def bench_prefill(device: torch.device, timer: Timer, cases: list[tuple[str, list[int], list[int]]],
                  dtype: torch.dtype) -> list[dict]:
    """cases: (name, q_lens, seq_lens); causal FLOPs = 4 * Hq * D * sum of visible KV."""
    from services.engine.kernels.attention import paged_attention
    from tests.kernels.batch import make_batch

    gen = torch.Generator().manual_seed(2)
    scale = D**-0.5
    rows = []
    for name, q_lens, seq_lens in cases:
        b = make_batch(seq_lens, q_lens, num_q_heads=HQ, num_kv_heads=HK, head_dim=D, page_size=PAGE,
                       device=device, generator=gen, poison_unused=False, dtype=dtype)
        out = torch.empty_like(b.q)
        t = timer(lambda b=b, out=out: paged_attention(b.q, b.k_cache, b.v_cache, b.meta, scale, out=out))
        visible = sum(ql * (sl - ql) + ql * (ql + 1) // 2 for ql, sl in zip(q_lens, seq_lens, strict=True))
        flops = 4 * HQ * D * visible
        row = dict(case=name, tokens=sum(q_lens), us=t * 1e6, tflops=flops / t / 1e12)
        if all(q == s for q, s in zip(q_lens, seq_lens, strict=True)) and len(set(q_lens)) == 1:
            # SDPA's flash path on the same (contiguous) KV, causal
            L, B = q_lens[0], len(q_lens)
            q4 = b.q.view(B, L, HQ, D).transpose(1, 2).contiguous()
            k4 = torch.randn(B, HK, L, D, device=device, dtype=dtype)
            v4 = torch.randn(B, HK, L, D, device=device, dtype=dtype)
            t_sdpa = timer(lambda q4=q4, k4=k4, v4=v4: F.scaled_dot_product_attention(
                q4, k4, v4, is_causal=True, scale=scale, enable_gqa=True))
            row.update(sdpa_us=t_sdpa * 1e6, sdpa_tflops=flops / t_sdpa / 1e12)
        rows.append(row)
        del b, out
    return rows


def bench_prefill_sweep(device: torch.device, timer: Timer, q_len: int) -> list[dict]:
    from services.engine.kernels.attention import launch, plan_attention
    from services.engine.kernels.common import sm_count
    from tests.kernels.batch import make_batch

    b = make_batch([q_len], [q_len], num_q_heads=HQ, num_kv_heads=HK, head_dim=D, page_size=PAGE,
                   device=device, generator=torch.Generator().manual_seed(3), poison_unused=False)
    out = torch.empty_like(b.q)
    base = plan_attention(num_tokens=q_len, num_seqs=1, num_q_heads=HQ, num_kv_heads=HK, head_dim=D,
                          max_query_len=q_len, max_seq_len=q_len, num_sms=sm_count(device))
    group = HQ // HK

    def rows_of(block_m: int, **kw: Any) -> Any:
        block_q = block_m // group
        return replace(base, block_m=block_m, block_q=block_q,
                       num_blocks=-(-q_len // block_q) + 1, **kw)

    variants = {
        "default": base,
        "m64s3": rows_of(64, num_stages=3),
        "m64n128": rows_of(64, block_n=128),
        "m64w8": rows_of(64, num_warps=8),
        "m128w8": rows_of(128, num_warps=8),
        "m128w8s3": rows_of(128, num_warps=8, num_stages=3),
        "m128n128w8s3": rows_of(128, num_warps=8, num_stages=3, block_n=128),
        # page numbers an iteration ahead: the K/V copies double-buffered (one buffer without)
        "m64p3": rows_of(64, num_stages=3, prefetch_pages=True),
        "m128w8p3": rows_of(128, num_warps=8, num_stages=3, prefetch_pages=True),
    }
    visible = q_len * (q_len + 1) // 2
    rows = []
    for name, plan in variants.items():
        row = dict(q_len=q_len, variant=name, block_m=plan.block_m, block_n=plan.block_n,
                   warps=plan.num_warps, stages=plan.num_stages, prefetch=plan.prefetch_pages)
        rows.append(timed(row, timer, lambda plan=plan: launch(b.q, b.k_cache, b.v_cache, b.meta,
                                                              D**-0.5, out, plan),
                          4 * HQ * D * visible, "tflops"))
    return rows


def bench_mixed_sweep(device: torch.device, timer: Timer, kv_dtype: torch.dtype | None,
                      smoke: bool) -> list[dict]:
    """A serving level's mixed step (a prefill chunk beside decode rows: C=256's 2048-token
    chunk and 256 rows at context 1536) under its default plan and with the page prefetch:
    whether mixed steps over FP8 pages should prefetch as their decode-only steps do."""
    from services.engine.kernels.attention import launch, plan_attention
    from services.engine.kernels.common import sm_count
    from tests.kernels.batch import make_batch

    chunk, rows, ctx = (6, 2, 20) if smoke else (2048, 256, 1536)
    q_lens, seq_lens = [chunk] + [1] * rows, [chunk] + [ctx] * rows
    b = make_batch(seq_lens, q_lens, num_q_heads=HQ, num_kv_heads=HK, head_dim=D, page_size=PAGE,
                   device=device, generator=torch.Generator().manual_seed(4), poison_unused=False)
    if kv_dtype is not None:
        b = replace(b, k_cache=b.k_cache.to(kv_dtype), v_cache=b.v_cache.to(kv_dtype))
    out = torch.empty_like(b.q)
    base = plan_attention(num_tokens=sum(q_lens), num_seqs=len(q_lens), num_q_heads=HQ,
                          num_kv_heads=HK, head_dim=D, max_query_len=chunk, max_seq_len=ctx,
                          num_sms=sm_count(device), kv_itemsize=b.k_cache.element_size())
    variants = {
        "default": base,
        "p3": replace(base, prefetch_pages=True, num_stages=3),
        "p3r128": replace(base, prefetch_pages=True, num_stages=3, max_registers=128),
    }
    kv_read = sum(seq_lens) * HK * D * 2 * b.k_cache.element_size()
    results = []
    for name, plan in variants.items():
        row = dict(step=f"{chunk} + {rows} decode@{ctx}", variant=name, stages=plan.num_stages,
                   prefetch=plan.prefetch_pages, splits=plan.num_splits)
        results.append(timed(row, timer, lambda plan=plan: launch(b.q, b.k_cache, b.v_cache,
                                                                 b.meta, D**-0.5, out, plan),
                             kv_read, "tb_s"))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "out"))
    parser.add_argument("--sections", default="copy,decode,sweep,prefill,prefill_sweep,ops")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (checks the script itself)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    parser.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16",
                        help="decode sections: the KV pages in bf16 or e4m3 (queries bf16)")
    parser.add_argument("--decode-batches", default="", help="e.g. 64,256 (decode section)")
    parser.add_argument("--decode-ctxs", default="", help="e.g. 1536 (decode section)")
    parser.add_argument("--sweep-points", default="",
                        help="BxCTX,... for the sweep section, e.g. 64x1536,256x1536")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.smoke:
        print("bench_kernels: no CUDA device; skipped (use --smoke to check the script on CPU)")
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = BF16
    if device.type == "cpu":  # smoke run through Triton's interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from tests.kernels.interpreter import DOT_DTYPE, patch_scalar_index

        patch_scalar_index()
        dtype = DOT_DTYPE
    timer = Timer(device, replays=3 if args.smoke else 15)
    sections = set(args.sections.split(","))
    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                               "torch": torch.__version__}
    import triton

    results["triton"] = triton.__version__
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    out_lines: list[str] = []

    def emit(*lines: str) -> None:
        """Print a section and rewrite the result files, so a cut-short run keeps what it did."""
        out_lines.extend(lines)
        print("\n".join(lines), flush=True)
        (out / "bench_kernels.json").write_text(json.dumps(results, indent=1))
        (out / "bench_kernels.txt").write_text("\n".join(out_lines) + "\n")

    if "copy" in sections and device.type == "cuda":
        results["copy_tb_s"] = measure_copy(device, timer) / 1e12
        emit(f"device-to-device copy: {results['copy_tb_s']:.3f} TB/s (read + write)")
    kv_dtype = torch.float8_e4m3fn if args.kv_dtype == "fp8" else None
    results["kv_dtype"] = args.kv_dtype
    if "decode" in sections:
        batches, ctxs = ([2], [40]) if args.smoke else ([1, 16, 64, 256], [128, 512, 1024, 2048, 4096, 8192])
        if args.decode_batches:
            batches = [int(b) for b in args.decode_batches.split(",")]
        if args.decode_ctxs:
            ctxs = [int(c) for c in args.decode_ctxs.split(",")]
        results["decode"] = bench_decode(device, timer, batches, ctxs, dtype, 1 if args.smoke else 32,
                                         kv_dtype)
        emit("", "decode attention (Qwen3-8B: 32 q / 8 kv heads, D=128, page 16)",
                      table(results["decode"], ["batch", "ctx", "us", "tb_s", "frac_limit", "sdpa_us",
                                                "speedup_vs_sdpa", "rel_err_vs_sdpa"]))
    if "sweep" in sections:
        points = [(1, 70)] if args.smoke else [
            (1, 512), (1, 2048), (1, 8192), (16, 512), (16, 2048), (64, 1024), (256, 4096)]
        if args.sweep_points:
            points = [(int(b), int(c)) for b, c in
                      (p.split("x") for p in args.sweep_points.split(","))]
        results["decode_sweep"] = bench_decode_sweep(device, timer, points, dtype, 1 if args.smoke else 16,
                                                     {"default", "splits*2", "n128s3", "p3", "p3r128"} if args.smoke else None,
                                                     kv_dtype)
        emit("", "decode launch-plan sweep",
                      table(results["decode_sweep"], ["batch", "ctx", "variant", "block_n", "warps", "stages",
                                                      "prefetch", "splits", "us", "tb_s"]))
    if "prefill" in sections:
        cases = [("1x20", [20], [20]), ("1+1 mixed", [5, 1], [5, 9])] if args.smoke else [
            ("1x1024", [1024], [1024]), ("1x4096", [4096], [4096]), ("1x16384", [16384], [16384]),
            ("4x2048", [2048] * 4, [2048] * 4), ("4x1024 over 8k prefix", [1024] * 4, [9216] * 4),
            ("mixed 2048 + 200 decode@2k", [2048] + [1] * 200, [2048] + [2048] * 200),
            ("chunk 512@1k + 64 decode@1k", [512] + [1] * 64, [1536] + [1024] * 64),
        ]
        results["prefill"] = bench_prefill(device, timer, cases, dtype)
        emit("", "prefill attention (causal FLOPs)",
                      table(results["prefill"], ["case", "tokens", "us", "tflops", "sdpa_us", "sdpa_tflops"]))
    if "mixed_sweep" in sections:
        results["mixed_sweep"] = bench_mixed_sweep(device, timer, kv_dtype, args.smoke)
        emit("", "mixed-step plan sweep (KV bytes read at TB/s)",
             table(results["mixed_sweep"], ["step", "variant", "stages", "prefetch", "splits",
                                            "us", "tb_s"]))
    if "prefill_sweep" in sections and not args.smoke:
        results["prefill_sweep"] = bench_prefill_sweep(device, timer, 4096)
        emit("", "prefill launch-plan sweep (1 x 4096)",
                      table(results["prefill_sweep"], ["variant", "block_m", "block_n", "warps", "stages",
                                                       "prefetch", "us", "tflops"]))
    if "ops" in sections:
        counts = [1, 3] if args.smoke else [1, 64, 512, 4096, 16384]
        results["ops"] = bench_ops(device, timer, counts, compile_=not args.no_compile and device.type == "cuda")
        emit("", "fused ops (GB/s of ideal bytes)",
                      table(results["ops"], ["op", "tokens", "triton_us", "triton_gb_s", "eager_us", "eager_gb_s",
                                             "compile_us", "compile_gb_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
