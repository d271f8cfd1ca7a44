"""The speculation policy through the scheduler and the fake runner: per-request opt-out,
acceptance statistics (by depth, censored inside a stopped run) that choose each request's
width down to zero (and probe again), the batch switch-off from measured step costs, the
speculative counters, and pages that only rejected drafts reached going back to the pool."""

from __future__ import annotations

import dataclasses
import itertools
import time

from services.engine.scheduler.speculation import (
    COPY,
    DEFAULT_ROW_COST,
    MIN_GAIN,
    PRIOR_MEAN,
    PRIOR_WEIGHT,
    PROBE_CREDIT,
    AcceptanceStats,
    choose_width,
    verify_label,
)
from tests.engine.fakes import collect, reference_tokens, run_step, run_until_idle
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request
from tests.engine.scheduler.test_verification import Oracle


class Wrong:
    """Proposes k drafts that are always wrong (never the reference token)."""

    num_tokens = 4
    source = COPY

    def __init__(self, prompt, count: int) -> None:
        self.prompt = list(prompt)
        self.reference = reference_tokens(prompt, count + 8, vocab=VOCAB)

    def propose(self, tokens, limit):
        done = len(tokens) - len(self.prompt)
        return tuple((t + 1) % VOCAB for t in self.reference[done:done + min(4, limit)])


def _two_frames(scheduler, runner) -> dict:
    """Drive to idle with a window of two (the engine loop's two-frame overlap)."""
    from tests.engine.fakes import run_step_two_frames

    outputs: dict = {}
    while scheduler.has_work:
        _, updates = run_step_two_frames(scheduler, runner)
        collect(outputs, updates)
    return outputs


def _drafted(runner) -> list:
    return [s for step in runner.steps for s in step.seqs if s.draft_token_ids]


class Both:
    """One oracle per prompt (each proposes only for its own request)."""

    num_tokens = 3
    source = COPY

    def __init__(self, *oracles) -> None:
        self.oracles = oracles

    def propose(self, tokens, limit):
        for oracle in self.oracles:
            if list(tokens[:len(oracle.prompt)]) == oracle.prompt:
                return oracle.propose(tokens, limit)
        return ()


def test_a_request_that_opts_out_never_verifies():
    on, off = prompt_of(15, salt=1), prompt_of(16, salt=11)
    oracles = Oracle(on, 12, k=3), Oracle(off, 12, k=3)
    scheduler, runner = make_engine(proposer=Both(*oracles))
    scheduler.admit(dataclasses.replace(request("off", off, 12), speculative=False))
    scheduler.admit(request("on", on, 12))
    outputs = run_until_idle(scheduler, runner)
    assert outputs["off"][0] == reference_tokens(off, 12, vocab=VOCAB)
    assert outputs["on"][0] == reference_tokens(on, 12, vocab=VOCAB)
    assert oracles[0].calls > 0 and oracles[1].calls == 0
    assert _drafted(runner)


def test_failing_drafts_narrow_the_width_to_zero_then_probe():
    prompt = prompt_of(13, salt=2)
    scheduler, runner = make_engine(proposer=Wrong(prompt, 60))
    scheduler.admit(request("a", prompt, 60))
    outputs = run_until_idle(scheduler, runner)
    assert outputs["a"][0] == reference_tokens(prompt, 60, vocab=VOCAB)
    widths = [len(s.draft_token_ids) for step in runner.steps for s in step.seqs
              if s.output_index > 0 and s.sample]
    assert widths[0] >= 2                   # the prior's width first
    later = widths[widths.index(0):]
    assert set(later) == {0, 1}             # then plain, with one-draft probes, funded by 1%
    probes = [i for i, w in enumerate(later) if w]      # of the rounds' cost: each waits
    wait = (MIN_GAIN + DEFAULT_ROW_COST) / PROBE_CREDIT  # for its row's and overlap's credit
    assert all(b - a >= wait - 1 for a, b in itertools.pairwise(probes))
    counters = scheduler.state.counters
    assert counters.spec_accepted_tokens == 0 and counters.spec_draft_tokens == sum(widths)
    assert counters.spec_rounds == len(widths) and counters.spec_depth == sum(widths)


def test_acceptance_statistics_by_depth():
    stats = AcceptanceStats()
    for _ in range(30):
        stats.observe(COPY, offered=3, emitted=2, committed=2)   # d0 accepted, d1 rejected
    assert stats.depth(COPY, 0).mean > 0.9 and stats.depth(COPY, 1).mean < 0.1
    assert stats.depth(COPY, 2).mean == PRIOR_MEAN               # never reached: the prior
    assert choose_width(stats, COPY, 3, 0.05) == 1
    censored = AcceptanceStats()
    censored.observe(COPY, offered=4, emitted=5, committed=2)    # stopped at token 2 of 5
    depths = [censored.depth(COPY, d) for d in range(4)]
    assert all(d.mean > PRIOR_MEAN and d.weight > PRIOR_WEIGHT for d in depths[:2])
    assert all((d.mean, d.weight) == (PRIOR_MEAN, PRIOR_WEIGHT) for d in depths[2:])
    assert choose_width(AcceptanceStats(), COPY, 0, 0.0) == 0
    assert choose_width(stats, "draft", 3, 0.05) >= 2           # another source: the prior


def test_the_batch_switch_off_uses_measured_costs():
    """Verification that costs more than its expected tokens are worth turns speculation off
    for the batch; cheap verification keeps it on."""
    prompts = [prompt_of(10, salt=30 + i) for i in range(4)]

    class Each:
        num_tokens = 3
        source = COPY

        def __init__(self) -> None:
            self.oracles = [Oracle(p, 20, k=3) for p in prompts]

        def propose(self, tokens, limit):
            for oracle in self.oracles:
                if list(tokens[:len(oracle.prompt)]) == oracle.prompt:
                    return oracle.propose(tokens, limit)
            return ()

    for verify_cost, expect_drafts in ((2.0, False), (1.05, True)):
        scheduler, runner = make_engine(proposer=Each(), cost_model=True)
        costs = scheduler.state.costs
        for width in range(2, 5):
            costs.observe(kind="verify", label=verify_label(4, width), batch_capacity=4,
                          token_capacity=16, num_requests=4, duration_s=verify_cost, now=0.0)
        costs.observe(kind="decode", label="b4 t4", batch_capacity=4, token_capacity=4,
                      num_requests=4, duration_s=1.0, now=0.0)
        for i, prompt in enumerate(prompts):
            scheduler.admit(request(f"r{i}", prompt, 20))
        costs.stale_after_s = 1e9
        outputs = run_until_idle(scheduler, runner)
        for i, prompt in enumerate(prompts):
            assert outputs[f"r{i}"][0] == reference_tokens(prompt, 20, vocab=VOCAB)
        assert bool(_drafted(runner)) is expect_drafts
        assert (scheduler.state.counters.speculation_off > 0) is not expect_drafts


def test_pages_only_rejected_drafts_reached_go_back():
    prompt = prompt_of(14, salt=4)                       # page size 4
    scheduler, runner = make_engine(proposer=Oracle(prompt, 30, k=4, wrong_at=0))
    scheduler.admit(request("a", prompt, 30))
    res = scheduler.state.resources
    outputs: dict = {}
    while scheduler.has_work:
        _, updates = run_step(scheduler, runner)
        collect(outputs, updates)
        for seq in scheduler.state.running.values():
            # resident between steps: never more pages than its known tokens need
            assert len(seq.page_ids) <= res.pages_for(seq.total_len), len(seq.page_ids)
    assert outputs["a"][0] == reference_tokens(prompt, 30, vocab=VOCAB)
    # some verification's drafts reached a page its accepted tokens did not
    assert any(res.pages_for(s.end) > res.pages_for(s.start + 2) for s in _drafted(runner))
    res.evict_all()
    assert res.pages.num_free == res.pages.capacity


def test_a_stop_inside_a_verified_run_keeps_no_terminal_state():
    """The stop id is an accepted draft in the middle of a run: the runners keep the hidden
    state of the run's last emitted row, not of the stop, so no terminal checkpoint is
    taken (a wrong one would poison the next turn)."""
    prompt = prompt_of(19, salt=5)
    reference = reference_tokens(prompt, 30, vocab=VOCAB)
    eos = reference[6]
    assert eos not in reference[:6]
    scheduler, runner = make_engine(proposer=Oracle(prompt, 30, k=4), eos=frozenset({eos}))
    scheduler.admit(request("a", prompt, 30, ignore_eos=False))
    outputs = run_until_idle(scheduler, runner)
    assert outputs["a"][0] == reference[:7]
    assert any(len(r.token_ids) > 1 and eos in r.token_ids[:-1]
               for c in runner.completed for r in c.results)
    assert not any(step.kind == "snapshot" for step in runner.steps)
    plain, plain_runner = make_engine(eos=frozenset({eos}))
    plain.admit(request("a", prompt, 30, ignore_eos=False))
    run_until_idle(plain, plain_runner)             # without drafts it is kept
    assert any(step.kind == "snapshot" for step in plain_runner.steps)


def test_a_choice_without_proposals_keeps_overlapping():
    """Under two-frame overlap, a choice whose proposer finds nothing decodes behind its
    in-flight step; a due probe that finds nothing does not stop that for good."""
    class Nothing:
        num_tokens = 4
        source = COPY

        def propose(self, tokens, limit):
            return ()

    prompt = prompt_of(11, salt=6)
    scheduler, runner = make_engine(proposer=Nothing(), overlap=True)
    scheduler.admit(request("a", prompt, 120))
    outputs = _two_frames(scheduler, runner)
    assert outputs["a"][0] == reference_tokens(prompt, 120, vocab=VOCAB)
    followers = [i for i, step in enumerate(runner.steps)
                 if any(s.feeds_pending for s in step.seqs)]
    assert len(followers) > 80 and followers[-1] > len(runner.steps) - 5


def test_drafts_stay_within_the_step_token_budget():
    """Every decoding sequence advances; drafts only fill what max_num_batched_tokens leaves
    (the runners' input buffers are sized from it)."""
    prompts = [prompt_of(9, salt=40 + i) for i in range(8)]
    oracles = [Oracle(p, 150, k=30) for p in prompts]
    scheduler, runner = make_engine(proposer=Both(*oracles), max_num_batched_tokens=64,
                                    max_num_seqs=8)
    for i, prompt in enumerate(prompts):
        scheduler.admit(request(f"r{i}", prompt, 150))
    outputs = run_until_idle(scheduler, runner)
    for i, prompt in enumerate(prompts):
        assert outputs[f"r{i}"][0] == reference_tokens(prompt, 150, vocab=VOCAB)
    widest = max(step.num_tokens for step in runner.steps if step.kind == "verify")
    assert 56 < widest <= 64                  # the budget bound the widths


def _costly_verification(scheduler, batch: int, verify_cost: float, now: float) -> None:
    """Measured costs where any verification costs `verify_cost` decodes, whatever its
    width (observed at `now`): spread over the widest one's rows, one draft looks worth
    verifying, and the batch switch-off is what finds the narrow verification a loss."""
    costs = scheduler.state.costs
    for width in range(2, 6):
        costs.observe(kind="verify", label=verify_label(batch, width), batch_capacity=batch,
                      token_capacity=batch * width, num_requests=batch,
                      duration_s=verify_cost, now=now)
    costs.observe(kind="decode", label=f"b{batch} t{batch}", batch_capacity=batch,
                  token_capacity=batch, num_requests=batch, duration_s=1.0, now=now)


def test_a_switched_off_choice_overlaps_until_its_next_probe():
    """Drafts the batch switch-off strips count as a zero width: under two-frame overlap the
    choice decodes behind its in-flight step until a probe is due (not waiting for its
    tokens every round to propose drafts that are stripped again). Three drafts spread a
    verification's cost thin enough that one looks worth it: the switch-off strips it."""
    prompt = prompt_of(12, salt=7)
    scheduler, runner = make_engine(proposer=Both(Oracle(prompt, 120, k=4)), overlap=True,
                                    cost_model=True)
    _costly_verification(scheduler, 1, 2.0, time.monotonic())
    scheduler.state.costs.stale_after_s = 1e9
    scheduler.admit(request("a", prompt, 120))
    outputs = _two_frames(scheduler, runner)
    assert outputs["a"][0] == reference_tokens(prompt, 120, vocab=VOCAB)
    assert not _drafted(runner)                              # every round switched off
    switched = scheduler.state.counters.speculation_off
    followers = [step for step in runner.steps if any(s.feeds_pending for s in step.seqs)]
    assert len(followers) > 90, (len(followers), switched)
    assert 0 < switched <= 2            # the switch-off holds: no round proposes again


def test_a_stale_verification_estimate_is_measured_again():
    """A verification estimate older than the estimator's staleness no longer switches the
    batch off: the round verifies (and is measured), else a once-slow measurement would
    keep speculation off for good."""
    prompt = prompt_of(12, salt=8)
    for stale, expect_drafts in ((False, False), (True, True)):
        scheduler, runner = make_engine(proposer=Oracle(prompt, 20, k=4), cost_model=True)
        now = time.monotonic()
        _costly_verification(scheduler, 1, 2.0, now - 120.0 if stale else now)
        scheduler.state.costs.stale_after_s = 60.0
        scheduler.admit(request("a", prompt, 20))
        outputs = run_until_idle(scheduler, runner)
        assert outputs["a"][0] == reference_tokens(prompt, 20, vocab=VOCAB)
        assert bool(_drafted(runner)) is expect_drafts


def test_a_batch_switched_off_keeps_every_choice_in_step():
    """When the batch switch-off strips drafts, the batch is too large for verification to
    pay whatever each request accepts: no choice probes again while the batch stays that
    large (a probe waits for its in-flight step and skips one step: 1 in 17 of each
    choice's steps), until the verification estimate goes stale and one round measures it
    again."""
    prompts = [prompt_of(12, salt=40 + i) for i in range(4)]
    scheduler, runner = make_engine(proposer=Both(*(Oracle(p, 100, k=3) for p in prompts)),
                                    overlap=True, cost_model=True)
    _costly_verification(scheduler, 4, 2.0, time.monotonic())
    scheduler.state.costs.stale_after_s = 1e9
    for i, prompt in enumerate(prompts):
        scheduler.admit(request(f"r{i}", prompt, 100))
    outputs = _two_frames(scheduler, runner)
    for i, prompt in enumerate(prompts):
        assert outputs[f"r{i}"][0] == reference_tokens(prompt, 100, vocab=VOCAB)
    assert not _drafted(runner)
    decodes = [step for step in runner.steps
               if all(s.output_index > 0 for s in step.seqs)]
    # after the first switch-off every decode step carries all four choices
    assert len(decodes) >= 95 and all(len(step.seqs) == 4 for step in decodes[4:]), \
        [len(step.seqs) for step in decodes]
    assert scheduler.state.counters.speculation_off <= 2


def test_a_smaller_batch_speculates_again():
    """The switch-off holds while the batch fills the capacity it stripped (4: one choice
    finishing leaves 3, the same bucket, and nobody drafts); when the others finish, the
    last choice (a batch of one, cheap to verify) proposes drafts again."""
    prompts = [prompt_of(12, salt=50 + i) for i in range(4)]
    lengths = [20, 40, 40, 90]
    scheduler, runner = make_engine(proposer=Both(*(Oracle(p, 90, k=3) for p in prompts)),
                                    cost_model=True)
    now = time.monotonic()
    _costly_verification(scheduler, 4, 2.0, now)
    _costly_verification(scheduler, 1, 1.05, now)               # a batch of one: cheap
    scheduler.state.costs.stale_after_s = 1e9
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        scheduler.admit(request(f"r{i}", prompt, n))
    outputs = run_until_idle(scheduler, runner)
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        assert outputs[f"r{i}"][0] == reference_tokens(prompt, n, vocab=VOCAB)
    drafted = _drafted(runner)
    assert drafted and all(s.output_index >= 40 for s in drafted)   # only once alone
    # once: leaving 3 of 4 did not end it (a re-evaluation would strip a second round)
    assert scheduler.state.counters.speculation_off == 1
