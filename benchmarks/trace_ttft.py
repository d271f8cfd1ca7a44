"""Where a request's time to first token goes across the services: a `helios run` stack with
stage marks in every process (benchmarks/ttft_trace/sitecustomize.py), one request at a time
through HTTP `/v1/completions` (token ids, streaming), and the median time of each mark from
the client's send.

    python benchmarks/trace_ttft.py                      # the CPU demo stack
    python benchmarks/trace_ttft.py --serve /cores/qwen3-8b --config stack.yaml

Marks (each process's wall clock, one host): the frontend's Generate entered, its engine call,
each engine message it reads; the engine servicer's Generate and each core message its pipe
reader dispatches; the core's step completions and pipe writes; the client's first SSE chunk.
`--requests` requests of `--input-len` random ids and 2 output tokens; the first `--skip` are
warm-up. Prints the timeline; writes trace_ttft.json under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACE_SITE = ROOT / "benchmarks" / "ttft_trace"


async def _send(url: str, model: str, prompts: list[list[int]], client_log: Path) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=120) as client:
        for prompt in prompts:
            body = {"model": model, "prompt": prompt, "max_tokens": 2, "ignore_eos": True,
                    "temperature": 0.0, "stream": True}
            marks = [f"{time.time():.6f} client.send"]
            async with client.stream("POST", url + "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and len(marks) == 1:
                        marks.append(f"{time.time():.6f} client.first_chunk")
            with client_log.open("a") as log:
                log.write("\n".join(marks) + "\n")
            await asyncio.sleep(0.05)


def timeline(trace_dir: Path, skip: int) -> list[tuple[str, float, int]]:
    """(mark, median ms after the client's send, requests that had it), in time order."""
    events = []
    for path in trace_dir.glob("*.txt"):
        for line in path.read_text().splitlines():
            stamp, label = line.split(maxsplit=1)
            events.append((float(stamp), label))
    events.sort()
    requests: list[list[tuple[float, str]]] = []
    for stamp, label in events:
        if label == "client.send":
            requests.append([])
        if requests:
            requests[-1].append((stamp, label))
    offsets: dict[str, list[float]] = defaultdict(list)
    for request in requests[skip:]:
        start = request[0][0]
        seen: dict[str, int] = defaultdict(int)
        for stamp, label in request:
            seen[label] += 1
            offsets[f"{label} #{seen[label]}"].append((stamp - start) * 1e3)
            if label == "client.first_chunk":
                break
    measured = len(requests[skip:])
    rows = [(name, statistics.median(values), len(values)) for name, values in offsets.items()
            if 2 * len(values) > measured]     # marks most requests have
    return sorted(rows, key=lambda row: row[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=Path, help="core or model directory (default: demo)")
    parser.add_argument("--config", type=Path, help="YAML config for --serve")
    parser.add_argument("--model", default="helios-demo", help="served model name")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--skip", type=int, default=5)
    parser.add_argument("--vocab-limit", type=int, default=150000)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    args = parser.parse_args()
    from tests.support.processes import HeliosRun, free_port

    rng = random.Random(0)
    prompts = [[rng.randrange(args.vocab_limit) for _ in range(args.input_len)]
               for _ in range(args.requests)]
    with tempfile.TemporaryDirectory() as tmp:
        trace_dir = Path(tmp) / "trace"
        trace_dir.mkdir()
        runtime = Path(tmp) / "run"
        runtime.mkdir()
        env = dict(os.environ, HELIOS_TTFT_TRACE_DIR=str(trace_dir),
                   PYTHONPATH=os.pathsep.join(filter(None, (
                       str(TRACE_SITE), str(ROOT), os.environ.get("PYTHONPATH")))))
        command = ["--demo"] if args.serve is None else [str(args.serve)]
        if args.config:
            command += ["--config", str(args.config)]
        run = HeliosRun(command, Path(tmp) / "helios-run.log", runtime, free_port(), env)
        with contextlib.ExitStack() as stack:
            stack.callback(run.stop)
            run.wait_output("Helios is serving", timeout=900)
            asyncio.run(_send(run.url, args.model, prompts, trace_dir / "client.txt"))
        rows = timeline(trace_dir, args.skip)
    print(f"{'ms after send':>14}  mark (requests)")
    for name, ms, count in rows:
        print(f"{ms:14.2f}  {name} ({count})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trace_ttft.json").write_text(json.dumps(
        [{"mark": name, "median_ms": ms, "requests": count} for name, ms, count in rows],
        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
