"""What each process of the stack spends, in CPU time, per streamed output token.

    python benchmarks/http_cpu_per_token.py                 # the CPU demo (helios run --demo)
    python benchmarks/http_cpu_per_token.py --serve CORE --config YAML --model NAME  # a GPU stack

Why: through HTTP every output token is a message on two gRPC streams (engine servicer ->
frontend -> gateway) and one SSE event, each handled by a single-threaded asyncio process. At
the engine's 6,000-9,000 output tok/s (issue 19's C=64 and C=256 levels) a process that needs
100 us a token would need most of a core. Per level (`--concurrency`, one run each through
HTTP, then through the engine's gRPC alone for its servicer's and core's share): tok/s, and
for every process of the stack (found under `helios run`'s process tree: gateway, frontend,
imageprep, the engine servicer and its core) the user + system CPU microseconds per output
token read from /proc, plus its collector pauses (benchmarks/gc_pauses.py). Writes
http_cpu_per_token.json under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
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

ROLES = ("gateway", "frontend", "imageprep", "engine")
TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float]:
    """(parent pid, user + system CPU seconds) of `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def stack_processes(root: int) -> dict[str, int]:
    """The services under `root` (`helios run`) by role, the engine core as `engine_core`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent, _ = _stat(int(entry))
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    found: dict[str, int] = {}
    pending = list(children.get(root, []))
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, []))
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        for role in ROLES:
            if f"serve {role}" in args:
                found[role] = pid
    engine = found.get("engine")
    for pid in children.get(engine, []) if engine else []:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        if "multiprocessing" in args and "resource_tracker" not in args:
            found.setdefault("engine_core", pid)      # the spawned core (compile workers fork
    return found                                     # from it, so they are its children)


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    return {role: _stat(pid)[1] for role, pid in pids.items()}


async def _measure(args: argparse.Namespace, run) -> list[dict]:
    import httpx

    from services.common.grpc_client import open_channel
    from services.common.pb import engine_pb2_grpc

    pids = stack_processes(run.proc.pid)
    print("processes:", pids, flush=True)
    rng = random.Random(0)
    channel = open_channel(run.addresses["engine"])
    stub = engine_pb2_grpc.EngineStub(channel)
    rows = []
    try:
        for concurrency in args.concurrency:
            for path in ("http", "engine"):
                limits = httpx.Limits(max_connections=concurrency + 8)
                async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0),
                                             limits=limits) as client:
                    def send(prompt, n=args.output_len, path=path, client=client):
                        if path == "http":
                            return http_request(client, run.url, args.model, prompt, n)
                        return engine_request(stub, prompt, n)

                    await run_level(send, concurrency, [      # warm: every step shape once
                        random_prompt(rng, args.input_len, args.vocab_limit)
                        for _ in range(concurrency)])
                    prompts = [random_prompt(rng, args.input_len, args.vocab_limit)
                               for _ in range(args.requests_per_level or 2 * concurrency)]
                    pauses = await asyncio.to_thread(gc_pauses.scrape, run.url)
                    before = cpu_seconds(pids)
                    results, duration = await run_level(send, concurrency, prompts)
                    after = cpu_seconds(pids)
                    gc = gc_pauses.summary(gc_pauses.delta(
                        pauses, await asyncio.to_thread(gc_pauses.scrape, run.url)))
                tokens = sum(r.output_tokens for r in results if r.ok)
                row = {"path": path, "concurrency": concurrency, "tokens": tokens,
                       "failed": sum(not r.ok for r in results),
                       "tok_s": round(tokens / duration, 1),
                       "cpu_us_per_token": {role: round(1e6 * (after[role] - before[role])
                                                        / max(1, tokens), 1) for role in pids},
                       "cores_busy": {role: round((after[role] - before[role]) / duration, 2)
                                      for role in pids},
                       "gc_ms": {proc: p["all_ms"] for proc, p in gc.items()}}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        await channel.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stack_arguments(parser)
    parser.add_argument("--concurrency", default="32",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--requests-per-level", type=int, default=0,
                        help="requests a level (default: twice its concurrency)")
    parser.add_argument("--vocab-limit", type=int, default=32000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, measured_stack(args, Path(tmp)) as run:
        rows = asyncio.run(_measure(args, run))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "http_cpu_per_token.json").write_text(json.dumps(rows, indent=2) + "\n")
    roles = sorted({role for row in rows for role in row["cpu_us_per_token"]})
    print(f"\n{'path':<8}{'C':>5}{'tok/s':>9}" + "".join(f"{r:>13}" for r in roles)
          + "   (CPU us per output token; cores busy in brackets)")
    for row in rows:
        print(f"{row['path']:<8}{row['concurrency']:>5}{row['tok_s']:>9}" + "".join(
            f"{row['cpu_us_per_token'].get(r, 0):>7.1f} ({row['cores_busy'].get(r, 0):.2f})"
            for r in roles))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
