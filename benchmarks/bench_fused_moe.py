"""The fused-MoE kernels alone on the H200: time per call, weight bandwidth, per-kernel split
and a tile sweep (issue 18's tuning).

    python benchmarks/bench_fused_moe.py --out benchmarks/out/gpu      # ~2 minutes on one H200

For each shape (Qwen3-30B-A3B: 128 experts, top 8, H 2048, I 768; gpt-oss-20b: 32 experts,
top 4, H 2880, I 2880, biases and clamped SwiGLU) and decode batch T, one
`fused_moe_routed` call (the path `decode_path` picks; at T <= 4 also each path forced:
`decode_us`, fused_moe_decode.py's two launches, `decode_given_us`, the same with the
routing given (fused_experts: no top-k in the gate/up programs), and `sorted_us`, route +
align, gate/up, down, top-k sum) captured in a CUDA graph and replayed: microseconds per call, the expert weights the call reads (the experts its
routing selected) and that as a fraction of the 4.27 TB/s copy rate (PERFORMANCE.md). The
per-kernel split comes from torch.profiler over eager calls. The sweep times gate/up tiles
with the down tiles fixed and then the reverse (their times add), at T = 1 and 64, and
prints the best against plan_moe's choice. The decode sweep (`--decode-sweep-tokens`) does
the same for the decode kernels' one-row tiles (fused_moe_decode.DecodePlan) against
plan_decode's. Writes fused_moe.json under --out.

    python benchmarks/bench_fused_moe.py --smoke   # tiny shapes through Triton's interpreter

`--smoke` (or no CUDA device) runs the same sections at the tiny shapes on the CPU (eager
calls timed, fp16 operands: the interpreter's tl.dot mishandles bf16), to check the script.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMOKE = "--smoke" in sys.argv or not torch.cuda.is_available()
if SMOKE:   # before the kernels are defined: they run in Triton's interpreter on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from tests.kernels.interpreter import DOT_DTYPE, patch_scalar_index

    patch_scalar_index()
DEVICE = "cpu" if SMOKE else "cuda"
DTYPE = DOT_DTYPE if SMOKE else torch.bfloat16

from services.engine.kernels.fused_moe import fused_experts, fused_moe_routed, plan_moe  # noqa: E402
from services.engine.kernels.fused_moe_decode import (  # noqa: E402
    DECODE_TOKENS,
    DecodePlan,
    plan_decode,
)
from services.engine.kernels.skinny_linear import LinearPlan  # noqa: E402

COPY_TB_S = 4.27
GPU_SHAPES = "qwen3-30b-a3b,gpt-oss-20b"
SHAPES = {   # experts, top_k, hidden, inter, activation, biases
    "qwen3-30b-a3b": (128, 8, 2048, 768, "silu", False),
    "gpt-oss-20b": (32, 4, 2880, 2880, "swiglu_oai", True),
    # --smoke (CPU): wide enough that the decode sweep's K steps (128, 256) fit
    "tiny": (8, 2, 128, 64, "silu", False),
    "tiny-oai": (4, 2, 128, 128, "swiglu_oai", True),
}


class Case:
    """One shape's weights (bf16 on the GPU; fp16 with --smoke) and a batch's activations
    and routing logits."""

    def __init__(self, shape: tuple, tokens: int, seed: int = 0) -> None:
        experts, self.top_k, hidden, inter, self.activation, bias = shape
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        kw = dict(device=DEVICE, dtype=DTYPE, generator=gen)
        self.w1 = torch.randn(experts, 2 * inter, hidden, **kw) * hidden ** -0.5
        self.w2 = torch.randn(experts, hidden, inter, **kw) * inter ** -0.5
        self.b1 = torch.randn(experts, 2 * inter, **kw) * 0.1 if bias else None
        self.b2 = torch.randn(experts, hidden, **kw) * 0.1 if bias else None
        self.x = torch.randn(tokens, hidden, **kw)
        self.logits = torch.randn(tokens, experts, device=DEVICE, generator=gen)
        self.load = torch.zeros(experts, dtype=torch.int64, device=DEVICE)
        self.real = torch.tensor([tokens], dtype=torch.int32, device=DEVICE)
        self.expert_bytes = (self.w1[0].numel() + self.w2[0].numel()) * 2
        self.shape = shape

    def call(self, tiles: tuple | DecodePlan | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        experts, top_k, hidden, inter = self.shape[:4]
        plan = (plan_moe(self.x.shape[0], top_k, experts, hidden, inter, tiles)
                if isinstance(tiles, tuple) else tiles)
        out, _, ids = fused_moe_routed(
            self.x, self.logits, self.w1, self.w2, top_k, True, gate_up_bias=self.b1,
            down_bias=self.b2, activation=self.activation, expert_tokens=self.load,
            num_real_tokens=self.real, plan=plan)
        return out, ids

    @functools.cached_property
    def given(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This case's routing (weights, ids), computed once for call_given."""
        _, weights, ids = fused_moe_routed(self.x, self.logits, self.w1, self.w2, self.top_k,
                                           True)
        return weights, ids

    def call_given(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts with the routing given (fused_experts: the decode kernels read the
        slots' experts instead of routing in the gate/up programs)."""
        out = fused_experts(self.x, self.w1, self.w2, self.given[0], self.given[1],
                            gate_up_bias=self.b1, down_bias=self.b2,
                            activation=self.activation, expert_tokens=self.load,
                            num_real_tokens=self.real)
        return out, self.given[1]

    def weight_bytes(self) -> int:
        _, ids = self.call()
        return int(torch.unique(ids).numel()) * self.expert_bytes


def graph_us(case: Case, tiles: tuple | DecodePlan | None = None, replays: int = 200,
             given: bool = False) -> float:
    """Microseconds per call, replayed in a CUDA graph of 10 calls (`given`: the routing
    given, Case.call_given)."""
    def call() -> object:
        return case.call_given() if given else case.call(tiles)

    if SMOKE:       # eager calls on the CPU: checks the path, times nothing meaningful
        call()
        start_s = time.perf_counter()
        call()
        return (time.perf_counter() - start_s) * 1e6
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            call()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays // 10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def kernel_split(case: Case) -> dict[str, float]:
    """Microseconds per call of each kernel (torch.profiler over 20 eager calls)."""
    from torch.profiler import ProfilerActivity, profile

    if SMOKE:
        return {}
    case.call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            case.call()
        torch.cuda.synchronize()
    split: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None)
        if total is None:
            total = getattr(event, "cuda_time_total", 0.0)
        if total and "kernel" in event.key.lower():
            split[event.key] += total / 20
    return dict(sorted(split.items(), key=lambda kv: -kv[1]))


def sweep_us(case: Case, tiles: tuple | DecodePlan) -> float | None:
    """A sweep's timing of one tiling; None (reported) where the compiler refuses it (shared
    memory, registers)."""
    try:
        return graph_us(case, tiles, replays=100)
    except Exception as exc:
        print(f"    tiles {tiles}: {type(exc).__name__}", flush=True)
        return None


def sweep(case: Case) -> dict:
    experts, top_k, hidden, inter = case.shape[:4]
    base = plan_moe(case.x.shape[0], top_k, experts, hidden, inter)
    default = (base.block_m, base.block_n1, base.block_k1, base.block_n2, base.block_k2,
               base.num_warps, base.num_stages)
    rows: list[dict] = []

    best = list(default)
    for part in ("gate_up", "down"):
        results = []
        for n in (16, 32, 64):
            for k in (64, 128, 256):
                for warps in (2, 4):
                    for stages in (3, 4):
                        tiles = list(best)
                        if part == "gate_up":
                            tiles[1], tiles[2] = n, k
                        else:
                            tiles[3], tiles[4] = n, k
                        tiles[5], tiles[6] = warps, stages
                        us = sweep_us(case, tuple(tiles))
                        if us is not None:
                            results.append((us, tuple(tiles)))
                            rows.append({"part": part, "tiles": tiles, "us": us})
        results.sort()
        best = list(results[0][1])
        print(f"    best after the {part} sweep: {results[0][0]:.1f} us with {results[0][1]}",
              flush=True)
    return {"default": default, "default_us": sweep_us(case, default), "best": best,
            "best_us": sweep_us(case, tuple(best)), "rows": rows}


# one-row tiles (block_n, block_k, warps) the decode sweep tries; a tiling whose fp32 tile
# would hold more than `cap` elements a thread (gate/up keeps two accumulators and two
# prefetched tiles, down one of each) is left out: it spills
DECODE_TILES = [(n, k, w) for n in (4, 8, 16, 32) for k in (128, 256, 512, 1024)
                for w in (2, 4, 8)]


def decode_sweep(case: Case) -> dict:
    """The decode kernels' tiles: gate/up with plan_decode's down, then down with the best
    gate/up (their times add: two launches)."""
    _, top_k, hidden, inter = case.shape[:4]
    default = plan_decode(hidden, inter, top_k, 132 if SMOKE else
                          torch.cuda.get_device_properties(0).multi_processor_count)
    rows: list[dict] = []

    best = default
    for part, cap in (("gate_up", 32), ("down", 64)):
        results: list[tuple[float, DecodePlan]] = []
        for n, k, warps in DECODE_TILES:
            if n * k > cap * 32 * warps or k > 2 * max(hidden, inter):
                continue
            tile = LinearPlan(block_n=n, block_k=k, num_warps=warps)
            plan = (DecodePlan(tile, best.down) if part == "gate_up"
                    else DecodePlan(best.gate_up, tile))
            us = sweep_us(case, plan)
            if us is not None:
                results.append((us, plan))
                rows.append({"part": part, "block_n": n, "block_k": k, "warps": warps,
                             "us": us})
        results.sort(key=lambda r: r[0])
        best = results[0][1]
        print(f"    best after the {part} sweep: {results[0][0]:.1f} us with {best}",
              flush=True)

    def tiles(plan: DecodePlan) -> list[list[int]]:
        return [[p.block_n, p.block_k, p.num_warps] for p in (plan.gate_up, plan.down)]

    return {"default": tiles(default), "default_us": sweep_us(case, default),
            "best": tiles(best), "best_us": sweep_us(case, best), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=GPU_SHAPES)
    parser.add_argument("--tokens", default="1,4,16,64,256")
    parser.add_argument("--sweep-tokens", default="1,64", help="'' for no sweep")
    parser.add_argument("--sweep-shapes", default="qwen3-30b-a3b")
    parser.add_argument("--decode-sweep-tokens", default="",
                        help="e.g. '1,2': the decode kernels' tile sweep at those T")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny shapes on the CPU (Triton's interpreter)")
    args = parser.parse_args()
    if SMOKE and args.shapes == GPU_SHAPES:
        args.shapes = args.sweep_shapes = "tiny,tiny-oai"
    report: dict = {"gpu": "cpu" if SMOKE else torch.cuda.get_device_name(),
                    "copy_tb_s": COPY_TB_S, "shapes": {}}
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        entry: dict = {"levels": [], "sweeps": {}}
        for tokens in map(int, args.tokens.split(",")):
            case = Case(shape, tokens)
            us = graph_us(case)
            weights = case.weight_bytes()
            limit_us = weights / (COPY_TB_S * 1e12) * 1e6
            split = kernel_split(case)
            level = {"tokens": tokens, "us": us, "weight_bytes": weights,
                     "limit_us": limit_us, "of_limit": limit_us / us, "kernels_us": split}
            note = ""
            if tokens <= DECODE_TOKENS:     # both paths forced: the decode kernels' A/B,
                # and what routing in the gate/up programs costs the decode path
                for mode, key, given in (("1", "decode_us", False), ("0", "sorted_us", False),
                                         ("1", "decode_given_us", True)):
                    os.environ["HELIOS_MOE_DECODE"] = mode
                    try:
                        level[key] = graph_us(case, given=given)
                    finally:
                        os.environ.pop("HELIOS_MOE_DECODE")
                note = (f" (decode path {level['decode_us']:.1f}, its routing given "
                        f"{level['decode_given_us']:.1f}, sorted {level['sorted_us']:.1f})")
            entry["levels"].append(level)
            kernels = ", ".join(f"{k.split('(')[0][:28]} {v:.1f}" for k, v in split.items())
            print(f"{name} T={tokens:4d}: {us:7.1f} us/call{note}, "
                  f"{weights / 1e6:7.1f} MB of experts ({limit_us:5.1f} us at {COPY_TB_S} "
                  f"TB/s: {limit_us / us:.2f} of limit); kernels: {kernels}", flush=True)
        sweeps = args.sweep_tokens.split(",") if name in args.sweep_shapes.split(",") else []
        for tokens in (int(t) for t in sweeps if t):
            print(f"{name} T={tokens}: tile sweep", flush=True)
            entry["sweeps"][tokens] = result = sweep(Case(shape, tokens))
            print(f"  plan_moe {result['default']}: {result['default_us']:.1f} us; best "
                  f"{result['best']}: {result['best_us']:.1f} us", flush=True)
        for tokens in (int(t) for t in args.decode_sweep_tokens.split(",") if t):
            if name not in args.sweep_shapes.split(","):
                break
            print(f"{name} T={tokens}: decode tile sweep (gate/up, down: block_n, block_k, "
                  f"warps)", flush=True)
            entry.setdefault("decode_sweeps", {})[tokens] = result = decode_sweep(
                Case(shape, tokens))
            print(f"  plan_decode {result['default']}: {result['default_us']:.1f} us; best "
                  f"{result['best']}: {result['best_us']:.1f} us", flush=True)
        report["shapes"][name] = entry
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fused_moe.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
