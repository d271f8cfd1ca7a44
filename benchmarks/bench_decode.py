"""Batch-1 decode through the engine vs HF transformers `generate`, same shapes, same run.

    python benchmarks/bench_decode.py --shapes qwen3-0.6b,qwen3-8b --out benchmarks/out/gpu
    python benchmarks/bench_decode.py --smoke          # CPU check of the script (tiny lengths)

Per shape: a weightless model directory (benchmarks/model_shapes.py) served by a real engine
process with `--load-format dummy` (bf16 on the GPU); `--requests` sequential gRPC requests of
`--input-len` random prompt tokens and exactly `--output-len` output tokens (greedy, EOS
ignored). Decode rate = (tokens - 1) / (end - first token). The engine's GetLoad graph rows
give the GPU time of one decode step (CUDA events, median of nine), so host time per token is
the rest. Limit = 4.27 TB/s (PERFORMANCE.md) / (weight bytes + KV bytes read per step).
HF: `AutoModelForCausalLM.from_config` (random bf16 weights) on the same device, `generate`
greedy with `--hf-output-len` new tokens after the same prompt length. Also times polling a
finished CUDA event through torch and through cuda-python's cuEventQuery.
Prints a table last; writes decode.json under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_serving import engine_request
from benchmarks.model_shapes import SHAPES, kv_bytes_per_token, weight_bytes, write_shape

COPY_TB_S = 4.27


@dataclass
class DecodeResult:
    shape: str
    device: str
    engine_tok_s: float = 0.0
    engine_ttft_ms: float = 0.0
    engine_tpot_ms: float = 0.0
    gpu_step_ms: float = 0.0           # decode b1 graph, CUDA events
    host_gap_ms: float = 0.0           # TPOT - GPU step
    limit_tok_s: float = 0.0
    hf_tok_s: float = 0.0
    hf_output_len: int = 0
    startup_s: float = 0.0
    graphs: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _engine_runs(address: str, vocab_limit: int, args) -> tuple[list, list[dict]]:
    from services.common.grpc_client import open_channel
    from services.common.pb import engine_pb2, engine_pb2_grpc

    rng = random.Random(args.seed)
    channel = open_channel(address)
    stub = engine_pb2_grpc.EngineStub(channel)
    warm = await engine_request(stub, [rng.randrange(vocab_limit) for _ in range(args.input_len)],
                                min(16, args.output_len))
    if not warm.ok:
        raise RuntimeError(f"warm-up failed: {warm.error}")
    results = []
    for _ in range(args.requests):
        prompt = [rng.randrange(vocab_limit) for _ in range(args.input_len)]
        results.append(await engine_request(stub, prompt, args.output_len))
    load = await stub.GetLoad(engine_pb2.GetLoadRequest(include_graphs=True))
    graphs = [{"kind": g.kind, "label": g.label, "calls": g.calls, "median_ms": g.mean_gpu_ms,
               "max_ms": g.max_gpu_ms} for g in load.graphs]
    await channel.close()
    return results, graphs


def measure_engine(name: str, model_dir: Path, result: DecodeResult, args) -> None:
    from tests.support.processes import ServiceProcess

    config = SHAPES[name]
    with tempfile.TemporaryDirectory() as tmp:
        address = f"unix://{tmp}/engine.sock"
        flags = ["serve", "engine", "--listen", address, "--model", str(model_dir),
                 "--load-format", "dummy", "--max-model-len", str(args.max_model_len),
                 "--max-num-seqs", str(args.max_num_seqs)]
        if args.smoke:
            flags += ["--kv-cache-bytes", str(64 << 20), "--runner", "graph"]
        started = time.perf_counter()
        with ServiceProcess.start(flags, Path(args.out) / f"engine-{name}.log") as engine:
            engine.wait_grpc_serving(address, timeout=args.startup_timeout)
            result.startup_s = time.perf_counter() - started
            runs, graphs = asyncio.run(_engine_runs(address, min(150_000,
                                                                 config["vocab_size"]), args))
    bad = [r.error for r in runs if not r.ok]
    if bad:
        result.errors.extend(bad)
        return
    rates = [(r.output_tokens - 1) / (r.e2e_s - r.ttft_s) for r in runs]
    result.engine_tok_s = statistics.median(rates)
    result.engine_tpot_ms = 1e3 / result.engine_tok_s
    result.engine_ttft_ms = statistics.median(r.ttft_s for r in runs) * 1e3
    result.graphs = graphs
    decode = [g for g in graphs if g["kind"] == "decode" and g["label"].startswith("b1 ")]
    if decode and decode[0]["median_ms"] > 0:
        result.gpu_step_ms = decode[0]["median_ms"]
        result.host_gap_ms = result.engine_tpot_ms - result.gpu_step_ms


def measure_hf(name: str, model_dir: Path, result: DecodeResult, args) -> None:
    import torch

    from benchmarks.hf_baseline import random_hf_model

    model, device = random_hf_model(model_dir)
    rng = random.Random(args.seed + 1)
    prompt = torch.tensor([[rng.randrange(150_000) for _ in range(args.input_len)]],
                          device=device)

    def generate(new_tokens: int) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(prompt, attention_mask=torch.ones_like(prompt),
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, pad_token_id=0)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    generate(2)                                             # warm-up
    prefill = generate(1)
    total = generate(args.hf_output_len)
    result.hf_output_len = args.hf_output_len
    result.hf_tok_s = (args.hf_output_len - 1) / max(total - prefill, 1e-9)


def event_poll_costs() -> dict[str, float]:
    """Microseconds per poll of a finished event: torch's query vs cuEventQuery."""
    import torch

    from services.engine.runner.cuda_driver import driver_available, driver_event_done

    if not torch.cuda.is_available():
        return {}
    event = torch.cuda.Event()
    event.record()
    torch.cuda.synchronize()
    costs = {}
    for label, poll in (("torch Event.query", event.query),
                        ("cuEventQuery", lambda: driver_event_done(event))):
        if label == "cuEventQuery" and not driver_available():
            continue
        start = time.perf_counter()
        for _ in range(20_000):
            poll()
        costs[label] = (time.perf_counter() - start) / 20_000 * 1e6
    return costs


def limit_tok_s(name: str, context: int) -> float:
    config = SHAPES[name]
    step_bytes = weight_bytes(config) + kv_bytes_per_token(config) * context
    return COPY_TB_S * 1e12 / step_bytes


def print_table(results: list[DecodeResult], polls: dict[str, float]) -> None:
    print(f"\n{'shape':<12}{'engine tok/s':>13}{'of limit':>9}{'limit':>8}{'HF tok/s':>9}"
          f"{'x HF':>7}{'TTFT ms':>9}{'TPOT ms':>9}{'GPU ms':>8}{'host ms':>8}{'start s':>8}")
    for r in results:
        ratio = r.engine_tok_s / r.hf_tok_s if r.hf_tok_s else float("nan")
        print(f"{r.shape:<12}{r.engine_tok_s:>13.1f}{r.engine_tok_s / r.limit_tok_s:>9.2f}"
              f"{r.limit_tok_s:>8.0f}{r.hf_tok_s:>9.1f}{ratio:>7.1f}{r.engine_ttft_ms:>9.1f}"
              f"{r.engine_tpot_ms:>9.3f}{r.gpu_step_ms:>8.3f}{r.host_gap_ms:>8.3f}"
              f"{r.startup_s:>8.1f}")
        for error in r.errors[:3]:
            print(f"  error: {error}")
    for label, micros in polls.items():
        print(f"poll a finished event: {label} {micros:.2f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="qwen3-0.6b,qwen3-8b")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--hf-output-len", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="CPU check: tiny lengths")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    if args.smoke:
        args.shapes, args.input_len, args.output_len = "qwen3-0.6b", 16, 6
        args.requests, args.hf_output_len, args.max_model_len = 1, 3, 64
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.shapes.split(","):
            model_dir = write_shape(name, Path(tmp) / name)
            import torch

            result = DecodeResult(name, torch.cuda.get_device_name(0)
                                  if torch.cuda.is_available() else "cpu")
            result.limit_tok_s = limit_tok_s(name, args.input_len + args.output_len // 2)
            try:
                measure_engine(name, model_dir, result, args)
            except Exception as exc:
                result.errors.append(f"engine: {type(exc).__name__}: {str(exc)[-2000:]}")
            if not args.skip_hf:
                try:
                    measure_hf(name, model_dir, result, args)
                except Exception as exc:
                    result.errors.append(f"hf: {type(exc).__name__}: {exc}")
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            results.append(result)
            print(json.dumps(asdict(result)), flush=True)
    polls = event_poll_costs()
    (args.out / "decode.json").write_text(json.dumps(
        {"results": [asdict(r) for r in results], "event_poll_us": polls}, indent=2) + "\n")
    print_table(results, polls)
    return 0 if all(not r.errors and r.engine_tok_s > 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
