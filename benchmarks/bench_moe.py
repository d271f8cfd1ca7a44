"""MoE decode and serving on one GPU: the engine against HF `generate` and the bandwidth limit.

    python benchmarks/bench_moe.py --shape qwen3-30b-a3b --out benchmarks/out/gpu
    python benchmarks/bench_moe.py --shape gpt-oss-20b --out benchmarks/out/gpu
    python benchmarks/bench_moe.py --shape gpt-oss-20b --mxfp4-experts keep --skip-hf
    python benchmarks/bench_moe.py --smoke          # CPU check of the script (tiny lengths)

`--mxfp4-experts keep` (gpt-oss): the engine keeps the experts MXFP4 (the checkpoint's
format: its config says `quant_method: mxfp4`, and dummy weights draw packed codes), and the
limit counts the expert matrices at 4.25 bits a weight; the HF baseline stays bf16. Run it
beside the default (dequantized to bf16) to choose the format by measurement.

One engine process (`helios serve engine --load-format dummy`: random bf16 weights at the
real shape, benchmarks/model_shapes.py) serves both measurements, then HF transformers runs
in this process with random weights from the same config (benchmarks/hf_baseline.py):

- batch-1 decode: `--requests` sequential requests of `--b1-input-len` prompt tokens and
  exactly `--b1-output-len` output tokens; rate = (tokens - 1) / (end - first token)
  (bench_decode.py's measurement); HF: `generate` at batch 1, prefill subtracted;
- serving: `--concurrency` requests at a time of `--input-len`/`--output-len` (greedy, EOS
  ignored), `--concurrency` x `--waves` requests in all (bench_serving.py's driver); output
  tok/s over the wall time; HF: one static batch of the same size, `--hf-output-len` tokens.

The bandwidth limit of a decode step: bytes it must read / 4.27 TB/s (PERFORMANCE.md's copy
rate). Bytes = the weights the step touches (attention, norms, routers and lm_head every
step; per sparse layer the distinct experts the batch selects: sum_e 1 - (1 - p_e)^B, with
p_e = k x expert e's share of the routed tokens measured through GetLoad's expert counters
over the run, uniform k / E before any) + the KV of every sequence at its mean context
(input + output / 2). Each engine result is also stated as a fraction of its limit.
Prints a table; writes moe-<shape>.json under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_decode import COPY_TB_S, DecodeResult
from benchmarks.bench_decode import measure_hf as measure_hf_decode
from benchmarks.bench_serving import engine_request, random_prompt, run_level, summarize
from benchmarks.bench_serving import measure_hf as measure_hf_serving
from benchmarks.model_shapes import (
    SHAPES,
    expected_active_experts,
    experts_of,
    kv_bytes_per_token,
    parameter_count,
    write_shape,
)


@dataclass
class Limit:
    batch: int
    context: int                 # mean KV length per sequence
    active_experts: float        # distinct experts per sparse layer per step
    weight_gb: float             # weights a step reads
    kv_gb: float                 # KV a step reads
    step_ms: float               # (weights + KV) / 4.27 TB/s
    tok_s: float                 # batch / step


@dataclass
class MoEResult:
    shape: str
    device: str
    total_params_b: float = 0.0
    b1_tok_s: float = 0.0
    b1_tpot_ms: float = 0.0
    b1_gpu_step_ms: float = 0.0
    b1_limit: Limit | None = None
    b1_fraction: float = 0.0
    b1_hf_tok_s: float = 0.0
    serving_tok_s: float = 0.0
    serving_tpot_ms: float = 0.0
    serving_ttft_ms: float = 0.0
    serving_limit: Limit | None = None
    serving_fraction: float = 0.0      # of the limit's tok/s (decode steps only)
    serving_hf_tok_s: float = 0.0
    expert_shares: list[float] = field(default_factory=list)
    busiest_expert_share: float = 0.0
    startup_s: float = 0.0
    graphs: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


MXFP4_BYTES = 17 / 32      # bytes a weight: 4 bits + one 8-bit scale per 32


def step_limit(config: dict, batch: int, context: int, shares: list[float] | None,
               mxfp4: bool = False) -> Limit:
    active = expected_active_experts(config, batch, shares)
    weights = parameter_count(config, active) * 2
    if mxfp4:     # the expert matrices (not their biases) at MXFP4's bytes
        _, _, inter, sparse = experts_of(config)
        weights -= sparse * active * 3 * config["hidden_size"] * inter * (2 - MXFP4_BYTES)
    kv = kv_bytes_per_token(config) * context * batch
    step_s = (weights + kv) / (COPY_TB_S * 1e12)
    return Limit(batch, context, round(active, 2), weights / 1e9, kv / 1e9, step_s * 1e3,
                 batch / step_s)


async def _load(stub) -> Any:
    from services.common.pb import engine_pb2

    return await stub.GetLoad(engine_pb2.GetLoadRequest(include_graphs=True))


async def _engine_runs(address: str, config: dict, args, result: MoEResult) -> None:
    from services.common.grpc_client import open_channel
    from services.common.pb import engine_pb2_grpc

    vocab = min(150_000, config["vocab_size"])
    rng = random.Random(args.seed)
    channel = open_channel(address)
    stub = engine_pb2_grpc.EngineStub(channel)
    warm = await engine_request(stub, random_prompt(rng, args.b1_input_len, vocab), 16)
    if not warm.ok:
        raise RuntimeError(f"warm-up failed: {warm.error}")
    before = list((await _load(stub)).expert_tokens)
    runs = [await engine_request(stub, random_prompt(rng, args.b1_input_len, vocab),
                                 args.b1_output_len) for _ in range(args.requests)]
    bad = [r.error for r in runs if not r.ok]
    if bad:
        raise RuntimeError(f"batch-1 requests failed: {bad[:2]}")
    rates = [(r.output_tokens - 1) / (r.e2e_s - r.ttft_s) for r in runs]
    result.b1_tok_s = statistics.median(rates)
    result.b1_tpot_ms = 1e3 / result.b1_tok_s
    prompts = [random_prompt(rng, args.input_len, vocab)
               for _ in range(args.concurrency * args.waves)]

    async def send(prompt: list[int]):
        return await engine_request(stub, prompt, args.output_len)

    levels, duration = await run_level(send, args.concurrency, prompts)
    summary = summarize("engine", args.concurrency, args.input_len, args.output_len, levels,
                        duration)
    if summary.failed:
        raise RuntimeError(f"{summary.failed} serving requests failed: "
                           f"{[r.error for r in levels if not r.ok][:2]}")
    result.serving_tok_s = summary.output_tok_s
    result.serving_tpot_ms = summary.tpot_ms["mean"]
    result.serving_ttft_ms = summary.ttft_ms["mean"]
    load = await _load(stub)
    await channel.close()
    routed = [b - a for a, b in zip(before, load.expert_tokens, strict=False)] or \
        list(load.expert_tokens)
    total = sum(routed)
    if total:
        result.expert_shares = [r / total for r in routed]
        result.busiest_expert_share = max(result.expert_shares)
    result.graphs = [{"kind": g.kind, "label": g.label, "calls": g.calls,
                      "median_ms": g.mean_gpu_ms, "total_ms": g.total_gpu_ms}
                     for g in load.graphs]
    decode_b1 = [g for g in result.graphs if g["kind"] == "decode"
                 and g["label"].startswith("b1 ")]
    if decode_b1:
        result.b1_gpu_step_ms = decode_b1[0]["median_ms"]


def measure_engine(name: str, model_dir: Path, result: MoEResult, args) -> None:
    from tests.support.processes import ServiceProcess

    with tempfile.TemporaryDirectory() as tmp:
        address = f"unix://{tmp}/engine.sock"
        flags = ["serve", "engine", "--listen", address, "--model", str(model_dir),
                 "--load-format", "dummy", "--max-model-len", str(args.max_model_len),
                 "--max-num-seqs", str(args.concurrency)]
        if args.smoke:
            flags += ["--kv-cache-bytes", str(64 << 20)]
        if args.mxfp4_experts == "keep":
            flags += ["--mxfp4-experts", "keep"]
        started = time.perf_counter()
        with ServiceProcess.start(flags, Path(args.out) / f"engine-moe-{name}.log") as engine:
            engine.wait_grpc_serving(address, timeout=args.startup_timeout)
            result.startup_s = time.perf_counter() - started
            asyncio.run(_engine_runs(address, SHAPES[name], args, result))


def measure_hf(model_dir: Path, result: MoEResult, args) -> None:
    decode = DecodeResult(result.shape, result.device)
    measure_hf_decode(result.shape, model_dir, decode, argparse.Namespace(
        seed=args.seed, input_len=args.b1_input_len, hf_output_len=args.hf_output_len))
    result.b1_hf_tok_s = decode.hf_tok_s
    rows = measure_hf_serving(argparse.Namespace(
        hf_model=model_dir, seed=args.seed, hf_concurrency=[args.concurrency],
        input_len=args.input_len, vocab_limit=min(150_000, SHAPES[result.shape]["vocab_size"]),
        hf_output_len=args.hf_output_len))
    result.serving_hf_tok_s = rows[0].output_tok_s


def print_table(r: MoEResult) -> None:
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "—"

    print(f"\n{r.shape} on {r.device}: {r.total_params_b:.1f} B parameters, busiest expert "
          f"{r.busiest_expert_share:.1%} of routed tokens")
    print(f"{'run':<22}{'tok/s':>9}{'limit':>9}{'of limit':>9}{'HF tok/s':>10}{'x HF':>7}"
          f"{'TPOT ms':>9}{'experts/layer':>14}{'weights GB':>11}{'KV GB':>7}")
    for label, tok_s, limit, hf, tpot in (
            ("batch-1 decode", r.b1_tok_s, r.b1_limit, r.b1_hf_tok_s, r.b1_tpot_ms),
            (f"C={r.serving_limit.batch if r.serving_limit else 0} serving", r.serving_tok_s,
             r.serving_limit, r.serving_hf_tok_s, r.serving_tpot_ms)):
        if limit is None:
            continue
        print(f"{label:<22}{tok_s:>9.1f}{limit.tok_s:>9.1f}{ratio(tok_s, limit.tok_s):>9}"
              f"{hf:>10.1f}{ratio(tok_s, hf):>7}{tpot:>9.2f}{limit.active_experts:>14.1f}"
              f"{limit.weight_gb:>11.2f}{limit.kv_gb:>7.2f}")
    if r.b1_gpu_step_ms:
        print(f"batch-1 decode graph: {r.b1_gpu_step_ms:.3f} ms GPU per step "
              f"(limit {r.b1_limit.step_ms if r.b1_limit else 0:.3f} ms)")
    for error in r.errors[:4]:
        print(f"  error: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-30b-a3b",
                        choices=sorted(n for n, c in SHAPES.items() if experts_of(c)[0]))
    parser.add_argument("--b1-input-len", type=int, default=128)
    parser.add_argument("--b1-output-len", type=int, default=512)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--waves", type=int, default=1, help="requests = concurrency x waves")
    parser.add_argument("--hf-output-len", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=2304)
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--mxfp4-experts", choices=("dequantize", "keep"),
                        default="dequantize", help="the engine setting (gpt-oss)")
    parser.add_argument("--smoke", action="store_true", help="CPU check: tiny lengths")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        print("bench_moe: no CUDA device; running the --smoke CPU check instead", flush=True)
        args.smoke = True
    if args.smoke:   # the script's plumbing on a CPU: a 3-layer model of the shape's kind
        args.b1_input_len, args.b1_output_len, args.requests = 8, 4, 1
        args.input_len, args.output_len, args.concurrency = 8, 4, 2
        args.hf_output_len, args.max_model_len = 3, 64
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"moe-{args.shape}" + ("-mxfp4" if args.mxfp4_experts == "keep" else "")
    config = SHAPES[args.shape]
    result = MoEResult(args.shape, torch.cuda.get_device_name(0)
                       if torch.cuda.is_available() else "cpu",
                       total_params_b=parameter_count(config) / 1e9)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_shape(args.shape, Path(tmp) / args.shape)
        if args.smoke:
            small = {**config, "num_hidden_layers": 3, "hidden_size": 256,
                     "intermediate_size": 256, "moe_intermediate_size": 64,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
            if "layer_types" in small:
                small["layer_types"] = small["layer_types"][:3]
            (model_dir / "config.json").write_text(json.dumps(small))
            SHAPES[args.shape] = config = small
        engine_dir = model_dir
        if args.mxfp4_experts == "keep":    # the engine's copy says its experts are MXFP4
            engine_dir = Path(tmp) / f"{args.shape}-mxfp4"
            shutil.copytree(model_dir, engine_dir)
            (engine_dir / "config.json").write_text(json.dumps(
                {**config, "quantization_config": {"quant_method": "mxfp4"}}))
        try:
            measure_engine(args.shape, engine_dir, result, args)
        except Exception as exc:
            result.errors.append(f"engine: {type(exc).__name__}: {str(exc)[-2000:]}")
        shares = result.expert_shares or None
        mxfp4 = args.mxfp4_experts == "keep"
        result.b1_limit = step_limit(config, 1, args.b1_input_len + args.b1_output_len // 2,
                                     shares, mxfp4)
        result.serving_limit = step_limit(config, args.concurrency,
                                          args.input_len + args.output_len // 2, shares, mxfp4)
        result.b1_fraction = result.b1_tok_s / result.b1_limit.tok_s
        result.serving_fraction = result.serving_tok_s / result.serving_limit.tok_s
        # the engine's figures first: a run cut off during HF generate still leaves them
        (args.out / f"{name}.json").write_text(json.dumps(asdict(result), indent=2))
        print(f"engine: batch-1 {result.b1_tok_s:.1f} tok/s ({result.b1_fraction:.2f} of "
              f"limit), C={args.concurrency} {result.serving_tok_s:.1f} tok/s "
              f"({result.serving_fraction:.2f})", flush=True)
        if not args.skip_hf:
            try:
                measure_hf(model_dir, result, args)
            except Exception as exc:
                result.errors.append(f"hf: {type(exc).__name__}: {exc}")
    (args.out / f"{name}.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    print_table(result)
    return 0 if not result.errors and result.b1_tok_s > 0 and result.serving_tok_s > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
