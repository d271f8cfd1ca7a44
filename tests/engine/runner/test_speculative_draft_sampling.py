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
    SAMPLES,
    Greedy,
    _requests,
    check_target_distribution,
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
    check_target_distribution(spec, target)
    plain = _drive(make_engine(source, **values), _requests())
    assert {rid: out[0] for rid, out in plain.items()} == \
        {rid: out[0] for rid, out in spec.items()}
