"""Every error class reaches each SDK as its documented exception, in the protocol's shape.

Upstream failures are raised by the fake frontend as typed Helios errors (through the real
gRPC error interceptor); 401 and 429 come from the gateway's own ingress.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import ollama
import openai
import pytest

from gateway.config import GatewayConfig
from tests.gateway.fake_frontend import MODEL_ID, script
from tests.gateway.harness import GatewayThread


def failing(kind: str, **extra) -> list[dict]:
    return [{"role": "user", "content": script(error={"kind": kind, "message": f"{kind}!",
                                                      **extra})}]


@pytest.fixture(scope="module")
def oai(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0)


@pytest.fixture(scope="module")
def claude(gateway):
    return anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)


@pytest.fixture(scope="module")
def llama(gateway):
    return ollama.Client(host=gateway.url)


OPENAI_CASES = [
    ("validation", openai.BadRequestError, 400),
    ("unsupported", openai.BadRequestError, 400),
    ("grammar", openai.BadRequestError, 400),
    ("image_decode", openai.BadRequestError, 400),
    ("not_found", openai.NotFoundError, 404),
    ("capacity", openai.InternalServerError, 503),
    ("unavailable", openai.InternalServerError, 503),
    ("worker_failure", openai.InternalServerError, 500),
    ("poisoned", openai.InternalServerError, 500),
    ("internal", openai.InternalServerError, 500),
]


@pytest.mark.parametrize(("kind", "exception", "status"), OPENAI_CASES)
def test_openai_sdk_exceptions(oai, kind, exception, status):
    with pytest.raises(exception) as info:
        oai.chat.completions.create(model="m", messages=failing(kind, hint="see the docs"))
    error = info.value
    assert error.status_code == status
    assert error.body["message"] == f"{kind}! (see the docs)"
    assert {"type", "param", "code"} <= set(error.body)
    headers = error.response.headers
    assert headers["x-request-id"] == error.request_id
    if status == 503:
        assert headers["retry-after"] == "1"
    if status == 500:
        assert headers["x-should-retry"] == "false"
    # Streaming requests fail the same way: the error precedes the first byte.
    with pytest.raises(exception):
        oai.chat.completions.create(model="m", messages=failing(kind), stream=True)


def test_context_overflow_carries_both_counts_and_the_context(oai):
    messages = failing("context_overflow", message="", prompt_tokens=4000, max_tokens=200,
                       context_length=4096, hint="raise --max-model-len")
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="m", messages=messages)
    body = info.value.body
    assert body["code"] == "context_length_exceeded"
    assert (body["prompt_tokens"], body["max_tokens"], body["context_length"]) == (4000, 200,
                                                                                  4096)
    for number in ("4096", "4000", "200", "raise --max-model-len"):
        assert number in body["message"]


def test_retry_after_from_upstream_advice(oai):
    with pytest.raises(openai.InternalServerError) as info:
        oai.chat.completions.create(model="m", messages=failing("capacity", retry_after_s=2.5))
    assert info.value.response.headers["retry-after"] == "3"
    assert info.value.response.headers["retry-after-ms"] == "2500"


ANTHROPIC_CASES = [
    ("validation", anthropic.BadRequestError, 400, "invalid_request_error"),
    ("not_found", anthropic.NotFoundError, 404, "not_found_error"),
    ("capacity", anthropic.InternalServerError, 503, "overloaded_error"),
    ("worker_failure", anthropic.InternalServerError, 500, "api_error"),
]


@pytest.mark.parametrize(("kind", "exception", "status", "type_"), ANTHROPIC_CASES)
def test_anthropic_sdk_exceptions(claude, kind, exception, status, type_):
    with pytest.raises(exception) as info:
        claude.messages.create(model="m", max_tokens=8, messages=failing(kind))
    assert info.value.status_code == status
    body = info.value.body
    assert body["type"] == "error" and body["error"]["type"] == type_
    assert body["error"]["message"] == f"{kind}!"
    assert body["request_id"] == info.value.response.headers["request-id"]


@pytest.mark.parametrize(("kind", "status"), [("validation", 400), ("not_found", 404),
                                              ("capacity", 503), ("internal", 500)])
def test_ollama_errors(llama, kind, status):
    with pytest.raises(ollama.ResponseError) as info:
        llama.chat(model=MODEL_ID, messages=failing(kind), stream=False)
    assert info.value.status_code == status and info.value.error == f"{kind}!"


def mid_stream(kind: str = "worker_failure") -> str:
    return script(text=["a", "b", "c"], error={"kind": kind, "message": "engine died"},
                  error_after=2)


def test_openai_stream_failure_after_start_is_an_error_event(oai, gateway):
    stream = oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": mid_stream()}], stream=True)
    received = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            received.append(chunk)
    assert "engine died" in str(info.value.message)
    assert received and received[0].choices[0].delta.role == "assistant"
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json={
            "model": "m", "stream": True,
            "messages": [{"role": "user", "content": mid_stream()}]}) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    last = json.loads(lines[-1][len("data: "):])
    assert last["error"]["message"] == "engine died" and "[DONE]" not in lines[-1]


def test_responses_stream_failure_is_response_failed(oai):
    events = []
    stream = oai.responses.create(model="m", input=mid_stream(), stream=True)
    for event in stream:
        events.append(event)
    kinds = [e.type for e in events]
    assert kinds[-2:] == ["error", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error"
    assert failed.error.message == "engine died"


def test_anthropic_stream_failure_is_an_error_event_without_message_stop(claude, gateway):
    with pytest.raises(anthropic.APIStatusError) as info, claude.messages.stream(
            model="m", max_tokens=8,
            messages=[{"role": "user", "content": mid_stream("capacity")}]) as stream:
        for _ in stream:
            pass
    assert "engine died" in str(info.value)
    with httpx.stream("POST", gateway.url + "/v1/messages", json={
            "model": "m", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": mid_stream("capacity")}]}) as response:
        lines = list(response.iter_lines())
    names = [line[7:] for line in lines if line.startswith("event: ")]
    assert names[-1] == "error" and "message_stop" not in names
    error = json.loads([line for line in lines if line.startswith("data: ")][-1][6:])
    assert error == {"type": "error", "error": {"type": "overloaded_error",
                                                "message": "engine died"}}


def test_ollama_stream_failure_is_an_error_line(llama):
    parts = []
    with pytest.raises(ollama.ResponseError) as info:
        for part in llama.chat(model=MODEL_ID, stream=True,
                               messages=[{"role": "user", "content": mid_stream()}]):
            parts.append(part)
    assert info.value.error == "engine died" and parts


@pytest.fixture(scope="module")
def secured(fake_frontend):
    config = GatewayConfig(frontend_address=fake_frontend.address, api_key="s3cret")
    with GatewayThread(config) as gw:
        yield gw


def test_api_key_on_every_route_but_health_and_metrics(secured):
    url = secured.url
    good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
    assert good.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    for key in ("wrong", ""):
        bad = openai.OpenAI(base_url=url + "/v1", api_key=key or "-", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            bad.models.list()
        assert info.value.body["code"] == "invalid_api_key"
    # Anthropic routes take x-api-key (the SDK's default) as well as Bearer.
    claude = anthropic.Anthropic(base_url=url, api_key="s3cret", max_retries=0)
    assert claude.messages.create(model="m", max_tokens=8,
                                  messages=[{"role": "user", "content": "x"}]).content
    bearer = anthropic.Anthropic(base_url=url, auth_token="s3cret", max_retries=0)
    assert bearer.messages.count_tokens(model="m", messages=[{"role": "user",
                                                              "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError) as info:
        anthropic.Anthropic(base_url=url, api_key="nope", max_retries=0).messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert info.value.body["error"]["type"] == "authentication_error"
    # x-api-key is not accepted on OpenAI routes.
    response = httpx.get(url + "/v1/models", headers={"x-api-key": "s3cret"})
    assert response.status_code == 401
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=url).list()
    assert info.value.status_code == 401
    assert ollama.Client(host=url, headers={"Authorization": "Bearer s3cret"}).list().models
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200


def test_unknown_routes_and_methods_in_protocol_shape(gateway):
    response = httpx.get(gateway.url + "/v1/nope")
    assert response.status_code == 404 and "error" in response.json()
    response = httpx.get(gateway.url + "/v1/chat/completions")
    assert response.status_code == 405 and response.json()["error"]["type"]
    response = httpx.get(gateway.url + "/v1/messages")
    assert response.status_code == 405 and response.json()["type"] == "error"
    response = httpx.post(gateway.url + "/v1/chat/completions", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]
