"""Robustness through the real four services (`helios run --demo`): issues 20 and 21.

One stack for the module, with gRPC keepalive pings every second (HELIOS_GRPC_KEEPALIVE_MS)
and a deliberately small engine: 4 request slots + 4 waiting, and a KV pool of 65 pages (1040
tokens) below the model's 4096-token context. What it checks:

- idle connections survive pings (no GOAWAY too_many_pings, /health never flips);
- bodies the fuzzers found: a 1 MB model name, NaN / Infinity literals, Responses without
  `model`, NUL characters, Ollama `num_predict` -1 / -2 with a client that leaves;
- requests that can never succeed are 400s naming the limit and the setting that raises it.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

from tests.support.processes import HeliosRun, engine_load, wait_for

MODEL = "helios-demo"
EXACT = {"ignore_eos": True, "temperature": 0}
SLOTS, WAITING = 4, 4
POOL_PAGES, PAGE_TOKENS = 66, 16            # 65 usable pages (one is restore headroom)
POOL_TOKENS = (POOL_PAGES - 1) * PAGE_TOKENS
# The demo model: 8192 bytes per 16-token page, snapshot rows of a page + 64 float32 hidden.
KV_BYTES = POOL_PAGES * 8192 + 2 * SLOTS * (8192 + 64 * 4)
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, demo_core):
    tmp = tmp_path_factory.mktemp("robust")
    config = tmp / "helios.yaml"
    config.write_text(f"engine:\n  max_num_seqs: {SLOTS}\n  max_waiting: {WAITING}\n"
                      f"  kv_cache_bytes: {KV_BYTES}\n")
    with HeliosRun.start_demo(tmp, "--config", str(config),
                              env={"HELIOS_GRPC_KEEPALIVE_MS": "1000"}) as run:
        yield run


def post(stack, path: str, body: dict | bytes, timeout: float = 60.0) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(stack.url + path, content=content, timeout=timeout,
                      headers={"content-type": "application/json"})


def error_text(response: httpx.Response) -> str:
    """The message of any protocol's error body (OpenAI, Anthropic, Ollama)."""
    body = response.json()
    error = body["error"]
    return error if isinstance(error, str) else error["message"]


# -- keepalive (issue 20 item 3) ------------------------------------------------------------

def test_idle_connections_survive_keepalive_pings(stack, oai):
    """5 s idle at 1 s pings: /health stays 200 throughout, no service logs a GOAWAY or an
    ended health watch, and the next request succeeds."""
    oai.models.list()                                   # every connection is up and used
    before = stack.output()
    statuses = set()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        statuses.add(httpx.get(stack.url + "/health", timeout=10).status_code)
        time.sleep(0.1)
    assert statuses == {200}
    reply = oai.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body=EXACT)
    assert reply.usage.completion_tokens == 2
    logged = stack.output()[len(before):]
    assert "too_many_pings" not in logged and "GOAWAY" not in logged
    assert "health watch on" not in logged


# -- fuzzed bodies (issue 20 item 9) --------------------------------------------------------

HUGE = "m" * 1_000_000
CHAT = [{"role": "user", "content": "Hi"}]
HUGE_MODEL_BODIES = {
    "/v1/chat/completions": {"model": HUGE, "messages": CHAT},
    "/v1/completions": {"model": HUGE, "prompt": "Hi"},
    "/v1/responses": {"model": HUGE, "input": "Hi"},
    "/v1/messages": {"model": HUGE, "max_tokens": 4, "messages": CHAT},
    "/v1/messages/count_tokens": {"model": HUGE, "messages": CHAT},
    "/api/chat": {"model": HUGE, "messages": CHAT},
    "/api/generate": {"model": HUGE, "prompt": "Hi"},
    "/api/show": {"model": HUGE},
    "/v1/embeddings": {"model": HUGE, "input": "Hi"},
    "/api/embed": {"model": HUGE, "input": "Hi"},
    "/api/embeddings": {"model": HUGE, "prompt": "Hi"},
}


@pytest.mark.parametrize("path", sorted(HUGE_MODEL_BODIES))
def test_a_huge_model_name_is_a_400_stating_the_limit(stack, path):
    response = post(stack, path, HUGE_MODEL_BODIES[path])
    assert response.status_code == 400, response.text[:500]
    assert "model" in error_text(response) and "256 characters" in error_text(response)
    assert len(response.content) < 2000                 # the name is not echoed back


def test_huge_ids_and_user_strings_are_400s(stack, oai):
    with pytest.raises(openai.BadRequestError, match="256"):
        oai.responses.create(model=MODEL, input="Hi", previous_response_id="r" * 100_000)
    with pytest.raises(openai.BadRequestError, match="512"):
        oai.chat.completions.create(model=MODEL, messages=CHAT, user="u" * 100_000)
    response = httpx.get(f"{stack.url}/v1/responses/{'r' * 5000}", timeout=30)
    assert response.status_code == 400 and "256" in error_text(response)
    response = httpx.get(f"{stack.url}/v1/models/{'m' * 5000}", timeout=30)
    assert response.status_code == 400 and "256" in error_text(response)


# Raw bytes: the official clients refuse to encode NaN (allow_nan=False); the fuzzers did not.
# Each value sits where no typed float field checks it (free-form objects, ignored options),
# which the routes used to accept and run.
NON_FINITE_BODIES = {
    "/v1/chat/completions": (b'{"model": "helios-demo", "messages": [{"role": "user", '
                             b'"content": "Hi"}], "chat_template_kwargs": {"x": NaN}}',
                             "chat_template_kwargs.x"),
    "/v1/completions": (b'{"model": "helios-demo", "prompt": "x", "vllm_xargs": '
                        b'{"a": [1, 1e999]}}', "vllm_xargs.a[1]"),
    "/v1/responses": (b'{"model": "helios-demo", "input": "Hi", "text": {"format": {"type": '
                      b'"json_schema", "name": "n", "schema": {"type": "number", '
                      b'"maximum": Infinity}}}}', "text.format.schema.maximum"),
    "/v1/messages": (b'{"model": "helios-demo", "max_tokens": 4, "messages": [{"role": '
                     b'"user", "content": "Hi"}], "tools": [{"name": "t", "input_schema": '
                     b'{"type": "object", "minimum": -Infinity}}]}', "tools[0].input_schema.minimum"),
    "/api/generate": (b'{"model": "helios-demo", "prompt": "Hi", "stream": false, '
                      b'"options": {"mirostat_tau": NaN}}', "options.mirostat_tau"),
    "/api/chat": (b'{"model": "helios-demo", "messages": [{"role": "user", "content": '
                  b'"Hi"}], "stream": false, "options": {"num_keep": Infinity}}',
                  "options.num_keep"),
}


@pytest.mark.parametrize("path", sorted(NON_FINITE_BODIES))
def test_non_finite_numbers_are_400s_on_every_route(stack, path):
    """Python's json accepts NaN / Infinity (not JSON), and 1e999 overflows to infinity: each
    is refused before anything runs, naming the field (free-form Ollama options included)."""
    body, field = NON_FINITE_BODIES[path]
    started = time.monotonic()
    response = post(stack, path, body)
    assert response.status_code == 400, response.text[:500]
    assert error_text(response).startswith(f"{field}: ") and "finite" in error_text(response)
    assert time.monotonic() - started < 30                # refused, not run


def test_responses_without_model_is_an_immediate_400(stack, oai):
    started = time.monotonic()
    response = post(stack, "/v1/responses", {"input": "Hi"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "model"
    assert "field required" in error_text(response)
    assert time.monotonic() - started < 30                # not a generation to the context
    with pytest.raises(openai.BadRequestError, match="model"):
        oai.responses.create(input="Hi", max_output_tokens=2)  # type: ignore[call-overload]


def test_nul_characters_reach_the_model_and_answer(oai):
    """A NUL in Responses input, instructions or message content is ordinary text: the
    request answers at once (the 35 s the fuzzer saw was a request without an output limit
    generating to the context, which `max_output_tokens` bounds)."""
    plain = oai.responses.create(model=MODEL, input="a b", max_output_tokens=2, temperature=0)
    with_nul = oai.responses.create(model=MODEL, input="a\x00b", max_output_tokens=2,
                                    temperature=0, instructions="be\x00brief")
    assert with_nul.status in ("completed", "incomplete")
    assert with_nul.usage.input_tokens > plain.usage.input_tokens   # the NULs were tokenized
    message = oai.responses.create(model=MODEL, max_output_tokens=2, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "\x00"}]}])
    assert message.usage.output_tokens <= 2


def test_a_non_ascii_thinking_signature_is_a_400(stack):
    """Schemathesis' one server error (a 500 TypeError from hmac.compare_digest)."""
    response = post(stack, "/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t",
                                           "signature": "s\u00e9\u00f7"}]},
        {"role": "user", "content": "Again"}]})
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert "signature" in error_text(response)


@pytest.mark.parametrize("num_predict", [-1, -2])
def test_ollama_unbounded_generation_is_cancelled_by_a_disconnect(stack, num_predict):
    """-1 (infinite) and -2 (fill the context) run until the context (here the KV pool) ends;
    a client that leaves, streaming or not, frees the engine slot."""
    wait_for(lambda: engine_load(stack).slots_live == 0)
    with httpx.stream("POST", stack.url + "/api/generate", timeout=60, json={
            "model": MODEL, "prompt": "Count", "options": {"num_predict": num_predict,
                                                           "temperature": 0}}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(3):
            assert not json.loads(next(lines))["done"]
        assert engine_load(stack).slots_live == 1
    wait_for(lambda: engine_load(stack).slots_live == 0)
    cancelled = engine_load(stack).requests_cancelled
    assert cancelled >= 1
    # Not streamed: the client sends the request, waits until the engine runs it, and leaves.
    body = json.dumps({"model": MODEL, "prompt": "Count", "stream": False,
                       "options": {"num_predict": num_predict, "temperature": 0}}).encode()
    with socket.create_connection(("127.0.0.1", stack.port), timeout=60) as sock:
        sock.sendall(b"POST /api/generate HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        wait_for(lambda: engine_load(stack).slots_live == 1)
    wait_for(lambda: engine_load(stack).slots_live == 0)
    assert engine_load(stack).requests_cancelled == cancelled + 1


# -- requests that can never succeed (issue 21 item 3) --------------------------------------

def test_a_batch_larger_than_the_engine_queue_is_a_400(oai, stack):
    most = SLOTS + WAITING
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt=["Hi"] * (most + 1), max_tokens=1)
    text = str(info.value)
    assert f"{most + 1} prompts" in text and f"at most {most}" in text
    assert "max_num_seqs" in text and "max_waiting" in text
    assert info.value.body["param"] == "prompt"
    batch = oai.completions.create(model=MODEL, prompt=["Hi"] * most, max_tokens=1,
                                   extra_body=EXACT)
    assert len(batch.choices) == most                      # the limit itself fits


def test_requests_larger_than_the_kv_pool_are_400s(oai, stack):
    """The context is 4096 tokens but the pool holds 1040: prompt + output beyond the pool
    can never run, whatever the load."""
    assert oai.models.retrieve(MODEL).model_dump()["max_model_len"] == 4096
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt="Hi", max_tokens=POOL_TOKENS + 100)
    assert "kv_cache_bytes" in str(info.value) and "never" in str(info.value)
    with pytest.raises(openai.BadRequestError, match="kv_cache_bytes"):
        oai.completions.create(model=MODEL, prompt=[5] * (POOL_TOKENS + 50), max_tokens=1)
    # Without an output limit the output stops where the pool ends (it was a 503 every time).
    filled = oai.completions.create(model=MODEL, prompt=[5] * (POOL_TOKENS - 20),
                                    max_tokens=None, extra_body=EXACT)
    assert filled.choices[0].finish_reason == "length"
    assert filled.usage.completion_tokens == 20
    load = engine_load(stack)
    assert load.slots_live == 0 and load.num_waiting == 0
