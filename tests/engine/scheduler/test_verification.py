"""Verification steps (plan.py's step semantics with max_emit > 1) through the scheduler and
the fake runner: a decode feeds its pending token plus k proposed drafts, may emit k + 1
tokens, and emits the sampled ones up to the first that differs from its draft. Whatever the
proposals, the output must equal the non-speculative reference; exact proposals must save
steps; finish rules cut inside an accepted run; nothing leaks."""

from __future__ import annotations

import random
from collections.abc import Sequence

from services.engine.scheduler.proposals import NgramProposer
from services.engine.scheduler.requests import FinishReason
from tests.engine.fakes import collect, reference_tokens, run_step, run_step_two_frames
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request


class Oracle:
    """Proposes the reference continuation (optionally wrong at one draft index)."""

    def __init__(self, prompt: Sequence[int], count: int, k: int, wrong_at: int = -1,
                 **reference) -> None:
        self.prompt = list(prompt)
        self.reference = reference_tokens(prompt, count + k + 1, vocab=VOCAB, **reference)
        self.k = k
        self.wrong_at = wrong_at
        self.calls = 0

    def propose(self, tokens: Sequence[int], limit: int) -> tuple[int, ...]:
        if list(tokens[:len(self.prompt)]) != self.prompt:
            return ()                                  # another request's: no proposal
        self.calls += 1
        done = len(tokens) - len(self.prompt)
        drafts = list(self.reference[done:done + min(self.k, limit)])
        if 0 <= self.wrong_at < len(drafts):
            drafts[self.wrong_at] = (drafts[self.wrong_at] + 1) % VOCAB
        return tuple(drafts)


def _drive(scheduler, runner):
    outputs: dict = {}
    finishes: dict = {}
    for _ in range(10_000):
        ran, updates = run_step(scheduler, runner)
        collect(outputs, updates)
        for update in updates:
            for delta in update.deltas:
                if delta.finish_reason is not None:
                    finishes[(update.request_id, delta.index)] = delta.finish_reason
        if not scheduler.has_work:
            return outputs, finishes
        assert ran or scheduler.state.in_flight
    raise AssertionError("did not finish")


def _verify_steps(runner) -> list:
    return [s for step in runner.steps for s in step.seqs if s.max_emit > 1]


def _pages_all_back(scheduler) -> None:
    res = scheduler.state.resources
    res.evict_all()
    assert res.pages.num_free == res.pages.capacity


def test_exact_drafts_emit_every_token_and_save_steps():
    prompt = prompt_of(21)
    oracle = Oracle(prompt, 20, k=3)
    scheduler, runner = make_engine(proposer=oracle)
    scheduler.admit(request("a", prompt, 20))
    outputs, _ = _drive(scheduler, runner)
    assert outputs["a"][0] == reference_tokens(prompt, 20, vocab=VOCAB)
    verifies = _verify_steps(runner)
    assert verifies and all(s.max_emit == len(s.draft_token_ids) + 1 for s in verifies)
    steps_with_output = [step for step in runner.steps if any(s.sample for s in step.seqs)]
    # the prompt step samples 1, then each verify emits up to 4: 1 + ceil(19 / 4) steps
    assert len(steps_with_output) == 1 + -(-19 // 4)
    assert scheduler.state.counters.generation_tokens == 20
    _pages_all_back(scheduler)


def test_a_wrong_draft_emits_the_accepted_run_and_the_correction():
    prompt = prompt_of(17, salt=3)
    oracle = Oracle(prompt, 16, k=3, wrong_at=1)       # d1 right, d2 wrong: emit 2
    scheduler, runner = make_engine(proposer=oracle)
    scheduler.admit(request("a", prompt, 16))
    outputs, _ = _drive(scheduler, runner)
    assert outputs["a"][0] == reference_tokens(prompt, 16, vocab=VOCAB)
    emitted = [len(r.token_ids) for c in _completions(runner) for r in c.results
               if r.token_ids]
    assert emitted[0] == 1 and set(emitted[1:-1]) == {2}


def _completions(runner):
    return list(runner.completed)


def test_stop_inside_an_accepted_run_drops_the_rest():
    prompt = prompt_of(19, salt=5)
    reference = reference_tokens(prompt, 30, vocab=VOCAB)
    eos = reference[6]
    assert eos not in reference[:6]
    oracle = Oracle(prompt, 30, k=4)
    scheduler, runner = make_engine(proposer=oracle, eos=frozenset({eos}))
    scheduler.admit(request("a", prompt, 30, ignore_eos=False))
    outputs, finishes = _drive(scheduler, runner)
    assert outputs["a"][0] == reference[:7]
    assert finishes[("a", 0)] is FinishReason.STOP
    _pages_all_back(scheduler)


def test_drafts_never_run_past_max_tokens_or_the_context():
    prompt = prompt_of(30, salt=7)
    oracle = Oracle(prompt, 9, k=4)
    scheduler, runner = make_engine(proposer=oracle, max_model_len=40)
    scheduler.admit(request("a", prompt, None))          # the context (40) ends it
    scheduler.admit(request("b", prompt_of(12, salt=8), 6))
    outputs, finishes = _drive(scheduler, runner)
    assert outputs["a"][0] == reference_tokens(prompt, 10, vocab=VOCAB)
    assert outputs["b"][0] == reference_tokens(prompt_of(12, salt=8), 6, vocab=VOCAB)
    assert finishes[("a", 0)] is FinishReason.LENGTH and finishes[("b", 0)] is FinishReason.LENGTH
    for s in _verify_steps(runner):
        assert s.end <= 40


def test_the_next_turn_reuses_a_verified_conversation():
    """Terminal capture after verification: the follow-up prompt repeats prompt + output and
    hits the cache at the exact consumed state."""
    prompt = prompt_of(23, salt=9)
    scheduler, runner = make_engine(proposer=Oracle(prompt, 12, k=3))
    scheduler.admit(request("a", prompt, 12, ends=(10,)))
    outputs, _ = _drive(scheduler, runner)
    follow_up = prompt + outputs["a"][0] + prompt_of(5, salt=10)
    scheduler.state.config = type(scheduler.state.config)(
        **{**_fields(scheduler.state.config), "proposer": Oracle(follow_up, 8, k=2)})
    admitted = scheduler.admit(request("b", follow_up, 8))
    assert admitted.usage.cached_tokens == len(prompt) + len(outputs["a"][0]) - 1
    again, _ = _drive(scheduler, runner)
    assert again["b"][0] == reference_tokens(follow_up, 8, vocab=VOCAB)


def _fields(config) -> dict:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def test_verification_under_two_frame_overlap_is_exact():
    prompts = {f"r{i}": prompt_of(9 + 5 * i, salt=20 + i) for i in range(4)}

    class Mixed:
        """Exact drafts for r0/r1, wrong ones for r2, none for r3 (plain decodes)."""

        def __init__(self) -> None:
            self.oracles = {rid: Oracle(p, 14, k=3, wrong_at=0 if rid == "r2" else -1)
                            for rid, p in prompts.items() if rid != "r3"}

        def propose(self, tokens, limit):
            for oracle in self.oracles.values():
                if list(tokens[:len(oracle.prompt)]) == oracle.prompt:
                    return oracle.propose(tokens, limit)
            return ()

    scheduler, runner = make_engine(proposer=Mixed(), overlap=True)
    for rid, prompt in prompts.items():
        scheduler.admit(request(rid, prompt, 14))
    outputs: dict = {}
    for _ in range(5000):
        ran, updates = run_step_two_frames(scheduler, runner)
        collect(outputs, updates)
        if not scheduler.has_work:
            break
        assert ran, "stalled"
    for rid, prompt in prompts.items():
        assert outputs[rid][0] == reference_tokens(prompt, 14, vocab=VOCAB), rid
    assert _verify_steps(runner)
    followers = [s for step in runner.steps for s in step.seqs if s.feeds_pending]
    assert followers and all(s.max_emit == 1 for s in followers)


def test_ngram_proposer_copies_the_continuation_of_the_latest_match():
    proposer = NgramProposer(num_tokens=3, max_ngram=3)
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # "1 2 3" occurred twice before; the latest one was followed by 7 8 1
    assert proposer.propose(tokens, 5) == (7, 8, 1)
    assert proposer.propose(tokens, 2) == (7, 8)
    assert proposer.propose(tokens, 0) == ()
    assert proposer.propose([4, 5, 6], 3) == ()                 # nothing repeats
    assert proposer.propose([5, 6, 5], 3) == (6, 5, 6)          # a 1-gram match, repeated
    assert proposer.propose([4, 9, 9, 9], 3) == (9, 9, 9)        # a run continues


def _scanned(proposer: NgramProposer, tokens: list[int], limit: int) -> tuple[int, ...]:
    """The proposal by a plain scan (what the byte search must equal)."""
    limit = min(limit, proposer.num_tokens)
    recent = tokens[-proposer.window:]
    for n in range(min(proposer.max_ngram, len(recent) - 1), proposer.min_ngram - 1, -1):
        for start in range(len(recent) - n - 1, -1, -1):
            if recent[start:start + n] == recent[-n:]:
                copied = list(recent)
                for i in range(limit):
                    copied.append(copied[start + n + i])
                return tuple(copied[len(recent):])
    return ()


def test_ngram_search_equals_a_scan():
    """Random sequences over small and large vocabularies, short windows included."""
    rng = random.Random(0)
    for trial in range(400):
        vocab = rng.choice([2, 3, 10, 300])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        low = rng.randrange(1, 3)
        proposer = NgramProposer(num_tokens=rng.randrange(1, 6), min_ngram=low,
                                 max_ngram=rng.randrange(low, 5),
                                 window=rng.choice([4, 16, 4096]))
        assert proposer.propose(tokens, 5) == _scanned(proposer, tokens, 5), (trial, tokens)


def test_ngram_proposals_keep_the_output_exact():
    """The fake's tokens are hashes, so most copied proposals are wrong: a prompt holding
    half the vocabulary makes 1-gram matches (proposals) frequent."""
    prompt = list(range(0, VOCAB, 2))
    scheduler, runner = make_engine(proposer=NgramProposer(num_tokens=4))
    scheduler.admit(request("a", prompt, 24))
    outputs, _ = _drive(scheduler, runner)
    assert outputs["a"][0] == reference_tokens(prompt, 24, vocab=VOCAB)
    assert _verify_steps(runner)
