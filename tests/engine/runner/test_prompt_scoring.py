"""Prompt scoring (prompt logprobs) through the scheduler and both runners vs transformers.

The demo model (tiny random Qwen3, float32 on the CPU): every prompt token after the first
gets log_softmax(logits of the row before) gathered at it, its rank and the top-k, equal to
transformers' float32 forward within 1e-4: in one chunk, with chunked prefill under a small
token budget, with a warm prefix cache (the scoring request must not reuse the cached prefix),
with generation after the prompt (the generated tokens unchanged), and prompt-only
(max_tokens 0: finish length, no tokens).
"""

from __future__ import annotations

import random

import pytest

from services.engine.scheduler.requests import FinishReason
from tests.engine.fakes import run_step
from tests.engine.runner.conftest import greedy_request, make_engine

TOL = 1e-4
TOKENIZER_VOCAB = 151_669     # the demo's Qwen3 tokenizer; its embedding has 151,936 rows


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(151_000) for _ in range(length)]


@pytest.fixture(scope="module")
def hf_logprobs(hf_demo):
    import torch

    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def get(prompt: list[int]) -> torch.Tensor:
        key = tuple(prompt)
        if key not in cache:
            with torch.no_grad():
                logits = hf_demo(torch.tensor([prompt])).logits[0].float()
            cache[key] = torch.log_softmax(logits, dim=-1)            # [L, V]
        return cache[key]
    return get


def _score(engine, request):
    """Drive the engine until `request` finishes: (prompt logprobs, tokens, finish, usage)."""
    engine.scheduler.admit(request)
    entries, tokens, finish, usage = [], [], None, None
    while engine.scheduler.has_work:
        _, updates = run_step(engine.scheduler, engine.runner)
        for update in updates:
            if update.request_id != request.request_id:
                continue
            usage = update.usage
            for delta in update.deltas:
                entries.extend(delta.prompt_logprobs)
                tokens.extend(delta.token_ids)
                finish = delta.finish_reason or finish
    return entries, tokens, finish, usage


def _scoring(request_id, prompt, max_tokens, k):
    import dataclasses

    return dataclasses.replace(greedy_request(request_id, prompt, max_tokens),
                               prompt_logprobs=k)


def _check(entries, prompt, reference, k):
    import torch

    assert [e.position for e in entries] == list(range(1, len(prompt)))
    assert [e.token_id for e in entries] == prompt[1:]
    for e in entries:
        row = reference[e.position - 1]
        want = row[prompt[e.position]].item()
        assert abs(e.logprob - want) < TOL, e.position
        # rank: tokens strictly above (within the tolerance: a random model has near-ties)
        assert int((row > want + TOL).sum()) + 1 <= e.rank <= int((row > want - TOL).sum()) + 1
        values, ids = torch.topk(row[:TOKENIZER_VOCAB], k)   # alternatives: tokenizer ids
        assert len(e.top) == k
        for got, value in zip(e.top, values.tolist(), strict=True):
            assert abs(got.logprob - value) < TOL
        assert [t.token_id for t in e.top][:1] == ids.tolist()[:1]
        assert all(t.token_id < TOKENIZER_VOCAB for t in e.top)


def test_alternatives_leave_out_the_embedding_padding():
    """Rows whose top logits are padding columns (past the tokenizer's ids): the logprob and
    rank are the model's own, the listed alternatives are tokenizer ids only."""
    from types import SimpleNamespace

    import torch

    from services.engine.runner.scoring import score_step

    vocab, tokens = 12, 10                       # columns 10 and 11 are padding
    logits = torch.arange(vocab, dtype=torch.float32).repeat(3, 1)       # [3, V]: 11 is top
    model = SimpleNamespace(compute_logits=lambda hidden: logits[:hidden.shape[0]])
    seq = SimpleNamespace(scores=True, score_targets=(4, 9), start=0, token_ids=(1, 4, 9),
                          score_top=3, pool="", handle=0)
    layout = SimpleNamespace(forward_seqs=[0], query_start_loc=[0, 3])
    step = SimpleNamespace(seqs=[seq])
    hidden = torch.zeros(3, 2)
    (entries, _), = score_step(model, step, layout, hidden, tokens).collect().values()
    expected = torch.log_softmax(logits[0], dim=-1)
    assert [e.token_id for e in entries] == [4, 9]
    assert abs(entries[1].logprob - expected[9].item()) < 1e-6 and entries[1].rank == 3
    assert [t.token_id for t in entries[0].top] == [9, 8, 7]
    (entries, _), = score_step(model, step, layout, hidden).collect().values()
    assert [t.token_id for t in entries[0].top] == [11, 10, 9]      # without the bound


@pytest.mark.parametrize("runner", ["torch", "graph"])
def test_prompt_only_in_chunks_equals_transformers(demo_source, hf_logprobs, runner):
    """150 tokens under a 64-token step budget: three chunks, every row scored."""
    engine = make_engine(demo_source, runner=runner, prefill_chunk_size=64,
                         max_num_batched_tokens=64)
    prompt = _prompt(150, 3)
    entries, tokens, finish, usage = _score(engine, _scoring("s", prompt, 0, 3))
    assert tokens == [] and finish is FinishReason.LENGTH
    assert usage.prompt_tokens == 150 and usage.completion_tokens == 0
    _check(entries, prompt, hf_logprobs(prompt), 3)
    assert engine.scheduler.state.counters.launches_by_kind["prefill"] == 3


@pytest.mark.parametrize("runner", ["torch", "graph"])
def test_warm_prefix_cache_is_not_reused_for_scoring(demo_source, hf_logprobs, runner):
    engine = make_engine(demo_source, runner=runner, page_size=16)
    prompt = _prompt(90, 5)
    _, first, _, _ = _score(engine, greedy_request("warm", prompt, 4, ends=(40,)))
    _, again, _, usage = _score(engine, greedy_request("hit", prompt, 4))
    assert again == first and usage.cached_tokens == 90          # the cache is warm
    entries, tokens, finish, usage = _score(engine, _scoring("s", prompt, 4, 2))
    assert usage.cached_tokens == 0                              # prefilled from 0
    _check(entries, prompt, hf_logprobs(prompt), 2)
    assert tokens == first and finish is FinishReason.LENGTH    # generation unchanged


def test_prompt_logprobs_alongside_other_requests(demo_source, hf_logprobs):
    """A plain request batched with a scoring one generates what it generates alone."""
    engine = make_engine(demo_source, prefill_chunk_size=64, max_num_batched_tokens=96)
    plain = _prompt(70, 8)
    _, alone, _, _ = _score(engine, greedy_request("alone", plain, 5))
    engine = make_engine(demo_source, prefill_chunk_size=64, max_num_batched_tokens=96)
    engine.scheduler.admit(greedy_request("plain", plain, 5))
    prompt = _prompt(100, 9)
    engine.scheduler.admit(_scoring("s", prompt, 0, 0))
    entries, tokens = [], []
    while engine.scheduler.has_work:
        _, updates = run_step(engine.scheduler, engine.runner)
        for update in updates:
            for delta in update.deltas:
                (tokens if update.request_id == "plain" else []).extend(delta.token_ids)
                entries.extend(delta.prompt_logprobs)
    assert tokens == alone and len(alone) == 5
    _check(entries, prompt, hf_logprobs(prompt), 0)


def test_max_tokens_zero_needs_scoring(demo_source):
    from services.common.errors import ValidationError

    engine = make_engine(demo_source)
    with pytest.raises(ValidationError, match="max_tokens 0"):
        engine.scheduler.admit(greedy_request("z", _prompt(5, 1), 0))


def test_graph_runner_with_two_frames(demo_source, hf_logprobs):
    """The GraphRunner's two-frame loop (as core/loop.py drives it): the scored steps'
    results come with their completion frames."""
    engine = make_engine(demo_source, runner="graph", overlap="on", prefill_chunk_size=64,
                         max_num_batched_tokens=64)
    scheduler, runner = engine.scheduler, engine.runner
    assert runner.window == 2
    plain = _prompt(30, 12)
    prompt = _prompt(100, 13)
    scheduler.admit(greedy_request("plain", plain, 6))
    scheduler.admit(_scoring("s", prompt, 4, 1))
    entries, tokens = [], {"plain": [], "s": []}
    overlapped = 0
    for _ in range(500):
        submitted = False
        if runner.outstanding < runner.window:
            plan = scheduler.plan()
            if plan is not None:
                runner.submit(scheduler.commit(plan, scheduler.state.resources.fences.next_fence))
                submitted = True
        overlapped = max(overlapped, runner.outstanding)
        if runner.outstanding and (runner.outstanding >= runner.window or not submitted):
            for update in scheduler.complete(runner.wait()):
                for delta in update.deltas:
                    entries.extend(delta.prompt_logprobs)
                    tokens[update.request_id].extend(delta.token_ids)
        if not scheduler.has_work:
            break
    _check(entries, prompt, hf_logprobs(prompt), 1)
    assert len(tokens["s"]) == 4 and len(tokens["plain"]) == 6
    assert overlapped == 2
