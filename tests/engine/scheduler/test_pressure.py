"""Page pressure: eviction, preemption and resumption, capacity errors, no starvation."""

from __future__ import annotations

import pytest

from services.common.errors import CapacityError, ValidationError
from tests.engine.fakes import reference_tokens, run_step, run_until_idle
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request


def test_preemption_and_resume_keep_outputs_exact():
    # 40 pages of 4 tokens: four requests of ~100 tokens cannot all stay resident.
    scheduler, runner = make_engine(num_pages=40, max_num_seqs=4)
    prompts = {f"r{i}": prompt_of(60 + 5 * i, salt=i) for i in range(4)}
    for i, (rid, prompt) in enumerate(prompts.items()):
        scheduler.admit(request(rid, prompt, 40, seed=i))
    out = run_until_idle(scheduler, runner)
    for i, (rid, prompt) in enumerate(prompts.items()):
        assert out[rid][0] == reference_tokens(prompt, 40, seed=i, vocab=VOCAB), rid
    assert scheduler.state.counters.preemptions > 0
    pool = scheduler.state.resources.pages
    cache = scheduler.state.resources.cache
    assert pool.num_free + cache.num_cached_pages == pool.capacity


def test_cache_leaves_are_evicted_before_anyone_is_preempted():
    scheduler, runner = make_engine(num_pages=40)
    for i in range(6):                     # fill the cache with finished prompts
        scheduler.admit(request(f"old{i}", prompt_of(30, salt=100 + i), 2))
        run_until_idle(scheduler, runner)
    cached_before = scheduler.state.resources.cache.num_checkpoints
    scheduler.admit(request("big", prompt_of(120), 20))
    out = run_until_idle(scheduler, runner)
    assert out["big"][0] == reference_tokens(prompt_of(120), 20, vocab=VOCAB)
    assert scheduler.state.resources.cache.counters.evicted > 0
    assert scheduler.state.resources.cache.num_checkpoints < cached_before + 1
    assert scheduler.state.counters.preemptions == 0


def test_a_request_that_can_never_fit_is_refused_with_the_hint():
    """Never fitting the whole pool is a validation error (400), not capacity (503 + retry)."""
    scheduler, _ = make_engine(num_pages=10)
    with pytest.raises(ValidationError) as info:
        scheduler.admit(request("huge", prompt_of(30), 20))
    assert "add pages" in str(info.value) and "kv_cache_bytes" in str(info.value)
    assert scheduler.state.counters.requests_rejected == 1 and not scheduler.state.requests


def test_a_full_waiting_queue_is_refused_with_retry_advice():
    scheduler, _ = make_engine(max_num_seqs=1, max_waiting=2)
    for rid in "abc":        # one will take the free slot, two may wait
        scheduler.admit(request(rid, prompt_of(10), 2))
    with pytest.raises(CapacityError) as info:
        scheduler.admit(request("d", prompt_of(10), 2))
    assert info.value.retry_after_s == 1.0 and "queue is full" in str(info.value)
    assert scheduler.state.counters.requests_rejected == 1


def test_no_starvation_long_prompts_progress_among_many_short_decodes():
    """64 tokens per step, and 39 short chats decoding would use 39 of them (a new one arrives
    each time one ends) while long prompts wait for the last slot. Once resident, a long prompt
    advances a whole chunk in every step (its prefill takes exactly ceil(400 / 64) steps), and
    everyone finishes."""
    scheduler, runner = make_engine(max_num_seqs=40, prefill_chunk_size=64,
                                    max_num_batched_tokens=64, num_pages=2048)
    for i in range(39):
        scheduler.admit(request(f"short{i}", prompt_of(8, salt=i), 30, seed=i))
    for _ in range(3):
        run_step(scheduler, runner)
    for i in range(3):
        scheduler.admit(request(f"long{i}", prompt_of(400, salt=50 + i), 4, seed=9))
    arrivals = 0
    out: dict[str, list[int]] = {}
    prefill_steps: dict[str, int] = {}
    for _ in range(2000):
        _, updates = run_step(scheduler, runner)
        for update in updates:
            out.setdefault(update.request_id, []).extend(
                t for d in update.deltas for t in d.token_ids)
            if update.finished and update.request_id.startswith("short") and arrivals < 80:
                arrivals += 1
                scheduler.admit(request(f"short-new{arrivals}", prompt_of(8, salt=arrivals),
                                        30))
        for s in runner.steps[-1].seqs:
            if s.start < 400 and s.token_ids and len(s.token_ids) > 1:
                prefill_steps[str(s.handle)] = prefill_steps.get(str(s.handle), 0) + 1
        if not scheduler.has_work:
            break
    assert not scheduler.has_work and arrivals == 80
    for i in range(3):
        assert out[f"long{i}"] == reference_tokens(prompt_of(400, salt=50 + i), 4, seed=9,
                                                   vocab=VOCAB)
    # each long prompt's prefill ran in consecutive steps of one chunk: ceil(400 / 64) = 7
    assert sorted(prefill_steps.values())[-3:] == [7, 7, 7]


def test_a_duplicate_checkpoint_is_not_held_by_the_sequence_that_proposed_it():
    """Two identical prompts prefill together: one publishes the prompt checkpoint, the other
    finds it existing and keeps its own pages. It must not also pin the duplicate, or a pool
    sized for one such sequence could never give it the pages it needs next (found by the
    random workload test)."""
    scheduler, runner = make_engine(num_pages=60, page_size=1, max_num_seqs=2)
    prompt = prompt_of(29)
    scheduler.admit(request("a", prompt, 1))
    scheduler.admit(request("b", prompt, 4, seed=1))
    out = run_until_idle(scheduler, runner)
    assert out["b"][0] == reference_tokens(prompt, 4, seed=1, vocab=VOCAB)
    assert scheduler.state.resources.cache.counters.duplicates == 1
    assert scheduler.state.resources.cache.counters.evicted >= 1
