"""Ollama-native routes through the official ollama client."""

from __future__ import annotations

import base64
import json

import httpx
import ollama
import pytest

from tests.gateway.fake_frontend import MODEL_ID, script

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()


@pytest.fixture(scope="module")
def client(gateway):
    return ollama.Client(host=gateway.url)


def test_chat_whole(client, frontend):
    reply = client.chat(model="helios-demo:latest", stream=False,
                        messages=[{"role": "user", "content": "hi"}],
                        options={"temperature": 0.2, "num_predict": 9, "stop": ["END"],
                                 "num_ctx": 8192, "seed": 5})
    assert reply.done and reply.done_reason == "stop"
    assert reply.message.role == "assistant" and reply.message.content == "Hello from Helios"
    assert reply.prompt_eval_count == 11 and reply.eval_count == 3
    assert reply.total_duration >= reply.eval_duration >= 0
    sent = frontend.requests[-1]
    assert sent.model == "helios-demo"            # the ":latest" tag is dropped
    assert sent.sampling.max_tokens == 9 and sent.sampling.seed == 5
    assert list(sent.stop) == ["END"]


def test_chat_streams_ndjson_by_default(client, gateway):
    parts = list(client.chat(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}],
                             stream=True))
    assert "".join(p.message.content for p in parts) == "Hello from Helios"
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == 3
    with httpx.stream("POST", gateway.url + "/api/chat", json={
            "model": MODEL_ID, "messages": [{"role": "user", "content": "x"}]}) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.iter_lines()]
    assert lines[-1]["done"] is True and len(lines) == 4


def test_thinking_and_tool_calls(client, frontend):
    content = script(reasoning=["hm"], tools=[{"name": "add", "arguments": ['{"a": 1,', ' "b": 2}']}],
                     finish="tool_calls")
    tools = [{"type": "function", "function": {"name": "add", "description": "add",
                                               "parameters": {"type": "object"}}}]
    reply = client.chat(model=MODEL_ID, messages=[{"role": "user", "content": content}],
                        tools=tools, think=True, stream=False)
    assert reply.message.thinking == "hm"
    call = reply.message.tool_calls[0]
    assert call.function.name == "add" and call.function.arguments == {"a": 1, "b": 2}
    sent = frontend.requests[-1]
    assert json.loads(sent.chat.chat_template_kwargs_json) == {"enable_thinking": True}
    assert sent.chat.tools[0].name == "add"
    parts = list(client.chat(model=MODEL_ID, messages=[{"role": "user", "content": content}],
                             tools=tools, stream=True))
    calls = [p.message.tool_calls for p in parts if p.message.tool_calls]
    assert len(calls) == 1 and calls[0][0].function.arguments == {"a": 1, "b": 2}
    # The tool result goes back with object arguments.
    client.chat(model=MODEL_ID, stream=False, messages=[
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "content": "3", "tool_name": "add"}])
    sent = frontend.requests[-1].chat.messages
    assert json.loads(sent[1].tool_calls[0].arguments_json) == {"a": 1, "b": 2}
    assert (sent[2].role, sent[2].text, sent[2].name) == ("tool", "3", "add")


def test_images_are_sniffed_and_decoded(client, frontend):
    client.chat(model=MODEL_ID, stream=False,
                messages=[{"role": "user", "content": "what", "images": [PNG]}])
    parts = frontend.requests[-1].chat.messages[0].parts.parts
    assert (parts[0].image.data, parts[0].image.media_type) == (base64.b64decode(PNG),
                                                                "image/png")
    assert parts[1].text == "what"
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=MODEL_ID, stream=False, messages=[
            {"role": "user", "content": "x", "images": [base64.b64encode(b"nope").decode()]}])
    assert info.value.status_code == 400


def test_generate(client, frontend):
    reply = client.generate(model=MODEL_ID, prompt="Why?", system="sys", stream=False)
    assert reply.response == "Hello from Helios" and reply.done
    assert reply.context and all(isinstance(i, int) for i in reply.context)
    sent = frontend.requests[-1].chat.messages
    assert [(m.role, m.text) for m in sent] == [("system", "sys"), ("user", "Why?")]
    raw = client.generate(model=MODEL_ID, prompt="raw text", raw=True, stream=False)
    assert raw.response == "Hello from Helios"
    assert frontend.requests[-1].completion.text == "raw text"
    parts = list(client.generate(model=MODEL_ID, prompt="go", stream=True))
    assert "".join(p.response for p in parts) == "Hello from Helios"
    assert parts[-1].done and parts[-1].context


def test_empty_requests_just_load(client, frontend):
    assert client.chat(model=MODEL_ID, messages=[]).done_reason == "load"
    assert client.generate(model=MODEL_ID, prompt="").done_reason == "load"
    assert frontend.requests == []


def test_discovery(client, gateway):
    models = client.list().models
    assert [m.model for m in models] == [MODEL_ID]
    assert models[0].details.family == "qwen3" and models[0].size == 2_469_134
    shown = client.show(MODEL_ID)
    assert shown.modelinfo["qwen3.context_length"] == 4096
    assert shown.capabilities == ["completion", "tools", "thinking"]   # a text model
    assert not [key for key in shown.modelinfo if ".vision." in key]
    assert shown.template == "{{ messages }}"
    assert httpx.get(gateway.url + "/api/version").json() == {"version": "0.12.0"}
    root = httpx.get(gateway.url + "/")
    assert root.status_code == 200 and root.text == "Ollama is running"
    assert httpx.head(gateway.url + "/").status_code == 200
    assert client.ps().models[0].context_length == 4096


def test_errors_use_ollamas_shape(client, gateway):
    with pytest.raises(ollama.ResponseError) as info:
        client.show("missing")
    assert info.value.status_code == 404 and "missing" in info.value.error
    response = httpx.post(gateway.url + "/api/chat", json={"messages": []})
    assert response.status_code == 400 and set(response.json()) == {"error"}
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model=MODEL_ID, prompt="x", suffix="y")
    assert info.value.status_code == 400


def test_image_limits_in_model_info_only_for_vision_models():
    from gateway.ollama.routes import vision_model_info
    from services.common.api.model_card import ModelCard

    limits = {"max_images": 3, "max_image_bytes": 1000, "max_image_pixels": 0}
    assert vision_model_info(ModelCard(id="m", vision=True, **limits), "qwen2_5_vl") == {
        "qwen2_5_vl.vision.request_max_images": 3,
        "qwen2_5_vl.vision.request_max_image_bytes": 1000}     # 0: no limit of the core's
    assert vision_model_info(ModelCard(id="m", **limits), "qwen3") == {}
