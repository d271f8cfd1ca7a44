"""/v1/chat/completions driven by the official openai SDK against the scripted fake frontend."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from services.common.pb import frontend_pb2
from tests.gateway.fake_frontend import script

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_whole_completion(client, frontend):
    reply = client.chat.completions.create(model="helios-demo", messages=USER)
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == "helios-demo"
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello from Helios"
    assert choice.finish_reason == "stop"
    assert reply.usage.prompt_tokens == 11
    assert reply.usage.completion_tokens == 3
    assert reply.usage.total_tokens == 14
    sent = frontend.requests[-1]
    assert sent.model == "helios-demo"
    assert sent.chat.messages[0].role == "user"
    assert sent.chat.messages[0].text == "hi"


def test_stream_chunks_follow_the_sdk_contract(client):
    stream = client.chat.completions.create(model="helios-demo", messages=USER, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 14
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from Helios"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}


def test_stream_without_stream_options_sends_no_usage(gateway):
    with httpx.stream("POST", gateway.url + "/v1/chat/completions",
                      json={"model": "m", "messages": USER, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert "content-encoding" not in response.headers
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        assert "usage" not in json.loads(line[len("data: "):])


def test_reasoning_is_sent_as_reasoning_and_reasoning_content(client):
    content = script(reasoning=["think", "ing"], text=["answer"])
    reply = client.chat.completions.create(model="m", messages=[{"role": "user",
                                                                  "content": content}])
    message = reply.choices[0].message.model_dump()
    assert message["reasoning"] == "thinking" and message["reasoning_content"] == "thinking"
    assert message["content"] == "answer"
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], stream=True))
    deltas = [c.choices[0].delta.model_dump() for c in chunks if c.choices]
    reasoning = [d for d in deltas if d.get("reasoning")]
    assert [d["reasoning"] for d in reasoning] == ["think", "ing"]
    assert all(d["reasoning_content"] == d["reasoning"] for d in reasoning)


def test_tool_call_round_trip(client, frontend):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    content = script(tools=[{"name": "get_weather", "id": "call_w1",
                             "arguments": ['{"city"', ': "Paris"}']}], finish="tool_calls")
    messages = [{"role": "user", "content": content}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=tools)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert (call.id, call.type, call.function.name) == ("call_w1", "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    sent = frontend.requests[-1].chat
    assert sent.tools[0].name == "get_weather"
    assert json.loads(sent.tools[0].parameters_json)["properties"]["city"]["type"] == "string"

    # Streamed: first fragment carries index, id, type and name; later ones only arguments.
    chunks = list(client.chat.completions.create(model="m", messages=messages, tools=tools,
                                                 stream=True))
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks
             if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0].index == 0 and calls[0].id == "call_w1" and calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert all(c.index == 0 and c.id is None for c in calls[1:])
    assert "".join(c.function.arguments for c in calls) == '{"city": "Paris"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    # The result goes back as an assistant tool_calls turn plus a tool message.
    follow_up = [*messages, choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": "call_w1", "content": "sunny"},]
    client.chat.completions.create(model="m", messages=follow_up, tools=tools)
    sent = frontend.requests[-1].chat.messages
    assert sent[1].role == "assistant" and sent[1].tool_calls[0].name == "get_weather"
    assert json.loads(sent[1].tool_calls[0].arguments_json) == {"city": "Paris"}
    assert (sent[2].role, sent[2].tool_call_id, sent[2].text) == ("tool", "call_w1", "sunny")


def test_n_choices_stream_per_index(client):
    reply = client.chat.completions.create(model="m", messages=USER, n=3)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content == "Hello from Helios" for c in reply.choices)
    chunks = list(client.chat.completions.create(model="m", messages=USER, n=2, stream=True))
    by_index: dict[int, str] = {}
    roles = set()
    for chunk in chunks:
        for c in chunk.choices:
            by_index[c.index] = by_index.get(c.index, "") + (c.delta.content or "")
            if c.delta.role:
                roles.add(c.index)
    assert by_index == {0: "Hello from Helios", 1: "Hello from Helios"} and roles == {0, 1}


def test_logprobs(client):
    reply = client.chat.completions.create(model="m", messages=USER, logprobs=True,
                                           top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert [lp.token for lp in content] == ["Hello", " from", " Helios"]
    assert content[0].logprob == -0.5 and content[0].bytes == list(b"Hello")
    assert [t.token for t in content[0].top_logprobs] == ["Hello", "x"]


def test_vllm_extensions_reach_the_frontend(client, frontend):
    client.chat.completions.create(
        model="m", messages=USER, temperature=0.3, top_p=0.9, seed=-1, max_tokens=50,
        stop=["END", ""], presence_penalty=0.5, frequency_penalty=0.25,
        logit_bias={"42": 3.0},
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True,
                    "min_tokens": 4, "stop_token_ids": [7, 9], "skip_special_tokens": False,
                    "include_stop_str_in_output": True,
                    "chat_template_kwargs": {"enable_thinking": False},
                    "add_generation_prompt": True, "priority": 3,
                    "spaces_between_special_tokens": False})
    sent = frontend.requests[-1]
    s = sent.sampling
    assert s.temperature == pytest.approx(0.3) and s.top_p == pytest.approx(0.9)
    assert (s.top_k, s.max_tokens, s.min_tokens, s.ignore_eos) == (20, 50, 4, True)
    assert s.min_p == pytest.approx(0.05) and s.repetition_penalty == pytest.approx(1.1)
    assert s.presence_penalty == 0.5 and s.frequency_penalty == 0.25
    assert s.seed == 2**64 - 1 and list(s.stop_token_ids) == [7, 9]
    assert dict(s.logit_bias) == {42: 3.0}
    assert list(sent.stop) == ["END"] and sent.include_stop_str_in_output
    assert sent.skip_special_tokens is False and sent.HasField("skip_special_tokens")
    assert not sent.spaces_between_special_tokens and sent.priority == 3
    assert json.loads(sent.chat.chat_template_kwargs_json) == {"enable_thinking": False}
    assert sent.chat.add_generation_prompt is True


def test_unset_optionals_stay_unset(client, frontend):
    client.chat.completions.create(model="m", messages=USER)
    sent = frontend.requests[-1]
    for name in ("temperature", "top_p", "top_k", "max_tokens", "seed"):
        assert not sent.sampling.HasField(name), name
    for name in ("n", "skip_special_tokens", "parse_reasoning"):
        assert not sent.HasField(name), name


def test_response_format_and_tool_choice(client, frontend):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    client.chat.completions.create(
        model="m", messages=USER,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "thing", "schema": schema, "strict": True}},
        tools=[{"type": "function", "function": {"name": "f"}}],
        tool_choice={"type": "function", "function": {"name": "f"}},
        parallel_tool_calls=False)
    sent = frontend.requests[-1]
    assert sent.response_format.type == frontend_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA
    assert json.loads(sent.response_format.schema_json) == schema
    assert sent.response_format.name == "thing" and sent.response_format.strict
    assert sent.chat.tool_choice.mode == frontend_pb2.TOOL_CHOICE_MODE_FUNCTION
    assert sent.chat.tool_choice.function_name == "f"
    assert sent.chat.tool_choice.parallel_tool_calls is False


def test_vllm_structured_outputs_become_response_formats(client, frontend):
    cases = [({"regex": "[a-z]+"}, "REGEX", "pattern", "[a-z]+"),
             ({"choice": ["a", "b"]}, "CHOICE", "choices", ["a", "b"]),
             ({"grammar": 'start: "x"'}, "GRAMMAR", "grammar", 'start: "x"'),
             ({"json": {"type": "object"}}, "JSON_SCHEMA", "schema_json", '{"type":"object"}')]
    for body, kind, field, value in cases:
        client.chat.completions.create(model="m", messages=USER,
                                       extra_body={"structured_outputs": body})
        sent = frontend.requests[-1].response_format
        assert sent.type == getattr(frontend_pb2, f"RESPONSE_FORMAT_TYPE_{kind}")
        got = getattr(sent, field)
        assert (list(got) if field == "choices" else got) == value
    for body, error in (({"structural_tag": {}}, "structural_tag"),
                        ({"regex": "a", "choice": ["a"]}, "one of")):
        with pytest.raises(openai.BadRequestError, match=error):
            client.chat.completions.create(model="m", messages=USER,
                                           extra_body={"structured_outputs": body})


def test_images_go_to_the_frontend_as_bytes(client, frontend):
    """A data URL's base64 is decoded in the gateway: the frontend (and imageprep after it)
    get the encoded image's bytes and media type; base64 that is not gets a 400 naming it."""
    url = "data:IMAGE/PNG;base64,iVBORw0K\r\nGgo="          # MIME line breaks are tolerated
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}}]}])
    parts = frontend.requests[-1].chat.messages[0].parts.parts
    assert parts[0].text == "what is this"
    assert (parts[1].image.url, parts[1].image.data) == ("", b"\x89PNG\r\n\x1a\n")
    assert (parts[1].image.media_type, parts[1].image.detail) == ("image/png", "low")
    for bad in ("data:image/png;base64,iVBO!!!", "data:image/png;base64,iVBORw0KGgo=A",
                "data:image/png;base64,"):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": bad}}]}])
        assert info.value.body["param"] == "messages[0].content[0].image_url.url"
        assert info.value.body["message"].startswith("image data is")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
    assert info.value.body["param"] == "messages[0].content[0].image_url.url"


def test_continuous_usage_stats(gateway):
    body = {"model": "m", "messages": USER, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body) as response:
        frames = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: {")]
    text_frames = [f for f in frames if f["choices"] and f["choices"][0]["delta"].get("content")]
    assert [f["usage"]["completion_tokens"] for f in text_frames] == [1, 2, 3]
