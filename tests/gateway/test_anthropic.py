"""/v1/messages and /v1/messages/count_tokens through the official anthropic SDK."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from tests.gateway.fake_frontend import count_tokens, script

USER = [{"role": "user", "content": "hi"}]
TOOL = {"name": "get_weather", "description": "weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}


@pytest.fixture(scope="module")
def client(gateway):
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


def test_message(client, frontend):
    message = client.messages.create(model="helios-demo", max_tokens=64, messages=USER,
                                     system="be brief", stop_sequences=["END"],
                                     extra_body={"temperature": 0.5, "top_k": 5})
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == "helios-demo"
    assert message.content[0].type == "text" and message.content[0].text == "Hello from Helios"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert (message.usage.input_tokens, message.usage.output_tokens) == (11, 3)
    sent = frontend.requests[-1]
    assert [(m.role, m.text) for m in sent.chat.messages] == [("system", "be brief"),
                                                              ("user", "hi")]
    assert sent.sampling.max_tokens == 64 and sent.sampling.top_k == 5
    assert sent.sampling.temperature == 0.5
    assert list(sent.stop) == ["END"]


def test_output_config(client, frontend):
    client.messages.create(model="m", max_tokens=64, messages=USER, output_config={
        "effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}})
    sent = frontend.requests[-1]
    assert json.loads(sent.chat.chat_template_kwargs_json) == {"reasoning_effort": "low"}
    assert json.loads(sent.response_format.schema_json) == {"type": "object"}


def test_stream_event_order(client):
    content = script(reasoning=["mull"], text=["a", "b"],
                     tools=[{"name": "get_weather", "id": "toolu_1",
                             "arguments": ['{"city":', ' "Oslo"}']}], finish="tool_calls")
    with client.messages.stream(model="m", max_tokens=64, tools=[TOOL],
                                messages=[{"role": "user", "content": content}]) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].thinking == "mull" and final.content[1].text == "ab"
    tool = final.content[2]
    assert (tool.id, tool.name, tool.input) == ("toolu_1", "get_weather", {"city": "Oslo"})
    assert final.stop_reason == "tool_use"
    assert final.usage.input_tokens == 11 and final.usage.output_tokens == 5


def test_raw_stream_frames(gateway):
    with httpx.stream("POST", gateway.url + "/v1/messages", json={
            "model": "m", "max_tokens": 10, "messages": USER, "stream": True}) as response:
        assert response.headers["request-id"] == response.headers["x-request-id"]
        lines = list(response.iter_lines())
    names = [line[7:] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert len(names) == len(datas) and names == [d["type"] for d in datas]
    assert names[:2] == ["message_start", "ping"]
    start = datas[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 11
    blocks = [d for d in datas if d["type"] == "content_block_start"]
    assert [b["index"] for b in blocks] == [0]
    delta = next(d for d in datas if d["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"]["output_tokens"] == 3


def test_tool_round_trip_and_claude_code_roles(client, frontend):
    thought = client.messages.create(model="m", max_tokens=64, messages=[
        {"role": "user", "content": script(reasoning=["use the tool"], text=["Checking."])}])
    signature = thought.content[0].signature   # sent back unchanged, as clients do
    client.messages.create(model="m", max_tokens=64, tools=[TOOL],
                           tool_choice={"type": "any"}, system=[{"type": "text", "text": "S1"}],
                           messages=[
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "use the tool", "signature": signature},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Oslo", "units": "C"}}]},
        {"role": "system", "content": "S2"},                     # Claude Code >= 2.1.154
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
            {"type": "text", "text": "and tomorrow?", "cache_control": {"type": "ephemeral"}}]},
        {"role": "ctx", "content": "context note"},
    ])
    sent = frontend.requests[-1].chat
    assert [m.role for m in sent.messages] == ["system", "user", "assistant", "tool", "user",
                                               "user"]
    assert sent.messages[0].text == "S1\n\nS2"
    assistant = sent.messages[2]
    assert assistant.text == "Checking." and assistant.reasoning_content == "use the tool"
    assert assistant.tool_calls[0].arguments_json == '{"city":"Oslo","units":"C"}'
    assert (sent.messages[3].tool_call_id, sent.messages[3].text) == ("toolu_1", "rain")
    assert sent.messages[5].text == "context note"
    assert sent.tool_choice.mode == 2  # REQUIRED
    assert json.loads(sent.tools[0].parameters_json)["required"] == ["city"]


def test_images_as_base64_blocks(client, frontend):
    client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}},
        {"type": "text", "text": "describe"}]}])
    parts = frontend.requests[-1].chat.messages[0].parts.parts
    assert (parts[0].image.url, parts[0].image.media_type) == ("", "image/png")
    assert parts[0].image.data == b"\x89PNG\r\n\x1a\n"      # decoded: bytes cross gRPC
    assert parts[1].text == "describe"
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo!"}}]}])
    assert info.value.body["error"]["message"].startswith("image data is not valid base64")


def test_thinking_config(client, frontend):
    client.messages.create(model="m", max_tokens=4096, messages=USER,
                           thinking={"type": "enabled", "budget_tokens": 2048})
    sent = frontend.requests[-1]
    assert json.loads(sent.chat.chat_template_kwargs_json) == {"enable_thinking": True}
    assert sent.parse_reasoning is True
    client.messages.create(model="m", max_tokens=64, messages=USER,
                           thinking={"type": "disabled"})
    assert json.loads(frontend.requests[-1].chat.chat_template_kwargs_json) == \
        {"enable_thinking": False}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="m", max_tokens=64, messages=USER,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert info.value.body["error"]["type"] == "invalid_request_error"


def test_count_tokens_is_the_frontends_count(client, frontend):
    messages = [{"role": "user", "content": "one two three"},
                {"role": "assistant", "content": "four"}]
    counted = client.messages.count_tokens(model="m", messages=messages, system="five six")
    # The fake counts words + 4 per message over exactly what the gateway sent it.
    assert counted.input_tokens == 3 + 1 + 2 + 4 * 3
    assert frontend.requests == []      # counting runs no generation
    from services.common.pb import frontend_pb2
    chat = frontend_pb2.ChatInput(messages=[
        frontend_pb2.ChatMessage(role="system", text="five six"),
        frontend_pb2.ChatMessage(role="user", text="one two three"),
        frontend_pb2.ChatMessage(role="assistant", text="four")])
    assert counted.input_tokens == count_tokens(chat)


def test_ignores_version_beta_headers_and_beta_query(gateway):
    response = httpx.post(gateway.url + "/v1/messages?beta=true", json={
        "model": "m", "max_tokens": 8, "messages": USER},
        headers={"anthropic-version": "2023-06-01", "anthropic-beta": "made-up-2099"})
    assert response.status_code == 200 and response.json()["type"] == "message"


def test_max_tokens_is_required(gateway):
    response = httpx.post(gateway.url + "/v1/messages", json={"model": "m", "messages": USER})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    assert body["request_id"] == response.headers["request-id"]


def test_stop_sequence_reason(client):
    message = client.messages.create(model="m", max_tokens=8, messages=[
        {"role": "user", "content": script(finish="stop_string", stop_sequence="END")}])
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
