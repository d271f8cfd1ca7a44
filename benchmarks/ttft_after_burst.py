"""Does a burst of concurrent requests leave the stack slower for the next lone request? TTFT
at c=1 through HTTP and through the engine's gRPC, before and after bursts.

    python benchmarks/ttft_after_burst.py                      # the CPU demo (helios run --demo)
    python benchmarks/ttft_after_burst.py --serve CORE --config YAML --model NAME   # a GPU stack

Why: on an H200 bench_serving's c=1 row, which runs right after a warm-up of 256 concurrent
requests, gave an HTTP TTFT of 21.5 ms over the engine's 9.6 (RESULTS.md 2026-12-06, eighth
session), where a dedicated c=1 run on an H200 had given 13.6 over 9.5 (second session). Each
round: `--prompts` lone requests on each path (TTFT p50 / p90: HTTP through a client of
their own, HTTP through the bursts' client with its pool of open connections, as
bench_serving's c=1 row does after its warm-up, and the engine's gRPC), then `--burst` requests at
once (`--burst-input-len` prompts, `--burst-output-len` tokens each) through HTTP. A TTFT
that grows round over round points at state the bursts leave behind. Writes
ttft_after_burst.json under --out. Each row also has `gc_lone`: every process's collector
pauses during its lone requests (full collections and their ms, ms in all collections; from
the gateway's /metrics, benchmarks/gc_pauses.py); each burst prints its own. Run it again with
`HELIOS_GC_FREEZE=0` for the start-up heap left unfrozen (services/common/heap.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gc_pauses
from benchmarks.bench_serving import (
    engine_request,
    http_request,
    random_prompt,
    run_level,
)
from benchmarks.stacks import add_stack_arguments, measured_stack


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(args: argparse.Namespace, engine: str, url: str) -> list[dict]:
    import httpx

    from services.common.grpc_client import open_channel
    from services.common.pb import engine_pb2_grpc

    rng = random.Random(0)
    channel = open_channel(engine)
    stub = engine_pb2_grpc.EngineStub(channel)
    # the bursts' client, whose pool keeps `burst` connections open after each burst; the lone
    # requests go through a client of their own (a lone user) and through the bursts' one
    # (what bench_serving's c=1 row after its warm-up does), to tell the client's share apart
    client = httpx.AsyncClient(timeout=httpx.Timeout(600.0),
                               limits=httpx.Limits(max_connections=args.burst + 8))
    lone = httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=4))
    paths = {"http": lambda p: http_request(lone, url, args.model, p, args.output_len),
             "http_burst_client": lambda p: http_request(client, url, args.model, p,
                                                         args.output_len),
             "engine": lambda p: engine_request(stub, p, args.output_len)}
    rows: list[dict] = []
    try:
        for send in paths.values():       # first use of each path (connections, caches)
            await run_level(send, 1, [random_prompt(rng, args.input_len, args.vocab_limit)
                                      for _ in range(3)])
        for round_index in range(args.rounds + 1):
            row: dict = {"round": round_index, "bursts_before": round_index}
            pauses = await asyncio.to_thread(gc_pauses.scrape, url)
            for name, send in paths.items():
                prompts = [random_prompt(rng, args.input_len, args.vocab_limit)
                           for _ in range(args.prompts)]
                results, _ = await run_level(send, 1, prompts)
                ttft = [1e3 * r.ttft_s for r in results if r.ok]
                row[name] = {"p50": round(statistics.median(ttft), 2),
                             "p90": round(_percentile(ttft, 0.9), 2),
                             "failed": sum(not r.ok for r in results)}
            after = await asyncio.to_thread(gc_pauses.scrape, url)
            row["gc_lone"] = gc_pauses.summary(gc_pauses.delta(pauses, after))
            rows.append(row)
            print(json.dumps(row), flush=True)
            if round_index == args.rounds:
                break
            burst = [random_prompt(rng, args.burst_input_len, args.vocab_limit)
                     for _ in range(args.burst)]
            results, duration = await run_level(
                lambda p: http_request(client, url, args.model, p, args.burst_output_len),
                args.burst, burst)
            burst_gc = gc_pauses.summary(gc_pauses.delta(
                after, await asyncio.to_thread(gc_pauses.scrape, url)))
            print(f"burst {round_index + 1}: {len(burst)} requests in {duration:.2f} s, "
                  f"{sum(not r.ok for r in results)} failed; collector pauses "
                  f"{json.dumps(burst_gc)}", flush=True)
            await asyncio.sleep(args.settle)
    finally:
        await client.aclose()
        await lone.aclose()
        await channel.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stack_arguments(parser)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=64)
    parser.add_argument("--burst-input-len", type=int, default=256)
    parser.add_argument("--burst-output-len", type=int, default=16)
    parser.add_argument("--vocab-limit", type=int, default=32000)
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds to wait after each burst before the lone requests")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, measured_stack(args, Path(tmp)) as run:
        rows = asyncio.run(_measure(args, run.addresses["engine"], run.url))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ttft_after_burst.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"{'bursts before':>14}{'http p50':>10}{'p90':>8}{'bursts client p50':>19}{'p90':>8}"
          f"{'engine p50':>12}{'p90':>8}{'full GCs':>10}{'their ms':>10}")
    for row in rows:
        full = sum(p["gen2"] for p in row["gc_lone"].values())
        full_ms = sum(p["gen2_ms"] for p in row["gc_lone"].values())
        shared = row["http_burst_client"]
        print(f"{row['bursts_before']:>14}{row['http']['p50']:>10}{row['http']['p90']:>8}"
              f"{shared['p50']:>19}{shared['p90']:>8}{row['engine']['p50']:>12}{row['engine']['p90']:>8}{full:>10}{full_ms:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
