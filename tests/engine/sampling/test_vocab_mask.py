"""Ids past the tokenizer's vocabulary (the embedding's padding rows) are never sampled and
carry no probability: `Sampler` (TorchRunner) and `sample_rows` (GraphRunner, the code its
decode graphs capture) mask them before logprobs and every sampling mode."""

from __future__ import annotations

import math

import pytest
import torch

from services.engine.runner.slot_sampler import SampleOutputs, sample_rows
from services.engine.runner.slot_state import SamplingMode, SlotState
from services.engine.sampling import Sampler, SamplingBatch, SamplingParams, SamplingRow
from services.engine.sampling.vocab import token_vocab_size, tokenizer_vocab_size

VOCAB, TOKENS, EOS = 40, 29, 2


def padded_logits(rows: int, seed: int) -> torch.Tensor:
    """Random logits whose padding columns would win every draw if they were not masked."""
    logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))
    logits[:, TOKENS:] += 30.0
    return logits


def check_masked(ids: list[int], logprobs: torch.Tensor, top_ids: torch.Tensor) -> None:
    assert all(0 <= i < TOKENS for i in ids)
    assert (top_ids < TOKENS).all()       # alternatives are tokens too
    assert torch.isfinite(logprobs).all()


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, seed=1),
    SamplingParams(temperature=1.0, seed=2),
    SamplingParams(temperature=1.5, top_k=35, top_p=0.99, min_p=0.0, presence_penalty=0.5,
                   seed=3),
])
def test_sampler_never_picks_padding_ids(params):
    for step in range(30):
        logits = padded_logits(4, step)
        rows = [SamplingRow(params, [5, 6]) for _ in range(4)]
        batch = SamplingBatch.build(rows, VOCAB, eos_token_ids=[EOS])
        out = Sampler(TOKENS)(logits.clone(), batch)
        check_masked(out.token_ids.tolist(), out.logprobs, out.top_token_ids)
    # unmasked (no token_vocab): the padding columns win, the check above can fail
    unmasked = Sampler()(padded_logits(4, 0), SamplingBatch.build(
        [SamplingRow(SamplingParams(temperature=0.0, seed=1), [])] * 4, VOCAB,
        eos_token_ids=[EOS]))
    assert (unmasked.token_ids >= TOKENS).all()


def test_logprobs_stay_the_models_own():
    """The draw is restricted to the tokenizer's ids; the logprob reported is the model's
    (log_softmax over every column, as transformers computes it)."""
    logits = padded_logits(2, 7)
    batch = SamplingBatch.build([SamplingRow(SamplingParams(seed=1, logprobs=True,
                                                           top_logprobs=20), [])] * 2,
                                VOCAB, eos_token_ids=[EOS])
    out = Sampler(TOKENS)(logits.clone(), batch)
    expected = torch.log_softmax(logits, dim=-1)
    chosen = out.token_ids.tolist()
    for row, token in enumerate(chosen):
        assert math.isclose(out.logprobs[row].item(), expected[row, token].item(),
                            rel_tol=1e-5, abs_tol=1e-6)


@pytest.mark.parametrize("mode", list(SamplingMode))
def test_slot_sampler_never_picks_padding_ids(mode):
    state = SlotState(3, VOCAB, 4, torch.float32, torch.device("cpu"), (EOS,),
                      token_vocab=TOKENS)
    if mode is not SamplingMode.GREEDY:
        state.floats["temperature"].fill_(1.0)
    outputs = SampleOutputs.allocate(3, torch.device("cpu"))
    slots = torch.tensor([0, 1, 2])
    for step in range(30):
        sample_rows(padded_logits(3, step), slots, state, mode, True, outputs)
        check_masked(outputs.ids[0, :3].tolist(), outputs.logprobs[:, :3],
                     outputs.ids[1:, :3])
    assert (state.ints["last_token"][:3] < TOKENS).all()


def test_sampler_mask_is_graph_safe():
    import torch._dynamo

    batch = SamplingBatch.build([SamplingRow(SamplingParams(seed=i, top_k=3), [1])
                                 for i in range(3)], VOCAB, eos_token_ids=[EOS],
                                enable_all=True)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(Sampler(TOKENS).__call__)(padded_logits(3, 0), batch)
    torch._dynamo.reset()
    assert explanation.graph_break_count == 0


def test_tokenizer_vocab_size_matches_the_frontend_tokenizer(demo_model_dir, tmp_path):
    import tokenizers

    path = demo_model_dir / "tokenizer.json"
    size = tokenizers.Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    assert tokenizer_vocab_size(path) == size == 151669
    assert token_vocab_size(path, 151936) == size
    assert token_vocab_size(path, 1000) == 1000          # never past the model's logits
    assert token_vocab_size(tmp_path / "missing.json", 512) == 512
