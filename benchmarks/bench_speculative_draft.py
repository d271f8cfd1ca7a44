"""Batch-1 speculative decoding with a draft model (`--speculative-method draft`) at the
Qwen3-8B shape (dummy bf16 weights), against speculation off in the same process.

    python benchmarks/bench_speculative_draft.py --out benchmarks/out/gpu
    python benchmarks/bench_speculative_draft.py --smoke    # CPU check (tiny shapes; also
                                                            # what runs without CUDA)

Random weights make real acceptance unmeasurable, so two drafts bound it:
- `self`: the target's own shape with the same dummy seed, i.e. the target's weights:
  every greedy draft is accepted (bf16 near-ties aside), but each draft forward costs a
  target step, so the width policy's cost model switches drafting off after its first
  rounds: the row shows that switch-off (an H100 measured 0.95-0.97x, 2 verification steps
  in 256 tokens);
- `0.6b`: the Qwen3-0.6B shape (the issue's pairing) with random weights: drafts are
  rejected, so the row shows the policy narrowing the width to zero (probes only) and the
  overhead left;
- `0.6b + oracle a=0.7`: the same draft model, every forward run and paid, its drafts
  replaced by bench_speculative's oracle at a = 0.7 (`OracleHead`) on a target made to
  repeat its last token (`make_repeating`, so the oracle's continuation stays exact): the
  speedup a draft model of that shape and acceptance would give, against plain decoding of
  the same engine.
Per row: output tok/s, speedup over plain decoding of the same prompt, tokens per round,
acceptance, mean width, drafter forwards per round, the drafter's measured forward (ms) and
the drafter's rounds by kind (graph replays, eager) with their wall time, how long the output
stays the plain one, and where it leaves it, the target's gap between
its two best tokens there (bench_speculative.split_margin: a near-tie or a wrong state).
Writes speculative_draft.json under --out.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.model_shapes import SHAPES, write_shape
from benchmarks.speculative_rows import (
    Oracle,
    OracleHead,
    agree,
    build_target,
    cell,
    free_memory,
    greedy_request,
    make_repeating,
    report_row,
    reset_row,
    serve,
    split_margin,
    with_proposer,
)

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_window_layers=2)


def _shape(name: str, directory: Path, smoke: bool, layers: int = 2) -> Path:
    path = write_shape(name, directory)
    if smoke:
        config = {**SHAPES[name], **TINY, "num_hidden_layers": layers}
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--kv-cache-gib", type=float, default=4.0)
    parser.add_argument("--smoke", action="store_true", help="CPU check: tiny shapes")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        print("no CUDA device: running the tiny CPU smoke instead", flush=True)
        args.smoke = True
    if args.smoke:
        args.input_len, args.output_len, args.max_num_seqs, args.max_model_len = 32, 24, 4, 256
    kv = dict(kv_cache_bytes=int(args.kv_cache_gib * 2**30)) if not args.smoke else {}
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        target = _shape("qwen3-8b", Path(tmp) / "qwen3-8b", args.smoke)
        drafts = {"self": target,
                  "0.6b": _shape("qwen3-0.6b", Path(tmp) / "qwen3-0.6b", args.smoke, 1)}
        engine = build_target(target, args, **kv)
        vocab = engine.scheduler.limits.vocab_size
        prompt = [random.Random(0).randrange(vocab) for _ in range(args.input_len)]
        serve(engine, [greedy_request("warm", prompt[:32], 8)])
        plain, decode_s, _ = serve(engine, [greedy_request("plain", prompt, args.output_len)])
        base = report_row("off", engine, plain, decode_s, 0.0, {})
        results.append(base)
        del engine
        free_memory()
        for name, draft in drafts.items():
            engine = build_target(target, args, speculative_method="draft",
                                  speculative_model=str(draft), num_speculative_tokens=args.k,
                                  **kv)
            serve(engine, [greedy_request("warm", prompt[:32], 8)])
            reset_row(engine)
            proposer = engine.scheduler.state.config.proposer
            since = _round_totals(proposer)
            tokens, spec_s, _ = serve(engine, [greedy_request("d", prompt, args.output_len)])
            counters = engine.scheduler.state.counters
            row = report_row(f"draft {name} k={args.k}", engine, tokens, spec_s, base["tok_s"], {
                "drafter_forwards_per_round": round(counters.spec_drafter_steps /
                                                    max(1, counters.spec_rounds), 3),
                "drafter_forward_ms": round(1e3 * getattr(proposer, "forward_s", 0.0), 3),
                "drafter_rounds": _rounds(proposer, since),
                "same_as_plain_until": agree(tokens["d"], plain["plain"])})
            row["split_margin_nats"] = split_margin(engine, prompt, plain["plain"],
                                                    row["same_as_plain_until"])
            results.append(row)
            del engine, proposer
            free_memory()
        results += _oracle_rows(target, drafts["0.6b"], prompt, vocab, args, kv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speculative_draft.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'run':<31}{'tok/s':>9}{'speedup':>9}{'tok/round':>10}{'accept':>8}{'width':>7}"
          f"{'fwd/rnd':>8}{'fwd ms':>8}{'same':>6}")
    for r in results:
        print(f"{r['name']:<31}{cell(r, 'tok_s', 9)}{cell(r, 'speedup', 9)}"
              f"{cell(r, 'tokens_per_round', 10)}{cell(r, 'acceptance', 8)}"
              f"{cell(r, 'mean_width', 7)}{cell(r, 'drafter_forwards_per_round', 8)}"
              f"{cell(r, 'drafter_forward_ms', 8)}{cell(r, 'same_as_plain_until', 6)}")
    return 0


def _round_totals(proposer) -> dict[str, tuple[int, float]]:
    """The drafter's rounds so far by kind: (count, seconds of wall time)."""
    pages = proposer.pages
    return {kind: (pages.round_counts[kind], pages.round_seconds[kind])
            for kind in pages.round_counts}


def _rounds(proposer, since: dict[str, tuple[int, float]]) -> dict:
    """The drafter's rounds after `since` (`_round_totals`), by kind: count and milliseconds
    of wall time (each round waits for its drafts, so the time is the planning it cost)."""
    return {kind: {"rounds": count - since[kind][0],
                   "ms": round(1e3 * (seconds - since[kind][1]), 2)}
            for kind, (count, seconds) in _round_totals(proposer).items()}


def _oracle_rows(target: Path, draft: Path, prompt: list[int], vocab: int, args,
                 kv: dict) -> list[dict]:
    """Plain decoding, then the draft model's rounds under the oracle's tokens (a = 0.7),
    on one engine whose target repeats its last token (module docstring)."""
    engine = build_target(target, args, speculative_method="draft", speculative_model=str(draft),
                          num_speculative_tokens=args.k, **kv)
    make_repeating(engine.runner.model)
    drafter = engine.scheduler.state.config.proposer
    with_proposer(engine, None)
    serve(engine, [greedy_request("warm", prompt[:32], 8)])
    plain, plain_s, _ = serve(engine, [greedy_request("plain", prompt, args.output_len)])
    rows = [report_row("off, repeating target", engine, plain, plain_s, 0.0, {})]
    oracle = Oracle({tuple(prompt): plain["plain"]}, 0.7, args.k, vocab, seed=args.k)
    with_proposer(engine, OracleHead(drafter, oracle))
    reset_row(engine)
    since = _round_totals(drafter)
    tokens, spec_s, _ = serve(engine, [greedy_request("o", prompt, args.output_len)])
    counters = engine.scheduler.state.counters
    rows.append(report_row(f"draft 0.6b + oracle a=0.7 k={args.k}", engine, tokens, spec_s,
                           rows[0]["tok_s"], {
                               "drafter_forwards_per_round": round(
                                   counters.spec_drafter_steps / max(1, counters.spec_rounds), 3),
                               "drafter_forward_ms": round(1e3 * drafter.forward_s, 3),
                               "drafter_rounds": _rounds(drafter, since),
                               "same_as_plain_until": agree(tokens["o"], plain["plain"])}))
    del engine, drafter
    free_memory()
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
