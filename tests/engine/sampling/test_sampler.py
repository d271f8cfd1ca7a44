"""The Sampler end to end: reference agreement, seeded reproducibility, distributions, logprobs."""

from __future__ import annotations

import collections
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import ValidationError
from services.engine.sampling import (
    Sampler,
    SamplingBatch,
    SamplingParams,
    SamplingRow,
    choice_seed,
    reference,
)
from services.engine.sampling.random_stream import row_keys, split_seed, uniform_noise

VOCAB = 32
EOS = 2


def sample(logits: torch.Tensor, rows: list[SamplingRow], **build):
    batch = SamplingBatch.build(rows, logits.shape[-1], eos_token_ids=[EOS], **build)
    return Sampler()(logits, batch), batch


def uniforms_of(params: SamplingParams, position: int, vocab: int) -> list[float]:
    lo, hi = split_seed(params.seed or 0)
    keys = row_keys(torch.tensor([lo]), torch.tensor([hi]), torch.tensor([position]))
    return uniform_noise(keys, vocab)[0].tolist()


params_strategy = st.builds(
    SamplingParams.create,
    temperature=st.sampled_from([0.0, 0.3, 1.0, 1.7]),
    top_p=st.sampled_from([1.0, 0.9, 0.5]),
    top_k=st.sampled_from([0, -1, 1, 3, 10]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
    presence_penalty=st.sampled_from([0.0, 0.7, -0.5]),
    frequency_penalty=st.sampled_from([0.0, 0.4]),
    repetition_penalty=st.sampled_from([1.0, 1.3, 0.8]),
    seed=st.integers(0, (1 << 64) - 1),
    min_tokens=st.sampled_from([0, 2]),
    logit_bias=st.dictionaries(st.integers(0, VOCAB - 1), st.floats(-5, 5), max_size=3),
    stop_token_ids=st.lists(st.integers(0, VOCAB - 1), max_size=2),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(params_strategy,
                          st.lists(st.integers(0, VOCAB - 1), max_size=5),
                          st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=5)),
                min_size=1, max_size=4),
       st.integers(0, 2**31))
def test_choice_matches_the_reference_pipeline(rows_spec, logits_seed) -> None:
    generator = torch.Generator().manual_seed(logits_seed)
    logits = torch.randn(len(rows_spec), VOCAB, generator=generator) * 3
    rows = [SamplingRow(p, out, prompt) for p, out, prompt in rows_spec]
    output, _ = sample(logits, rows)
    for i, (params, out, prompt) in enumerate(rows_spec):
        expected = reference.choose(logits[i].tolist(), params, out, prompt, [EOS],
                                    uniforms_of(params, len(out), VOCAB))
        assert output.token_ids[i].item() == expected


def test_seeded_rows_ignore_their_neighbours() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, VOCAB, generator=generator)
    target = SamplingRow(SamplingParams(temperature=1.0, top_p=0.9, seed=77), [5, 6, 7])
    others = [SamplingRow(SamplingParams(temperature=t, seed=s), [1] * s)
              for t, s in ((0.5, 1), (0.0, 2), (1.5, 3), (1.0, 4), (0.9, 5))]
    alone, _ = sample(logits[:1], [target])
    crowded, _ = sample(torch.cat((logits[1:4], logits[:1], logits[4:])),
                        [*others[:3], target, *others[3:]])
    assert crowded.token_ids[3] == alone.token_ids[0]
    assert crowded.logprobs[3] == alone.logprobs[0]
    with_all, _ = sample(logits[:1], [target], enable_all=True)   # graph-shaped batch
    assert with_all.token_ids[0] == alone.token_ids[0]


def test_same_seed_same_tokens_and_positions_advance_the_stream() -> None:
    logits = torch.zeros(1, VOCAB)                      # uniform: pure noise decides
    params = SamplingParams(seed=123)
    draws = [sample(logits, [SamplingRow(params, [0] * position)])[0].token_ids.item()
             for position in range(40)]
    again = [sample(logits, [SamplingRow(params, [0] * position)])[0].token_ids.item()
             for position in range(40)]
    assert draws == again
    assert len(set(draws)) > 15                          # not stuck on one token
    other_seed = [sample(logits, [SamplingRow(SamplingParams(seed=124), [0] * p)])[0]
                  .token_ids.item() for p in range(40)]
    assert other_seed != draws


def test_n_choices_are_independent_rows() -> None:
    logits = torch.zeros(8, VOCAB)
    rows = [SamplingRow(SamplingParams(seed=choice_seed(99, i)), []) for i in range(8)]
    tokens = sample(logits, rows)[0].token_ids.tolist()
    assert len(set(tokens)) > 4


def test_empirical_distribution_matches_softmax() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    probs = torch.softmax(logits / 0.8, dim=-1)
    draws = 6000
    rows = [SamplingRow(SamplingParams(temperature=0.8, seed=2024), [0] * p)
            for p in range(draws)]
    tokens = sample(logits.expand(draws, -1), rows)[0].token_ids.tolist()
    counts = collections.Counter(tokens)
    for token, p in enumerate(probs.tolist()):
        sigma = math.sqrt(p * (1 - p) / draws)
        assert abs(counts[token] / draws - p) < 5 * sigma + 1e-3, (token, counts, p)


def test_filters_restrict_the_support() -> None:
    logits = torch.tensor([3.0, 2.5, 2.0, 0.0, -1.0, -2.0]).expand(500, -1)
    top_k = [SamplingRow(SamplingParams(top_k=2, seed=1), [0] * p) for p in range(500)]
    assert set(sample(logits, top_k)[0].token_ids.tolist()) == {0, 1}
    # probs ~ [.48, .29, .18, .02, ...]: top_p 0.7 keeps the first two
    top_p = [SamplingRow(SamplingParams(top_p=0.7, seed=2), [0] * p) for p in range(500)]
    assert set(sample(logits, top_p)[0].token_ids.tolist()) == {0, 1}
    min_p = [SamplingRow(SamplingParams(min_p=0.3, seed=3), [0] * p) for p in range(500)]
    assert set(sample(logits, min_p)[0].token_ids.tolist()) == {0, 1, 2}


def test_greedy_rows_take_the_argmax_after_penalties() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.9, 0.0], [1.0, 3.0, 2.9, 0.0]])
    rows = [SamplingRow(SamplingParams(temperature=0, seed=0), []),
            SamplingRow(SamplingParams(temperature=0, seed=0, presence_penalty=0.5), [1])]
    assert sample(logits, rows)[0].token_ids.tolist() == [1, 2]
    repetition = [SamplingRow(SamplingParams(temperature=0, seed=0, repetition_penalty=1.5),
                              [], prompt_token_ids=[1])]
    assert sample(logits[:1], repetition)[0].token_ids.tolist() == [2]
    tiny = [SamplingRow(SamplingParams(temperature=1e-30, seed=s), []) for s in range(20)]
    assert sample(logits[:1].expand(20, -1), tiny)[0].token_ids.tolist() == [1] * 20


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.full((1, 8), -5.0)
    logits[0, EOS] = 10.0
    logits[0, 6] = 9.0
    params = SamplingParams(temperature=0, seed=0, min_tokens=2, stop_token_ids=(6,))
    assert sample(logits, [SamplingRow(params, [1])])[0].token_ids.item() not in (EOS, 6)
    assert sample(logits, [SamplingRow(params, [1, 1])])[0].token_ids.item() == EOS
    sampled = SamplingParams(seed=9, min_tokens=3)
    rows = [SamplingRow(sampled, [p % 3 + 3] * (p % 3)) for p in range(60)]   # below min
    assert EOS not in sample(logits.expand(60, -1), rows)[0].token_ids.tolist()


def test_logit_bias_forces_and_bans() -> None:
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3))
    force = SamplingParams.create(seed=1, logit_bias={17: 100.0})
    ban = SamplingParams.create(temperature=0, seed=1, logit_bias={int(logits[1].argmax()): -100})
    out = sample(logits, [SamplingRow(force, []), SamplingRow(ban, [])])[0].token_ids.tolist()
    assert out[0] == 17 and out[1] != int(logits[1].argmax())


def test_logprobs_are_the_models_and_top_alternatives_are_sorted() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(4))
    rows = [SamplingRow(SamplingParams(temperature=0.5, seed=1, logprobs=True, top_logprobs=5),
                        []),
            SamplingRow(SamplingParams(temperature=0, seed=2, logprobs=True), []),
            SamplingRow(SamplingParams.create(seed=3, logprobs=True, top_logprobs=2,
                                              logit_bias={0: 50.0}), [])]
    output, batch = sample(logits, rows)
    model = torch.log_softmax(logits, dim=-1)
    for i, token in enumerate(output.token_ids.tolist()):
        assert output.logprobs[i] == model[i, token]      # raw model logprob, not filtered
    assert output.token_ids[2] == 0 and output.logprobs[2] < -0.5  # bias does not show
    assert output.top_token_ids.shape == (3, 5)
    per_row = output.to_lists(batch.num_top_logprobs)
    assert [len(alternatives) for _, _, alternatives in per_row] == [5, 0, 2]
    top = per_row[0][2]
    assert [t for t, _ in top] == model[0].topk(5).indices.tolist()
    assert all(a[1] >= b[1] for a, b in itertools.pairwise(top))


def test_unseeded_rows_are_refused() -> None:
    with pytest.raises(ValidationError, match="seed"):
        SamplingBatch.build([SamplingRow(SamplingParams(), [])], VOCAB)


def test_sampler_is_graph_safe() -> None:
    import torch._dynamo

    logits = torch.randn(3, VOCAB)
    rows = [SamplingRow(SamplingParams(seed=i, top_k=3, top_p=0.8, min_p=0.1,
                                       presence_penalty=0.2), [1, 2]) for i in range(3)]
    batch = SamplingBatch.build(rows, VOCAB, eos_token_ids=[EOS], enable_all=True)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(Sampler().__call__)(logits, batch)
    torch._dynamo.reset()
    assert explanation.graph_break_count == 0
