"""Prompt scoring in the scheduler, with the fake runner (its "model" reads KV through the page
table): every prompt position is reported once and exactly, whatever the chunking, a warm
prefix cache (never reused for scoring) or preemption (replayed positions not repeated); an
embedding pools once per residency (mean restarts after preemption)."""

from __future__ import annotations

import dataclasses
import math

from services.engine.scheduler.requests import FinishReason
from tests.engine.fakes import (
    fake_hidden,
    fake_prompt_logprob,
    reference_tokens,
    run_step,
)
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request


def _drive(scheduler, runner):
    scored: dict[str, list] = {}
    tokens: dict[str, list[int]] = {}
    embeddings: dict[str, tuple[float, ...]] = {}
    finish: dict[str, FinishReason] = {}
    while scheduler.has_work:
        _, updates = run_step(scheduler, runner)
        for update in updates:
            for delta in update.deltas:
                if delta.index:
                    continue
                scored.setdefault(update.request_id, []).extend(delta.prompt_logprobs)
                tokens.setdefault(update.request_id, []).extend(delta.token_ids)
                if delta.embedding:
                    embeddings[update.request_id] = delta.embedding
                if delta.finish_reason:
                    finish[update.request_id] = delta.finish_reason
    return scored, tokens, embeddings, finish


def _expected(prompt):
    return [fake_prompt_logprob(prompt[:p], prompt[p]) for p in range(1, len(prompt))]


def test_prompt_logprobs_exact_under_preemption_and_a_warm_cache():
    # 40 pages of 4 tokens: four ~100-token requests cannot all stay resident
    scheduler, runner = make_engine(num_pages=40, max_num_seqs=4)
    prompts = {f"r{i}": prompt_of(60 + 5 * i, salt=i) for i in range(4)}
    warm = prompt_of(60, salt=0)
    scheduler.admit(request("warm", warm, 3))
    _drive(scheduler, runner)
    for i, (rid, prompt) in enumerate(prompts.items()):
        scheduler.admit(dataclasses.replace(request(rid, prompt, 40, seed=i),
                                            prompt_logprobs=0))
    scored, tokens, _, _ = _drive(scheduler, runner)
    assert scheduler.state.counters.preemptions > 0
    for i, (rid, prompt) in enumerate(prompts.items()):
        got = scored[rid]
        assert [e.position for e in got] == list(range(1, len(prompt))), rid
        assert [e.logprob for e in got] == _expected(prompt)
        assert tokens[rid] == reference_tokens(prompt, 40, seed=i, vocab=VOCAB)


def test_prompt_only_and_embeddings():
    scheduler, runner = make_engine(prefill_chunk_size=64, max_num_batched_tokens=64)
    prompt = prompt_of(150, salt=5)
    scheduler.admit(dataclasses.replace(request("s", prompt, 0), prompt_logprobs=0))
    scheduler.admit(dataclasses.replace(request("e", prompt, 0), embed=True))
    scored, tokens, embeddings, finish = _drive(scheduler, runner)
    assert tokens["s"] == [] and finish["s"] is FinishReason.LENGTH
    assert [e.logprob for e in scored["s"]] == _expected(prompt)
    want = fake_hidden(prompt)
    norm = math.sqrt(sum(v * v for v in want))
    assert embeddings["e"] == tuple(v / norm for v in want)
    assert scheduler.state.resources.cache.counters.reused_tokens == 0

    scheduler, runner = make_engine(num_pages=40, max_num_seqs=4, pooling="mean")
    prompts = {f"m{i}": prompt_of(60 + 5 * i, salt=20 + i) for i in range(3)}
    scheduler.admit(request("busy", prompt_of(90, salt=9), 40))
    for rid, p in prompts.items():
        scheduler.admit(dataclasses.replace(request(rid, p, 0), embed=True))
    _, _, embeddings, _ = _drive(scheduler, runner)
    for rid, p in prompts.items():
        rows = [fake_hidden(p[:k]) for k in range(1, len(p) + 1)]
        mean = [sum(column) / len(p) for column in zip(*rows, strict=True)]
        norm = math.sqrt(sum(v * v for v in mean))
        assert all(abs(a - b / norm) < 1e-12 for a, b in zip(embeddings[rid], mean,
                                                             strict=True)), rid
