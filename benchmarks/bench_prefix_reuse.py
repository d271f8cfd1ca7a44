"""Prefix reuse through HTTP: shared-prefix groups against the same lengths with nothing shared.

    python benchmarks/bench_prefix_reuse.py --serve CORE --config YAML --model NAME \
        --out benchmarks/out/prefix_reuse.json

Workloads (issue 15), each with fresh random tokens per run (`--seed`, default: the clock), so
no earlier run warms the cache:

- shared: `--groups` x `--per-group` requests; each group shares a `--prefix-len` prefix and
  each request adds its own `--question-len` tokens; the requests of all groups are shuffled
  together (arrivals interleave) and sent `--concurrency` at a time, as /v1/completions with
  token ids, ignore_eos, `--output-len` tokens;
- unshared: the same number of requests, the same lengths, every prompt fresh;
- agents: a multi-turn agent trace for the host-memory KV tier: `--agents` sessions of
  `--turns` turns; turn 1 is `--first-len` fresh tokens, each later turn is the previous
  prompt plus `--turn-len` fresh tokens (the reply and the tool result); rounds go turn by
  turn over every agent, `--agent-concurrency` at a time, `--agent-output-len` tokens each. Sized
  so the agents' contexts are about twice the GPU KV pool, an agent's blocks have left the
  GPU when its next turn comes: they are recomputed, or brought back from the host tier
  (`kv_offload_gib`). Run it against a stack with the host tier and one without (the same
  YAML otherwise) and compare TTFT p50 (the target: 2x better with the tier).

Reported per workload: the fraction of prompt tokens served from cache (usage
`prompt_tokens_details.cached_tokens` over `prompt_tokens`), output tok/s, TTFT p50/p99; and the
ratio of the shared workload's output tok/s to the unshared one's in the same run (the target:
at least 0.85 served from cache and 2x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_serving import (
    http_request,
    percentiles,
    random_prompt,
    run_level,
)
from benchmarks.stacks import serve_stack


def shared_prompts(rng: random.Random, args: argparse.Namespace) -> list[list[int]]:
    prompts = []
    for _ in range(args.groups):
        prefix = random_prompt(rng, args.prefix_len, args.vocab_limit)
        prompts += [prefix + random_prompt(rng, args.question_len, args.vocab_limit)
                    for _ in range(args.per_group)]
    rng.shuffle(prompts)
    return prompts


def unshared_prompts(rng: random.Random, args: argparse.Namespace) -> list[list[int]]:
    length = args.prefix_len + args.question_len
    return [random_prompt(rng, length, args.vocab_limit)
            for _ in range(args.groups * args.per_group)]


async def agent_trace(rng: random.Random, args: argparse.Namespace, send):
    """Every agent's turn t, then every agent's turn t + 1 ... (results of turns >= 2: turn
    1 has nothing to reuse)."""
    contexts = [random_prompt(rng, args.first_len, args.vocab_limit)
                for _ in range(args.agents)]
    results = []
    duration = 0.0
    for turn in range(args.turns):
        if turn:
            contexts = [c + random_prompt(rng, args.turn_len, args.vocab_limit)
                        for c in contexts]
        level, seconds = await run_level(lambda p: send(p, args.agent_output_len),
                                         args.agent_concurrency, contexts)
        if turn:
            results += level
            duration += seconds
        print(f"agents turn {turn + 1}: {len(contexts[0])} tokens each, "
              f"{sum(r.cached_tokens for r in level)} cached, {seconds:.2f} s", flush=True)
    return results, duration


async def measure(url: str, args: argparse.Namespace) -> list[dict]:
    import httpx

    rng = random.Random(args.seed)
    client = httpx.AsyncClient(timeout=httpx.Timeout(3600.0),
                               limits=httpx.Limits(max_connections=args.concurrency + 8))

    def send(prompt, n=args.output_len):
        return http_request(client, url, args.model, prompt, n)

    warm, _ = await run_level(lambda p: send(p, 8), args.concurrency, [
        random_prompt(rng, args.prefix_len + args.question_len, args.vocab_limit)
        for _ in range(args.concurrency)])          # every step shape once, nothing shared
    if not all(r.ok for r in warm):
        raise SystemExit(f"warm-up failed: {[r.error for r in warm if not r.ok][:3]}")
    rows = []
    makers = {"unshared": unshared_prompts, "shared": shared_prompts}
    for name in args.workloads:
        if name == "agents":
            results, duration = await agent_trace(rng, args, send)
        else:
            results, duration = await run_level(send, args.concurrency, makers[name](rng, args))
        good = [r for r in results if r.ok]
        prompt_tokens = sum(r.prompt_tokens for r in good)
        rows.append({
            "workload": name, "requests": len(results), "failed": len(results) - len(good),
            "duration_s": duration,
            "cached_fraction": sum(r.cached_tokens for r in good) / max(1, prompt_tokens),
            "output_tok_s": sum(r.output_tokens for r in good) / duration,
            "ttft_ms": percentiles([r.ttft_s for r in good]),
            "errors": sorted({r.error for r in results if not r.ok})[:3]})
        print(f"{name}: {rows[-1]['output_tok_s']:.1f} output tok/s, "
              f"{rows[-1]['cached_fraction']:.1%} of prompt tokens cached, "
              f"{rows[-1]['failed']} failed", flush=True)
    await client.aclose()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", help="gateway base URL (else --serve starts a stack)")
    parser.add_argument("--serve", type=Path, help="start `helios run` on this core/model")
    parser.add_argument("--config", type=Path, help="YAML config for --serve")
    parser.add_argument("--model", default="helios-demo")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--per-group", type=int, default=16)
    parser.add_argument("--prefix-len", type=int, default=2048)
    parser.add_argument("--question-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--vocab-limit", type=int, default=150000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--first-len", type=int, default=2048)
    parser.add_argument("--turn-len", type=int, default=512)
    parser.add_argument("--agent-output-len", type=int, default=32)
    parser.add_argument("--agent-concurrency", type=int, default=8)
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=["unshared", "shared"],
                        help="which workloads, in order (unshared, shared, agents)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.seed = time.time_ns() if args.seed is None else args.seed
    if args.http:
        rows = asyncio.run(measure(args.http, args))
    elif args.serve:
        log = (args.out.parent if args.out else Path("/tmp")) / "helios-prefix-run.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with serve_stack(args.serve, args.config, log, args.startup_timeout) as run:
            rows = asyncio.run(measure(run.url, args))
    else:
        raise SystemExit("give --http URL or --serve MODEL")
    by_name = {row["workload"]: row for row in rows}
    ratio = None
    if {"shared", "unshared"} <= set(by_name):
        ratio = by_name["shared"]["output_tok_s"] / max(1e-9, by_name["unshared"]["output_tok_s"])
    print(f"\n{'workload':<10}{'reqs':>6}{'fail':>5}{'cached':>9}{'out tok/s':>11}"
          f"{'TTFT p50':>10}{'p99':>9}")
    for row in rows:
        print(f"{row['workload']:<10}{row['requests']:>6}{row['failed']:>5}"
              f"{row['cached_fraction']:>9.1%}{row['output_tok_s']:>11.1f}"
              f"{row['ttft_ms']['p50']:>10.1f}{row['ttft_ms']['p99']:>9.1f}")
    if ratio is not None:
        print(f"shared / unshared output tok/s: {ratio:.2f}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "ratio": ratio, "seed": args.seed,
                                        "args": {k: str(v) for k, v in vars(args).items()}},
                                       indent=2) + "\n")
    return 0 if all(row["failed"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
