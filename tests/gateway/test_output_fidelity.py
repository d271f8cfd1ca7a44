"""Output details against the scripted frontend, through the official SDKs: thinking-block
signatures, Anthropic's cache split on a full prefix-cache hit, vLLM's `stop_reason`, and
the logprobs of tokens that produce no text (carried by the finish event)."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from gateway.anthropic.signature import ThinkingSigner
from tests.gateway.fake_frontend import script


@pytest.fixture(scope="module")
def claude(gateway):
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def oai(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def ask(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def test_thinking_blocks_are_signed_and_verified(claude, frontend):
    content = script(reasoning=["weigh ", "it"], text=["ok"])
    whole = claude.messages.create(model="m", max_tokens=64, messages=ask(content))
    thinking = whole.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "weigh it"
    assert len(thinking.signature) > 20
    with claude.messages.stream(model="m", max_tokens=64, messages=ask(content)) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    assert final.content[0].signature == thinking.signature
    # the signature arrives as the block's last delta, before content_block_stop
    raw = [kind for kind in kinds if kind[0].startswith("content_block")]
    position = raw.index(("content_block_delta", "signature_delta"))
    assert raw[position + 1][0] == "content_block_stop"

    def follow_up(block: dict) -> None:
        claude.messages.create(model="m", max_tokens=8, messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [block, {"type": "text", "text": "ok"}]},
            {"role": "user", "content": "more"}])

    follow_up({"type": "thinking", "thinking": "weigh it", "signature": thinking.signature})
    assert frontend.requests[-1].chat.messages[1].reasoning_content == "weigh it"
    follow_up({"type": "thinking", "thinking": "my own notes", "signature": ""})
    with pytest.raises(anthropic.BadRequestError) as error:
        follow_up({"type": "thinking", "thinking": "weigh it (edited)",
                   "signature": thinking.signature})
    assert "signature" in error.value.message
    with pytest.raises(anthropic.BadRequestError):
        follow_up({"type": "thinking", "thinking": "weigh it",
                   "signature": ThinkingSigner(b"another key").sign("weigh it")})


def test_full_cache_hit_counts_the_last_prompt_token_as_input(claude, gateway):
    content = script(prompt_tokens=11, cached_tokens=11)
    usage = claude.messages.create(model="m", max_tokens=8, messages=ask(content)).usage
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (1, 10)
    with claude.messages.stream(model="m", max_tokens=8, messages=ask(content)) as stream:
        events = list(stream)
    start = next(e for e in events if e.type == "message_start").message.usage
    delta = next(e for e in events if e.type == "message_delta").usage
    assert (start.input_tokens, start.cache_read_input_tokens) == (1, 10)
    assert (delta.input_tokens, delta.cache_read_input_tokens) == (1, 10)
    partial = claude.messages.create(model="m", max_tokens=8,
                                     messages=ask(script(prompt_tokens=11, cached_tokens=4)))
    assert (partial.usage.input_tokens, partial.usage.cache_read_input_tokens) == (7, 4)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_reason_is_null_on_eos_and_the_id_for_a_requested_stop_token(oai, stream):
    def stop_reason(**extra) -> object:
        content = script(finish="stop", stop_token_id=2)
        if not stream:
            reply = oai.chat.completions.create(model="m", messages=ask(content),
                                                extra_body=extra)
            return reply.choices[0].model_extra["stop_reason"]
        chunks = oai.chat.completions.create(model="m", messages=ask(content), stream=True,
                                             extra_body=extra)
        last = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
        return last.choices[0].model_extra["stop_reason"]

    assert stop_reason() is None                              # the model's EOS (id 2)
    assert stop_reason(stop_token_ids=[7, 2]) == 2            # a stop token the request named
    text = oai.completions.create(model="m", prompt=script(finish="stop", stop_token_id=2))
    assert text.choices[0].model_extra["stop_reason"] is None


def test_finish_logprobs_reach_every_protocol(gateway):
    """A finish event's logprobs (an EOS: no text) are counted in chat, completions,
    Responses and Ollama, streamed and not."""
    content = script(text=["a", "b"], eos_logprob=True)
    body = {"model": "m", "messages": ask(content), "logprobs": True}
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        whole = http.post("/v1/chat/completions", json=body).json()
        assert [e["token"] for e in whole["choices"][0]["logprobs"]["content"]] == \
            ["a", "b", "<eos>"]
        lines = http.post("/v1/chat/completions", json={**body, "stream": True}).text
        assert lines.count('"token":"<eos>"') == 1
        text = http.post("/v1/completions", json={"model": "m", "prompt": content,
                                                  "logprobs": 0}).json()
        assert text["choices"][0]["logprobs"]["tokens"] == ["a", "b", "<eos>"]
        streamed = http.post("/v1/completions", json={"model": "m", "prompt": content,
                                                      "logprobs": 0, "stream": True}).text
        assert streamed.count('"tokens":["<eos>"]') == 1
        responses = {"model": "m", "input": content, "top_logprobs": 0,
                     "include": ["message.output_text.logprobs"]}
        reply = http.post("/v1/responses", json=responses).json()
        assert [e["token"] for e in reply["output"][0]["content"][0]["logprobs"]] == \
            ["a", "b", "<eos>"]
        events = [json.loads(line[6:]) for line in http.post(
            "/v1/responses", json={**responses, "stream": True}).text.splitlines()
            if line.startswith("data: ")]
        assert [e["token"] for event in events if event["type"] ==
                "response.output_text.delta" for e in event["logprobs"]] == \
            ["a", "b", "<eos>"]
        assert len(events[-1]["response"]["output"][0]["content"][0]["logprobs"]) == 3
        ollama = http.post("/api/chat", json={"model": "m", "messages": ask(content),
                                              "logprobs": True, "stream": False}).json()
        assert [e["token"] for e in ollama["logprobs"]] == ["a", "b", "<eos>"]
        lines = [json.loads(line) for line in http.post("/api/chat", json={
            "model": "m", "messages": ask(content), "logprobs": True}).text.splitlines()]
        assert [e["token"] for line in lines for e in line.get("logprobs", ())] == \
            ["a", "b", "<eos>"]


def test_cut_off_call_is_incomplete_and_left_out_of_the_history(oai, frontend):
    content = script(tools=[{"name": "get_weather", "id": "call_9",
                             "arguments": ['{"city": "Os']}], finish="length")
    cut = oai.responses.create(model="m", input=content, max_output_tokens=5)
    (item,) = cut.output
    assert cut.status == "incomplete" and item.type == "function_call"
    assert item.status == "incomplete" and item.arguments == '{"city": "Os'
    oai.responses.create(model="m", input="next", previous_response_id=cut.id)
    history = frontend.requests[-1].chat.messages
    assert [m.role for m in history] == ["user", "assistant", "user"]
    assert not history[1].tool_calls
    whole = oai.chat.completions.create(model="m", messages=ask(content))
    assert whole.choices[0].finish_reason == "length"
    assert whole.choices[0].message.tool_calls[0].function.arguments == '{"city": "Os'
