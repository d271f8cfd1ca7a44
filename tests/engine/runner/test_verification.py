"""Verification steps on the real model (TorchRunner): a decode that feeds k drafts emits
the tokens the non-speculative engine would have produced, greedy or seeded sampling, for
exact, wrong and copied proposals; logprobs match. A graph runner built without speculation
refuses them (its buffers hold one sampled row per sequence); test_speculative.py runs the
graph runner's verification."""

from __future__ import annotations

import dataclasses
import random

import pytest

from services.common.errors import WorkerFailure
from services.engine.scheduler.proposals import NgramProposer
from tests.engine.fakes import run_until_idle
from tests.engine.runner.conftest import greedy_request, make_engine


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(151_000) for _ in range(length)]


class Continuations:
    """Proposes the known continuation of each prompt, with every `wrong_every`-th draft
    changed (0: all exact)."""

    def __init__(self, expected: dict[tuple[int, ...], list[int]], k: int,
                 wrong_every: int = 0) -> None:
        self.expected = expected
        self.k = k
        self.wrong_every = wrong_every
        self.count = 0

    def propose(self, tokens, limit):
        for prompt, output in self.expected.items():
            if tuple(tokens[:len(prompt)]) == prompt:
                done = len(tokens) - len(prompt)
                drafts = list(output[done:done + min(limit, self.k)])
                for i in range(len(drafts)):
                    self.count += 1
                    if self.wrong_every and self.count % self.wrong_every == 0:
                        drafts[i] = (drafts[i] + 7) % 151_000
                return tuple(drafts)
        return ()


def _with_proposer(engine, proposer):
    state = engine.scheduler.state
    state.config = dataclasses.replace(state.config, proposer=proposer)
    return engine


def _run(engine, requests):
    for req in requests:
        engine.scheduler.admit(req)
    return run_until_idle(engine.scheduler, engine.runner)


def _logprobs(engine, requests):
    """Run and collect each request's (tokens, logprobs) from the streamed deltas."""
    found: dict[str, tuple[list[int], list[float]]] = {}
    for req in requests:
        engine.scheduler.admit(req)
    from tests.engine.fakes import run_step
    while engine.scheduler.has_work:
        _, updates = run_step(engine.scheduler, engine.runner)
        for update in updates:
            for delta in update.deltas:
                tokens, lps = found.setdefault(update.request_id, ([], []))
                tokens.extend(delta.token_ids)
                lps.extend(lp.logprob for lp in delta.logprobs)
    return found


@pytest.mark.parametrize("wrong_every", [0, 3])
def test_greedy_verification_equals_plain_decoding(demo_source, wrong_every):
    prompts = [_prompt(37, 1), _prompt(12, 2), _prompt(70, 3)]
    plain = _logprobs(make_engine(demo_source), [
        greedy_request(f"r{i}", p, 14, logprobs=True) for i, p in enumerate(prompts)])
    expected = {tuple(p): plain[f"r{i}"][0] for i, p in enumerate(prompts)}
    engine = _with_proposer(make_engine(demo_source),
                            Continuations(expected, k=4, wrong_every=wrong_every))
    spec = _logprobs(engine, [greedy_request(f"r{i}", p, 14, logprobs=True)
                              for i, p in enumerate(prompts)])
    kinds = engine.scheduler.state.counters.launches_by_kind
    assert kinds["verify"] > 0
    for i in range(len(prompts)):
        tokens, lps = spec[f"r{i}"]
        assert tokens == plain[f"r{i}"][0]
        assert max(abs(a - b) for a, b in zip(lps, plain[f"r{i}"][1], strict=True)) < 1e-4
    if not wrong_every:   # exact drafts: 14 tokens in 1 + ceil(13 / 5) sampling steps each
        assert kinds["verify"] + kinds.get("decode", 0) <= 3 * len(prompts)


@pytest.mark.parametrize("wrong_every", [0, 2])
def test_seeded_sampling_is_the_same_with_proposals(demo_source, wrong_every):
    """The counter-based noise depends on the output position only, and a row at draft
    offset o samples as if the o drafts before it were accepted (penalties included): a
    seeded request draws the same tokens whether they came one per step or verified in
    runs."""
    prompt = _prompt(25, 4)
    request = [greedy_request("s", prompt, 24, temperature=0.9, top_p=0.95, seed=11,
                              repetition_penalty=1.3, presence_penalty=0.5)]
    plain = _run(make_engine(demo_source), request)
    engine = _with_proposer(make_engine(demo_source), Continuations(
        {tuple(prompt): plain["s"][0]}, k=3, wrong_every=wrong_every))
    spec = _run(engine, request)
    assert spec["s"][0] == plain["s"][0]
    assert engine.scheduler.state.counters.launches_by_kind["verify"] > 0


def test_copied_proposals_on_a_repetitive_output(demo_source):
    """Prompt lookup on the real model: whatever it proposes, greedy output is unchanged."""
    prompt = _prompt(9, 6) * 6
    plain = _run(make_engine(demo_source), [greedy_request("c", prompt, 30)])
    engine = _with_proposer(make_engine(demo_source), NgramProposer(num_tokens=3))
    assert _run(engine, [greedy_request("c", prompt, 30)])["c"][0] == plain["c"][0]


def test_a_graph_runner_built_without_speculation_refuses_drafts(demo_source):
    prompt = _prompt(20, 5)
    engine = _with_proposer(make_engine(demo_source, runner="graph"),
                            Continuations({tuple(prompt): [1, 2, 3, 4, 5, 6]}, k=2))
    engine.scheduler.admit(greedy_request("g", prompt, 6))
    with pytest.raises(WorkerFailure, match="verifies 2 drafts, the runner was built for 0"):
        run_until_idle(engine.scheduler, engine.runner)


def test_terminal_captures_ride_along_in_verification_graphs(demo_source):
    """Choices that end while others verify save their terminal state in the verification
    graph's step (as a decode graph's do), not in an eager step: on the H200 an eager
    verification of 16 sequences took 22.5 ms against 9.7 for 32 in a graph. The graph
    runner's padded graph body runs on the CPU too."""
    prompts = [_prompt(30, 7), _prompt(21, 8), _prompt(44, 9)]
    lengths = (5, 14, 23)
    requests = [greedy_request(f"t{i}", p, n) for i, (p, n) in enumerate(zip(prompts, lengths,
                                                                              strict=True))]
    plain = _run(make_engine(demo_source), requests)
    engine = _with_proposer(
        make_engine(demo_source, runner="graph", speculative_method="ngram",
                    num_speculative_tokens=4),
        Continuations({tuple(p): plain[f"t{i}"][0] for i, p in enumerate(prompts)}, k=4))
    riding = []
    submit = engine.runner.submit

    def watched(step):
        if step.kind == "verify" and any(not s.token_ids for s in step.seqs):
            riding.append(step.fence)
        return submit(step)

    engine.runner.submit = watched
    spec = _run(engine, requests)
    assert {rid: out[0] for rid, out in spec.items()} == \
        {rid: out[0] for rid, out in plain.items()}
    assert riding, "no choice ended beside a verification"
    reasons = engine.runner.eager_verify_reasons
    assert set(reasons) <= {"a prefill chunk or prompt scoring beside it (mixed)"}, reasons
    assert engine.runner.verify_graph_steps >= len(riding)
