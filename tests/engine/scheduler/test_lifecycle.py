"""Cancellation at every phase, plan invalidation, completion validation, finish reasons."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.errors import ContextOverflowError, InternalError, ValidationError
from services.engine.scheduler.plan import PlanInvalidated
from services.engine.scheduler.requests import FinishReason
from tests.engine.fakes import reference_tokens, run_step, run_until_idle
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request


def _all_free(scheduler) -> bool:
    state = scheduler.state
    res = state.resources
    return (state.slots.num_free == state.slots.num_slots and
            res.pages.num_free + res.cache.num_cached_pages == res.pages.capacity and
            res.snapshots.num_free + res.cache.num_owned_snapshots == res.snapshots.capacity)


def test_cancel_while_queued():
    scheduler, runner = make_engine(max_num_seqs=1)
    scheduler.admit(request("a", prompt_of(10), 50))
    scheduler.admit(request("b", prompt_of(10, 1), 5))
    run_step(scheduler, runner)
    update = scheduler.cancel("b")
    assert update.finished and update.deltas[0].finish_reason is FinishReason.CANCELLED
    assert scheduler.cancel("b") is None                 # idempotent
    out = run_until_idle(scheduler, runner)
    assert "b" not in out and _all_free(scheduler)
    assert scheduler.state.counters.requests_cancelled == 1


def test_cancel_after_residency_before_the_first_step():
    scheduler, _ = make_engine()
    scheduler.admit(request("a", prompt_of(100), 5))
    plan = scheduler.plan()                               # a is resident now
    scheduler.cancel("a")
    with pytest.raises(PlanInvalidated):
        scheduler.commit(plan, scheduler.state.resources.fences.next_fence)
    assert _all_free(scheduler)


@pytest.mark.parametrize("phase", ["prefill", "decode", "resume"])
def test_cancel_in_flight_releases_only_after_the_last_use(phase):
    scheduler, runner = make_engine(num_pages=64)
    prompt = prompt_of(40)
    if phase == "resume":                               # a full hit: the first step resumes
        scheduler.admit(request("warm", prompt, 1))
        run_until_idle(scheduler, runner)
    scheduler.admit(request("a", prompt, 20))
    steps = {"prefill": 0, "decode": 3, "resume": 0}[phase]
    for _ in range(steps):
        run_step(scheduler, runner)
    runner.hold = True
    run_step(scheduler, runner)                         # submitted, not completed
    (step,) = scheduler.state.in_flight.values()
    seq_step = step.seqs[0]
    if phase == "resume":
        assert seq_step.resume_snapshot is not None
    seq = scheduler.state.running[seq_step.handle.slot]
    private = set(seq.cache.private_pages)
    update = scheduler.cancel("a")
    assert update.finished and update.deltas[0].finish_reason is FinishReason.CANCELLED
    res = scheduler.state.resources
    assert scheduler.state.slots.num_retiring == 1
    assert res.pages.num_retiring == len(private)
    # a new request now cannot get those pages while the step is in flight
    scheduler.admit(request("b", prompt_of(30, 2), 3))
    run_step(scheduler, runner)                         # b's first step, also held
    taken = {p for s in scheduler.state.running.values() for p in s.cache.private_pages}
    assert taken and not taken & private
    runner.hold = False
    runner.release()
    out = run_until_idle(scheduler, runner)
    assert "a" not in out
    assert out["b"][0] == reference_tokens(prompt_of(30, 2), 3, vocab=VOCAB)
    assert _all_free(scheduler)


def test_cancel_a_preempted_request():
    scheduler, runner = make_engine(num_pages=40, max_num_seqs=4)
    for i in range(4):
        scheduler.admit(request(f"r{i}", prompt_of(60, salt=i), 40, seed=i))
    preempted = None
    for _ in range(500):
        run_step(scheduler, runner)
        waiting = [s for s in scheduler.state.waiting if s.output_ids]
        if waiting:
            preempted = waiting[0].request.request_id
            break
    assert preempted is not None
    scheduler.cancel(preempted)
    run_until_idle(scheduler, runner)
    assert _all_free(scheduler)


def test_plan_survives_unrelated_admission_but_not_mutation():
    scheduler, runner = make_engine()
    scheduler.admit(request("a", prompt_of(20), 5))
    plan = scheduler.plan()
    scheduler.admit(request("b", prompt_of(20, 1), 5))     # unrelated: plan stays valid
    step = scheduler.commit(plan, scheduler.state.resources.fences.next_fence)
    runner.submit(step)
    scheduler.complete(runner.poll())
    plan = scheduler.plan()
    seq = scheduler.state.running[plan.seqs[0].handle.slot]
    seq.bump()                                              # any mutation of a participant
    with pytest.raises(PlanInvalidated):
        scheduler.commit(plan, scheduler.state.resources.fences.next_fence)
    plan = scheduler.plan()
    with pytest.raises(PlanInvalidated):
        scheduler.commit(plan, scheduler.state.resources.fences.next_fence + 1)


def test_completions_are_validated_before_they_mutate_state():
    scheduler, runner = make_engine()
    scheduler.admit(request("a", prompt_of(20), 5))
    plan = scheduler.plan()
    runner.submit(scheduler.commit(plan, scheduler.state.resources.fences.next_fence))
    good = runner.poll()
    result = good.results[0]
    bad_cases = [
        dataclasses.replace(good, fence=good.fence + 1),
        dataclasses.replace(good, results=()),
        dataclasses.replace(good, results=(dataclasses.replace(result, consumed=19),)),
        dataclasses.replace(good, results=(dataclasses.replace(result, token_ids=()),)),
        dataclasses.replace(good, results=(dataclasses.replace(result, token_ids=(VOCAB,)),)),
        dataclasses.replace(good, results=(dataclasses.replace(result, token_ids=(-1,)),)),
        # logprobs for more tokens than it emitted
        dataclasses.replace(good, results=(dataclasses.replace(
            result, logprobs=(None, None)),)),
        # two tokens from a step that may emit one (consumed would say so too)
        dataclasses.replace(good, results=(dataclasses.replace(
            result, token_ids=(1, 2), consumed=result.consumed + 1),)),
        dataclasses.replace(good, results=(dataclasses.replace(
            result, handle=dataclasses.replace(result.handle, generation=9)),)),
    ]
    seq = scheduler.state.running[result.handle.slot]
    for bad in bad_cases:
        with pytest.raises(InternalError, match="invalid completion"):
            scheduler.complete(bad)
        assert seq.num_computed == 0 and not seq.output_ids
    assert scheduler.complete(good)[0].deltas[0].token_ids


def test_finish_reasons():
    eos = frozenset({reference_tokens(prompt_of(12), 3, vocab=VOCAB)[2]})
    scheduler, runner = make_engine(eos=eos, max_model_len=20)
    prompt = prompt_of(12)
    scheduler.admit(request("eos", prompt, 8, ignore_eos=False))
    scheduler.admit(request("ignore", prompt, 5, ignore_eos=True, seed=0))
    scheduler.admit(request("min", prompt, 6, ignore_eos=False, min_tokens=4))
    stop_id = reference_tokens(prompt, 2, seed=3, vocab=VOCAB)[1]
    scheduler.admit(request("stopid", prompt, 8, seed=3, stop_ids=(stop_id,)))
    scheduler.admit(request("context", prompt, None))       # the context ends it
    finishes = {}
    tokens: dict[str, list[int]] = {}
    for _ in range(100):
        _, updates = run_step(scheduler, runner)
        for update in updates:
            for d in update.deltas:
                tokens.setdefault(update.request_id, []).extend(d.token_ids)
                if d.finish_reason:
                    finishes[update.request_id] = (d.finish_reason, d.stop_token_id)
        if not scheduler.has_work:
            break
    assert finishes["eos"] == (FinishReason.STOP, next(iter(eos))) and len(tokens["eos"]) == 3
    assert finishes["ignore"] == (FinishReason.LENGTH, None) and len(tokens["ignore"]) == 5
    assert finishes["min"][0] is FinishReason.LENGTH and len(tokens["min"]) == 6
    assert next(iter(eos)) not in tokens["min"][:4]          # suppressed below min_tokens
    assert finishes["stopid"] == (FinishReason.STOP, stop_id) and len(tokens["stopid"]) == 2
    assert finishes["context"][0] is FinishReason.LENGTH and len(tokens["context"]) == 8


def test_admission_validation():
    scheduler, _ = make_engine(max_model_len=100)
    with pytest.raises(ValidationError, match="empty"):
        scheduler.admit(request("a", [], 5))
    with pytest.raises(ValidationError, match="vocabulary"):
        scheduler.admit(request("a", [VOCAB], 5))
    with pytest.raises(ContextOverflowError) as info:
        scheduler.admit(request("a", prompt_of(90), 20))
    assert (info.value.prompt_tokens, info.value.max_tokens, info.value.context_length) == \
        (90, 20, 100)
    assert "longer context" in str(info.value)
    with pytest.raises(ValidationError, match="checkpoint_token_ends"):
        scheduler.admit(request("a", prompt_of(10), 5, ends=(5, 3)))
    with pytest.raises(ValidationError, match="min_tokens"):
        scheduler.admit(request("a", prompt_of(10), 5, min_tokens=6))
    scheduler.admit(request("a", prompt_of(10), 5))
    with pytest.raises(ValidationError, match="already live"):
        scheduler.admit(request("a", prompt_of(10), 5))
    assert scheduler.state.counters.requests_rejected == 6


def test_slot_generations_distinguish_reuse():
    scheduler, runner = make_engine(max_num_seqs=1)
    handles = []
    for i in range(3):
        scheduler.admit(request(f"r{i}", prompt_of(5, i), 2))
        run_until_idle(scheduler, runner)
        handles.append(runner.steps[-1].seqs[0].handle)
    assert [h.slot for h in handles] == [0, 0, 0]
    assert [h.generation for h in handles] == [1, 2, 3]
