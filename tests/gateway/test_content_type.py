"""Request bodies are JSON whatever their content type says (issue 20 item 1).

`curl URL -d '{...}'` sends application/x-www-form-urlencoded and LiteLLM's `ollama/` and
`ollama_chat/` providers send no content type; Ollama and vLLM read the JSON regardless, so
every body route here does too. A body that is not JSON is still a 400 in the route's shape.
(LiteLLM itself runs against the real four services in tests/gateway/test_e2e.py.)
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.gateway.fake_frontend import MODEL_ID

CHAT = [{"role": "user", "content": "Why is the sky blue?"}]
BODIES = {
    "/v1/chat/completions": {"model": "m", "messages": CHAT},
    "/v1/completions": {"model": "m", "prompt": "Why is the sky blue?"},
    "/v1/responses": {"model": "m", "input": "Why is the sky blue?"},
    "/v1/messages": {"model": "m", "max_tokens": 8, "messages": CHAT},
    "/v1/messages/count_tokens": {"model": "m", "messages": CHAT},
    "/api/chat": {"model": MODEL_ID, "messages": CHAT, "stream": False},
    "/api/generate": {"model": MODEL_ID, "prompt": "Why is the sky blue?", "stream": False},
    "/api/show": {"model": MODEL_ID},
    "/v1/embeddings": {"model": "m", "input": "Why is the sky blue?"},
    "/api/embed": {"model": MODEL_ID, "input": "Why is the sky blue?"},
    "/api/embeddings": {"model": MODEL_ID, "prompt": "Why is the sky blue?"},
}
CONTENT_TYPES = [None, "application/x-www-form-urlencoded", "text/plain;charset=UTF-8",
                 "application/octet-stream", "application/json"]


def post(gateway, path: str, body: bytes, content_type: str | None) -> httpx.Response:
    headers = {"content-type": content_type} if content_type else {}
    return httpx.post(gateway.url + path, content=body, headers=headers, timeout=30)


def test_the_table_covers_every_body_route(gateway):
    """A new POST route with a JSON body belongs in BODIES (so it is checked here too)."""
    paths = {path for path, ops in gateway.app.openapi()["paths"].items()
             for method, op in ops.items() if method in ("post", "put", "patch")
             and "requestBody" in op}
    assert paths == set(BODIES)


@pytest.mark.parametrize("content_type", CONTENT_TYPES, ids=str)
def test_every_body_route_reads_json_whatever_the_content_type(gateway, frontend,
                                                              content_type):
    for path, body in BODIES.items():
        response = post(gateway, path, json.dumps(body).encode(), content_type)
        assert response.status_code == 200, (path, response.text)
    # What the routes read reached the frontend: the prompt text, each time.
    assert sum("Why is the sky blue?" in str(r) for r in frontend.requests) >= 5


def test_the_issue_curl_command(gateway, frontend):
    """`curl 127.0.0.1:8000/api/generate -d '{...}'` (curl's form content type, streamed
    NDJSON by Ollama's default)."""
    body = b'{"model": "helios-demo", "prompt": "Why is the sky blue?"}'
    response = post(gateway, "/api/generate", body, "application/x-www-form-urlencoded")
    assert response.status_code == 200
    lines = [json.loads(line) for line in response.text.splitlines() if line]
    assert "".join(line["response"] for line in lines) == "Hello from Helios"
    assert lines[-1]["done"] is True


@pytest.mark.parametrize(("path", "message"), [
    ("/v1/chat/completions", lambda b: b["error"]["message"]),
    ("/v1/messages", lambda b: b["type"] == "error" and b["error"]["message"]),
    ("/api/generate", lambda b: b["error"]),
])
@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded"], ids=str)
def test_a_body_that_is_not_json_is_a_400_in_the_protocol_shape(gateway, path, message,
                                                                 content_type):
    response = post(gateway, path, b"model=m&prompt=Why+is+the+sky+blue%3F", content_type)
    assert response.status_code == 400
    text = message(response.json())
    assert text.startswith("request body is not valid JSON"), text
    # A JSON body that is not an object names what is wrong, whatever the content type.
    response = post(gateway, path, b'["a", "list"]', content_type)
    assert response.status_code == 400 and message(response.json())
