"""Greedy tokens through scheduler + TorchRunner equal transformers' generate (float32, CPU).

The demo model (tiny random Qwen3, real 151,936-token vocabulary) runs single requests,
batches of mixed lengths with chunked prefill, full and partial prefix hits, and preemption
with resumption; logprobs match within 1e-4.
"""

from __future__ import annotations

import random

import pytest

from tests.engine.fakes import run_until_idle
from tests.engine.runner.conftest import greedy_request, hf_greedy, make_engine


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(151_000) for _ in range(length)]


@pytest.fixture(scope="module")
def expected(hf_demo):
    cache: dict[tuple[int, int, int], tuple[list[int], list[float]]] = {}

    def get(length: int, seed: int, max_tokens: int):
        key = (length, seed, max_tokens)
        if key not in cache:
            cache[key] = hf_greedy(hf_demo, _prompt(length, seed), max_tokens)
        return cache[key]
    return get


def _run(engine, requests):
    for req in requests:
        engine.scheduler.admit(req)
    return run_until_idle(engine.scheduler, engine.runner)


def test_single_request_with_logprobs(demo_source, expected):
    engine = make_engine(demo_source)
    req = greedy_request("a", _prompt(37, 1), 12, logprobs=True, top_logprobs=3)
    engine.scheduler.admit(req)
    logprobs = []
    from tests.engine.fakes import run_step
    tokens: list[int] = []
    while engine.scheduler.has_work:
        _, updates = run_step(engine.scheduler, engine.runner)
        for update in updates:
            for delta in update.deltas:
                tokens.extend(delta.token_ids)
                logprobs.extend(delta.logprobs)
    want_tokens, want_logprobs = expected(37, 1, 12)
    assert tokens == want_tokens
    assert [lp.token_id for lp in logprobs] == tokens
    for got, want in zip(logprobs, want_logprobs, strict=True):
        assert abs(got.logprob - want) < 1e-4
        assert len(got.top) == 3 and got.top[0].logprob >= got.top[-1].logprob
        assert got.top[0].token_id == got.token_id      # greedy: the best is the chosen one


def test_batch_of_mixed_lengths_with_chunked_prefill(demo_source, expected):
    engine = make_engine(demo_source, prefill_chunk_size=64, max_num_batched_tokens=96)
    shapes = [(5, 2), (150, 3), (64, 4), (1, 5), (97, 6)]
    out = _run(engine, [greedy_request(f"r{i}", _prompt(n, s), 6)
                        for i, (n, s) in enumerate(shapes)])
    for i, (n, s) in enumerate(shapes):
        assert out[f"r{i}"][0] == expected(n, s, 6)[0], (n, s)


def test_full_and_partial_prefix_hits(demo_source, expected, hf_demo):
    engine = make_engine(demo_source, page_size=16)
    prompt = _prompt(75, 7)
    out = _run(engine, [greedy_request("first", prompt, 8, ends=(40,))])
    assert out["first"][0] == expected(75, 7, 8)[0]
    # the same prompt again: a full hit resumes sampling from the saved hidden state
    out = _run(engine, [greedy_request("again", prompt, 8)])
    assert out["again"][0] == expected(75, 7, 8)[0]
    assert engine.scheduler.state.resources.cache.counters.reused_tokens == 75
    # a different continuation after the 40-token message boundary: a partial hit at 40
    other = prompt[:40] + _prompt(30, 8)
    out = _run(engine, [greedy_request("partial", other, 8, ends=(40,))])
    assert out["partial"][0] == hf_greedy(hf_demo, other, 8)[0]
    assert engine.scheduler.state.resources.cache.counters.reused_tokens == 75 + 40
    # the next turn of the first conversation reuses its terminal state (prompt + output but
    # the last token), captured after it finished
    first = expected(75, 7, 8)[0]
    turn2 = prompt + first[:-1] + _prompt(12, 9)
    out = _run(engine, [greedy_request("turn2", turn2, 6, ends=(75 + 7,))])
    assert out["turn2"][0] == hf_greedy(hf_demo, turn2, 6)[0]
    assert engine.scheduler.state.resources.cache.counters.reused_tokens == 75 + 40 + 82


def test_preemption_and_resume(demo_source, expected):
    # 12 pages of 16 tokens: three sequences of 50 + 30 tokens (5 pages each) do not fit
    page_bytes = 2 * 2 * 2 * 16 * 4 * 16
    engine = make_engine(demo_source, max_num_seqs=3, num_snapshots=6,
                         kv_cache_bytes=6 * (page_bytes + 64 * 4) + 12 * page_bytes)
    out = _run(engine, [greedy_request(f"p{i}", _prompt(50, 20 + i), 30) for i in range(3)])
    assert engine.scheduler.state.counters.preemptions > 0
    for i in range(3):
        assert out[f"p{i}"][0] == expected(50, 20 + i, 30)[0]
