"""Fuzzing the gateway's own OpenAPI document with schemathesis (positive and negative cases).

Every generated request - valid or malformed body, query or path - must get an answer below
500, 4xx answers must be in the route's protocol error shape, and nothing may hang (each
call has a timeout). Example counts are bounded to keep CI time small.
"""

from __future__ import annotations

import copy
import json
import math

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.errors import Protocol, protocol_for_path
from tests.gateway.harness import GatewayThread

MAX_EXAMPLES = 20

schema = schemathesis.openapi.from_dict(create_app(GatewayConfig()).openapi())
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                max_examples=MAX_EXAMPLES)
schema.config.phases.coverage.enabled = False


@pytest.fixture(scope="module")
def fuzz_gateway(fake_frontend):
    with GatewayThread(GatewayConfig(frontend_address=fake_frontend.address,
                                     sse_keepalive_s=1.0)) as gw:
        yield gw


def check_error_shape(path: str, body: object) -> None:
    protocol = protocol_for_path(path)
    assert isinstance(body, dict), body
    if protocol is Protocol.ANTHROPIC:
        assert body["type"] == "error"
        assert isinstance(body["error"]["type"], str) and isinstance(body["error"]["message"],
                                                                      str)
    elif protocol is Protocol.OLLAMA:
        assert isinstance(body["error"], str)
    else:
        error = body["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str)
        assert "param" in error and "code" in error


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzz(case, fuzz_gateway):
    response = case.call(base_url=fuzz_gateway.url, timeout=30)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
    if 400 <= response.status_code < 500 and case.method != "HEAD":
        check_error_shape(case.formatted_path, response.json())


# ---------------------------------------------------------------------------------------------
# Mutations of valid bodies: any leaf replaced, removed or joined by arbitrary JSON, including
# text the schema generator never produces (unpaired surrogates, huge numbers, deep nesting).

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
VALID: dict[str, dict] = {
    "/v1/chat/completions": {"model": "m", "max_tokens": 5, "tools": [TOOL], "n": 1,
                             "messages": [{"role": "system", "content": "s"},
                                          {"role": "user", "content": [
                                              {"type": "text", "text": "hi"}]}]},
    "/v1/completions": {"model": "m", "prompt": ["a", "b"], "logprobs": 1, "echo": True},
    "/v1/responses": {"model": "m", "instructions": "i", "tools": [
        {"type": "function", "name": "f", "parameters": {}}], "input": [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"}]},
    "/v1/messages": {"model": "m", "max_tokens": 8, "system": "s", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                           "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "content": "ok"}]}]},
    "/v1/messages/count_tokens": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
    "/api/chat": {"model": "helios-demo", "stream": False, "options": {"num_predict": 4},
                  "messages": [{"role": "user", "content": "hi"}]},
    "/api/generate": {"model": "helios-demo", "prompt": "hi", "stream": False},
    "/api/show": {"model": "helios-demo"},
}

plain_text = st.text(max_size=8)
# An unpaired surrogate between ordinary characters: JSON can spell it ("\ud800"), Unicode
# cannot; adjacent surrogates would pair up into one valid character instead.
lone_surrogate_text = st.builds(lambda a, s, b: a + s + b, plain_text,
                                st.characters(categories=["Cs"]), plain_text)
any_text = plain_text | lone_surrogate_text
# NaN / Infinity are not JSON, but json.dumps writes them as literals (the fuzzers sent them):
# every route must refuse them with a 400 wherever they sit.
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | any_text | non_finite,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(any_text, children, max_size=3),
    max_leaves=6)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _get(value, path):
    for key in path:
        value = value[key]
    return value


@st.composite
def mutated_bodies(draw):
    route = draw(st.sampled_from(sorted(VALID)))
    body = copy.deepcopy(VALID[route])
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(body) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "add", "text"]))
        texts = [p for p in paths if isinstance(_get(body, p), str)]
        if action == "text" and texts:
            # Keep the shape, change the words: reaches the conversion code behind validation.
            path = draw(st.sampled_from(texts))
            parent = body
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = draw(any_text)
        elif action == "replace":
            parent[path[-1]] = draw(json_values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(any_text)] = draw(json_values)
        else:
            parent.append(draw(json_values))
    stream = draw(st.booleans())
    if stream and route not in ("/v1/messages/count_tokens", "/api/show"):
        body["stream"] = True
    return route, body, draw(st.booleans())


@given(case=mutated_bodies())
@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
def test_mutated_bodies_never_fail_the_server(fuzz_gateway, case):
    route, body, ascii_only = case
    content = json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    with httpx.stream("POST", fuzz_gateway.url + route, content=content, timeout=30,
                      headers={"content-type": "application/json"}) as response:
        data = response.read()
    assert response.status_code < 500, (route, body, data[:500])
    if response.status_code >= 400:
        check_error_shape(route, json.loads(data))
    if _has_non_finite(body):
        # (a body with a lone surrogate too may be refused for that first)
        assert response.status_code == 400 and (b"not a finite number" in data or
                                                b"UTF" in data), (body, data)


def _has_non_finite(value) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False
