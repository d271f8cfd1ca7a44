"""SamplingParams: contract defaults, protobuf conversion, validation with named fields."""

from __future__ import annotations

import pytest

from services.common.errors import ValidationError
from services.common.pb import common_pb2
from services.engine.sampling import SamplingParams, choice_seed


def test_defaults_are_the_contracts() -> None:
    params = SamplingParams.from_pb(common_pb2.SamplingParams())
    assert params == SamplingParams()
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (1.0, 1.0, 0, 0.0)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (
        0.0, 0.0, 1.0)
    assert params.seed is None and params.max_tokens is None and params.min_tokens == 0
    assert not params.is_greedy and not params.has_penalties and params.num_top_logprobs == 0


def test_from_pb_reads_every_field() -> None:
    message = common_pb2.SamplingParams(
        temperature=0.7, top_p=0.95, top_k=40, min_p=0.05, presence_penalty=0.5,
        frequency_penalty=-0.25, repetition_penalty=1.1, seed=(1 << 64) - 1, max_tokens=64,
        min_tokens=3, ignore_eos=True, stop_token_ids=[7, 9], logprobs=True, top_logprobs=5,
        logit_bias={11: 2.5, 3: -100.0})
    params = SamplingParams.from_pb(message)
    assert params == SamplingParams(
        temperature=0.7, top_p=0.95, top_k=40, min_p=0.05, presence_penalty=0.5,
        frequency_penalty=-0.25, repetition_penalty=1.1, seed=(1 << 64) - 1, max_tokens=64,
        min_tokens=3, ignore_eos=True, stop_token_ids=(7, 9), logprobs=True, top_logprobs=5,
        logit_bias=((3, -100.0), (11, 2.5)))
    assert params.num_top_logprobs == 5 and params.has_penalties


def test_explicit_zero_temperature_is_greedy() -> None:
    assert SamplingParams.from_pb(common_pb2.SamplingParams(temperature=0.0)).is_greedy


@pytest.mark.parametrize(("fields", "param"), [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.01}, "min_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3.0}, "frequency_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ({"seed": -1}, "seed"),
    ({"seed": 1 << 64}, "seed"),
    ({"max_tokens": -1}, "max_tokens"),   # 0 is prompt scoring (admission checks it)
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"stop_token_ids": (-3,)}, "stop_token_ids"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"logit_bias": ((4, 101.0),)}, "logit_bias"),
    ({"logit_bias": ((4, 1.0), (4, 2.0))}, "logit_bias"),
    ({"logit_bias": ((-4, 1.0),)}, "logit_bias"),
])
def test_out_of_range_values_name_the_field(fields: dict, param: str) -> None:
    with pytest.raises(ValidationError) as info:
        SamplingParams(**fields)
    assert info.value.param == f"sampling.{param}"
    assert param in info.value.message


def test_token_ids_must_be_in_the_vocabulary() -> None:
    SamplingParams.create(logit_bias={99: 1.0}, stop_token_ids=[99]).check_vocab(100)
    with pytest.raises(ValidationError, match=r"outside the vocabulary \(0\.\.99\)") as info:
        SamplingParams.create(logit_bias={100: 1.0}).check_vocab(100)
    assert info.value.param == "sampling.logit_bias"
    with pytest.raises(ValidationError) as info:
        SamplingParams.create(stop_token_ids=[5, 100]).check_vocab(100)
    assert info.value.param == "sampling.stop_token_ids"


def test_with_seed_keeps_a_given_seed_and_draws_a_missing_one() -> None:
    assert SamplingParams(seed=5).with_seed().seed == 5
    drawn = {SamplingParams().with_seed().seed for _ in range(8)}
    assert None not in drawn and len(drawn) == 8
    assert all(0 <= seed < 1 << 64 for seed in drawn if seed is not None)


def test_choice_seeds() -> None:
    assert choice_seed(1234, 0) == 1234
    seeds = {choice_seed(1234, i) for i in range(64)}
    assert len(seeds) == 64 and all(0 <= s < 1 << 64 for s in seeds)
    assert choice_seed(1234, 3) == choice_seed(1234, 3) != choice_seed(1235, 3)
