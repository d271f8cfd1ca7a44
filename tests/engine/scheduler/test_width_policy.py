"""The width policy against the best fixed width, through the whole scheduler.

The fake runner reports GPU-measured step durations (an H200 at the Qwen3-8B shape: a decode
4.55 ms, a verification of w rows 5.0-5.25 ms), the cost model learns them, and an oracle
proposer offers the true continuation with each draft corrupted with probability 1 - a, so
draft d is accepted with probability a given drafts 0..d-1 were. The policy has to find the
best width on its own (from the prior, through noise that drives some depth's mean low for
a while) and keep most of what the best fixed width gets. That is measured on the same
acceptances, replayed (common random numbers): against the expected E_w = (1 - a^(w+1)) /
(1 - a) tokens a round, one run's luck alone moves the speedup by a few percent (about 4%
at a = 0.5 over 256 tokens), as much as the policy may lose. Also: observational weight ages
without changing the mean, and optimistic probes are funded by 1% of the rounds' cost."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from services.engine.scheduler.speculation import (
    AGING,
    COPY,
    MIN_GAIN,
    PRIOR_MEAN,
    PRIOR_WEIGHT,
    PROBE_CREDIT,
    PROBE_SAVINGS,
    AcceptanceStats,
    choose_width,
    plan_width,
)
from tests.engine.fakes import FakeRunner, reference_tokens, run_like_the_loop
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request

DECODE_MS = 4.55
VERIFY_MS = {2: 5.0, 3: 5.06, 4: 5.09, 5: 5.23, 6: 5.24, 7: 5.25}   # by rows (1 + drafts)
PREFILL_MS = 20.0
NUM_TOKENS = 256
SEEDS = range(6)


class NoisyOracle:
    """The reference continuation with the draft for each output position wrong (never the
    reference token) with probability 1 - a, drawn once per position: a round's drafts are
    accepted independently with probability a each, and every policy meets the same
    acceptances (common random numbers: `best_fixed_speedup` replays them)."""

    source = COPY

    def __init__(self, prompt, count: int, a: float, k: int, seed: int) -> None:
        self.prompt = list(prompt)
        self.reference = reference_tokens(prompt, count + k + 1, vocab=VOCAB)
        self.num_tokens = k
        rng = random.Random(seed)
        self.correct = [rng.random() < a for _ in self.reference]

    def propose(self, tokens, limit):
        done = len(tokens) - len(self.prompt)
        end = done + min(limit, self.num_tokens)
        return tuple(t if ok else (t + 1) % VOCAB
                     for t, ok in zip(self.reference[done:end], self.correct[done:end],
                                      strict=True))


class TimedRunner(FakeRunner):
    """The fake runner reporting each step's duration from the H200 table."""

    def submit(self, step) -> int:
        fence = super().submit(step)
        self.done[-1] = dataclasses.replace(self.done[-1], duration_s=_step_ms(step) / 1e3)
        return fence


def _step_ms(step) -> float:
    if step.kind == "verify":
        return VERIFY_MS[step.width]
    return DECODE_MS if step.kind == "decode" else PREFILL_MS


def simulated_speedup(oracle: NoisyOracle) -> float:
    """Plain decoding's time for the generated tokens over the simulated decode and
    verification time (the prefill, the same either way, left out)."""
    scheduler, _ = make_engine(cost_model=True, overlap=True, proposer=oracle,
                               num_pages=1024)
    runner = TimedRunner(num_pages=1024, page_size=4, num_snapshots=32, vocab=VOCAB)
    runner.window = 2
    scheduler.admit(request("o", oracle.prompt, NUM_TOKENS))
    outputs = run_like_the_loop(scheduler, runner)
    assert outputs["o"][0] == oracle.reference[:NUM_TOKENS]
    generation_ms = sum(_step_ms(s) for s in runner.steps if s.kind in ("verify", "decode"))
    return (NUM_TOKENS - 1) * DECODE_MS / generation_ms    # the prefill sampled the first


def best_fixed_speedup(oracle: NoisyOracle) -> float:
    """The best fixed width's speedup on the same acceptances, replayed: each round
    verifies min(w, tokens left - 1) drafts and emits the accepted ones plus one."""
    best = 0.0
    for width in range(1, oracle.num_tokens + 1):
        emitted, ms = 1, 0.0
        while emitted < NUM_TOKENS:
            drafts = min(width, NUM_TOKENS - emitted - 1)
            accepted = next((d for d in range(drafts) if not oracle.correct[emitted + d]),
                            drafts)
            ms += VERIFY_MS[drafts + 1] if drafts else DECODE_MS
            emitted += accepted + 1
        best = max(best, (NUM_TOKENS - 1) * DECODE_MS / ms)
    return best


@pytest.mark.parametrize("k", (2, 4, 6))
@pytest.mark.parametrize("a", (0.5, 0.7, 0.9))
def test_the_policy_keeps_most_of_the_best_fixed_speedup(a, k):
    oracles = [NoisyOracle(prompt_of(16, salt=seed), NUM_TOKENS, a, k, seed) for seed in SEEDS]
    ratios = [simulated_speedup(o) / best_fixed_speedup(o) for o in oracles]
    assert sum(ratios) / len(ratios) >= 0.95, ratios


def _rounds(stats: AcceptanceStats, a: float, num_rounds: int, limit: int, row_cost: float,
            seed: int = 0) -> list[tuple[int, int, float, float]]:
    """Drive one choice's statistics as the policy does through `num_rounds` rounds of
    i.i.d. acceptance `a` with `limit` proposals each; returns each round's (ordinary width,
    verified width, the probe due, the budget before it)."""
    rng = random.Random(seed)
    rounds = []
    stats.proposed = True                              # the proposer always finds drafts
    for _ in range(num_rounds):
        ordinary = choose_width(stats, COPY, limit, row_cost)
        due, budget = stats.probe_cost, stats.budget
        width = plan_width(stats, COPY, limit, row_cost)
        stats.close_round(COPY, width, limit, row_cost)
        if width:
            accepted = next((d for d in range(width) if rng.random() >= a), width)
            stats.observe(COPY, width, accepted + 1, accepted + 1)
        rounds.append((ordinary, width, due, budget))
    return rounds


def test_aging_lowers_the_weight_a_round_does_not_observe_and_keeps_the_mean():
    stats = AcceptanceStats()
    for _ in range(5):
        stats.observe(COPY, offered=3, emitted=2, committed=2)   # d0 accepted, d1 rejected
    depths = [stats.depth(COPY, d) for d in range(3)]
    assert (depths[2].mean, depths[2].weight) == (PRIOR_MEAN, PRIOR_WEIGHT)   # unobserved
    before = [(d.mean, d.weight) for d in depths]
    stats.observe(COPY, offered=3, emitted=1, committed=1)       # d0 rejected, d1, d2 not seen
    assert depths[0].mean < before[0][0]
    for depth, (mean, weight) in zip(depths[1:], before[1:], strict=True):
        assert depth.mean == mean and depth.weight == pytest.approx(weight * AGING)
    rejected, optimistic = depths[1], depths[1].optimistic
    mean, weight = rejected.mean, rejected.weight
    for _ in range(30):                                          # plain rounds age them all
        stats.close_round(COPY, 0, 3, 0.05)
    assert rejected.mean == mean and rejected.weight == pytest.approx(weight * AGING ** 30)
    assert rejected.optimistic > optimistic + 0.1


def test_a_probe_waits_until_the_budget_covers_it():
    stats = AcceptanceStats(budget=0.0)
    for _ in range(3):                                 # depth 0 rejected: width 0
        stats.observe(COPY, offered=1, emitted=1, committed=1)
    assert choose_width(stats, COPY, 4, 0.05) == 0
    assert choose_width(stats, COPY, 4, 0.05, optimistic=True) > 0
    rounds = _rounds(stats, 0.0, 200, 4, 0.05)
    probes = [i for i, (_, width, _, _) in enumerate(rounds) if width]
    # one draft from width zero costs its row and the overlap: 15 plain rounds' credit
    cost = 0.05 + MIN_GAIN
    assert all(width <= 1 for _, width, _, _ in rounds)
    assert probes[0] == math.ceil(cost / PROBE_CREDIT)
    assert len(probes) <= len(rounds) * PROBE_CREDIT / cost + 1
    assert all(due == pytest.approx(cost) and budget >= due
               for _, width, due, budget in rounds if width)
    fresh = AcceptanceStats()                          # a new choice starts with savings
    for _ in range(3):
        fresh.observe(COPY, offered=1, emitted=1, committed=1)
    assert [width for _, width, _, _ in _rounds(fresh, 0.0, 2, 4, 0.05)] == [0, 1]


@pytest.mark.parametrize("a", (0.0, 1.0))
def test_probes_spend_about_one_percent_of_the_cost(a):
    """Where the ordinary width is already the best (0 for a = 0, the limit for a = 1),
    probes spend no more than the budget earns, 1% of the rounds' cost: all of it at a = 0
    (the optimistic width keeps rising as the weight ages), none at a = 1 once the width
    is the limit (nothing is wider)."""
    limit, row_cost = 4, 0.05
    rounds = _rounds(AcceptanceStats(), a, 5000, limit, row_cost)
    raw = sum(1.0 + width * row_cost for _, width, _, _ in rounds)
    spent = sum(due for _, _, due, _ in rounds)
    assert all(ordinary == (limit if a else 0) for ordinary, _, _, _ in rounds[50:])
    assert all(due for ordinary, width, due, _ in rounds if width > ordinary)
    assert spent <= PROBE_CREDIT * raw + PROBE_SAVINGS
    assert spent >= 0.009 * raw if a == 0.0 else not any(due for *_, due, _ in rounds[50:])
