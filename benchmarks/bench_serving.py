"""Serving benchmark that mirrors `vllm bench serve`: random prompts of exact length, ignore EOS,
fixed concurrency, rate inf; against the engine's gRPC endpoint and/or the full HTTP path.

    python benchmarks/bench_serving.py                # starts `helios run --demo` itself
    python benchmarks/bench_serving.py --engine unix:///tmp/run/engine.sock \
        --http http://127.0.0.1:8000 --model helios-demo \
        --input-len 128 --output-len 128 --concurrency 1,16 --out benchmarks/out/serving.json

For each concurrency C it sends N = max(--min-prompts, 5 * C) requests, C at a time, each one as
soon as a slot frees. Per request it records TTFT (first token), TPOT ((e2e - TTFT) / (tokens - 1))
and ITL (gaps between successive streamed chunks, as vLLM counts them). It prints a table last
and writes every number as JSON.

With `--hf-model DIR` (a model directory: config.json; random bf16 weights) it then runs HF
transformers `generate` in the same process after the stack has stopped: one static batch of C
prompts of the same length per `--hf-concurrency` level, greedy, exactly `--hf-output-len` new
tokens, output tok/s = C * new tokens / wall time (prefill included, as in the serving rows).
HF's per-token cost grows with the context it has cached, so a shorter `--hf-output-len` than
the serving rows' favours HF.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gc_pauses
from benchmarks.stacks import serve_stack


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    error: str = ""
    prompt_tokens: int = 0        # HTTP: the final usage's counts
    cached_tokens: int = 0


@dataclass
class RunSummary:
    target: str
    concurrency: int
    requests: int
    failed: int
    duration_s: float
    input_len: int
    output_len: int
    output_tok_s: float
    total_tok_s: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    peak_gpu_mem_mib: float | None = None
    graphs: list[dict] = field(default_factory=list)   # engine per-shape GPU time, this level
    gpu_busy: float | None = None      # sum of step GPU time / wall time (engine target)
    gc: dict | None = None   # every process's collector pauses this level (gc_pauses.summary)


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), "p50": float("nan"), "p99": float("nan")}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * scale

    return {"mean": statistics.fmean(ordered) * scale, "p50": pick(0.5), "p99": pick(0.99)}


def random_prompt(rng: random.Random, length: int, vocab_limit: int) -> list[int]:
    return [rng.randrange(0, vocab_limit) for _ in range(length)]


# ----------------------------------------------------------------------------- engine gRPC


async def engine_request(stub, prompt: list[int], output_len: int) -> RequestResult:
    from services.common.pb import common_pb2, engine_pb2

    request = engine_pb2.EngineGenerateRequest(
        request_id=f"bench-{uuid.uuid4().hex[:12]}", prompt_token_ids=prompt,
        sampling=common_pb2.SamplingParams(max_tokens=output_len, ignore_eos=True,
                                           temperature=0.0))
    start = time.perf_counter()
    result = RequestResult(ok=False)
    last = None
    try:
        async for response in stub.Generate(request):
            now = time.perf_counter()
            new = sum(len(o.token_ids) for o in response.outputs)
            if new == 0:
                continue
            if result.output_tokens == 0:
                result.ttft_s = now - start
            else:
                result.itl_s.append(now - last)
            last = now
            result.output_tokens += new
        result.e2e_s = time.perf_counter() - start
        result.ok = result.output_tokens == output_len
        if not result.ok:
            result.error = f"got {result.output_tokens} tokens, wanted {output_len}"
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


# ----------------------------------------------------------------------------- HTTP


async def http_request(client, url: str, model: str, prompt: list[int],
                       output_len: int) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    result = RequestResult(ok=False)
    last = None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if usage := chunk.get("usage"):
                    result.output_tokens = usage["completion_tokens"]
                    result.prompt_tokens = usage["prompt_tokens"]
                    result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens") or 0
                if "error" in chunk:
                    result.error = str(chunk["error"])
                    return result
                if not any(c.get("text") for c in chunk.get("choices", [])):
                    continue
                now = time.perf_counter()
                if last is None:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last = now
        result.e2e_s = time.perf_counter() - start
        result.ok = result.output_tokens == output_len
        if not result.ok:
            result.error = f"usage says {result.output_tokens} tokens, wanted {output_len}"
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


# ----------------------------------------------------------------------------- driver


async def run_level(send, concurrency: int, prompts: list[list[int]]) -> tuple[list[RequestResult], float]:
    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    results: list[RequestResult] = []

    async def worker() -> None:
        while True:
            try:
                prompt = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            results.append(await send(prompt))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - start


def gpu_memory_mib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return float(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def summarize(target: str, concurrency: int, input_len: int, output_len: int,
              results: list[RequestResult], duration: float) -> RunSummary:
    good = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in good)
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in good if r.output_tokens > 1]
    return RunSummary(
        target=target, concurrency=concurrency, requests=len(results),
        failed=len(results) - len(good), duration_s=duration, input_len=input_len,
        output_len=output_len, output_tok_s=output_tokens / duration,
        total_tok_s=(output_tokens + input_len * len(good)) / duration,
        ttft_ms=percentiles([r.ttft_s for r in good]), tpot_ms=percentiles(tpots),
        itl_ms=percentiles([x for r in good for x in r.itl_s]),
        peak_gpu_mem_mib=gpu_memory_mib())


def print_table(summaries: list[RunSummary]) -> None:
    print(f"\n{'target':<8}{'in':>6}{'C':>5}{'reqs':>6}{'fail':>5}{'out tok/s':>11}"
          f"{'tot tok/s':>11}"
          f"{'TTFT p50':>10}{'p99':>9}{'TPOT p50':>10}{'p99':>9}{'ITL p50':>9}{'p99':>9}")
    for s in summaries:
        print(f"{s.target:<8}{s.input_len:>6}{s.concurrency:>5}{s.requests:>6}{s.failed:>5}"
              f"{s.output_tok_s:>11.1f}"
              f"{s.total_tok_s:>11.1f}{s.ttft_ms['p50']:>10.1f}{s.ttft_ms['p99']:>9.1f}"
              f"{s.tpot_ms['p50']:>10.2f}{s.tpot_ms['p99']:>9.2f}{s.itl_ms['p50']:>9.2f}"
              f"{s.itl_ms['p99']:>9.2f}")
    for s in summaries:
        if not s.graphs:
            continue
        print(f"engine C={s.concurrency}: GPU busy {s.gpu_busy:.0%} of {s.duration_s:.1f} s; "
              "top step shapes (calls, median ms, total s):")
        print("  " + "; ".join(f"{g['kind']} {g['label']}: {g['calls']}, {g['median_ms']:.2f}, "
                               f"{g['total_ms'] / 1e3:.1f}" for g in s.graphs[:6]))
    for s in summaries:
        if s.gc:
            print(f"{s.target} C={s.concurrency}: full collections (ms) "
                  + ", ".join(f"{proc} {p['gen2']} ({p['gen2_ms']:.0f})"
                              for proc, p in s.gc.items())
                  + "; all collections ms "
                  + ", ".join(f"{proc} {p['all_ms']:.0f}" for proc, p in s.gc.items()))


async def main_async(args: argparse.Namespace) -> list[RunSummary]:
    """Each target's warm-up, c=1 row and levels. Through HTTP every level gets a client of
    its own, its pool sized to the level: a pool left holding the warm-up's 256 idle
    connections cost each later request 2-6 ms of the client's own time on the CPU demo
    (benchmarks/ttft_after_burst.py, RESULTS.md 2026-12-07), which the c=1 row counted as
    TTFT."""
    import httpx

    from services.common.grpc_client import open_channel
    from services.common.pb import engine_pb2_grpc

    rng = random.Random(args.seed)
    summaries: list[RunSummary] = []
    stub = None
    if args.engine:
        channel = open_channel(args.engine)
        stub = engine_pb2_grpc.EngineStub(channel)

    @contextlib.asynccontextmanager
    async def sender(name: str, width: int, output_len: int):
        """send(prompt) for `width` requests at once on target `name`."""
        if name == "engine":
            yield lambda p: engine_request(stub, p, output_len)
            return
        async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0),
                                     limits=httpx.Limits(max_connections=width + 8)) as client:
            yield lambda p: http_request(client, args.http, args.model, p, output_len)

    targets = [name for name, address in (("engine", args.engine), ("http", args.http))
               if address]
    wanted = set(getattr(args, "targets", "engine,http").split(","))
    for name in (t for t in targets if t in wanted):
        # warm-up at the largest concurrency, short outputs: every step shape the level will
        # meet (eager prefill/mixed shapes compile their kernels on first use) is seen once
        width = max(args.concurrency) if args.warmup else 2
        warm_len = min(args.output_len, 16)
        async with sender(name, width, warm_len) as send_warm:
            warm, _ = await run_level(send_warm, width, [
                random_prompt(rng, args.input_len, args.vocab_limit) for _ in range(width)])
        if not all(r.ok for r in warm):
            raise SystemExit(f"{name}: warm-up failed: {[r.error for r in warm][:3]}")
        ttft_len = getattr(args, "ttft_input_len", 0)
        if ttft_len:    # one request at a time: time to the first token of a short prompt
            prompts = [random_prompt(rng, ttft_len, args.vocab_limit)
                       for _ in range(args.ttft_prompts)]
            async with sender(name, 1, warm_len) as send_one:
                results, duration = await run_level(send_one, 1, prompts)
            summary = summarize(name, 1, ttft_len, warm_len, results, duration)
            summaries.append(summary)
            print(f"{name} c=1 {ttft_len}-token prompts: TTFT p50 {summary.ttft_ms['p50']:.1f} ms",
                  flush=True)
        levels = args.concurrency
        if name == "http" and getattr(args, "http_concurrency", None):
            levels = args.http_concurrency
        for concurrency in levels:
            count = max(args.min_prompts, args.prompts_per_concurrency * concurrency)
            prompts = [random_prompt(rng, args.input_len, args.vocab_limit) for _ in range(count)]
            before = await engine_graphs(args.engine) if name == "engine" else []
            pauses = await asyncio.to_thread(gc_pauses.scrape, args.http) if args.http else None
            async with sender(name, concurrency, args.output_len) as send:
                results, duration = await run_level(send, concurrency, prompts)
            summary = summarize(name, concurrency, args.input_len, args.output_len, results,
                                duration)
            summaries.append(summary)
            if pauses is not None:
                summary.gc = gc_pauses.summary(gc_pauses.delta(
                    pauses, await asyncio.to_thread(gc_pauses.scrape, args.http)))
            if name == "engine":
                summary.graphs = graph_delta(before, await engine_graphs(args.engine))
                summary.gpu_busy = sum(g["total_ms"] for g in summary.graphs) / 1e3 / duration
            errors = {r.error for r in results if not r.ok}
            print(f"{name} C={concurrency}: {summary.output_tok_s:.1f} output tok/s, "
                  f"{summary.failed} failed {sorted(errors)[:3]}", flush=True)
    if args.engine:
        await channel.close()
    return summaries


def _run_against_demo(args: argparse.Namespace) -> list[RunSummary]:
    import tempfile

    from tests.support.processes import HeliosRun

    args.warmup = False            # the CPU demo: a two-request warm-up is enough
    with tempfile.TemporaryDirectory() as tmp, HeliosRun.start_demo(Path(tmp)) as run:
        args.engine, args.http = run.addresses["engine"], run.url
        return asyncio.run(main_async(args))


def _run_against_stack(args: argparse.Namespace) -> list[RunSummary]:
    """`helios run CORE --config YAML` (all four services), measured on both paths."""
    import tempfile

    from tests.support.processes import ServiceProcess

    with tempfile.TemporaryDirectory() as tmp:
        runtime = Path(tmp) / "run"
        runtime.mkdir()
        log_dir = args.out.parent if args.out else Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / "helios-run.log"
        extra = ["--config", str(args.config)] if args.config else []
        if args.targets == "engine":              # the engine alone (no HTTP services)
            address = f"unix://{runtime / 'engine.sock'}"
            engine = ServiceProcess(["serve", "engine", "--model", str(args.serve), "--listen",
                                     address, *extra], log_path)
            try:
                started = time.perf_counter()
                engine.wait_grpc_serving(address, timeout=args.startup_timeout)
                print(f"engine ready in {time.perf_counter() - started:.1f} s", flush=True)
                args.engine = address
                return asyncio.run(main_async(args))
            finally:
                engine.stop()
        with serve_stack(args.serve, args.config, log_path, args.startup_timeout) as run:
            args.engine = args.engine or run.addresses["engine"]
            args.http = args.http or run.url
            return asyncio.run(main_async(args))


def measure_hf(args: argparse.Namespace) -> list[RunSummary]:
    """HF `generate` on static batches (the module docstring), one row per level."""
    import torch

    from benchmarks.hf_baseline import random_hf_model

    model, device = random_hf_model(args.hf_model)
    rng = random.Random(args.seed + 7)
    rows = []
    for concurrency in args.hf_concurrency:
        prompts = torch.tensor([random_prompt(rng, args.input_len, args.vocab_limit)
                                for _ in range(concurrency)], device=device)
        with torch.no_grad():
            model.generate(prompts[:, :8], attention_mask=torch.ones_like(prompts[:, :8]),
                           max_new_tokens=2, do_sample=False, pad_token_id=0)   # warm-up
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts),
                                 max_new_tokens=args.hf_output_len,
                                 min_new_tokens=args.hf_output_len, do_sample=False,
                                 pad_token_id=0)
            if device == "cuda":
                torch.cuda.synchronize()
        duration = time.perf_counter() - start
        new_tokens = (out.shape[1] - prompts.shape[1]) * concurrency
        rows.append(RunSummary(
            target="hf", concurrency=concurrency, requests=concurrency, failed=0,
            duration_s=duration, input_len=args.input_len, output_len=args.hf_output_len,
            output_tok_s=new_tokens / duration,
            total_tok_s=(new_tokens + args.input_len * concurrency) / duration,
            ttft_ms=percentiles([]), tpot_ms=percentiles([duration / args.hf_output_len]),
            itl_ms=percentiles([]), peak_gpu_mem_mib=gpu_memory_mib()))
        print(f"hf C={concurrency}: {new_tokens / duration:.1f} output tok/s over "
              f"{duration:.1f} s", flush=True)
    del model
    return rows


def graph_delta(before: list[dict], after: list[dict]) -> list[dict]:
    """Per-shape calls and GPU time of one level (GetLoad totals are cumulative); the
    median is the estimator's at the end of the level."""
    earlier = {(g["kind"], g["label"]): g for g in before}
    rows = []
    for g in after:
        old = earlier.get((g["kind"], g["label"]), {"calls": 0, "total_ms": 0.0})
        calls = g["calls"] - old["calls"]
        if calls:
            rows.append({**g, "calls": calls, "total_ms": g["total_ms"] - old["total_ms"]})
    return sorted(rows, key=lambda g: -g["total_ms"])


async def engine_graphs(address: str) -> list[dict]:
    """The engine's per-shape GPU step durations (GetLoad graphs: CUDA events, median)."""
    from services.common.grpc_client import open_channel
    from services.common.pb import engine_pb2, engine_pb2_grpc

    channel = open_channel(address)
    load = await engine_pb2_grpc.EngineStub(channel).GetLoad(
        engine_pb2.GetLoadRequest(include_graphs=True))
    await channel.close()
    return [{"kind": g.kind, "label": g.label, "calls": g.calls, "median_ms": g.mean_gpu_ms,
             "max_ms": g.max_gpu_ms, "total_ms": g.total_gpu_ms} for g in load.graphs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", help="engine gRPC address (tokens in, tokens out)")
    parser.add_argument("--http", help="gateway base URL (the full HTTP path)")
    parser.add_argument("--model", default="helios-demo", help="model name for HTTP requests")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 16, 64, 256])
    parser.add_argument("--prompts-per-concurrency", type=int, default=5)
    parser.add_argument("--min-prompts", type=int, default=10)
    parser.add_argument("--vocab-limit", type=int, default=150000,
                        help="prompt ids are drawn from [0, this) (below special tokens)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--serve", type=Path, help="start `helios run` on this core/model")
    parser.add_argument("--config", type=Path, help="YAML config for --serve")
    parser.add_argument("--targets", default="engine,http",
                        help="which paths to measure: engine, http or both")
    parser.add_argument("--http-concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        help="concurrency levels for the HTTP path (default: --concurrency)")
    parser.add_argument("--ttft-input-len", type=int, default=0,
                        help="first, per target: requests of this many prompt tokens one at a "
                             "time (16 output tokens), for TTFT at c=1 (0: none)")
    parser.add_argument("--ttft-prompts", type=int, default=20)
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                        help="warm up with max(--concurrency) short requests per target "
                             "(else 2)")
    parser.add_argument("--hf-model", type=Path,
                        help="also run HF generate on this model directory (see above)")
    parser.add_argument("--hf-concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        help="batch sizes for HF generate (default: --concurrency)")
    parser.add_argument("--hf-output-len", type=int, default=256)
    args = parser.parse_args()
    if args.serve:
        summaries = _run_against_stack(args)
    elif args.engine or args.http:
        summaries = asyncio.run(main_async(args))
    else:  # no target given: serve the demo model locally and measure both paths
        summaries = _run_against_demo(args)
    if args.hf_model:
        args.hf_concurrency = args.hf_concurrency or args.concurrency
        summaries += measure_hf(args)
    print_table(summaries)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([asdict(s) for s in summaries], indent=2) + "\n")
    return 0 if all(s.failed == 0 for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
