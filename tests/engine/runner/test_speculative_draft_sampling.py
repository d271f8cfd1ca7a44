"""Sampling with a draft model (`speculative_method draft`, the target as its own draft: its
greedy two-token continuation is drafted in the round after the first sampled token)
preserves the target distribution: the chi-square test of test_speculative_sampling.py over
the next two tokens, and each seed draws the tokens it draws without speculation."""

from __future__ import annotations

import pytest

from services.common.core import open_model
from tests.engine.model.checkpoints import SPECS, build_checkpoint, load_reference
from tests.engine.runner.conftest import make_engine
from tests.engine.runner.test_speculative import _drive
from tests.engine.runner.test_speculative_sampling import (
    CHI2_CRITICAL_3DF,
    PROMPT,
    SAMPLES,
    Greedy,
    _requests,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(SPECS["qwen3-qknorm-sharded"],
                            tmp_path_factory.mktemp("chi2-draft"))


def test_draft_model_sampling_preserves_the_distribution(checkpoint):
    source = open_model(checkpoint)
    values = dict(page_size=4, max_num_seqs=16, kv_cache_bytes=8 << 20, prefill_chunk_size=64,
                  max_num_batched_tokens=128, max_waiting=SAMPLES)
    engine = make_engine(source, speculative_method="draft", speculative_model=str(checkpoint),
                         num_speculative_tokens=2, **values)
    spec = _drive(engine, _requests())
    counters = engine.scheduler.state.counters
    assert counters.spec_drafts >= SAMPLES and counters.spec_accepted_tokens > 0
    assert counters.spec_drafter_steps > 0
    target = Greedy(load_reference(checkpoint))    # the target's tempered probabilities
    # cells: both drafts accepted, the first only, the best other token, anything else
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
    plain = _drive(make_engine(source, **values), _requests())
    assert {rid: out[0] for rid, out in plain.items()} == \
        {rid: out[0] for rid, out in spec.items()}
