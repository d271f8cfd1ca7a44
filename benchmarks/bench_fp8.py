"""FP8 on the H200 at the Qwen3-8B shape (random weights), bf16 rows in the same run.

    python benchmarks/bench_fp8.py --out benchmarks/out/gpu        # ~5 minutes on one H200
    python benchmarks/bench_fp8.py --smoke           # CPU check of the script (Qwen3-0.6B)
    python benchmarks/bench_fp8.py --batch1-only     # the four batch-1 rows, ~2.5 minutes
    python benchmarks/bench_fp8.py --levels 64 --no-batch1   # C=64 only: bf16, fp8, scaled_mm

Engine processes (`--load-format dummy`; weights drawn on the device, FP8 ones drawn in
bf16 and quantized per row at load), each serving over gRPC (benchmarks/bench_serving.py's
client; benchmarks/bench_decode.py's batch-1 runs):

- bf16:                 batch-1 decode, 64 concurrent 1024/1024, 256 concurrent 1024/1024
- fp8 weights:          batch-1 decode, 64 concurrent 1024/1024     (`--quantization fp8`)
- fp8 scaled_mm:        64 concurrent 1024/1024 with `HELIOS_FP8_GEMM=scaled_mm` (every
                        rowwise GEMM through cuBLASLt: the same run's before of the Triton
                        kernel that decode batches of up to 64 rows take by default)
- fp8 weights + fp8 KV: 256 concurrent 1024/1024                     (+ `--kv-cache-dtype fp8`)
- fp8 b1 tensor cores:  batch-1 decode with `HELIOS_FP8_SKINNY=tensor-cores` (the tl.dot
                        kernel on converted e4m3 tiles; slower where timed, opt-in)
- fp8 b1 w8a8:          batch-1 decode with `HELIOS_FP8_SKINNY=w8a8` (the row quantized in
                        the kernel, e4m3 x e4m3 wgmma; opt-in: 173-175 tok/s against the
                        default's 216 on an H100, 2026-12-06)
The two opt-in batch-1 rows run with --batch1-only only.

Per engine: KV pages (ModelInfo), GPU memory in use after the runs (nvidia-smi; the KV pool
takes kv_cache_memory_fraction of what the weights leave, so it is nearly all of the GPU in
every row: the page count is the figure that moves). Batch-1 limits: 4.27 TB/s
(PERFORMANCE.md's copy rate) / bytes one step reads (weights + KV at the run's context); for
FP8 the decoder projections are 1 byte per parameter, the lm_head and norms stay bf16. Also
times the rowwise FP8 GEMM three ways (torch._scaled_mm, the Triton kernel with its K split,
the Triton kernel unsplit) at the Qwen3-8B projections, M = 64 and 256, before the engines
start. Writes fp8.json under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_decode import COPY_TB_S, _engine_runs
from benchmarks.bench_serving import (
    engine_request,
    gpu_memory_mib,
    random_prompt,
    run_level,
    summarize,
)
from benchmarks.model_shapes import SHAPES, kv_bytes_per_token, weight_bytes, write_shape

SHAPE = "qwen3-8b"


@dataclass
class EngineRow:
    label: str
    flags: list[str]
    num_pages: int = 0
    page_size: int = 0
    startup_s: float = 0.0
    gpu_mem_mib: float | None = None
    decode_tok_s: float = 0.0
    decode_limit_tok_s: float = 0.0
    levels: dict[str, dict] = field(default_factory=dict)   # "C=64" -> summary
    errors: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)        # the engine's environment


def projection_parameters(config: dict) -> int:
    """Parameters of the decoder projections (what `quantization: fp8` stores in e4m3)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    return config["num_hidden_layers"] * (hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter)


def step_bytes(config: dict, fp8_weights: bool, fp8_kv: bool, context: int) -> int:
    """Bytes a batch-1 decode step reads: every weight but the input embedding table (one row
    of it is read), plus the context's KV."""
    dense = weight_bytes(config)
    if not config.get("tie_word_embeddings"):
        dense -= config["vocab_size"] * config["hidden_size"] * 2      # embedding: one row
    if fp8_weights:
        dense -= projection_parameters(config)                         # 2 bytes -> 1
    return dense + kv_bytes_per_token(config, 1 if fp8_kv else 2) * context


def gemm_timings(smoke: bool) -> dict[str, float]:
    """Microseconds per rowwise FP8 GEMM: torch._scaled_mm, the Triton kernel (K split where
    its tiles do not cover the SMs), and the Triton kernel unsplit (the split's before)."""
    import torch

    if smoke or not torch.cuda.is_available():
        return {}
    from services.engine.kernels import fp8_gemm

    config = SHAPES[SHAPE]
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * config["head_dim"]
    out: dict[str, float] = {}
    for m in (64, 256):
        for name, (n, k) in {"qkv": (qkv, hidden), "o_proj": (hidden, hidden),
                             "gate_up": (2 * inter, hidden), "down": (hidden, inter)}.items():
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
            sa, sw = torch.rand(m, 1, device="cuda"), torch.rand(n, device="cuda")
            for backend in ("scaled_mm", "triton", "triton unsplit"):
                def call(backend=backend, a=a, sa=sa, w=w, sw=sw):
                    if backend.startswith("triton"):
                        return fp8_gemm.triton_mm(a, sa, w, sw, None, torch.bfloat16,
                                                  blockwise=False,
                                                  splits=1 if "unsplit" in backend else None)
                    return fp8_gemm.rowwise_mm(a, sa, w, sw, None, torch.bfloat16)
                # timed in a CUDA graph of 10 calls: an eager loop times the host's launch
                # cost (~30 us a call), not the GEMM
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(3):
                        call()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(10):
                        call()
                graph.replay()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                for _ in range(5):
                    graph.replay()
                end.record()
                torch.cuda.synchronize()
                out[f"{name} M={m} {backend}"] = start.elapsed_time(end) / 50 * 1e3
    torch.cuda.empty_cache()
    return out


async def _serving_levels(address: str, row: EngineRow, levels: list[int], args) -> None:
    from services.common.grpc_client import open_channel
    from services.common.pb import engine_pb2, engine_pb2_grpc

    channel = open_channel(address)
    stub = engine_pb2_grpc.EngineStub(channel)
    info = await stub.GetModelInfo(engine_pb2.GetModelInfoRequest())
    row.num_pages, row.page_size = info.num_pages, info.page_size
    rng = random.Random(args.seed)
    vocab = min(150_000, SHAPES[SHAPE]["vocab_size"])
    for concurrency in levels:
        # warm-up at this width with short outputs: the eager prefill/mixed shapes compile
        warm, _ = await run_level(lambda p: engine_request(stub, p, 8), concurrency,
                                  [random_prompt(rng, args.input_len, vocab)
                                   for _ in range(concurrency)])
        if not all(r.ok for r in warm):
            row.errors.append(f"C={concurrency} warm-up: {[r.error for r in warm][:2]}")
            continue
        prompts = [random_prompt(rng, args.input_len, vocab) for _ in range(concurrency)]
        results, duration = await run_level(
            lambda p: engine_request(stub, p, args.output_len), concurrency, prompts)
        summary = summarize("engine", concurrency, args.input_len, args.output_len, results,
                            duration)
        row.levels[f"C={concurrency}"] = asdict(summary)
        print(f"{row.label} C={concurrency}: {summary.output_tok_s:.1f} output tok/s "
              f"({summary.failed} failed)", flush=True)
    await channel.close()


def run_engine(row: EngineRow, levels: list[int], decode: bool, model_dir: Path, args) -> None:
    from tests.support.processes import ServiceProcess

    with tempfile.TemporaryDirectory() as tmp:
        address = f"unix://{tmp}/engine.sock"
        flags = ["serve", "engine", "--listen", address, "--model", str(model_dir),
                 "--load-format", "dummy", "--max-model-len", str(args.max_model_len),
                 "--max-num-seqs", str(max([4, *levels])), *row.flags]
        if args.smoke:
            flags += ["--kv-cache-bytes", str(64 << 20), "--runner", "graph"]
        started = time.perf_counter()
        log = Path(args.out) / f"engine-fp8-{re.sub(r'[^A-Za-z0-9]+', '_', row.label)}.log"
        with ServiceProcess.start(flags, log, env=row.env) as engine:
            engine.wait_grpc_serving(address, timeout=args.startup_timeout)
            row.startup_s = time.perf_counter() - started
            if decode:
                decode_args = argparse.Namespace(seed=args.seed, input_len=args.decode_input_len,
                                                 output_len=args.decode_output_len,
                                                 requests=args.decode_requests)
                runs, _ = asyncio.run(_engine_runs(address, 150_000, decode_args))
                bad = [r.error for r in runs if not r.ok]
                row.errors.extend(bad)
                if not bad:
                    row.decode_tok_s = statistics.median(
                        (r.output_tokens - 1) / (r.e2e_s - r.ttft_s) for r in runs)
            asyncio.run(_serving_levels(address, row, levels, args))
            row.gpu_mem_mib = gpu_memory_mib()


def print_table(rows: list[EngineRow], gemm: dict[str, float]) -> None:
    print(f"\n{'config':<22}{'pages':>8}{'mem MiB':>9}{'b1 tok/s':>9}{'limit':>7}{'of lim':>7}"
          f"{'C=64 tok/s':>11}{'C=256 tok/s':>12}{'start s':>8}")
    base = rows[0]
    for r in rows:
        if not r.startup_s and not r.errors:     # not in this run's plan
            continue
        c64 = r.levels.get("C=64", {}).get("output_tok_s", 0.0)
        c256 = r.levels.get("C=256", {}).get("output_tok_s", 0.0)
        frac = r.decode_tok_s / r.decode_limit_tok_s if r.decode_tok_s else 0.0
        print(f"{r.label:<22}{r.num_pages:>8}{r.gpu_mem_mib or 0:>9.0f}{r.decode_tok_s:>9.1f}"
              f"{r.decode_limit_tok_s:>7.0f}{frac:>7.2f}{c64:>11.0f}{c256:>12.0f}"
              f"{r.startup_s:>8.1f}")
        for error in r.errors[:3]:
            print(f"  error: {error}")
    for level in ("C=64", "C=256"):
        dense = base.levels.get(level, {}).get("output_tok_s", 0.0)
        for r in rows[1:]:
            got = r.levels.get(level, {}).get("output_tok_s", 0.0)
            if dense and got:
                print(f"{level} {r.label}: {got / dense:.2f}x bf16")
    for name, micros in gemm.items():
        print(f"rowwise FP8 GEMM {name}: {micros:.1f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=1024)
    parser.add_argument("--decode-input-len", type=int, default=128)
    parser.add_argument("--decode-output-len", type=int, default=256)
    parser.add_argument("--decode-requests", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=2304)
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch1-only", action="store_true",
                        help="only the batch-1 rows (bf16, fp8 weights, fp8 b1 tensor cores / w8a8)")
    parser.add_argument("--levels", default="64,256",
                        help="serving concurrencies (64: bf16, fp8, fp8 scaled_mm; 256: bf16, "
                             "fp8 + fp8 KV); a row left with no level and no batch-1 run "
                             "does not start")
    parser.add_argument("--no-batch1", action="store_true", help="no batch-1 decode runs")
    parser.add_argument("--smoke", action="store_true", help="CPU check: tiny lengths")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    narrow, broad = [c for c in levels if c <= 64], [c for c in levels if c > 64]
    if args.smoke:
        args.input_len, args.output_len, args.max_model_len = 8, 2, 32
        args.decode_input_len, args.decode_output_len, args.decode_requests = 8, 3, 1
        narrow, broad = [2] if narrow else [], [3] if broad else []
    args.out.mkdir(parents=True, exist_ok=True)
    shape = "qwen3-0.6b" if args.smoke else SHAPE
    config = SHAPES[shape]
    context = args.decode_input_len + args.decode_output_len
    rows = [EngineRow("bf16", []), EngineRow("fp8 weights", ["--quantization", "fp8"]),
            EngineRow("fp8 weights + fp8 KV", ["--quantization", "fp8", "--kv-cache-dtype",
                                               "fp8"]),
            EngineRow("fp8 scaled_mm", ["--quantization", "fp8"],
                      env={"HELIOS_FP8_GEMM": "scaled_mm"}),
            EngineRow("fp8 b1 tensor cores", ["--quantization", "fp8"],
                      env={"HELIOS_FP8_SKINNY": "tensor-cores"}),
            EngineRow("fp8 b1 w8a8", ["--quantization", "fp8"],
                      env={"HELIOS_FP8_SKINNY": "w8a8"})]
    for row, fp8_w, fp8_kv in zip(rows, (False, True, True, True, True, True),
                                  (False, False, True, False, False, False), strict=True):
        row.decode_limit_tok_s = COPY_TB_S * 1e12 / step_bytes(config, fp8_w, fp8_kv, context)
    gemm = gemm_timings(args.smoke)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_shape(shape, Path(tmp) / shape)
        batch1 = not args.no_batch1
        plan = ((rows[0], narrow + broad, batch1), (rows[1], narrow, batch1),
                (rows[2], broad, False), (rows[3], narrow, False))
        plan = tuple(entry for entry in plan if entry[1] or entry[2])
        if args.batch1_only:    # no serving levels: the batch-1 rows, the opt-in kernels too
            plan = ((rows[0], [], True), (rows[1], [], True), (rows[4], [], True),
                    (rows[5], [], True))
        for row, levels, decode in plan:
            try:
                run_engine(row, levels, decode, model_dir, args)
            except Exception as exc:   # a failed configuration still leaves the others' rows
                row.errors.append(f"{type(exc).__name__}: {exc}")
    print_table(rows, gemm)
    (args.out / "fp8.json").write_text(json.dumps(
        {"shape": shape, "rows": [asdict(r) for r in rows], "rowwise_gemm_us": gemm,
         "copy_tb_s": COPY_TB_S}, indent=2) + "\n")
    return 0 if not any(r.errors for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
