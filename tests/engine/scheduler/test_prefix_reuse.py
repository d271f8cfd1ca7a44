"""Prefix hits through the scheduler: full (resume sampling), partial, unaligned, n > 1."""

from __future__ import annotations

from tests.engine.fakes import reference_tokens, run_until_idle
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request


def test_full_prompt_hit_resumes_sampling_without_replaying_the_prompt():
    scheduler, runner = make_engine()
    prompt = prompt_of(101)                     # not page aligned: the tail is restored
    scheduler.admit(request("a", prompt, 6))
    run_until_idle(scheduler, runner)
    before = len(runner.steps)
    admitted = scheduler.admit(request("b", prompt, 6))
    assert admitted.usage.cached_tokens == 101
    out = run_until_idle(scheduler, runner)
    assert out["b"][0] == reference_tokens(prompt, 6, vocab=VOCAB)
    steps = runner.steps[before:]
    assert steps[0].kind == "resume" and steps[0].num_tokens == 0
    assert steps[1].seqs[0].restore is not None and steps[1].seqs[0].restore.num_tokens == 1
    fed = sum(s.num_tokens for s in steps)
    assert fed == 5                              # only the generated tokens, no prompt replay
    counters = scheduler.state.resources.cache.counters
    assert counters.hits == 1 and counters.reused_tokens == 101


def test_partial_hit_at_a_message_boundary():
    scheduler, runner = make_engine()
    shared = prompt_of(90)
    first = shared + prompt_of(30, salt=1)
    second = shared + prompt_of(45, salt=2)
    scheduler.admit(request("a", first, 4, ends=(90,)))
    run_until_idle(scheduler, runner)
    before = len(runner.steps)
    assert scheduler.admit(request("b", second, 4, ends=(90,))).usage.cached_tokens == 90
    out = run_until_idle(scheduler, runner)
    assert out["b"][0] == reference_tokens(second, 4, vocab=VOCAB)
    steps = runner.steps[before:]
    assert steps[0].seqs[0].start == 90 and steps[0].seqs[0].restore is not None
    assert steps[0].seqs[0].restore.num_tokens == 90 % 4


def test_prefill_stops_at_each_selected_checkpoint():
    scheduler, runner = make_engine(prefill_chunk_size=128, max_num_batched_tokens=256,
                                    checkpoint_stops=True)
    prompt = prompt_of(300)
    scheduler.admit(request("a", prompt, 2, ends=(40, 100, 250)))
    run_until_idle(scheduler, runner)
    ends = [s.seqs[0].end for s in runner.steps if s.seqs[0].token_ids]
    # the prompt end, the last and the first message boundary are checkpoints
    assert 40 in ends and 250 in ends and 300 in ends
    captured = [s.seqs[0].capture.num_tokens for s in runner.steps if s.seqs[0].capture]
    # ... and, after it finished, the terminal state: prompt + output but the last token
    assert captured == [40 % 4, 250 % 4, 300 % 4, 301 % 4]
    assert scheduler.state.resources.cache.num_checkpoints == 4


def test_chunks_capture_the_boundaries_they_run_past():
    """Without checkpoint_stops the chunks are the stop-free ones; each boundary a chunk
    crosses is a tail capture of that step, published before its chunk-end checkpoint, and
    serves later prompts that prefill on from it (never a full hit: no hidden state)."""
    scheduler, runner = make_engine(prefill_chunk_size=128, max_num_batched_tokens=256)
    prompt = prompt_of(300)
    scheduler.admit(request("a", prompt, 2, ends=(40, 100, 250)))
    out = run_until_idle(scheduler, runner)
    assert out["a"][0] == reference_tokens(prompt, 2, vocab=VOCAB)
    fed = [s.seqs[0] for s in runner.steps if s.seqs[0].token_ids]
    assert [s.end for s in fed[:3]] == [128, 256, 300]
    assert [[c.endpoint for c in s.tail_captures] for s in fed[:3]] == [[40], [250], []]
    assert [(c.num_tokens, c.page_id) for c in fed[0].tail_captures] == \
        [(0, -1)]                                  # 40 is page aligned: nothing to copy
    assert (fed[1].tail_captures[0].num_tokens, fed[1].tail_captures[0].page_id) == \
        (250 % 4, fed[1].page_ids[250 // 4])
    cache = scheduler.state.resources.cache
    assert cache.num_checkpoints == 4             # 40, 250, the prompt end, the terminal
    # a prompt sharing 250 tokens prefills on from the tail checkpoint there (its 2 rows)
    second = prompt[:250] + prompt_of(20, salt=3)
    before = len(runner.steps)
    assert scheduler.admit(request("b", second, 3)).usage.cached_tokens == 250
    out = run_until_idle(scheduler, runner)
    assert out["b"][0] == reference_tokens(second, 3, vocab=VOCAB)
    first = runner.steps[before].seqs[0]
    assert first.start == 250 and first.restore.num_tokens == 250 % 4
    # the prompt up to the boundary is no full hit: it reuses the block below (192 tokens)
    # and prefills the rest
    before = len(runner.steps)
    assert scheduler.admit(request("c", prompt[:250], 3)).usage.cached_tokens == 192
    out = run_until_idle(scheduler, runner)
    assert out["c"][0] == reference_tokens(prompt[:250], 3, vocab=VOCAB)
    assert all(s.seqs[0].resume_snapshot is None for s in runner.steps[before:])


def test_n_choices_share_the_prompt_pages():
    scheduler, runner = make_engine()
    prompt = prompt_of(77)
    scheduler.admit(request("a", prompt, 5, n=3, seed=11))
    out = run_until_idle(scheduler, runner)
    for i in range(3):
        assert out["a"][i] == reference_tokens(prompt, 5, seed=11, vocab=VOCAB, choice=i)
    assert len({tuple(v) for v in out["a"].values()}) == 3
    prompt_fed = sum(len(s.token_ids) for step in runner.steps for s in step.seqs
                     if s.start < 77)
    assert prompt_fed == 77                     # the prompt ran once for three choices
    resumes = [s for step in runner.steps for s in step.seqs if s.resume_snapshot is not None]
    assert len(resumes) == 2


def test_identical_concurrent_prompts_publish_once():
    scheduler, runner = make_engine()
    prompt = prompt_of(64)
    scheduler.admit(request("a", prompt, 3))
    scheduler.admit(request("b", prompt, 3, seed=5))
    out = run_until_idle(scheduler, runner)
    assert out["b"][0] == reference_tokens(prompt, 3, seed=5, vocab=VOCAB)
    cache = scheduler.state.resources.cache
    # one prompt checkpoint (the second proposal found it existing) + two terminal states
    assert cache.counters.duplicates == 1 and cache.num_checkpoints == 3
    pool = scheduler.state.resources.pages
    assert pool.num_free + cache.num_cached_pages == pool.capacity


def test_terminal_state_serves_the_next_turn():
    """A finished choice checkpoints prompt + output (but its last, pending token): the next
    turn, which repeats them and adds a message, reuses all of it."""
    scheduler, runner = make_engine()
    prompt = prompt_of(70)
    scheduler.admit(request("turn1", prompt, 10))
    out = run_until_idle(scheduler, runner)["turn1"][0]
    assert out == reference_tokens(prompt, 10, vocab=VOCAB)
    capture_step = runner.steps[-1]
    assert capture_step.num_tokens == 0 and capture_step.seqs[0].capture is not None
    second = prompt + out[:-1] + prompt_of(20, salt=5)
    admitted = scheduler.admit(request("turn2", second, 6))
    assert admitted.usage.cached_tokens == 79
    before = len(runner.steps)
    result = run_until_idle(scheduler, runner)["turn2"][0]
    assert result == reference_tokens(second, 6, vocab=VOCAB)
    assert runner.steps[before].seqs[0].start == 79


def test_no_terminal_capture_for_a_single_token_or_after_abandon():
    scheduler, runner = make_engine()
    scheduler.admit(request("one", prompt_of(30), 1))
    run_until_idle(scheduler, runner)
    assert scheduler.state.resources.cache.num_checkpoints == 1       # the prompt end only
    scheduler.admit(request("two", prompt_of(30, salt=3), 4))
    from tests.engine.fakes import run_step

    while scheduler.state.requests:
        run_step(scheduler, runner)                # up to the finishing token
    (seq,) = scheduler.state.running.values()
    assert seq.phase.value == "capturing" and seq.is_finished
    scheduler.abandon_captures()                   # e.g. a drain
    assert not scheduler.has_work
    res = scheduler.state.resources
    assert res.cache.num_checkpoints == 2          # two prompt ends, no terminal state
    assert res.pages.num_free + res.cache.num_cached_pages == res.pages.capacity
    assert res.snapshots.num_free + res.cache.num_owned_snapshots == res.snapshots.capacity


def test_a_prompt_sharing_complete_blocks_reuses_them_without_a_boundary():
    """No message boundary, no full match: the longest run of shared complete 64-token blocks
    is reused, and prefill resumes at its boundary with nothing to restore."""
    scheduler, runner = make_engine()
    shared = prompt_of(150)
    first = shared + prompt_of(20, salt=1)
    second = shared + prompt_of(37, salt=2)
    scheduler.admit(request("a", first, 4))
    run_until_idle(scheduler, runner)
    before = len(runner.steps)
    assert scheduler.admit(request("b", second, 4)).usage.cached_tokens == 128
    out = run_until_idle(scheduler, runner)
    assert out["b"][0] == reference_tokens(second, 4, vocab=VOCAB)
    step = runner.steps[before].seqs[0]
    assert step.start == 128 and step.restore is None
    # the block checkpoint is the second prompt's base: its own prompt end chains from it
    third = second + prompt_of(5, salt=3)
    assert scheduler.admit(request("c", third, 2)).usage.cached_tokens == len(second)
    assert run_until_idle(scheduler, runner)["c"][0] == reference_tokens(third, 2, vocab=VOCAB)


def test_a_prompt_waits_for_the_blocks_a_resident_prompt_is_prefilling():
    """Two prompts sharing 256 tokens arrive together: the second waits while the first
    prefills them, then reuses them (counted as cached), instead of computing them twice."""
    scheduler, runner = make_engine(prefill_chunk_size=64, max_num_batched_tokens=128)
    shared = prompt_of(256)
    first, second = shared + prompt_of(44, salt=1), shared + prompt_of(20, salt=2)
    scheduler.admit(request("a", first, 3))
    assert scheduler.admit(request("b", second, 3)).usage.cached_tokens == 0
    before = len(runner.steps)
    out = run_until_idle(scheduler, runner)
    assert out["b"][0] == reference_tokens(second, 3, vocab=VOCAB)
    assert out["a"][0] == reference_tokens(first, 3, vocab=VOCAB)
    (a_step,) = runner.steps[before].seqs            # the first step is the first prompt's
    b_starts = [s.start for step in runner.steps[before:] for s in step.seqs
                if s.handle.slot != a_step.handle.slot]
    assert b_starts and min(b_starts) == 256          # it never computed the shared blocks
    counters = scheduler.state.resources.cache.counters
    assert counters.reused_tokens == 256 and counters.hits == 1
    assert len(scheduler.state.inflight) == 0


def test_a_small_overlap_does_not_wait():
    scheduler, runner = make_engine(prefill_chunk_size=64, max_num_batched_tokens=256)
    first = prompt_of(64) + prompt_of(236, salt=1)
    second = prompt_of(64) + prompt_of(236, salt=2)     # one block of 300 shared
    scheduler.admit(request("a", first, 2))
    scheduler.admit(request("b", second, 2))
    out = run_until_idle(scheduler, runner)
    assert out["b"][0] == reference_tokens(second, 2, vocab=VOCAB)
    assert len(runner.steps[0].seqs) == 2               # both prefilled from the first step
