"""Tail checkpoints on a real (tiny, random) Qwen3: a prefill chunk that runs past a message
boundary saves the boundary's partial page, and a later prompt that hits it prefills on from
exactly the KV a cold prefill makes: the same tokens and logprobs as an engine with an empty
cache. On TorchRunner and on GraphRunner (CPU; prefill graphs, with and without overlap).
A prompt that ends exactly at the boundary is not a full hit (no hidden state was saved);
`checkpoint_stops` brings back the reference design's stop at the boundary.
"""

from __future__ import annotations

import pytest

from tests.engine.runner.conftest import greedy_request, make_engine, random_prompt

RUNNERS = [("torch", False), ("graph", False), ("graph", True)]


def _engine(source, runner: str, overlap: bool, **overrides):
    values = dict(page_size=4, max_num_seqs=4, kv_cache_bytes=8 << 20, prefill_chunk_size=64,
                  max_num_batched_tokens=80, runner=runner, overlap="on" if overlap else "off")
    values.update(overrides)
    return make_engine(source, **values)


def _run(engine, request, steps: list | None = None):
    """(cached tokens, tokens, logprobs) of one request driven to idle like the engine loop;
    the steps submitted are appended to `steps`."""
    scheduler, runner = engine.scheduler, engine.runner
    cached = scheduler.admit(request).usage.cached_tokens
    tokens: list[int] = []
    logprobs: list[float] = []
    while scheduler.has_work:
        submitted = False
        if runner.outstanding < runner.window:
            plan = scheduler.plan()
            if plan is not None:
                step = scheduler.commit(plan, scheduler.state.resources.fences.next_fence)
                if steps is not None:
                    steps.append(step)
                runner.submit(step)
                submitted = True
        if runner.outstanding and (runner.outstanding >= runner.window or not submitted):
            for update in scheduler.complete(runner.wait()):
                for delta in update.deltas:
                    tokens.extend(delta.token_ids)
                    logprobs.extend(lp.logprob for lp in delta.logprobs)
    return cached, tokens, logprobs


def _cold(source, runner, overlap, prompt):
    """The request on an engine with an empty cache: the reference."""
    return _run(_engine(source, runner, overlap), greedy_request("cold", prompt, 6,
                                                                 logprobs=True))


def _same(got, want) -> None:
    assert got[1] == want[1]
    assert len(got[2]) == len(want[2])
    assert all(abs(a - b) < 1e-5 for a, b in zip(got[2], want[2], strict=True)), (got, want)


@pytest.mark.parametrize(("runner", "overlap"), RUNNERS)
def test_a_hit_on_a_tail_checkpoint_prefills_on_from_exact_kv(source, runner, overlap):
    engine = _engine(source, runner, overlap)
    prompt = random_prompt(50, 1)                   # one chunk, past the boundary at 30
    steps: list = []
    _run(engine, greedy_request("first", prompt, 3, ends=(30,)), steps)
    fed = [s.seqs[0] for s in steps if s.seqs[0].token_ids]
    assert (fed[0].start, fed[0].end) == (0, 50)          # the prompt in one step
    assert [c.endpoint for c in fed[0].tail_captures] == [30]
    assert fed[0].tail_captures[0].num_tokens == 30 % 4   # the partial page: 2 rows
    if runner == "graph":
        assert engine.runner.prefill_graph_steps >= 1    # a prefill graph ran the chunk

    # the next turn: the boundary's 30 tokens reused, its partial page restored
    other = prompt[:30] + random_prompt(13, 2)
    steps = []
    got = _run(engine, greedy_request("next", other, 6, logprobs=True), steps)
    assert got[0] == 30
    first = steps[0].seqs[0]
    assert first.start == 30 and first.restore is not None and first.restore.num_tokens == 2
    _same(got, _cold(source, runner, overlap, other))

    # the boundary's prompt alone is no full hit (no hidden state there): it prefills
    exact = prompt[:30]
    steps = []
    got = _run(engine, greedy_request("exact", exact, 6, logprobs=True), steps)
    assert got[0] < 30 and all(s.seqs[0].resume_snapshot is None for s in steps)
    _same(got, _cold(source, runner, overlap, exact))


def test_checkpoint_stops_costs_a_chat_one_more_step(source):
    """A chat's last boundary (the end of the user's message) sits a few tokens before the
    prompt end: with the reference's stop there the first token takes two steps, as a tail
    capture one; both save a checkpoint there that the next turn hits."""
    prompt = random_prompt(40, 3)
    other = prompt[:36] + random_prompt(9, 4)
    counts = {}
    for stops in (True, False):
        engine = _engine(source, "torch", False, checkpoint_stops=stops)
        steps: list = []
        _run(engine, greedy_request("chat", prompt, 2, ends=(36,)), steps)
        counts[stops] = next(i for i, s in enumerate(steps) if s.seqs[0].max_emit) + 1
        assert _run(engine, greedy_request("next", other, 2))[0] == 36
    assert counts == {True: 2, False: 1}
