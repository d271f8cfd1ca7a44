"""Every supported architecture (the model colleague's tiny checkpoints: Llama with rope
scalings, Qwen2 with biases and yarn, sharded Qwen3, Mistral) through the whole engine core:
a mixed batch with chunked prefill, then full and partial prefix hits, then preemption, each
equal to transformers' greedy generate."""

from __future__ import annotations

import random

import pytest

from services.common.core import open_model
from tests.engine.fakes import run_until_idle
from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint, load_reference
from tests.engine.runner.conftest import greedy_request, hf_greedy, make_engine


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_SIZE) for _ in range(length)]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_engine_matches_transformers(name, tmp_path):
    directory = build_checkpoint(SPECS[name], tmp_path / name)
    reference = load_reference(directory)
    source = open_model(directory)
    context = source.manifest.max_model_len
    long = min(90, context - 12)
    prompts = {"a": _prompt(long, 1), "b": _prompt(7, 2), "c": _prompt(long // 2, 3)}
    engine = make_engine(source, page_size=4, prefill_chunk_size=64, max_num_batched_tokens=64)
    for rid, prompt in prompts.items():
        ends = (long // 3,) if len(prompt) > long // 3 else ()
        engine.scheduler.admit(greedy_request(rid, prompt, 8, ends=ends))
    out = run_until_idle(engine.scheduler, engine.runner)
    for rid, prompt in prompts.items():
        assert out[rid][0] == hf_greedy(reference, prompt, 8)[0], rid
    # a full hit and a partial hit (at the message boundary) on the same engine
    partial = prompts["a"][:long // 3] + _prompt(long - long // 3, 9)
    for rid, prompt in (("full", prompts["a"]), ("partial", partial)):
        engine.scheduler.admit(greedy_request(rid, prompt, 8, ends=(long // 3,)))
        out = run_until_idle(engine.scheduler, engine.runner)
        assert out[rid][0] == hf_greedy(reference, prompt, 8)[0], rid
    assert engine.scheduler.state.resources.cache.counters.reused_tokens >= long + long // 3
    # preemption: pages for about two of the three sequences
    per_seq = -(-(long + 8) // 4)
    page = engine.runner.kv.num_bytes // engine.runner.kv.num_pages
    row = page + engine.runner.model.config.hidden_size * 4
    tight = make_engine(source, page_size=4, max_num_seqs=3, num_snapshots=4,
                        kv_cache_bytes=4 * row + (2 * per_seq + 2) * page)
    assert tight.info.num_pages == 2 * per_seq + 2
    for i in range(3):
        tight.scheduler.admit(greedy_request(f"p{i}", _prompt(long, 10 + i), 8))
    out = run_until_idle(tight.scheduler, tight.runner)
    assert tight.scheduler.state.counters.preemptions > 0
    for i in range(3):
        assert out[f"p{i}"][0] == hf_greedy(reference, _prompt(long, 10 + i), 8)[0]
