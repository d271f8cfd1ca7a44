"""Every generated token's logprob reaches the client exactly once: the real SmolLM2 GGUF
served by `helios run FILE.gguf`, through the official openai and ollama clients.

A natural finish ends on the EOS token, which produces no text: its logprob still comes back
(it travels on the frontend's finish event), so `len(logprobs) == completion_tokens` for chat
completions, completions, Responses and Ollama, streamed and not.
"""

from __future__ import annotations

import ollama
import openai
import pytest

from tests.engine.service.test_real_models import helios_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
MODEL = "SmolLM2-135M-Instruct"
QUESTIONS = ["What is the capital of France?", "Say hi.", "Name one colour."]
LIMIT = 120   # far above these answers: they end on the EOS


@pytest.fixture(scope="module")
def smollm(tmp_path_factory, smollm2_gguf):
    with helios_run(tmp_path_factory.mktemp("logprobs"), smollm2_gguf) as run:
        yield run


@pytest.fixture(scope="module")
def oai(smollm):
    return openai.OpenAI(base_url=smollm.url + "/v1", api_key="k", max_retries=0, timeout=600)


def model_id(oai) -> str:
    return oai.models.list().data[0].id


@pytest.mark.parametrize("question", QUESTIONS)
def test_chat_logprobs_count_every_token(oai, question):
    messages = [{"role": "user", "content": question}]
    reply = oai.chat.completions.create(model=model_id(oai), messages=messages,
                                        max_tokens=LIMIT, temperature=0, logprobs=True,
                                        top_logprobs=2)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.stop_reason is None
    assert len(choice.logprobs.content) == reply.usage.completion_tokens
    assert choice.logprobs.content[-1].token == "<|im_end|>"

    chunks = list(oai.chat.completions.create(
        model=model_id(oai), messages=messages, max_tokens=LIMIT, temperature=0, logprobs=True,
        stream=True, stream_options={"include_usage": True}))
    streamed = [lp for c in chunks for ch in c.choices if ch.logprobs
                for lp in ch.logprobs.content or ()]
    finish = [ch for c in chunks for ch in c.choices if ch.finish_reason]
    assert finish[0].finish_reason == "stop"
    assert len(streamed) == chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    assert [lp.token for lp in streamed] == [lp.token for lp in choice.logprobs.content]
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert text == choice.message.content


def test_completions_and_responses_logprobs_count_every_token(oai):
    prompt = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    reply = oai.completions.create(model=model_id(oai), prompt=prompt, max_tokens=LIMIT,
                                   temperature=0, logprobs=1)
    assert reply.choices[0].finish_reason == "stop"
    assert len(reply.choices[0].logprobs.tokens) == reply.usage.completion_tokens
    chunks = list(oai.completions.create(model=model_id(oai), prompt=prompt, max_tokens=LIMIT,
                                         temperature=0, logprobs=1, stream=True,
                                         stream_options={"include_usage": True}))
    tokens = [t for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.tokens]
    assert len(tokens) == chunks[-1].usage.completion_tokens == reply.usage.completion_tokens

    response = oai.responses.create(model=model_id(oai), input="Say hi.", temperature=0,
                                    max_output_tokens=LIMIT, top_logprobs=1,
                                    include=["message.output_text.logprobs"])
    assert response.status == "completed"
    part = response.output[-1].content[0]
    assert len(part.logprobs) == response.usage.output_tokens
    events = list(oai.responses.create(model=model_id(oai), input="Say hi.", temperature=0,
                                       max_output_tokens=LIMIT, top_logprobs=1, stream=True,
                                       include=["message.output_text.logprobs"]))
    deltas = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert len(deltas) == len(done.logprobs) == final.usage.output_tokens


def test_ollama_logprobs_count_every_token(smollm, oai):
    client = ollama.Client(host=smollm.url, timeout=600)
    messages = [{"role": "user", "content": "Say hi."}]
    options = {"temperature": 0, "num_predict": LIMIT}
    whole = client.chat(model=model_id(oai), messages=messages, options=options, logprobs=True)
    assert whole.done_reason == "stop"
    assert len(whole.logprobs) == whole.eval_count
    lines = list(client.chat(model=model_id(oai), messages=messages, options=options,
                             logprobs=True, stream=True))
    streamed = [lp for line in lines for lp in line.logprobs or ()]
    assert len(streamed) == lines[-1].eval_count == whole.eval_count
