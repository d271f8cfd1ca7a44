"""The ingress layer: admission before the body, body limit, request ids, disconnects,
paused readers, keep-alives, pause/resume, /health and /metrics."""

from __future__ import annotations

import contextlib
import json
import re
import socket

import anthropic
import httpx
import ollama
import openai
import pytest

from gateway.config import GatewayConfig
from tests.gateway.fake_frontend import MODEL_ID, script
from tests.gateway.harness import GatewayThread
from tests.support.processes import wait_for

HANG = [{"role": "user", "content": script(hang=True)}]


@pytest.fixture(scope="module")
def small(fake_frontend):
    """A gateway with two admission permits, a 4 KiB body limit and fast keep-alives."""
    config = GatewayConfig(frontend_address=fake_frontend.address, max_active=1,
                           queue_capacity=1, max_body_bytes=4096, sse_keepalive_s=0.2)
    with GatewayThread(config) as gw:
        yield gw


@contextlib.contextmanager
def hanging_stream(gw: GatewayThread):
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", gw.url + "/v1/chat/completions",
            json={"model": "m", "messages": HANG, "stream": True}) as response:
        assert response.status_code == 200
        yield response


def test_admission_rejects_with_429_before_reading_the_body(small, frontend):
    with hanging_stream(small), hanging_stream(small):
        wait_for(lambda: frontend.active == 2)
        assert small.admission.active == 2
        # The permit check comes first: an invalid or oversized body is never read.
        for body in (b"{not json", b"x" * 100_000):
            response = httpx.post(small.url + "/v1/chat/completions", content=body)
            assert response.status_code == 429
            assert response.headers["retry-after"] == "1"
        with pytest.raises(openai.RateLimitError) as info:
            openai.OpenAI(base_url=small.url + "/v1", api_key="k", max_retries=0) \
                .chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert info.value.body["code"] == "rate_limit_exceeded"
        assert "--queue-capacity" in info.value.body["message"]
        with pytest.raises(anthropic.RateLimitError) as info:
            anthropic.Anthropic(base_url=small.url, api_key="k", max_retries=0) \
                .messages.create(model="m", max_tokens=4, messages=[{"role": "user",
                                                                      "content": "x"}])
        assert info.value.body["error"]["type"] == "rate_limit_error"
        with pytest.raises(ollama.ResponseError) as info:
            ollama.Client(host=small.url).chat(model=MODEL_ID, messages=[
                {"role": "user", "content": "x"}], stream=False)
        assert info.value.status_code == 429
        # GETs need no permit.
        assert httpx.get(small.url + "/v1/models").status_code == 200
    # Closing the streams released their permits (and cancelled their upstream calls).
    wait_for(lambda: small.admission.active == 0 and frontend.active == 0)
    response = httpx.post(small.url + "/v1/chat/completions",
                          json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 200


def test_client_disconnect_cancels_the_upstream_call(small, frontend):
    cancelled = frontend.cancelled
    with hanging_stream(small):
        wait_for(lambda: frontend.active == 1)
    wait_for(lambda: frontend.cancelled == cancelled + 1 and frontend.active == 0)
    # A non-streaming request whose client gives up is cancelled too.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(small.url + "/v1/chat/completions", timeout=0.5,
                   json={"model": "m", "messages": HANG})
    wait_for(lambda: frontend.cancelled == cancelled + 2 and frontend.active == 0)
    wait_for(lambda: small.admission.active == 0)


def test_paused_reader_keeps_its_whole_response(gateway, frontend):
    count = 2000                                                # ~2 MB of deltas
    body = json.dumps({"model": "m", "stream": True, "messages": [
        {"role": "user", "content": script(numbered=[count, 1000])}]})
    completed = frontend.completed
    with socket.create_connection(("127.0.0.1", gateway.config.port)) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
                     f"connection: close\r\n\r\n{body}".encode())
        # Read nothing until the upstream finished: it must not have been blocked.
        wait_for(lambda: frontend.completed == completed + 1)
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    text = data.decode()
    assert text.startswith("HTTP/1.1 200")
    numbers = re.findall(r"<(\d{6})>", text)
    assert numbers == [f"{i:06d}" for i in range(count)]      # none lost, none repeated
    assert "data: [DONE]" in text


@pytest.mark.parametrize(("path", "check"), [
    ("/v1/chat/completions", lambda b: b["error"]["code"] == "request_too_large"),
    ("/v1/messages", lambda b: b["error"]["type"] == "request_too_large"),
    ("/api/chat", lambda b: "4096" in b["error"]),
])
def test_body_limit_is_413_in_each_protocol(small, path, check):
    big = b'{"pad": "' + b"x" * 8000 + b'"}'
    response = httpx.post(small.url + path, content=big,
                          headers={"content-type": "application/json"})
    assert response.status_code == 413 and check(response.json())

    def chunks():             # no content-length: counted while reading
        for _ in range(10):
            yield b"x" * 1000

    response = httpx.post(small.url + path, content=chunks())
    assert response.status_code == 413


def test_request_id_passes_through(gateway, frontend):
    response = httpx.post(gateway.url + "/v1/chat/completions",
                          headers={"x-request-id": "trace-123"},
                          json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert response.headers["x-request-id"] == "trace-123"
    assert frontend.metadata[-1]["x-request-id"] == "trace-123"
    generated = httpx.get(gateway.url + "/v1/models", headers={"x-request-id": "bad id\t!"})
    assert generated.headers["x-request-id"] not in ("", "bad id\t!")
    messages = httpx.post(gateway.url + "/v1/messages", headers={"x-request-id": "r-9"},
                          json={"model": "m", "max_tokens": 4,
                                "messages": [{"role": "user", "content": "x"}]})
    assert messages.headers["request-id"] == "r-9" == messages.headers["x-request-id"]


def test_keepalives_during_a_silent_upstream(small):
    slow = script(text=["a"], delay_s=0.45)
    with httpx.stream("POST", small.url + "/v1/chat/completions", json={
            "model": "m", "stream": True,
            "messages": [{"role": "user", "content": slow}]}) as response:
        lines = list(response.iter_lines())
    assert ": keep-alive" in lines and "data: [DONE]" in lines
    with httpx.stream("POST", small.url + "/v1/messages", json={
            "model": "m", "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": slow}]}) as response:
        names = [line[7:] for line in response.iter_lines() if line.startswith("event: ")]
    assert names.count("ping") >= 2 and names[-1] == "message_stop"


def test_pause_resume_and_wait_for_requests(small, frontend):
    with hanging_stream(small) as stream:
        wait_for(lambda: frontend.active == 1)
        small.admission.pause()
        try:
            response = httpx.post(small.url + "/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "x"}]})
            assert response.status_code == 503 and response.headers["retry-after"]
            assert httpx.get(small.url + "/health").status_code == 503
            assert small.run(small.admission.wait_for_requests(0.2)) is False
            stream.close()
            assert small.run(small.admission.wait_for_requests(20)) is True
        finally:
            small.admission.resume()
    assert httpx.get(small.url + "/health").status_code == 200
    response = httpx.post(small.url + "/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 200


def test_health_follows_the_frontend(gateway, fake_frontend):
    assert httpx.get(gateway.url + "/health").status_code == 200
    fake_frontend.set_serving(False)
    try:
        wait_for(lambda: httpx.get(gateway.url + "/health").status_code == 503)
    finally:
        fake_frontend.set_serving(True)
    wait_for(lambda: httpx.get(gateway.url + "/health").status_code == 200)


def test_metrics(gateway):
    httpx.post(gateway.url + "/v1/chat/completions", headers={"x-request-id": "secret-id"},
               json={"model": "m", "messages": [{"role": "user", "content": "prompt words"}]})
    text = httpx.get(gateway.url + "/metrics").text
    assert 'helios_gateway_requests_total{route="/v1/chat/completions",status="200"}' in text
    assert "helios_gateway_admission_capacity 320.0" in text
    assert "helios_gateway_active_requests" in text
    assert "secret-id" not in text and "prompt words" not in text


def test_large_bodies_are_checked_off_the_event_loop(gateway, frontend):
    """Over 1 MiB the UTF-8 / surrogate check runs in a thread; same answers."""
    url = "data:image/png;base64," + "A" * (3 << 20)
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "ok"}]}]}
    assert httpx.post(gateway.url + "/v1/chat/completions", json=body,
                      timeout=60).status_code == 200
    body["messages"][0]["content"][1]["text"] = "\ud800"
    response = httpx.post(gateway.url + "/v1/chat/completions", timeout=60,
                          content=json.dumps(body).encode(),
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].content[1].text"
