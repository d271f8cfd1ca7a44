"""The scheduler against the fake runner: tokens equal the reference however they are batched."""

from __future__ import annotations

from tests.engine.fakes import reference_tokens, run_until_idle
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request


def test_single_request_matches_reference():
    scheduler, runner = make_engine()
    prompt = prompt_of(150)
    scheduler.admit(request("a", prompt, 10))
    out = run_until_idle(scheduler, runner)
    assert out["a"][0] == reference_tokens(prompt, 10, vocab=VOCAB)
    state = scheduler.state
    assert state.slots.num_free == 4 and not state.running and not state.requests


def test_batch_of_mixed_lengths_with_chunked_prefill():
    scheduler, runner = make_engine(prefill_chunk_size=64, max_num_batched_tokens=96)
    prompts = {f"r{i}": prompt_of(length, salt=i)
               for i, length in enumerate([5, 70, 200, 1, 130, 64])}
    for rid, prompt in prompts.items():
        scheduler.admit(request(rid, prompt, 12, seed=3))
    out = run_until_idle(scheduler, runner)
    for rid, prompt in prompts.items():
        assert out[rid][0] == reference_tokens(prompt, 12, seed=3, vocab=VOCAB), rid
    kinds = {step.kind for step in runner.steps}
    assert "mixed" in kinds and max(s.num_tokens for s in runner.steps) <= 96


def test_the_scheduler_never_imports_torch():
    """Plain Python: the GPU runner may not leak device concerns into planning."""
    import subprocess
    import sys

    code = ("import sys, services.engine.scheduler.scheduler, services.engine.prefix.cache; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
