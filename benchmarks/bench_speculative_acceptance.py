"""Real acceptance of copy proposals (`--speculative-method ngram`) on a real checkpoint, on
the CPU: SmolLM2-135M-Instruct (the pinned GGUF, float32) greedy on chat prompts that restate
or edit their input, with speculation on and off in the same run.

    python benchmarks/bench_speculative_acceptance.py [--max-tokens 96] [--out benchmarks/out]

Per prompt: whether the output is the plain output (it must be), tokens, generation rounds,
drafts verified, drafts accepted, acceptance, tokens per round, and wall seconds of each run
(on a shared CPU the times are indicative only; the acceptance is the measurement).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXT = ("The quick brown fox jumps over the lazy dog. Meanwhile, the cat sat on the warm "
        "windowsill, watching the birds in the garden. The farmer walked slowly to the barn, "
        "carrying a bucket of fresh water for the horses.")
CODE = ("def total(items):\n    result = 0\n    for item in items:\n"
        "        result += item.price * item.count\n    return result\n")
PROMPTS = {
    "restate": f"Repeat this text exactly, word for word:\n{TEXT}",
    "edit-code": f"Rename the variable result to acc in this code and print the whole "
                 f"function:\n{CODE}",
    "fix-typos": "Correct the spelling and repeat the sentence: The quik brown fox jumpd over "
                 "the lazzy dog near the rivr bank.",
}


def _chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    from tokenizers import Tokenizer

    from services.common.core import open_model
    from services.common.model_assets import fetch_model
    from services.engine.config import EngineConfig
    from services.engine.core.build import build_engine
    from services.engine.sampling import SamplingParams
    from services.engine.scheduler.requests import EngineRequest, StopRules

    path = fetch_model("smollm2")
    source = open_model(path)
    tokenizer = Tokenizer.from_file(str(source.path(source.manifest.tokenizer_file)))
    stops = frozenset(source.manifest.eos_token_ids)

    def run(prompt_ids: list[int], **speculation) -> tuple[list[int], float, object]:
        engine = build_engine(EngineConfig(model=str(path), max_num_seqs=2, device="cpu",
                                           kv_cache_bytes=64 << 20, **speculation), source)
        params = SamplingParams.create(temperature=0.0, max_tokens=args.max_tokens, seed=0)
        engine.scheduler.admit(EngineRequest(
            request_id="r", prompt_token_ids=tuple(prompt_ids), sampling=params,
            stop=StopRules(max_tokens=args.max_tokens, stop_token_ids=stops), seed=0))
        scheduler, runner = engine.scheduler, engine.runner
        tokens: list[int] = []
        started = time.perf_counter()
        while scheduler.has_work:
            plan = scheduler.plan()
            if plan is not None:
                runner.submit(scheduler.commit(plan, scheduler.state.resources.fences.next_fence))
            if runner.outstanding:
                for update in scheduler.complete(runner.wait()):
                    for delta in update.deltas:
                        tokens.extend(delta.token_ids)
        return tokens, time.perf_counter() - started, scheduler.state.counters

    rows = {}
    for name, text in PROMPTS.items():
        ids = tokenizer.encode(_chat(text)).ids
        plain, plain_s, _ = run(ids)
        spec, spec_s, c = run(ids, speculative_method="ngram",
                              num_speculative_tokens=args.num_speculative_tokens)
        rows[name] = {
            "same_as_plain": spec == plain, "tokens": len(spec), "rounds": c.spec_rounds,
            "drafts": c.spec_draft_tokens, "accepted": c.spec_accepted_tokens,
            "acceptance": round(c.spec_accepted_tokens / c.spec_draft_tokens, 3)
            if c.spec_draft_tokens else None,
            "tokens_per_round": round((len(spec) - 1) / c.spec_rounds, 3) if c.spec_rounds
            else None,
            "plain_s": round(plain_s, 2), "spec_s": round(spec_s, 2)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speculative_acceptance.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"{'prompt':<12}{'same':>6}{'tokens':>8}{'rounds':>8}{'drafts':>8}{'accepted':>10}"
          f"{'accept':>8}{'tok/round':>10}{'plain s':>9}{'spec s':>8}")
    for name, r in rows.items():
        print(f"{name:<12}{r['same_as_plain']!s:>6}{r['tokens']:>8}{r['rounds']:>8}"
              f"{r['drafts']:>8}{r['accepted']:>10}{r['acceptance']!s:>8}"
              f"{r['tokens_per_round']!s:>10}{r['plain_s']:>9}{r['spec_s']:>8}")
    return 0 if all(r["same_as_plain"] for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
