"""Where a batch-1 verification round's host time goes, and what a graph launch costs on an idle
GPU: the Qwen3-8B shape (dummy bf16 weights, the `make_repeating` target of
bench_speculative.py), the oracle proposer at a = 0.7, k = 4.

    python benchmarks/profile_verify_round.py [--out DIR]
    python benchmarks/profile_verify_round.py --smoke     # tiny shape, any machine
    python benchmarks/profile_verify_round.py --smoke --profile round.prof   # + cProfile

Plain decoding hides the host's work behind the step in flight; nothing follows a
verification, so each round's host time (complete, plan, commit, pack, upload, launch) sits
between two graphs. Reported:
- `phases`: mean microseconds per round of each host phase, timed by wrapping the engine's
  own functions (perf_counter, no profiler), and the round's wall time;
- `launch`: the w5 verification graph replayed by itself: the host time of `cuGraphLaunch`,
  its GPU time queued behind a busy stream (pure graph time), and from an idle stream (what a
  round pays: launch latency + graph);
- `split`: a chain of N short PDL kernels (N = the verification graph's kernel count)
  captured as 1, 2 or 4 graphs and launched from idle, to see whether launching the pieces
  back to back starts the GPU sooner.
Writes verify_round.json under --out.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import speculative_rows as spec
from benchmarks.model_shapes import SHAPES, write_shape

CLOCK = time.perf_counter


class Phases:
    """Seconds spent in wrapped callables, by name (nested names count both)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, owner, attr: str, name: str) -> None:
        inner = getattr(owner, attr)

        @functools.wraps(inner)
        def timed(*args, **kwargs):
            at = CLOCK()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[name] += CLOCK() - at

        setattr(owner, attr, timed)


def instrument(engine, phases: Phases) -> None:
    from services.engine.runner import cuda_driver, decode_graphs, graph_runner

    runner, scheduler = engine.runner, engine.scheduler
    phases.wrap(scheduler, "complete", "complete")
    phases.wrap(scheduler, "plan", "plan")
    phases.wrap(scheduler, "commit", "commit")
    phases.wrap(runner, "_enqueue", "enqueue")
    phases.wrap(runner.frames, "upload", "enqueue.upload")
    phases.wrap(runner.completions, "record", "enqueue.record")
    phases.wrap(runner.completions, "start", "enqueue.start")
    phases.wrap(runner, "_complete", "wait.read")
    phases.wrap(cuda_driver.GraphLauncher, "launch", "enqueue.launch")
    phases.wrap(decode_graphs.DecodeGraphs, "replay", "enqueue.replay")
    for name in ("layout_step", "pack_decode", "pack_verify"):
        phases.wrap(graph_runner, name, f"enqueue.{name}")


def _events():
    import torch

    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def time_launches(launch, stream, repeats: int = 50) -> dict[str, float]:
    """Host us of one launch; GPU us behind a busy stream and from an idle one."""
    import torch

    host, busy, idle = [], [], []
    with torch.cuda.stream(stream):
        for _ in range(repeats):
            torch.cuda.synchronize()
            torch.cuda._sleep(2_000_000)           # keep the stream busy while launching
            a, b = _events()
            a.record()
            launch()
            b.record()
            torch.cuda.synchronize()
            busy.append(a.elapsed_time(b) * 1e3)
            torch.cuda.synchronize()
            a, b = _events()
            a.record()
            at = CLOCK()
            launch()
            host.append((CLOCK() - at) * 1e6)
            b.record()
            torch.cuda.synchronize()
            idle.append(a.elapsed_time(b) * 1e3)
    return {"host_launch_us": statistics.median(host), "gpu_busy_us": statistics.median(busy),
            "gpu_idle_us": statistics.median(idle)}


def split_chain(kernels: int, pieces_list=(1, 2, 4)) -> list[dict]:
    """N short PDL kernels as 1..4 graphs, launched back to back from an idle stream."""
    import torch
    import triton
    import triton.language as tl

    from services.engine.kernels.pdl import launch_options, wait_for_previous_grids

    @triton.jit
    def bump(x_ptr, n, PDL: tl.constexpr, BLOCK: tl.constexpr):
        wait_for_previous_grids(PDL)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(x_ptr + offs, x + 1.0, mask=offs < n)

    device = torch.device("cuda")
    x = torch.zeros(1 << 16, device=device)
    options = launch_options(device, 1)
    stream = torch.cuda.Stream()

    def run(count: int) -> None:
        for _ in range(count):
            bump[(64,)](x, x.numel(), BLOCK=1024, **options)

    rows = []
    with torch.cuda.stream(stream):
        run(2)
        torch.cuda.synchronize()
        for pieces in pieces_list:
            graphs = []
            for i in range(pieces):
                count = kernels // pieces + (1 if i < kernels % pieces else 0)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    run(count)
                graphs.append(graph)

            def launch(graphs=graphs) -> None:
                for g in graphs:
                    g.replay()

            row = {"kernels": kernels, "pieces": pieces, **time_launches(launch, stream)}
            rows.append(row)
            del graphs
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--profile", type=Path,
                        help="write a cProfile of the measured request's rounds here")
    parser.add_argument("--out", type=Path,
                        default=Path(os.environ.get("OUT", "benchmarks/out")))
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    args.smoke = args.smoke or not cuda
    args.max_model_len, args.max_num_seqs = 2048, 4
    config = dict(SHAPES["qwen3-8b"])
    input_len = 256
    if args.smoke:
        config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_window_layers=2)
        input_len, args.output_len, args.max_model_len = 64, 200, 512
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_shape("qwen3-8b", Path(tmp) / "m")
        (model_dir / "config.json").write_text(json.dumps(config))
        overrides = {"runner": "graph", "overlap": "on"} if args.smoke else {}
        engine = spec.build_target(model_dir, args, speculative_method="ngram",
                                   num_speculative_tokens=4, **overrides)
        spec.make_repeating(engine.runner.model)
        vocab = engine.scheduler.limits.vocab_size
        rng = random.Random(0)
        prompt = [rng.randrange(vocab) for _ in range(input_len)]
        spec.with_proposer(engine, None)
        spec.serve(engine, [spec.greedy_request("warm", prompt[:32], 8)])
        plain, decode_s, _ = spec.serve(engine, [spec.greedy_request("p", prompt,
                                                                     args.output_len)])
        oracle = spec.Oracle({tuple(prompt): plain["p"]}, 0.7, 4, vocab, seed=4)
        spec.with_proposer(engine, oracle)
        spec.serve(engine, [spec.greedy_request("o1", prompt, args.output_len)])   # warm
        phases = Phases()
        instrument(engine, phases)
        spec.reset_row(engine)
        profile = None
        if args.profile:
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        tokens, round_s, _ = spec.serve(engine, [spec.greedy_request("o", prompt,
                                                                     args.output_len)])
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
        rounds = engine.scheduler.state.counters.spec_verify_steps or 1
        result["plain_ms_per_token"] = 1e3 * decode_s / max(1, len(plain["p"]) - 1)
        result["rounds"] = rounds
        result["round_ms"] = 1e3 * round_s / rounds
        result["tokens_per_round"] = (len(tokens["o"]) - 1) / rounds
        result["phases_us_per_round"] = {k: round(1e6 * v / rounds, 1)
                                         for k, v in sorted(phases.seconds.items())}
        # the enqueue's own host work: without the replay (the forward itself on the CPU)
        # and the completion record (after the launch)
        per = result["phases_us_per_round"]
        per["enqueue.before_launch"] = round(per["enqueue"] - per["enqueue.replay"]
                                             - per["enqueue.record"], 1)
        result["host"] = {k: round(v, 4) for k, v in spec.meter(engine).host.items()}
        print(json.dumps(result, indent=1), flush=True)
        if cuda:
            from services.engine.runner.decode_graphs import padding_step

            graphs = engine.runner.graphs
            key = next(k for k in graphs.graphs if k[0] == 1 and k[1] == 5)
            # replay on the capture's own inputs (an all-padding step): the served request's
            # slots and pages are released by now
            with torch.cuda.stream(graphs.stream):
                padding_step(graphs.frames, graphs.packing(1, 5), graphs.mirror)
            torch.cuda.synchronize()
            result["launch"] = time_launches(graphs.graphs[key].launch, graphs.stream)
            kernels = int(os.environ.get("CHAIN_KERNELS", "281"))
            result["split"] = split_chain(kernels)
    print(json.dumps(result, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verify_round.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
