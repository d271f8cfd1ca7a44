"""Sampling with speculation preserves the target distribution (CPU float32, the tiny Qwen3
checkpoint): over many seeds, the next two tokens after a sampled first token, verified
against the target's greedy two-token continuation as drafts, follow the model's own
probabilities (transformers, float32) by a chi-square test; and each seed draws exactly the
tokens it draws without speculation (seeded requests reproduce)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.common.core import open_model
from tests.engine.model.checkpoints import SPECS, build_checkpoint, load_reference
from tests.engine.runner.conftest import greedy_request, make_engine
from tests.engine.runner.test_speculative import _drive

PROMPT = [5, 17, 33, 2, 90, 41, 7]
TEMPERATURE = 3.0
SAMPLES = 400
# the chi-square distribution's 0.999 quantile at 3 degrees of freedom (4 cells)
CHI2_CRITICAL_3DF = 16.266


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(SPECS["qwen3-qknorm-sharded"], tmp_path_factory.mktemp("chi2"))


class Greedy:
    """Proposes the target's greedy two-token continuation (transformers float32) and keeps
    the target's tempered next-token probabilities along it."""

    num_tokens = 2
    source = "copy"

    def __init__(self, model) -> None:
        self.model = model
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}

    def probs(self, tokens) -> torch.Tensor:
        key = tuple(tokens)
        if key not in self.cache:
            with torch.no_grad():
                logits = self.model(torch.tensor([list(key)])).logits[0, -1].float()
            self.cache[key] = torch.softmax(logits / TEMPERATURE, -1)
        return self.cache[key]

    def continuation(self, tokens) -> tuple[int, int]:
        a = int(self.probs(tokens).argmax())
        return a, int(self.probs([*tokens, a]).argmax())

    def propose(self, tokens, limit):
        if len(tokens) != len(PROMPT) + 1:
            return ()
        return self.continuation(tokens)[:limit]


def _requests():
    return [greedy_request(f"s{seed}", PROMPT, 4, temperature=TEMPERATURE, seed=seed)
            for seed in range(SAMPLES)]


def test_verified_sampling_preserves_the_distribution(checkpoint):
    source = open_model(checkpoint)
    values = dict(page_size=4, max_num_seqs=16, kv_cache_bytes=8 << 20, prefill_chunk_size=64,
                  max_num_batched_tokens=128, max_waiting=SAMPLES)
    proposer = Greedy(load_reference(checkpoint))
    engine = make_engine(source, speculative_method="ngram", num_speculative_tokens=2,
                         **values)
    state = engine.scheduler.state
    state.config = dataclasses.replace(state.config, proposer=proposer)
    spec = _drive(engine, _requests())
    counters = state.counters
    assert counters.spec_drafts == SAMPLES and counters.spec_accepted_tokens > 0
    check_target_distribution(spec, proposer)
    # the same seeds without speculation: the same tokens, seed for seed
    plain = _drive(make_engine(source, **values), _requests())
    assert {rid: out[0] for rid, out in plain.items()} == \
        {rid: out[0] for rid, out in spec.items()}


def check_target_distribution(spec, target) -> None:
    """Chi-square test that each seed's 2nd and 3rd tokens (drafts `target.continuation`
    proposes after the 1st) follow the target's tempered probabilities (`target.probs`):
    cells both drafts accepted, the first only, the best other token, anything else."""
    observed = [0.0] * 4
    expected = [0.0] * 4
    for seed in range(SAMPLES):
        t1, t2, t3 = spec[f"s{seed}"][0][:3]
        head = [*PROMPT, t1]
        a, b = target.continuation(head)
        p2 = target.probs(head)
        p3 = target.probs([*head, a])
        ranked = [int(t) for t in p2.argsort(descending=True)[:2]]
        other = ranked[1] if ranked[0] == a else ranked[0]
        cells = [float(p2[a] * p3[b]), float(p2[a] * (1 - p3[b])), float(p2[other])]
        cells.append(1.0 - sum(cells))
        for k, p in enumerate(cells):
            expected[k] += p
        cell = (0 if t3 == b else 1) if t2 == a else 2 if t2 == other else 3
        observed[cell] += 1
    assert min(expected) >= 5, expected
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    assert chi2 < CHI2_CRITICAL_3DF, (observed, expected, chi2)
