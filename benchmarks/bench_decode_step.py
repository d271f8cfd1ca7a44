"""The batch-1 decode step in isolation: where its time goes, and what the fused kernels buy.

    python benchmarks/bench_decode_step.py --shapes qwen3-0.6b,qwen3-8b --out benchmarks/out/gpu
    python benchmarks/bench_decode_step.py --smoke        # CPU check of the script (tiny shape)

Per shape (benchmarks/model_shapes.py, dummy bf16 weights drawn on the GPU): the model's
decode step for one sequence (forward over the paged KV cache, logits, argmax) captured in a
CUDA graph, exactly what the engine's decode graph runs minus the slot bookkeeping, timed over
replays with CUDA events, under four variants:

    unfused       cuBLAS projections + separate norm / activation kernels, no PDL
    unfused+pdl   the same with programmatic dependent launch on the Triton kernels
    fused         skinny linear kernels with the norm and SiLU fused in (kernels/skinny_linear.py)
    fused+pdl     the same with PDL (the engine's default on an H200)

For each variant: ms per step, tok/s, kernels per step, and (with --profile) the kernels by
total time from torch.profiler over a few replays. Then a sweep of the skinny kernel's tilings
at each of the shape's projections (M = 1, 2, 4, 5, 8, 16 rows: --linear-rows) against cuBLAS (+ the unfused norm
and activation where the fused kernel replaces them), each call reading its weights from HBM
(rotating weight sets larger than the L2). Prints tables; writes decode_step.json under --out.

`--batch B` runs the step sections with B sequences in the step (each at --ctx: decode at
a batch, as C=64 serving decodes). FP8 (issue 16: where the FP8 time goes): `--sections step-fp8` times the same step
with every decoder projection quantized online to e4m3 (`quantization: fp8`, per-row
scales; the lm_head stays bf16) under the fused variants, with the kernel table under
--profile; `--sections linear-fp8` sweeps the FP8 skinny kernel's tilings
(kernels/fp8_layers.py) at one row per projection, beside the bf16 skinny default, in GB/s of
the bytes each reads (an e4m3 weight is half a bf16 one, so the bf16-tuned tiles stream half
the bytes per step: the sweep includes twice their BLOCK_K), and each normed projection
unfused (the norm kernel, then the one-row kernel without its per-step norm). `--kv-fp8`
runs the step sections over e4m3 KV pages (`kv_cache_dtype: fp8`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.kernel_timing import capture_graph, kernel_table, replay_seconds  # noqa: E402
from benchmarks.model_shapes import SHAPES  # noqa: E402

L2_BYTES = 60 * 2**20
VARIANTS = ("unfused", "unfused+pdl", "fused", "fused+pdl")
FUSED_OPS = ("linear", "norm_linear")


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Switch the model's kernel dispatch (ops.kernel_ops) and PDL for the block."""
    from services.engine.kernels import pdl
    from services.engine.model import ops

    original = ops.kernel_ops
    ops.kernel_ops.cache_clear()
    kernels = dict(original())
    if not name.startswith("fused"):
        for op in FUSED_OPS:
            kernels.pop(op, None)
    old_env = os.environ.get("HELIOS_PDL")
    os.environ["HELIOS_PDL"] = "1" if name.endswith("+pdl") else "0"
    pdl.switched_off.cache_clear()
    ops.kernel_ops = lambda: kernels  # type: ignore[assignment]
    try:
        yield
    finally:
        ops.kernel_ops = original  # type: ignore[assignment]
        if old_env is None:
            os.environ.pop("HELIOS_PDL", None)
        else:
            os.environ["HELIOS_PDL"] = old_env
        pdl.switched_off.cache_clear()


def graph_time(fn: Callable[[], Any], replays: int) -> tuple[float, torch.cuda.CUDAGraph]:
    """Median seconds of one replay of `fn` captured in a CUDA graph (and the graph)."""
    graph = capture_graph(fn)
    return replay_seconds(graph, replays), graph


def profile_graph(graph: torch.cuda.CUDAGraph, replays: int = 3) -> tuple[int, list[dict]]:
    """Kernels per replay and the kernels by total time (torch.profiler over `replays`)."""
    def run() -> None:
        for _ in range(replays):
            graph.replay()

    return kernel_table(run, replays)


class DecodeStep:
    """One sequence at context `ctx` in a KV cache sized for `max_len`, the graph's view."""

    def __init__(self, shape: str, device: torch.device, ctx: int, max_len: int,
                 layers: int | None = None, quantization: str = "", batch: int = 1,
                 kv_dtype: torch.dtype = torch.bfloat16) -> None:
        from services.engine.model import (
            ForwardBatch,
            ModelConfig,
            allocate_kv_cache,
            load_dummy_model,
        )
        from services.engine.model.attention import AttentionMetadata

        config = dict(SHAPES[shape])
        if layers:
            config["num_hidden_layers"] = layers
        self.config = ModelConfig.from_dict(config, quantization)
        self.model = load_dummy_model(self.config, device, torch.bfloat16, max_positions=max_len)
        page = 16
        # the table is as wide as max_len (the graph's view), but only the pages a sequence's
        # ctx positions use are allocated; the rest of a row points at page 0, never read
        # (bf16 pages at b256 would not fit an 80 GB card at max_len 2304 otherwise)
        pages, used = -(-max_len // page), -(-ctx // page)
        if not 0 < ctx <= max_len:
            raise ValueError(f"--ctx {ctx} must be in 1..--max-len {max_len}")
        self.kv = allocate_kv_cache(self.config, batch * used + 1, page, device, kv_dtype)
        table = torch.zeros(batch, pages, dtype=torch.int32, device=device)
        table[:, :used] = torch.arange(1, batch * used + 1, dtype=torch.int32,
                                       device=device).view(batch, used)
        self.meta = AttentionMetadata(
            query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
            seq_lens=torch.full((batch,), ctx, dtype=torch.int32, device=device),
            page_table=table,
            slot_mapping=(table[:, (ctx - 1) // page].long() * page + (ctx - 1) % page),
            max_query_len=1, max_seq_len=max_len)
        self.ids = torch.full((batch,), 7, dtype=torch.int64, device=device)
        self.positions = torch.full((batch,), ctx - 1, dtype=torch.int64, device=device)
        self.out = torch.zeros(batch, dtype=torch.int64, device=device)
        self.batch = ForwardBatch(self.ids, self.positions, self.meta)

    def __call__(self) -> None:
        hidden = self.model(self.batch, self.kv).hidden
        self.out.copy_(self.model.compute_logits(hidden).argmax(dim=-1))

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def bench_step(shape: str, device: torch.device, args, quantization: str = "") -> dict:
    kv_dtype = torch.float8_e4m3fn if args.kv_fp8 else torch.bfloat16
    step = DecodeStep(shape, device, args.ctx, args.max_len, 2 if args.smoke else None,
                      quantization, args.batch, kv_dtype)
    label = " ".join(x for x in (shape, quantization, "kv-fp8" if args.kv_fp8 else "",
                                 f"b{args.batch}" if args.batch > 1 else "") if x)
    result: dict[str, Any] = {"shape": label, "weight_gb": step.weight_bytes() / 1e9,
                              "ctx": args.ctx, "max_len": args.max_len, "variants": {}}
    answers = {}
    # the unfused variants take the bf16 kernels out; FP8 projections have only fused ones
    for name in VARIANTS if not quantization else ("fused", "fused+pdl"):
        with variant(name):
            if device.type != "cuda":
                start = time.perf_counter()
                step()
                result["variants"][name] = {"ms": (time.perf_counter() - start) * 1e3}
                continue
            seconds, graph = graph_time(step, args.replays)
            kernels, top = profile_graph(graph) if args.profile else (0, [])
            answers[name] = tuple(step.out.tolist())
            result["variants"][name] = {"ms": seconds * 1e3, "tok_s": args.batch / seconds,
                                        "kernels": kernels, "top": top[:args.top]}
            del graph
    result["same_token"] = len(set(answers.values())) <= 1
    return result


def linear_cases(shape: str) -> list[tuple[str, int, int, str]]:
    """(name, N rows of the weight, K, kind) of each projection; kind: norm, silu, plain, logits.
    A mixture-of-experts shape has its router (normed, as model/moe.py's forward_residual runs
    it) where a dense one has its MLP: the experts are bench_fused_moe.py's."""
    c = SHAPES[shape]
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    head_dim = c.get("head_dim") or hidden // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    experts = c.get("num_experts") or c.get("num_local_experts")
    mlp = [("router", experts, hidden, "norm")] if experts else [
        ("gate_up", 2 * inter, hidden, "silu"), ("down", hidden, inter, "plain")]
    return [("qkv", q + 2 * kv, hidden, "norm"), ("o_proj", hidden, q, "plain"), *mlp,
            ("lm_head", c["vocab_size"], hidden, "logits")]


class LinearCase:
    """One projection at M rows: weight sets to rotate over (read from HBM, not L2) and the
    buffers both paths write."""

    def __init__(self, device: torch.device, n: int, k: int, kind: str, m: int,
                 weights: list[torch.Tensor]) -> None:
        self.kind, self.weights = kind, weights
        self.silu = kind == "silu"
        self.normed = kind in ("norm", "silu")
        out_dtype = torch.float32 if kind == "logits" else torch.bfloat16
        self.x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        self.res = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        self.norm_w = torch.ones(k, device=device, dtype=torch.bfloat16)
        self.out = torch.empty(m, n // 2 if self.silu else n, device=device, dtype=out_dtype)
        self.wide = torch.empty(m, n, device=device, dtype=torch.bfloat16)
        self.res_out = torch.empty_like(self.x)

    def cublas(self) -> None:
        """What the model ran before: the norm kernel, cuBLAS, the activation or fp32 cast."""
        from services.engine.kernels.activation import silu_and_mul
        from services.engine.kernels.norm import fused_add_rms_norm

        for w in self.weights:
            a = self.x
            if self.normed:
                a, _ = fused_add_rms_norm(self.x, self.res, self.norm_w, 1e-6)
            if self.kind in ("norm", "plain"):
                torch.mm(a, w.t(), out=self.out)
            elif self.silu:
                torch.mm(a, w.t(), out=self.wide)
                silu_and_mul(self.wide, out=self.out)
            else:
                torch.mm(a, w.t(), out=self.wide)
                self.out.copy_(self.wide)

    def skinny(self, plan: Any) -> None:
        from services.engine.kernels.skinny_linear import launch

        for w in self.weights:
            launch(self.x, self.res if self.normed else None,
                   self.norm_w if self.normed else None, 1e-6, w, None, self.out,
                   self.res_out if self.normed else None, "silu" if self.silu else None, plan)


def bench_linear(shape: str, device: torch.device, args) -> list[dict]:
    from triton.runtime.errors import OutOfResources

    from services.engine.kernels import pdl
    from services.engine.kernels.skinny_linear import LinearPlan, plan_linear

    rows_out = []
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    for name, n, k, kind in linear_cases(shape):
        weight_bytes = n * k * 2
        sets = max(1, min(16, -(-3 * L2_BYTES // weight_bytes)))
        weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
                   for _ in range(sets)]
        for m in args.rows:
            case = LinearCase(device, n, k, kind, m, weights)
            base, _ = graph_time(case.cublas, args.replays)
            row: dict[str, Any] = {"shape": shape, "proj": name, "m": m, "n": n, "k": k,
                                   "sets": sets, "cublas_us": base / sets * 1e6,
                                   "cublas_gb_s": weight_bytes / (base / sets) / 1e9}
            default = plan_linear(n // 2 if case.silu else n, k, m, sms, case.silu,
                                  case.normed)
            plans = {default, *(LinearPlan(bn, bk, w) for bn, bk, w in args.plans)} if m == 1 \
                else {default, *(LinearPlan(bn, bk, w, 16, st) for bn, bk, w, st in args.row_plans)}
            best: tuple[str, float] | None = None
            for plan in sorted(plans, key=lambda p: (p.block_n, p.block_k, p.num_warps)):
                # PDL on and off for the default tiling, on (the engine's setting) for the rest
                for use_pdl in (False, True) if plan == default else (True,):
                    os.environ["HELIOS_PDL"] = "1" if use_pdl else "0"
                    pdl.switched_off.cache_clear()
                    try:
                        seconds, _ = graph_time(lambda plan=plan, case=case: case.skinny(plan),
                                                args.replays)
                    except OutOfResources:      # a tiling past the shared memory
                        torch.cuda.synchronize()
                        continue
                    us = seconds / sets * 1e6
                    key = (f"{plan.block_n}x{plan.block_k}w{plan.num_warps}"
                           + (f"m{plan.block_m}s{plan.num_stages}" if plan.block_m > 1 else "")
                           + ("+pdl" if use_pdl else ""))
                    row[key] = us
                    if plan == default:
                        row["default" + ("_pdl" if use_pdl else "")] = us
                    if best is None or us < best[1]:
                        best = (key, us)
            os.environ.pop("HELIOS_PDL", None)
            pdl.switched_off.cache_clear()
            assert best is not None
            row["best"], row["best_us"] = best
            row["best_gb_s"] = weight_bytes / (best[1] / 1e6) / 1e9
            rows_out.append(row)
            print(f"  {shape} {name:8} m={m} cuBLAS {row['cublas_us']:8.2f} us "
                  f"({row['cublas_gb_s']:6.0f} GB/s)  default {row['default']:8.2f} / pdl "
                  f"{row['default_pdl']:8.2f}  best {best[0]} {best[1]:8.2f} us "
                  f"({row['best_gb_s']:6.0f} GB/s)", flush=True)
        del weights
    return rows_out


def fp8_unfused_norm(case: LinearCase, fp8: list, act: str | None, device: torch.device,
                     args) -> dict[str, Any]:
    """A normed FP8 projection unfused: the residual-add norm kernel, then the one-row kernel
    without its per-step norm (what a normed projection costs if its activations come
    normalized), at the plain rule's tiling and at plan_linear's with twice the K step."""
    from services.engine.kernels import fp8_layers
    from services.engine.kernels.common import sm_count
    from services.engine.kernels.norm import fused_add_rms_norm
    from services.engine.kernels.skinny_linear import LinearPlan, plan_linear

    n_out = case.out.shape[1]
    base = plan_linear(n_out, fp8[0].shape[1], 1, sm_count(device), act is not None)
    plans = {"unfused_rule": fp8_layers.skinny_plan(fp8[0], n_out, 1, device, act is not None,
                                                    False),
             "unfused_2k": LinearPlan(base.block_n, 2 * base.block_k, base.num_warps)}
    out: dict[str, Any] = {}
    for key, plan in plans.items():
        def run(plan=plan):
            for w in fp8:
                a, _ = fused_add_rms_norm(case.x, case.res, case.norm_w, 1e-6)
                fp8_layers._skinny(a, None, None, 1e-6, w, None, case.out, None, act, plan)

        seconds, _ = graph_time(run, args.replays)
        out[key] = seconds / len(fp8) * 1e6
        out[f"{key}_plan"] = f"{plan.block_n}x{plan.block_k}w{plan.num_warps}"
    print(f"    unfused norm + fp8: {out['unfused_rule_plan']} {out['unfused_rule']:.2f} us, "
          f"{out['unfused_2k_plan']} {out['unfused_2k']:.2f} us", flush=True)
    return out


def bench_fp8_linear(shape: str, device: torch.device, args) -> list[dict]:
    """The FP8 skinny kernel at one row per projection: its default tiling, the sweep, and
    the bf16 skinny default on the same shape (GB/s of the bytes each reads)."""
    from services.common.quantization import ONLINE_FP8
    from services.engine.kernels import fp8_layers
    from services.engine.kernels.skinny_linear import LinearPlan
    from services.engine.model.fp8 import Fp8Weight, quantize_rows

    rows_out = []
    for name, n, k, kind in linear_cases(shape):
        if kind == "logits":
            continue                                   # the lm_head stays bf16
        sets = max(1, min(16, -(-3 * L2_BYTES // (n * k))))
        dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
                 for _ in range(sets)]
        fp8 = [Fp8Weight(*quantize_rows(w), ONLINE_FP8) for w in dense]
        case = LinearCase(device, n, k, kind, 1, dense)
        norm = case.norm_w if case.normed else None
        res, res_out = (case.res, case.res_out) if case.normed else (None, None)
        act = "silu" if case.silu else None

        def run_fp8(plan, case=case, fp8=fp8, norm=norm, res=res, res_out=res_out, act=act):
            for w in fp8:
                fp8_layers._skinny(case.x, res, norm, 1e-6, w, None, case.out, res_out, act,
                                   plan)

        bf16_s, _ = graph_time(lambda case=case: case.skinny(None), args.replays)
        row: dict[str, Any] = {"shape": shape, "proj": name, "n": n, "k": k, "sets": sets,
                               "bf16_default_us": bf16_s / sets * 1e6,
                               "bf16_gb_s": n * k * 2 / (bf16_s / sets) / 1e9}
        default = fp8_layers.skinny_plan(fp8[0], n // 2 if case.silu else n, 1, device,
                                         case.silu, case.normed)
        plans = {default, *(LinearPlan(bn, bk, w) for bn, bk, w in args.plans),
                 *(LinearPlan(bn, bk, w) for bn, bk, w in ((8, 1024, 4), (8, 2048, 8),
                                                           (16, 2048, 8), (32, 1024, 8)))}
        best: tuple[str, float] | None = None
        for plan in sorted(plans, key=lambda p: (p.block_n, p.block_k, p.num_warps)):
            try:
                seconds, _ = graph_time(lambda plan=plan: run_fp8(plan), args.replays)
            except Exception as exc:        # a tiling that does not compile or fit: skipped
                print(f"    {shape} {name} {plan}: skipped, {exc!r:.160}", flush=True)
                row[f"{plan.block_n}x{plan.block_k}w{plan.num_warps}"] = repr(exc)[:80]
                continue
            us = seconds / sets * 1e6
            key = f"{plan.block_n}x{plan.block_k}w{plan.num_warps}"
            row[key] = us
            if plan == default:
                row["default"] = us
            if best is None or us < best[1]:
                best = (key, us)
        assert best is not None
        row["best"], row["best_us"] = best
        row["best_gb_s"] = n * k / (best[1] / 1e6) / 1e9
        row["default_gb_s"] = n * k / (row["default"] / 1e6) / 1e9
        if case.normed:
            row.update(fp8_unfused_norm(case, fp8, act, device, args))
        rows_out.append(row)
        print(f"  fp8 {shape} {name:8} bf16 skinny {row['bf16_default_us']:8.2f} us "
              f"({row['bf16_gb_s']:5.0f} GB/s)  fp8 default {row['default']:8.2f} us "
              f"({row['default_gb_s']:5.0f} GB/s)  best {best[0]} {best[1]:8.2f} us "
              f"({row['best_gb_s']:5.0f} GB/s)", flush=True)
        del dense, fp8
    return rows_out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="qwen3-0.6b,qwen3-8b")
    parser.add_argument("--ctx", type=int, default=384, help="the sequence's context length")
    parser.add_argument("--max-len", type=int, default=1024, help="the graph's max_seq_len")
    parser.add_argument("--batch", type=int, default=1,
                        help="sequences in the step sections' decode step (each at --ctx)")
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--profile", action="store_true", help="torch.profiler kernel tables")
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--sections", default="step,linear")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "out"))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--linear-rows", default="1,2,4,5,8,16",
                        help="token rows M of the linear sweep")
    parser.add_argument("--kv-fp8", action="store_true",
                        help="the step sections over e4m3 KV pages (kv_cache_dtype: fp8)")
    args = parser.parse_args()
    args.plans = [(4, 512, 4), (8, 256, 4), (8, 512, 4), (16, 256, 4), (16, 512, 4),
                  (16, 512, 8), (32, 256, 4), (32, 512, 8), (16, 1024, 8)]
    # the tl.dot kernel's tilings (16 token rows per program) for M > 1
    args.row_plans = [(bn, bk, 4, st) for bn in (16, 32, 64) for bk in (64, 128, 256)
                      for st in (3, 5)] + [(16, 128, 8, 4), (32, 128, 8, 4)]
    args.rows = [int(m) for m in args.linear_rows.split(",")]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        print("no CUDA device: running the smoke shapes (the step timings need a GPU)")
        args.smoke = True
    if args.smoke:
        args.ctx, args.max_len, args.replays = 20, 64, 3
    sections = set(args.sections.split(","))
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if device.type == "cuda"
                              else "cpu", "steps": [], "linear": [], "linear_fp8": []}
    for shape in args.shapes.split(","):
        if "step" in sections:
            result = bench_step(shape, device, args)
            report["steps"].append(result)
            torch.cuda.empty_cache() if device.type == "cuda" else None
        if "step-fp8" in sections:
            report["steps"].append(bench_step(shape, device, args, "fp8"))
            torch.cuda.empty_cache() if device.type == "cuda" else None
        if "linear" in sections and device.type == "cuda":
            report["linear"] += bench_linear(shape, device, args)
        if "linear-fp8" in sections and device.type == "cuda":
            report["linear_fp8"] += bench_fp8_linear(shape, device, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_step.json").write_text(json.dumps(report, indent=2))
    print("\nshape        variant       ms/step   tok/s  kernels")
    for result in report["steps"]:
        for name, v in result["variants"].items():
            print(f"{result['shape']:12} {name:12} {v['ms']:8.3f} {v.get('tok_s', 0):7.0f} "
                  f"{v.get('kernels', 0):8}")
        print(f"{result['shape']:12} same argmax in every variant: {result['same_token']}")
    for result in report["steps"]:
        for name, v in result["variants"].items():
            if v.get("top"):
                print(f"\n{result['shape']} {name}: kernels by time per step")
                for r in v["top"]:
                    print(f"  {r['us_per_step']:8.1f} us  x{r['per_step']:5.1f}  "
                          f"{r['median_us']:6.2f} us each  {r['kernel']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
