"""Content lists through every API that takes them (fake frontend, official SDKs).

Text parts reach the frontend as parts (it renders them in the form each chat template reads:
docs/frontend.md); an empty list is a 400 naming the field and the rule, in each protocol's
error shape, before anything reaches the frontend (issue 21 item 5).
"""

from __future__ import annotations

import anthropic
import openai
import pytest


@pytest.fixture(scope="module")
def oai(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def claude(gateway):
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


def texts(message) -> list[str]:
    assert message.WhichOneof("content") == "parts"
    return [part.text for part in message.parts.parts]


def test_chat_text_parts_reach_the_frontend_as_parts(oai, frontend):
    oai.chat.completions.create(model="m", messages=[
        {"role": "system", "content": [{"type": "text", "text": "Be"}, {"type": "text",
                                                                      "text": "brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]}])
    sent = frontend.requests[-1].chat.messages
    assert texts(sent[0]) == ["Be", "brief."] and texts(sent[1]) == ["Hello"]


def test_responses_and_messages_keep_parts_too(oai, claude, frontend):
    oai.responses.create(model="m", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "one"}, {"type": "input_text", "text": "two"}]}])
    assert texts(frontend.requests[-1].chat.messages[0]) == ["one", "two"]
    claude.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
        {"type": "text", "text": "three"}, {"type": "text", "text": "four"}]}])
    assert texts(frontend.requests[-1].chat.messages[0]) == ["three", "four"]


def test_empty_chat_content_names_the_field(oai, frontend):
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="m", messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
            {"role": "user", "content": []}])
    error = info.value.body
    assert error["message"].startswith("messages[2].content: must not be an empty list")
    assert error["param"] == "messages[2].content"
    assert error["type"] == "invalid_request_error"
    assert not frontend.requests


def test_empty_responses_content_names_the_field(oai, frontend):
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model="m", input=[{"role": "user", "content": []}])
    assert info.value.body["message"].startswith("input[0].content: must not be an empty list")
    assert info.value.body["param"] == "input[0].content"
    assert not frontend.requests


def test_empty_anthropic_content_names_the_field(claude, frontend):
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="m", max_tokens=5,
                               messages=[{"role": "user", "content": []}])
    error = info.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("messages[0].content: must not be an empty list")
    assert not frontend.requests
    # An empty final assistant turn is a prefill of nothing, as Anthropic allows.
    claude.messages.create(model="m", max_tokens=5, messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": []}])
    assert frontend.requests[-1].chat.messages[0].role == "user"
