"""Batch-1 speculative decoding at the Qwen3-8B shape (dummy bf16 weights), in one process,
against speculation off in the same run.

    python benchmarks/bench_speculative.py --out benchmarks/out/gpu
    python benchmarks/bench_speculative.py --smoke        # CPU check of the script (tiny shape;
                                                          # also what runs without CUDA)
    python benchmarks/bench_speculative.py --acceptances 0.7 --widths 4 --batch 0 \
        --no-repeat --no-eagle3 --profile     # the a=0.7 k=4 row and its kernels alone

Random weights accept no real drafts, so the mechanism is measured with an oracle proposer:
it offers the target's own greedy continuation (recorded by the plain run of the same
prompt) and corrupts each draft independently with probability 1 - a. For each (a, k) the
engine runs with `--speculative-method` on and `--num-speculative-tokens k`; the scheduler's
acceptance statistics still choose each round's width (up to k). Reported per row: output
tok/s, the speedup over plain decoding of the same prompt, measured tokens per verification
round and accepted drafts per draft, the policy's mean width, and the ideal tokens per round
of fixed width k, E = (1 - a^(k+1)) / (1 - a). `--pairs N` measures each oracle row N times,
each after a plain run of its own (plain, oracle, plain, oracle ...: the host's speed drifts
between runs, and a round's host time is not hidden), and adds the median speedup of the pairs
(`median_speedup`, `pair_speedups`): two single runs on one warm H100 gave 2.415x and 2.275x.

The target repeats its last token (`speculative_rows.make_repeating`), so the recorded
continuation stays the target's own.

Also: an EAGLE-3 head at its real shape for this target (`--speculative-method eagle3`, a
random head written in the public format: one Llama decoder layer over 2x hidden inputs,
draft vocabulary 32,000), whose forwards all run and are paid for while the oracle's tokens
replace its drafts (`OracleHead`): the speedup at a = 0.7, k = 4 that a head of that
acceptance would give. Copy proposals (`ngram`, the real proposer) on a prompt that repeats
a block: on this target every copy is right, so the row is the proposer's ceiling. And the
batch switch-off: `--batch` concurrent requests with the oracle at a = 0.7, k = 4 against
speculation off (with the cost model on, measured verification costs turn it off when
verifying costs more than it yields).
Writes speculative.json under --out and prints a table.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
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
    meter,
    report_row,
    reset_row,
    serve,
    with_proposer,
    write_eagle3_head,
)

ACCEPTANCES = (0.5, 0.7, 0.9)
WIDTHS = (2, 4, 6)


def _profile(engine, name: str, proposer, prompt: list[int], output_len: int) -> dict:
    """One more run of a row under torch.profiler from its first token on (prefill left out):
    the GPU kernels per step by time, printed and returned."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.kernel_timing import kernel_rows

    reset_row(engine)
    with_proposer(engine, proposer)
    prof = profile(activities=[ProfilerActivity.CUDA])

    def start() -> None:
        torch.cuda.synchronize()
        prof.start()

    serve(engine, [greedy_request("p", prompt, output_len)], on_first=start)
    torch.cuda.synchronize()
    prof.stop()
    host = meter(engine).host
    steps = host["steps"] - host["steps_before_first"]
    kernels, rows = kernel_rows(prof, steps)
    total = sum(r["us_per_step"] for r in rows)
    print(f"\n{name}: {steps:.0f} steps after the first token, {kernels} kernels and "
          f"{total:.0f} us of kernel time per step; the kernels by time per step:")
    for r in rows[:24]:
        print(f"  {r['us_per_step']:8.1f} us  x{r['per_step']:6.1f}  {r['median_us']:7.2f} us "
              f"each  {r['kernel']}")
    return {"name": name, "steps": steps, "kernels": kernels, "us_per_step": total,
            "top": rows[:40]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64, help="switch-off check (0: skip)")
    parser.add_argument("--batch-input-len", type=int, default=1024)
    parser.add_argument("--batch-output-len", type=int, default=1024)
    parser.add_argument("--acceptances", default=",".join(map(str, ACCEPTANCES)),
                        help="the oracle rows' acceptance rates a (comma-separated)")
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)),
                        help="the oracle rows' widths k (comma-separated)")
    parser.add_argument("--no-repeat", dest="repeat", action="store_false",
                        help="skip the copy-proposal rows on a repeated block")
    parser.add_argument("--no-eagle3", dest="eagle3", action="store_false",
                        help="skip the EAGLE-3 head rows")
    parser.add_argument("--pairs", type=int, default=1,
                        help="interleaved plain/oracle pairs per oracle row (the median)")
    parser.add_argument("--smoke", action="store_true", help="CPU check: a tiny shape")
    parser.add_argument("--profile", action="store_true",
                        help="GPU kernels per step of the plain and a=0.7 k=4 rows, one more "
                             "run each under torch.profiler (profile.json)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    acceptances = [float(a) for a in args.acceptances.split(",")]
    widths = [int(k) for k in args.widths.split(",")]
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        print(f"no CUDA device: the {args.shape} shape needs one; running the tiny CPU smoke "
              "instead", flush=True)
        args.smoke = True
    config = dict(SHAPES[args.shape])
    if args.smoke:
        config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_window_layers=2)
        args.input_len, args.output_len, args.batch, args.batch_output_len = 32, 24, 4, 12
        args.batch_input_len = 32
        args.max_num_seqs, args.max_model_len = 8, 256
    rng = random.Random(0)
    results: list[dict] = []
    profiles: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_shape(args.shape, Path(tmp) / args.shape)
        (model_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        engine = build_target(model_dir, args, speculative_method="ngram",
                              num_speculative_tokens=max(widths))
        make_repeating(engine.runner.model)
        proposer_off = engine.scheduler.state.config.proposer
        vocab = engine.scheduler.limits.vocab_size     # the tokenizer's ids (no padding rows)
        with_proposer(engine, None)
        prompt = [rng.randrange(vocab) for _ in range(args.input_len)]
        serve(engine, [greedy_request("warm", prompt[:32], 8)])
        reset_row(engine)
        plain, decode_s, _ = serve(engine, [greedy_request("plain", prompt, args.output_len)])
        reference = plain["plain"]
        base = report_row("off", engine, plain, decode_s, 0.0, {})
        base_tok_s = base["tok_s"]
        results.append(base)

        def oracle_row(name: str, proposer, acceptance: float, width: int) -> dict:
            reset_row(engine)
            with_proposer(engine, proposer)
            tokens, decode_s, _ = serve(engine, [greedy_request("o", prompt, args.output_len)])
            ideal = (1 - acceptance ** (width + 1)) / (1 - acceptance)
            drafter = engine.scheduler.state.config.proposer
            return report_row(name, engine, tokens, decode_s, base_tok_s, {
                "a": acceptance, "k": width, "ideal_tokens": round(ideal, 3),
                "drafter_forward_ms": round(1e3 * getattr(drafter, "forward_s", 0.0), 3),
                "same_as_plain_until": agree(tokens["o"], reference)})

        def rate(proposer) -> float:
            """One more run of the prompt with `proposer` (None: plain): output tok/s."""
            reset_row(engine)
            with_proposer(engine, proposer)
            tokens, seconds, _ = serve(engine, [greedy_request("r", prompt, args.output_len)])
            return (len(tokens["r"]) - 1) / max(seconds, 1e-9)

        for acceptance in acceptances:
            for width in widths:
                # a fresh oracle per run, the same seed: the same corrupted drafts and rounds
                oracle = functools.partial(Oracle, {tuple(prompt): reference}, acceptance,
                                           width, vocab, seed=width)

                name = f"oracle a={acceptance} k={width}"
                row = oracle_row(name, oracle(), acceptance, width)
                if args.pairs > 1:
                    pairs = [row["speedup"]]
                    for _ in range(args.pairs - 1):
                        plain_tok_s = rate(None)            # plain first, as in the first pair
                        pairs.append(round(rate(oracle()) / plain_tok_s, 3))
                    row["pair_speedups"] = pairs
                    row["median_speedup"] = statistics.median(pairs)
                    print(f"{name}: {args.pairs} plain/oracle pairs, speedups {pairs}, "
                          f"median {row['median_speedup']}", flush=True)
                results.append(row)
        if args.profile and not args.smoke:
            profiled = Oracle({tuple(prompt): reference}, 0.7, 4, vocab, seed=4)
            profiles += [_profile(engine, "off", None, prompt, args.output_len),
                         _profile(engine, "oracle a=0.7 k=4", profiled, prompt,
                                  args.output_len)]
        # copy proposals on a prompt that repeats a block (this target repeats its last
        # token, so every copy is right: the real proposer's ceiling)
        block = [rng.randrange(vocab) for _ in range(args.input_len // 4)]
        repeated = block * 4
        if args.repeat:
            with_proposer(engine, None)
            reset_row(engine)
            plain_rep, plain_s, _ = serve(engine, [greedy_request("rep-off", repeated,
                                                                  args.output_len)])
            off_row = report_row("repeat, off", engine, plain_rep, plain_s, 0.0, {})
            results.append(off_row)
            with_proposer(engine, proposer_off)
            reset_row(engine)
            rep, rep_s, _ = serve(engine, [greedy_request("rep", repeated, args.output_len)])
            results.append(report_row(f"repeat, ngram k={max(widths)}", engine, rep, rep_s,
                                      off_row["tok_s"], {"same_as_plain_until": agree(
                                          rep["rep"], plain_rep["rep-off"])}))
        if args.batch:
            # three prompt sets that share no prefix (no run reuses another's KV): this
            # target's continuation is its prompt's last token, whatever comes before it
            def prompt_set(n: int) -> list[list[int]]:
                return [[rng.randrange(vocab) for _ in range(args.batch_input_len)]
                        for _ in range(n)]

            warm, prompts = prompt_set(8), prompt_set(args.batch)
            again = [[(p[0] + 1) % vocab, *p[1:]] for p in prompts]
            with_proposer(engine, None)
            serve(engine, [greedy_request(f"w{i}", p, 16) for i, p in enumerate(warm)])
            reset_row(engine)
            off, off_s, _ = serve(engine, [greedy_request(f"b{i}", p, args.batch_output_len)
                                           for i, p in enumerate(prompts)])
            batch_off = report_row(f"batch {args.batch}, off", engine, off, off_s, 0.0, {})
            results.append(batch_off)
            continuations = {tuple(p): off[f"b{i}"] for i, p in enumerate(again)}
            reset_row(engine)
            with_proposer(engine, Oracle(continuations, 0.7, 4, vocab))
            on, on_s, _ = serve(engine, [greedy_request(f"b{i}", p, args.batch_output_len)
                                         for i, p in enumerate(again)])
            results.append(report_row(f"batch {args.batch}, oracle a=0.7 k=4", engine, on, on_s,
                                      batch_off["tok_s"], {"same_as_plain_until": min(
                                          agree(on[f"b{i}"], off[f"b{i}"])
                                          for i in range(args.batch))}))
        del engine, proposer_off
        free_memory()
        if args.eagle3:
            head = write_eagle3_head(Path(tmp) / "eagle3", config, draft_vocab=32000,
                                     intermediate_size=config["intermediate_size"])
            engine = build_target(model_dir, args, speculative_method="eagle3",
                                  speculative_model=str(head), num_speculative_tokens=4)
            make_repeating(engine.runner.model)
            eagle = engine.scheduler.state.config.proposer
            serve(engine, [greedy_request("warm", prompt[:32], 8)])
            results.append(oracle_row("eagle3 head, its drafts, k=4", eagle, 0.0, 4))
            oracle = Oracle({tuple(prompt): reference}, 0.7, 4, vocab, seed=4)
            results.append(oracle_row("eagle3 head + oracle a=0.7 k=4",
                                      OracleHead(eagle, oracle), 0.7, 4))
            del engine, eagle
            free_memory()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speculative.json").write_text(json.dumps(results, indent=2) + "\n")
    if args.profile:
        (args.out / "profile.json").write_text(json.dumps(profiles, indent=2) + "\n")
    print(f"{'run':<32}{'tok/s':>9}{'speedup':>9}{'tok/round':>10}{'accept':>8}"
          f"{'width':>7}{'ideal':>7}{'fwd ms':>8}{'off':>5}{'same':>6}")
    for r in results:
        print(f"{r['name']:<32}{cell(r, 'tok_s', 9)}{cell(r, 'speedup', 9)}"
              f"{cell(r, 'tokens_per_round', 10)}{cell(r, 'acceptance', 8)}"
              f"{cell(r, 'mean_width', 7)}{cell(r, 'ideal_tokens', 7)}"
              f"{cell(r, 'drafter_forward_ms', 8)}"
              f"{cell(r, 'switched_off', 5)}{cell(r, 'same_as_plain_until', 6)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
