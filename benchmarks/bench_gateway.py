"""The gateway's HTTP overhead: the same requests through the frontend's gRPC stream and through
the gateway's OpenAI SSE route, in the same run, at 1, 16, 64 and 256 concurrent streams.

    .venv/bin/python benchmarks/bench_gateway.py             # starts `helios run --demo` itself
    .venv/bin/python benchmarks/bench_gateway.py --model /cores/qwen3-8b --concurrency 1,16,64,256
    .venv/bin/python benchmarks/bench_gateway.py --url http://127.0.0.1:8000 \
        --frontend unix:///tmp/run/frontend.sock --model-name qwen3-8b
    .venv/bin/python benchmarks/bench_gateway.py --fake --token-interval-ms 20

`--fake` puts a real `helios serve gateway` in front of the scripted test frontend
(tests/gateway/fake_frontend.py, its own process), which emits one token every
--token-interval-ms: no model noise, so the difference is the gateway's own cost (HTTP, JSON,
SSE, asyncio) plus the client's SSE parsing (the client runs in this process).

Each level sends N = max(--min-requests, --per-stream x C) chat requests, C at a time (a new one
as soon as one finishes), each a distinct prompt of about --input-words words with exactly
--output-len tokens (ignore_eos; temperature 1 with a per-request seed, the same seeds on both
paths: greedy output of a random-weight model is whitespace, which the frontend holds back
until it knows no tool call follows, so greedy runs would have no inter-token gaps). The gRPC and HTTP runs of a level alternate in
--rounds rounds and use different prompts, so neither profits from the other's prefix cache.
Per request: TTFT (request sent -> first token-bearing event / SSE chunk) and ITL (gaps between
successive token-bearing events / chunks; one SSE chunk per frontend event). The table reports
p50/p99 of both paths and the HTTP path's added TTFT and ITL (p50 differences).
Writes benchmarks/out/bench_gateway.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.frontend_client import FrontendClient  # noqa: E402
from services.common.api.chat import ChatInput, ChatMessage  # noqa: E402
from services.common.api.events import ReasoningDelta, TextDelta, ToolCallDelta  # noqa: E402
from services.common.api.generate import GenerateRequest, Sampling  # noqa: E402
from services.common.grpc_client import open_channel  # noqa: E402

WORDS = ["the", "model", "streams", "tokens", "while", "the", "scheduler", "plans", "the", "next", "step", "and", "the", "cache", "keeps", "pages", "of", "earlier", "prompts", "for", "later", "requests"]
NO_THINK = {"enable_thinking": False}


@dataclass
class Sample:
    ttft_s: float
    itl_s: list[float] = field(default_factory=list)
    tokens: int = 0


@dataclass
class PathStats:
    requests: int = 0
    failed: int = 0
    duration_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    tokens: int = 0

    def add(self, sample: Sample) -> None:
        self.requests += 1
        self.ttft_s.append(sample.ttft_s)
        self.itl_s.extend(sample.itl_s)
        self.tokens += sample.tokens


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000.0


FAKE_SCRIPT: str | None = None     # set by --fake: every prompt is this script


def prompt(level: int, path: str, number: int, words: int) -> str:
    if FAKE_SCRIPT is not None:
        return FAKE_SCRIPT
    salt = f"{path}-{level}-{number}"
    return salt + " " + " ".join(WORDS[(number * 7 + i * 13) % len(WORDS)] for i in range(words))


FAKE_SERVER = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from tests.gateway.fake_frontend import FakeFrontendServer
server = FakeFrontendServer()
print(server.address, flush=True)
threading.Event().wait()
"""


def start_fake(args: argparse.Namespace, runtime: Path) -> tuple[list[subprocess.Popen], str, str]:
    """The scripted test frontend and a real `helios serve gateway`, each its own process."""
    global FAKE_SCRIPT
    from tests.gateway.fake_frontend import script

    FAKE_SCRIPT = script(numbered=[args.output_len, 2],
                         delay_s=args.token_interval_ms / 1000.0)
    fake = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, str(ROOT)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    address = fake.stdout.readline().strip()  # type: ignore[union-attr]
    port = _free_port()
    log = open(runtime / "gateway.log", "wb")  # noqa: SIM115 (lives as long as the process)
    gateway = subprocess.Popen([sys.executable, "-m", "services.cli.main", "serve", "gateway",
                                "--port", str(port), "--frontend-address", address,
                                "--max-active", "2048", "--queue-capacity", "0",
                                "--log-level", "warning"],
                               cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, gateway, args.startup_timeout, runtime / "gateway.log")
    return [gateway, fake], url, address


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{url} did not come up; see {log}")
        time.sleep(0.2)


async def grpc_request(client: FrontendClient, model: str, text: str, output_len: int,
                       seed: int) -> Sample:
    request = GenerateRequest(
        request_id=f"bench-{time.monotonic_ns()}", model=model,
        input=ChatInput(messages=(ChatMessage(role="user", content=text),),
                        template_kwargs=NO_THINK),
        sampling=Sampling(temperature=1.0, seed=seed, max_tokens=output_len, ignore_eos=True))
    start = time.perf_counter()
    sample, last = None, 0.0
    call = client.generate(request)
    async for event in call.events():
        if isinstance(event, TextDelta | ReasoningDelta | ToolCallDelta):
            now = time.perf_counter()
            if sample is None:
                sample = Sample(ttft_s=now - start)
            else:
                sample.itl_s.append(now - last)
            sample.tokens += 1
            last = now
    return sample or Sample(ttft_s=time.perf_counter() - start)


async def http_request(target: tuple[str, int], model: str, text: str, output_len: int,
                       seed: int) -> Sample:
    """One streamed chat completion over a raw HTTP/1.1 connection.

    A deliberately thin client (no httpx, no JSON parsing of chunks): at hundreds of streams a
    full Python HTTP client costs more CPU than the gateway itself and would measure itself.
    A chunk carries a token when its delta has non-empty content / reasoning / tool calls.
    """
    body = json.dumps({"model": model, "stream": True, "max_tokens": output_len,
                       "temperature": 1.0, "seed": seed, "ignore_eos": True,
                       "messages": [{"role": "user", "content": text}],
                       "chat_template_kwargs": {"enable_thinking": False}}).encode()
    host, port = target
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n"
                     b"connection: close\r\n\r\n%s" % (host.encode(), len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
        sample, last, buffer = None, 0.0, b""
        while True:
            size = int((await reader.readline()).strip() or b"0", 16)   # chunked encoding
            if size == 0:
                break
            buffer += (await reader.readexactly(size + 2))[:-2]
            *events, buffer = buffer.split(b"\n\n")
            now = time.perf_counter()
            for event in events:
                if _TOKEN_MARKS[0] in event or _TOKEN_MARKS[1] in event or \
                        _TOKEN_MARKS[2] in event:
                    if sample is None:
                        sample = Sample(ttft_s=now - start)
                    else:
                        sample.itl_s.append(now - last)
                    sample.tokens += 1
                    last = now
    finally:
        writer.close()
    return sample or Sample(ttft_s=time.perf_counter() - start)


_TOKEN_MARKS = (b'"delta":{"content":"', b'"reasoning":"', b'"tool_calls":[')


async def run_level(name: str, concurrency: int, count: int, make) -> PathStats:
    stats = PathStats()
    queue = list(range(count))
    start = time.perf_counter()

    async def worker() -> None:
        while queue:
            number = queue.pop()
            try:
                stats.add(await make(number))
            except Exception as exc:  # recorded, the run goes on
                stats.failed += 1
                print(f"  {name} request failed: {exc}", file=sys.stderr)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    stats.duration_s = time.perf_counter() - start
    return stats


async def measure(args: argparse.Namespace, url: str, frontend: str) -> list[dict]:
    channel = open_channel(frontend)
    client = FrontendClient(channel)
    parsed = httpx.URL(url)
    http = (parsed.host, parsed.port or 80)
    results = []
    # Warm both paths (first requests load code paths and fill the allocator).
    await grpc_request(client, args.model_name, prompt(0, "warm", 0, 8), 4, 0)
    await http_request(http, args.model_name, prompt(0, "warm", 1, 8), 4, 0)
    for level in args.concurrency:
        count = max(args.min_requests, args.per_stream * level)
        merged = {"grpc": PathStats(), "http": PathStats()}
        for round_number in range(args.rounds):
            base = round_number * count
            for name in ("grpc", "http"):
                def make(number: int, name: str = name, level: int = level,
                         base: int = base):
                    text = prompt(level, name, base + number, args.input_words)
                    if name == "grpc":
                        return grpc_request(client, args.model_name, text, args.output_len,
                                            number)
                    return http_request(http, args.model_name, text, args.output_len, number)

                stats = await run_level(name, level, count, make)
                total = merged[name]
                total.requests += stats.requests
                total.failed += stats.failed
                total.duration_s += stats.duration_s
                total.ttft_s += stats.ttft_s
                total.itl_s += stats.itl_s
                total.tokens += stats.tokens
        row = {"concurrency": level, "requests_per_path": count * args.rounds}
        for name, stats in merged.items():
            row[name] = {"requests": stats.requests, "failed": stats.failed,
                         "ttft_p50_ms": pct(stats.ttft_s, 0.5),
                         "ttft_p99_ms": pct(stats.ttft_s, 0.99),
                         "itl_p50_ms": pct(stats.itl_s, 0.5),
                         "itl_p99_ms": pct(stats.itl_s, 0.99),
                         "itl_mean_ms": statistics.fmean(stats.itl_s) * 1000
                         if stats.itl_s else float("nan"),
                         "output_tok_s": stats.tokens / stats.duration_s
                         if stats.duration_s else 0.0}
        row["added_ttft_p50_ms"] = row["http"]["ttft_p50_ms"] - row["grpc"]["ttft_p50_ms"]
        row["added_itl_p50_ms"] = row["http"]["itl_p50_ms"] - row["grpc"]["itl_p50_ms"]
        row["added_itl_mean_ms"] = row["http"]["itl_mean_ms"] - row["grpc"]["itl_mean_ms"]
        results.append(row)
        print(f"C={level:<4} grpc ttft p50 {row['grpc']['ttft_p50_ms']:8.2f} ms, "
              f"http {row['http']['ttft_p50_ms']:8.2f} ms; itl p50 "
              f"{row['grpc']['itl_p50_ms']:.2f} / {row['http']['itl_p50_ms']:.2f} ms",
              flush=True)
    await channel.close()
    return results


def start_stack(args: argparse.Namespace, runtime: Path) -> tuple[list[subprocess.Popen], str,
                                                                   str]:
    port = _free_port()
    target = ["--demo"] if not args.model else [args.model]
    log = open(runtime / "helios-run.log", "wb")  # noqa: SIM115 (lives as long as the stack)
    proc = subprocess.Popen([sys.executable, "-m", "services.cli.main", "run", *target,
                             "--port", str(port), "--runtime-dir", str(runtime)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc, args.startup_timeout, runtime / "helios-run.log")
    return [proc], url, f"unix://{runtime / 'frontend.sock'}"


def print_table(rows: list[dict]) -> None:
    print("\n| streams | path | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | "
          "out tok/s | added TTFT p50 ms | added ITL p50 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        for name in ("grpc", "http"):
            s = row[name]
            added = (f"{row['added_ttft_p50_ms']:+.2f} | {row['added_itl_p50_ms']:+.2f}"
                     if name == "http" else " | ")
            print(f"| {row['concurrency']} | {name} | {s['ttft_p50_ms']:.2f} | "
                  f"{s['ttft_p99_ms']:.2f} | {s['itl_p50_ms']:.2f} | {s['itl_p99_ms']:.2f} | "
                  f"{s['output_tok_s']:.0f} | {added} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running gateway (default: start helios run)")
    parser.add_argument("--frontend", help="its frontend's gRPC address (with --url)")
    parser.add_argument("--model", help="core or model directory for helios run (default demo)")
    parser.add_argument("--model-name", default="helios-demo", help="served model name")
    parser.add_argument("--concurrency", default="1,16,64,256",
                        type=lambda text: [int(c) for c in text.split(",")])
    parser.add_argument("--per-stream", type=int, default=5, help="requests per stream (N=kC)")
    parser.add_argument("--min-requests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1, help="alternating grpc/http rounds")
    parser.add_argument("--input-words", type=int, default=48)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    parser.add_argument("--fake", action="store_true",
                        help="scripted frontend instead of a model: the gateway's own cost")
    parser.add_argument("--token-interval-ms", type=float, default=20.0, help="with --fake")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "bench_gateway.json"))
    args = parser.parse_args()
    processes: list[subprocess.Popen] = []
    runtime = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    if args.url:
        if not args.frontend:
            parser.error("--url needs --frontend")
        url, frontend = args.url, args.frontend
    elif args.fake:
        processes, url, frontend = start_fake(args, runtime)
    else:
        processes, url, frontend = start_stack(args, runtime)
    try:
        rows = asyncio.run(measure(args, url, frontend))
    finally:
        for proc in processes:
            proc.terminate()
            proc.wait(timeout=120)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    report = {"benchmark": "gateway", "commit": commit, "machine": platform.platform(),
              "processor": platform.processor(), "args": {k: v for k, v in vars(args).items()},
              "results": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print_table(rows)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
