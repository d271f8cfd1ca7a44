"""Prompt logprobs through the real four services (`helios run --demo`) with the openai SDK.

`/v1/completions` with `echo` and `logprobs` returns the prompt tokens' logprobs (null first)
before the output's; `max_tokens: 0` with `echo` scores the prompt alone; vLLM's
`prompt_logprobs` adds token id -> {logprob, rank, decoded_token} per prompt token (chat too).
The values equal transformers' float32 forward of the demo checkpoint.
"""

from __future__ import annotations

import json
import random

import httpx
import openai
import pytest

MODEL = "helios-demo"
pytestmark = pytest.mark.timeout(600)
TOL = 2e-3


@pytest.fixture(scope="module")
def reference(demo_model_dir):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(demo_model_dir,
                                                              dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return logprobs


def _ids(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 150_000) for _ in range(length)]


def test_echo_max_tokens_zero_scores_the_prompt(oai, reference):
    ids = _ids(90, 1)           # more than one 64-token prefill chunk
    reply = oai.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True,
                                   logprobs=1, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert reply.usage.prompt_tokens == 90 and reply.usage.completion_tokens == 0
    lp = choice.logprobs
    assert len(lp.tokens) == 90 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = reference(ids)
    for position in range(1, 90):
        expected = want[position - 1, ids[position]].item()
        assert abs(lp.token_logprobs[position] - expected) < TOL
        top = lp.top_logprobs[position]
        assert abs(max(top.values()) - want[position - 1].max().item()) < TOL
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert sum(lp.token_logprobs[1:]) < -100          # not the 0 of unscored prompts


def test_echo_with_generation_and_prompt_logprobs(oai, reference):
    ids = _ids(20, 2)
    plain = oai.completions.create(model=MODEL, prompt=ids, max_tokens=3, logprobs=0,
                                   temperature=0, extra_body={"ignore_eos": True})
    reply = oai.completions.create(model=MODEL, prompt=ids, max_tokens=3, echo=True,
                                   logprobs=0, temperature=0,
                                   extra_body={"ignore_eos": True, "prompt_logprobs": 2})
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 3
    lp = choice.logprobs
    assert len(lp.token_logprobs) == 23 and lp.token_logprobs[0] is None
    assert lp.token_logprobs[20:] == plain.choices[0].logprobs.token_logprobs
    assert choice.text.endswith(plain.choices[0].text)
    scored = choice.model_extra["prompt_logprobs"]
    want = reference(ids)
    assert scored[0] is None and len(scored) == 20
    for position in range(1, 20):
        entry = scored[position]
        mine = entry[str(ids[position])]
        assert abs(mine["logprob"] - want[position - 1, ids[position]].item()) < TOL
        assert mine["rank"] >= 1 and isinstance(mine["decoded_token"], str)
        ranks = sorted(v["rank"] for k, v in entry.items() if k != str(ids[position]))
        assert ranks[:2] == [1, 2] or mine["rank"] <= 2


def test_streamed_echo_carries_prompt_logprobs(stack, reference):
    ids = _ids(12, 3)
    body = {"model": MODEL, "prompt": ids, "max_tokens": 2, "echo": True, "logprobs": 1,
            "temperature": 0, "stream": True, "ignore_eos": True}
    chunks = []
    with httpx.stream("POST", stack.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    logprobs = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and
                c["choices"][0]["logprobs"]]
    first = logprobs[0]
    assert first["token_logprobs"][0] is None and len(first["token_logprobs"]) == 12
    want = reference(ids)
    assert abs(first["token_logprobs"][5] - want[4, ids[5]].item()) < TOL
    assert sum(len(x["token_logprobs"]) for x in logprobs) == 14


def test_chat_prompt_logprobs_and_refusals(oai):
    reply = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=2,
        extra_body={"prompt_logprobs": 0, "chat_template_kwargs": {"enable_thinking": False}})
    scored = reply.model_extra["prompt_logprobs"]
    assert scored[0] is None and len(scored) == reply.usage.prompt_tokens
    assert all(len(entry) == 1 for entry in scored[1:])
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        oai.completions.create(model=MODEL, prompt="hi", max_tokens=0)
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model=MODEL, prompt="hi", max_tokens=1,
                               extra_body={"prompt_logprobs": 21})
