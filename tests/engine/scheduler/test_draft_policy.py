"""The width policy with a draft model (a `SequenceProposer`: its forwards cost time), through
the scheduler and the fake runner: the width is chosen before drafting and the drafter is asked
for exactly that many drafts (none while the width is zero: no forwards wasted on drafts that
are not verified), its forwards are counted, and with the cost model a drafter slower than
the drafts it saves stops being asked (the measured forward enters the per-draft cost)."""

from __future__ import annotations

from services.engine.scheduler.speculation import DRAFT
from tests.engine.fakes import reference_tokens, run_until_idle
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request


class Drafter:
    """A SequenceProposer over the reference continuation (`wrong`: every draft off by one);
    records each call's handle and limit; `forward_s` as a drafter measures it."""

    num_tokens = 4
    source = DRAFT

    def __init__(self, prompt, count: int, *, wrong: bool = False, forward_s: float = 0.0):
        self.prompt = list(prompt)
        self.reference = reference_tokens(prompt, count + 8, vocab=VOCAB)
        self.wrong = wrong
        self.forward_s = forward_s
        self.calls: list[tuple[object, int]] = []

    def propose_for(self, handle, tokens, limit, target_pages=()):
        self.calls.append((handle, limit))
        done = len(tokens) - len(self.prompt)
        drafts = self.reference[done:done + limit]
        if self.wrong:
            drafts = [(t + 1) % VOCAB for t in drafts]
        return tuple(drafts), len(drafts)


def _widths(runner) -> list[int]:
    return [len(s.draft_token_ids) for step in runner.steps for s in step.seqs
            if s.output_index > 0 and s.sample]


def test_the_drafter_drafts_the_chosen_width():
    prompt = prompt_of(14, salt=3)
    drafter = Drafter(prompt, 40)
    scheduler, runner = make_engine(proposer=drafter)
    scheduler.admit(request("a", prompt, 40))
    assert run_until_idle(scheduler, runner)["a"][0] == reference_tokens(prompt, 40, vocab=VOCAB)
    widths = [w for w in _widths(runner) if w]
    assert widths and max(widths) == 4
    # asked for what was verified (the output limit may cut the last), one handle
    assert [limit for _, limit in drafter.calls][:len(widths) - 1] == widths[:-1]
    assert len({handle for handle, _ in drafter.calls}) == 1
    counters = scheduler.state.counters
    assert counters.spec_drafter_steps == sum(widths)
    assert counters.spec_accepted_tokens == counters.spec_draft_tokens


def test_no_drafting_while_the_width_is_zero():
    prompt = prompt_of(13, salt=4)
    drafter = Drafter(prompt, 80, wrong=True)
    scheduler, runner = make_engine(proposer=drafter)
    scheduler.admit(request("a", prompt, 80))
    assert run_until_idle(scheduler, runner)["a"][0] == reference_tokens(prompt, 80, vocab=VOCAB)
    widths = _widths(runner)
    assert widths.count(0) > 40
    assert len(drafter.calls) == sum(1 for w in widths if w)     # zero-width rounds: no call


def test_a_slow_drafter_is_switched_off_by_the_cost_model():
    """Exact drafts, but each draft forward costs 50 measured decodes (1 ms in the fake):
    after the first verified rounds measure the decode, no more drafts are asked for."""
    prompt = prompt_of(12, salt=5)
    slow = Drafter(prompt, 60, forward_s=0.05)
    scheduler, runner = make_engine(proposer=slow, cost_model=True)
    scheduler.admit(request("a", prompt, 60))
    assert run_until_idle(scheduler, runner)["a"][0] == reference_tokens(prompt, 60, vocab=VOCAB)
    widths = _widths(runner)
    late = widths[len(widths) // 2:]
    assert sum(1 for w in late if w) <= len(late) // 16 + 1     # probes at most
    fast = Drafter(prompt, 60, forward_s=0.0)
    scheduler, runner = make_engine(proposer=fast, cost_model=True)
    scheduler.admit(request("a", prompt, 60))
    run_until_idle(scheduler, runner)
    assert sum(1 for w in _widths(runner) if w) > 5
