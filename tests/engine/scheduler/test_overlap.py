"""Two-frame overlap in the scheduler: a decode planned behind a sequence's in-flight step.

The fake runner feeds a pending token from the slot's last sampled token (as the GPU runner
does from device memory), so a wrong position, page, output index or a token kept after the
choice finished changes the outputs against `reference_tokens`.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.engine.scheduler.plan import PENDING_TOKEN
from services.engine.scheduler.requests import FinishReason
from tests.engine.fakes import reference_tokens, run_step_two_frames
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request


def _drive(scheduler, runner, max_rounds: int = 5000):
    outputs: dict[str, dict[int, list[int]]] = {}
    finish: dict[str, FinishReason | None] = {}
    for _ in range(max_rounds):
        ran, updates = run_step_two_frames(scheduler, runner)
        for update in updates:
            for delta in update.deltas:
                outputs.setdefault(update.request_id, {}).setdefault(delta.index, []).extend(
                    delta.token_ids)
                if delta.finish_reason is not None:
                    finish[update.request_id] = delta.finish_reason
        if not scheduler.has_work:
            return outputs, finish
        assert ran, "stalled"
    raise AssertionError("did not finish")


def _all_free(scheduler) -> bool:
    state = scheduler.state
    res = state.resources
    return (state.slots.num_free == state.slots.num_slots and
            res.pages.num_free + res.cache.num_cached_pages == res.pages.capacity and
            res.snapshots.num_free + res.cache.num_owned_snapshots == res.snapshots.capacity)


def _followed(runner) -> int:
    return sum(1 for step in runner.steps for s in step.seqs if s.feeds_pending)


def test_decodes_follow_in_flight_steps_and_match_the_reference():
    scheduler, runner = make_engine(overlap=True)
    prompts = {f"r{i}": prompt_of(10 + 17 * i, salt=i) for i in range(4)}
    for i, (rid, prompt) in enumerate(prompts.items()):
        scheduler.admit(request(rid, prompt, 12 + i, seed=i))
    outputs, finish = _drive(scheduler, runner)
    for i, (rid, prompt) in enumerate(prompts.items()):
        assert outputs[rid][0] == reference_tokens(prompt, 12 + i, seed=i, vocab=VOCAB)
        assert finish[rid] is FinishReason.LENGTH
    assert _followed(runner) > 20
    # a followed decode feeds the pending token at the position after its predecessor's end
    for step in runner.steps:
        for s in step.seqs:
            if s.feeds_pending:
                assert s.token_ids == (PENDING_TOKEN,) and s.sample and s.output_index > 0
    # never a decode behind the token that ends the choice by count
    lengths = {rid: len(prompts[rid]) + 12 + i for i, rid in enumerate(prompts)}
    assert all(s.end <= lengths[max(lengths)] for st_ in runner.steps for s in st_.seqs)
    assert _all_free(scheduler)


def test_overlap_off_never_follows():
    scheduler, runner = make_engine()
    scheduler.admit(request("a", prompt_of(20), 8))
    outputs, _ = _drive(scheduler, runner)
    assert outputs["a"][0] == reference_tokens(prompt_of(20), 8, vocab=VOCAB)
    assert _followed(runner) == 0


def test_stop_token_drops_the_decode_behind_it_and_keeps_the_terminal_state():
    """The token that hits EOS cannot be known before it is sampled: one decode already ran
    behind it. Its token is dropped, and the terminal checkpoint still holds prompt + output
    (but the pending last token), so the next turn reuses all of it."""
    prompt = prompt_of(70)
    free_run = reference_tokens(prompt, 40, vocab=VOCAB)
    eos = frozenset({free_run[6]})                       # the 7th token is "EOS"
    scheduler, runner = make_engine(overlap=True, eos=eos)
    scheduler.admit(request("turn1", prompt, 40, ignore_eos=False))
    outputs, finish = _drive(scheduler, runner)
    out = outputs["turn1"][0]
    assert out == reference_tokens(prompt, 40, vocab=VOCAB, eos=eos) and len(out) == 7
    assert finish["turn1"] is FinishReason.STOP
    dropped = [s for step in runner.steps for s in step.seqs
               if s.feeds_pending and s.start == len(prompt) + 6]
    assert dropped, "a decode ran behind the stop token"
    second = prompt + out[:-1] + prompt_of(20, salt=5)
    admitted = scheduler.admit(request("turn2", second, 6))
    assert admitted.usage.cached_tokens == len(prompt) + 6
    outputs, _ = _drive(scheduler, runner)
    assert outputs["turn2"][0] == reference_tokens(second, 6, vocab=VOCAB)
    assert _all_free(scheduler)


def test_min_tokens_suppression_counts_the_pending_token():
    prompt = prompt_of(30, salt=2)
    free_run = reference_tokens(prompt, 20, vocab=VOCAB)
    eos = frozenset({free_run[2]})
    scheduler, runner = make_engine(overlap=True, eos=eos)
    scheduler.admit(request("a", prompt, 10, ignore_eos=False, min_tokens=5))
    _drive(scheduler, runner)
    for step in runner.steps:
        for s in step.seqs:
            if s.sample:
                assert bool(s.suppress_token_ids) == (s.output_index < 5), s


def test_cancel_with_a_followed_decode_in_flight_retires_after_both():
    scheduler, runner = make_engine(overlap=True, num_pages=64)
    scheduler.admit(request("a", prompt_of(40), 30))
    for _ in range(12):
        run_step_two_frames(scheduler, runner)
    assert len(scheduler.state.in_flight) == 1
    plan = scheduler.plan()                              # the decode behind it
    runner.submit(scheduler.commit(plan, scheduler.state.resources.fences.next_fence))
    assert len(scheduler.state.in_flight) == 2
    assert list(scheduler.state.in_flight.values())[-1].seqs[0].feeds_pending
    (seq,) = scheduler.state.running.values()
    private = set(seq.cache.private_pages)
    scheduler.cancel("a")
    res = scheduler.state.resources
    assert scheduler.state.slots.num_retiring == 1 and res.pages.num_retiring == len(private)
    scheduler.complete(runner.done.popleft())            # the older step: still retiring
    assert scheduler.state.slots.num_retiring == 1 and res.pages.num_retiring == len(private)
    scheduler.complete(runner.done.popleft())
    assert _all_free(scheduler)


_request = st.tuples(
    st.integers(0, 3),            # which shared prefix
    st.integers(1, 60),           # prefix length used
    st.integers(0, 30),           # private suffix length
    st.integers(1, 20),           # max tokens
    st.integers(1, 2),            # n
    st.integers(0, 40),           # cancel after this many rounds (>= 12: never)
    st.booleans(),                # stops at EOS
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_request, min_size=1, max_size=8),
       num_pages=st.integers(50, 160), page_size=st.sampled_from([1, 4, 16]),
       slots=st.integers(1, 4), eos_token=st.integers(0, VOCAB - 1),
       checkpoint_stops=st.booleans())
def test_random_overlapped_workloads_are_exact_and_leak_nothing(requests, num_pages,
                                                               page_size, slots, eos_token,
                                                               checkpoint_stops):
    """Shared prefixes with message boundaries (tail captures, or the reference's stops),
    n > 1, EOS, cancellations, two steps in flight: exact tokens, nothing leaked."""
    eos = frozenset({eos_token})
    scheduler, runner = make_engine(num_pages=num_pages, page_size=page_size,
                                    max_num_seqs=slots, num_snapshots=10,
                                    max_num_batched_tokens=96, overlap=True, eos=eos,
                                    cost_model=True, checkpoint_stops=checkpoint_stops)
    expected = {}
    cancel_at = {}
    for i, (prefix, length, suffix, max_tokens, n, cancel, stops) in enumerate(requests):
        prompt = prompt_of(60, salt=prefix)[:length] + prompt_of(suffix, salt=100 + i)
        prompt = prompt[:(num_pages - 2) * page_size // 2]
        max_tokens = min(max_tokens, (num_pages - 2) * page_size - len(prompt))
        rid = f"r{i}"
        scheduler.admit(request(rid, prompt, max_tokens, seed=i, n=n, ignore_eos=not stops,
                                ends=(length,) if 0 < length < len(prompt) else ()))
        expected[rid] = (prompt, max_tokens, n, stops)
        if cancel < 12:
            cancel_at[rid] = cancel
    outputs: dict[str, dict[int, list[int]]] = {}
    cancelled = set()
    for round_ in range(5000):
        for rid, when in list(cancel_at.items()):
            if when <= round_:
                del cancel_at[rid]
                if scheduler.cancel(rid) is not None:
                    cancelled.add(rid)
        ran, updates = run_step_two_frames(scheduler, runner)
        for update in updates:
            for delta in update.deltas:
                outputs.setdefault(update.request_id, {}).setdefault(delta.index, []).extend(
                    delta.token_ids)
        if not scheduler.has_work:
            break
        assert ran, "stalled"
    assert not scheduler.has_work
    for rid, (prompt, max_tokens, n, stops) in expected.items():
        if rid in cancelled:
            continue
        for choice in range(n):
            want = reference_tokens(prompt, max_tokens, seed=int(rid[1:]), vocab=VOCAB,
                                    eos=eos if stops else frozenset(), choice=choice)
            assert outputs[rid][choice] == want, (rid, choice)
    assert _all_free(scheduler)
