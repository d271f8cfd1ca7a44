"""Frontend request preparation: render + tokenize latency and throughput, against transformers.

    .venv/bin/python benchmarks/bench_frontend.py [--asset qwen3] [--seconds 2] [--quick]

Workloads (chat requests rendered with the pinned template of --asset, Qwen3 by default):
  short      a system prompt and one short question
  history50  a 50-turn conversation (100 messages, mixed scripts and emoji)
  large100k  one 100 KB user message
  tools      24 tool definitions with nested schemas and a tool-calling history

For each, in the same run:
  helios     ChatRenderer.render: template + tokenize + message token endpoints
  hf         transformers apply_chat_template(tokenize=True) on the same conversation
latency p50/p95 (one thread) and throughput at 1 and 4 threads. Then the event loop's lag while
a burst of large prompts is prepared on the worker pool (threads, as the frontend does, and a
process pool for comparison): the reason preparation runs on `frontend_workers` threads.

Prints a table; writes benchmarks/out/bench_frontend.json.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.common import assets  # noqa: E402
from services.common.api.chat import (  # noqa: E402
    ChatInput,
    ChatMessage,
    ToolCall,
    ToolDefinition,
)
from services.frontend.assets import load_tokenizer_dir  # noqa: E402
from services.frontend.chat.renderer import ChatRenderer  # noqa: E402

TEXT = ("the model streams tokens quickly while the scheduler plans the next step; "
        "prefix caching reuses pages — Grüße, 日本語, emoji 😀🚀, naïve café, ελληνικά ")
WORDS = TEXT.split()


def _text(n_words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 13) % len(WORDS)] for i in range(n_words))


def _tool(i: int) -> ToolDefinition:
    return ToolDefinition(
        name=f"tool_{i}", description=f"Tool number {i}: " + _text(20, i),
        parameters={"type": "object", "properties": {
            "query": {"type": "string", "description": _text(8, i + 1)},
            "filters": {"type": "object", "properties": {
                "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                "tags": {"type": "array", "items": {"type": "string"}},
                "mode": {"type": "string", "enum": ["fast", "exact", "fuzzy"]}}},
            "limit": {"type": "integer", "default": 10}}, "required": ["query"]})


def workloads() -> dict[str, ChatInput]:
    system = ChatMessage("system", "You are a helpful assistant. " + _text(30, 1))
    history: list[ChatMessage] = [system]
    for turn in range(50):
        history.append(ChatMessage("user", f"Question {turn}: " + _text(40, turn)))
        history.append(ChatMessage("assistant", f"Answer {turn}: " + _text(70, turn + 50)))
    history.append(ChatMessage("user", "And finally?"))
    large = _text(1, 0)
    while len(large.encode()) < 100_000:
        large += " " + _text(200, len(large))
    tool_history = [system, ChatMessage("user", "Find papers about caching from 2024.")]
    for i in range(4):
        call = ToolCall(f"call_{i}", f"tool_{i}", json.dumps(
            {"query": _text(6, i), "filters": {"year": 2024, "tags": ["a", "b"]}, "limit": 5}))
        tool_history.append(ChatMessage("assistant", "", tool_calls=(call,)))
        tool_history.append(ChatMessage("tool", json.dumps({"results": [_text(30, i + k)
                                                            for k in range(3)]}),
                                        tool_call_id=f"call_{i}"))
    tool_history.append(ChatMessage("user", "Summarize the findings."))
    return {
        "short": ChatInput((system, ChatMessage("user", "What is the capital of France?"))),
        "history50": ChatInput(tuple(history)),
        "large100k": ChatInput((system, ChatMessage("user", large[:100_000]))),
        "tools": ChatInput(tuple(tool_history), tools=tuple(_tool(i) for i in range(24))),
    }


def hf_messages(chat: ChatInput) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    messages = []
    for m in chat.messages:
        data: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            data["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": json.loads(c.arguments_json)}} for c in m.tool_calls]
        if m.tool_call_id:
            data["tool_call_id"] = m.tool_call_id
        messages.append(data)
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.parameters}}
             for t in chat.tools] or None
    return messages, tools


def latency(fn, seconds: float, min_runs: int = 5) -> list[float]:
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < min_runs:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def throughput(fn, threads: int, seconds: float) -> float:
    count = [0] * threads
    stop = time.perf_counter() + seconds

    def worker(slot: int) -> None:
        while time.perf_counter() < stop:
            fn()
            count[slot] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(count) / (time.perf_counter() - start)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---------------------------------------------------------------------------------------------
# Event-loop lag during a burst of preparations

_PROCESS_RENDERER: ChatRenderer | None = None


def _process_init(asset: str) -> None:
    global _PROCESS_RENDERER
    loaded = load_tokenizer_dir(assets.fetch(asset))
    _PROCESS_RENDERER = ChatRenderer(loaded.tokenizer, loaded.templates)


def _process_render(chat: ChatInput) -> int:
    assert _PROCESS_RENDERER is not None
    return len(_PROCESS_RENDERER.render(chat).token_ids)


async def _burst(executor: concurrent.futures.Executor, fn, chat: ChatInput, requests: int
                 ) -> dict[str, float]:
    """Submit `requests` preparations at once; meanwhile a 1 ms ticker stands in for token
    streaming and records how late it wakes up (the event loop's lag)."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - start - 0.001)

    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    await asyncio.gather(*(loop.run_in_executor(executor, fn, chat) for _ in range(requests)))
    elapsed = time.perf_counter() - start
    done.set()
    await tick
    return {"burst_s": elapsed, "lag_p50_ms": percentile(lags, 0.5) * 1e3,
            "lag_p99_ms": percentile(lags, 0.99) * 1e3, "lag_max_ms": max(lags) * 1e3}


async def _idle(seconds: float) -> dict[str, float]:
    """The ticker alone: the machine's own scheduling noise, for reference."""
    lags: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - start - 0.001)
    return {"burst_s": 0.0, "lag_p50_ms": percentile(lags, 0.5) * 1e3,
            "lag_p99_ms": percentile(lags, 0.99) * 1e3, "lag_max_ms": max(lags) * 1e3}


def loop_lag(asset: str, renderer: ChatRenderer, chat: ChatInput, requests: int, workers: int
             ) -> dict[str, dict[str, float]]:
    results = {"idle": asyncio.run(_idle(1.0))}
    with concurrent.futures.ThreadPoolExecutor(workers) as threads:
        asyncio.run(_burst(threads, renderer.render, chat, 2))  # warm up
        results["threads"] = asyncio.run(_burst(threads, renderer.render, chat, requests))
    with concurrent.futures.ProcessPoolExecutor(workers, initializer=_process_init,
                                                initargs=(asset,)) as processes:
        asyncio.run(_burst(processes, _process_render, chat, workers * 2))  # load + warm up
        results["processes"] = asyncio.run(_burst(processes, _process_render, chat, requests))
    return results


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--asset", default="qwen3", choices=sorted(assets.PINNED))
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--quick", action="store_true", help="0.3 s per measurement")
    args, _ = parser.parse_known_args(argv)
    seconds = 0.3 if args.quick else args.seconds

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    directory = assets.fetch(args.asset)
    loaded = load_tokenizer_dir(directory)
    renderer = ChatRenderer(loaded.tokenizer, loaded.templates)
    hf = AutoTokenizer.from_pretrained(str(directory))

    rows: list[dict[str, Any]] = []
    for name, chat in workloads().items():
        messages, tools = hf_messages(chat)
        ours = renderer.render(chat)
        theirs = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
        assert ours.token_ids == list(theirs), f"{name}: token ids differ from transformers"
        impls = {
            "helios": lambda chat=chat: renderer.render(chat),
            "hf": lambda m=messages, t=tools: hf.apply_chat_template(
                m, tools=t, add_generation_prompt=True, tokenize=True, return_dict=False),
        }
        for impl, fn in impls.items():
            fn()
            times = latency(fn, seconds)
            rows.append({
                "workload": name, "impl": impl, "prompt_tokens": len(ours.token_ids),
                "prompt_bytes": len(ours.prompt.encode()),
                "message_ends": len(ours.message_token_ends),
                "p50_ms": statistics.median(times) * 1e3, "p95_ms": percentile(times, 0.95) * 1e3,
                "rps_1t": throughput(fn, 1, seconds), "rps_4t": throughput(fn, 4, seconds),
            })
    large = workloads()["large100k"]
    lag = loop_lag(args.asset, renderer, large, requests=16, workers=2)

    print(f"\nrender + tokenize, template {args.asset}, {os.cpu_count()} CPUs, "
          f"{seconds:g} s per measurement")
    print(f"{'workload':<10} {'impl':<7} {'tokens':>7} {'ends':>5} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'req/s 1t':>9} {'req/s 4t':>9} {'x hf p50':>9}")
    by_key = {(r["workload"], r["impl"]): r for r in rows}
    for row in rows:
        hf_row = by_key[(row["workload"], "hf")]
        speedup = hf_row["p50_ms"] / row["p50_ms"]
        print(f"{row['workload']:<10} {row['impl']:<7} {row['prompt_tokens']:>7} "
              f"{row['message_ends']:>5} {row['p50_ms']:>8.3f} {row['p95_ms']:>8.3f} "
              f"{row['rps_1t']:>9.1f} {row['rps_4t']:>9.1f} {speedup:>9.2f}")
    print("\nevent-loop lag while 16 x 100 KB prompts are prepared by 2 workers")
    print(f"{'pool':<10} {'burst s':>8} {'lag p50 ms':>11} {'lag p99 ms':>11} {'lag max ms':>11}")
    for pool, values in lag.items():
        print(f"{pool:<10} {values['burst_s']:>8.3f} {values['lag_p50_ms']:>11.2f} "
              f"{values['lag_p99_ms']:>11.2f} {values['lag_max_ms']:>11.2f}")

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip()
    out = ROOT / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_frontend.json").write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "commit": commit, "asset": args.asset,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs {platform.python_version()}",
        "seconds": seconds, "rows": rows, "loop_lag": lag}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
