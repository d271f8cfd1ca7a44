"""Greedy generation through the paged forward equals transformers' `generate` (float32, CPU).

Every supported architecture variant (tests/engine/model/checkpoints.py) runs the same
scenarios through the test driver: one sequence, a batch of mixed lengths, chunked prefill
mixed with decodes (with padding rows), and prefill continuing from another sequence's cached
prefix pages. Token ids must be identical; logprobs within 1e-4.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE
from tests.engine.model.driver import PagedDriver, Sequence

NUM_NEW_TOKENS = 20
LOGPROB_TOLERANCE = 1e-4


def make_prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_SIZE) for _ in range(length)]


@pytest.fixture(scope="session")
def hf_greedy(reference_models: dict[str, Any]):
    cache: dict[tuple[str, tuple[int, ...], int], tuple[list[int], list[float]]] = {}

    def run(name: str, prompt: list[int], num_new: int) -> tuple[list[int], list[float]]:
        key = (name, tuple(prompt), num_new)
        if key not in cache:
            input_ids = torch.tensor([prompt])
            out = reference_models[name].generate(   # explicit mask: prompts may hold id 0
                input_ids, attention_mask=torch.ones_like(input_ids),
                max_new_tokens=num_new, do_sample=False,
                output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            ids = out.sequences[0, len(prompt):].tolist()
            logprobs = [float(torch.log_softmax(step[0].float(), dim=-1)[token])
                        for step, token in zip(out.logits, ids, strict=True)]
            cache[key] = (ids, logprobs)
        return cache[key]

    return run


def assert_matches_reference(name: str, sequences: list[Sequence], hf_greedy) -> None:
    for seq in sequences:
        ids, logprobs = hf_greedy(name, seq.prompt, seq.max_new_tokens)
        assert seq.generated == ids, f"{name}: prompt of {len(seq.prompt)} tokens diverged"
        worst = max(abs(a - b) for a, b in zip(seq.logprobs, logprobs, strict=True))
        assert worst < LOGPROB_TOLERANCE, f"{name}: logprob differs by {worst}"


@pytest.mark.parametrize("name", SPECS)
def test_single_sequence(name: str, engine_models, hf_greedy) -> None:
    driver = PagedDriver(engine_models[name], page_size=4, seed=1)
    driver.add(make_prompt(13, seed=1), NUM_NEW_TOKENS)
    driver.run()
    assert_matches_reference(name, driver.sequences, hf_greedy)


@pytest.mark.parametrize("name", SPECS)
def test_batch_of_mixed_lengths(name: str, engine_models, hf_greedy) -> None:
    driver = PagedDriver(engine_models[name], page_size=8, seed=2)
    for i, length in enumerate((1, 6, 21, 9)):
        driver.add(make_prompt(length, seed=10 + i), NUM_NEW_TOKENS)
    driver.run()   # one prefill step for all four, then batched decodes
    assert driver.num_steps == NUM_NEW_TOKENS
    assert_matches_reference(name, driver.sequences, hf_greedy)


@pytest.mark.parametrize("name", SPECS)
def test_chunked_prefill_mixed_with_decode(name: str, engine_models, hf_greedy) -> None:
    driver = PagedDriver(engine_models[name], page_size=4, seed=3, num_padding_rows=3)
    arrivals = {0: [(make_prompt(6, seed=20), NUM_NEW_TOKENS)],
                3: [(make_prompt(21, seed=21), NUM_NEW_TOKENS)],
                5: [(make_prompt(13, seed=22), 12), (make_prompt(2, seed=23), 7)]}
    driver.run(chunk_size=4, arrivals=arrivals)
    assert driver.num_mixed_steps >= 4
    assert_matches_reference(name, driver.sequences, hf_greedy)


@pytest.mark.parametrize("name", SPECS)
def test_prefill_continues_from_cached_prefix(name: str, engine_models, hf_greedy) -> None:
    driver = PagedDriver(engine_models[name], page_size=4, seed=4)
    first = driver.add(make_prompt(13, seed=30), NUM_NEW_TOKENS)
    driver.step(chunk_size=64)                          # first's prompt is cached now
    tail = make_prompt(7, seed=31)
    driver.add(first.prompt[:12] + tail, NUM_NEW_TOKENS, prefix_of=first, prefix_len=12)
    driver.step(chunk_size=64)                          # 7-token prefill beside a decode
    # A prefix that covers generated tokens too: the 13 prompt tokens + 3 generated ones.
    driver.run(chunk_size=3)
    driver.add(first.tokens[:16] + tail[:3], 5, prefix_of=first, prefix_len=16)
    driver.run(chunk_size=2)
    assert_matches_reference(name, driver.sequences, hf_greedy)


def test_saved_final_hidden_resumes_sampling(engine_models) -> None:
    """compute_logits on a stored final hidden state gives the same next token (prefix hits)."""
    model = engine_models["qwen3-qknorm-sharded"]
    driver = PagedDriver(model, page_size=4, seed=5)
    seq = driver.add(make_prompt(9, seed=40), 3)
    driver.run()
    logits = model.compute_logits(torch.stack(seq.hidden))
    assert logits.dtype == torch.float32 and logits.shape == (3, model.config.vocab_size)
    assert logits.argmax(dim=-1).tolist() == seq.generated
