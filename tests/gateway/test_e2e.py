"""Conformance against the real four services (`helios run --demo`) with the official SDKs.

One stack per module. The demo model has random weights: its words are nonsense, so these
tests check shapes, counts and lifecycles (usage, finish reasons, token accounting, slots),
never wording. Greedy decoding (temperature 0) with `ignore_eos` makes lengths exact.
"""

from __future__ import annotations

import asyncio
import json
import os

import anthropic
import grpc
import httpx
import ollama
import openai
import pytest

from services.common.pb import engine_pb2, engine_pb2_grpc, frontend_pb2, frontend_pb2_grpc
from tests.support.processes import ServiceProcess, engine_load, free_port, wait_for

MODEL = "helios-demo"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
EXACT = {"ignore_eos": True, "temperature": 0}
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def frontend_stub(stack):
    channel = grpc.insecure_channel(stack.addresses["frontend"])
    yield frontend_pb2_grpc.FrontendStub(channel)
    channel.close()


def test_openai_routes(oai):
    models = oai.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert oai.models.retrieve(MODEL).model_dump()["max_model_len"] > 0
    reply = oai.chat.completions.create(model=MODEL, max_tokens=6, extra_body={**EXACT,
                                                                               **NO_THINK},
                                        messages=[{"role": "user", "content": "Hello"}])
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 6 and reply.usage.prompt_tokens > 0
    chunks = list(oai.chat.completions.create(
        model=MODEL, max_tokens=6, stream=True, stream_options={"include_usage": True},
        logprobs=True, extra_body={**EXACT, **NO_THINK},
        messages=[{"role": "user", "content": "Hello"}]))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 6
    tokens = [lp for c in chunks if c.choices and c.choices[0].logprobs
              for lp in c.choices[0].logprobs.content]
    assert len(tokens) == 6                   # every generated token reached the client once
    # Greedy: the streamed text equals the whole response's text.
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == reply.choices[0].message.content
    completion = oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5,
                                        extra_body=EXACT)
    assert completion.usage.completion_tokens == 5
    assert completion.choices[0].finish_reason == "length"


def test_responses_routes(oai):
    first = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=4,
                                 instructions="Be brief.", temperature=0)
    assert first.status in ("completed", "incomplete") and first.usage.output_tokens <= 4
    again = oai.responses.retrieve(first.id)
    assert again.id == first.id
    second = oai.responses.create(model=MODEL, input="And?", max_output_tokens=4,
                                  previous_response_id=first.id)
    # The second prompt holds the first turn: it is longer than the first prompt.
    assert second.usage.input_tokens > first.usage.input_tokens
    with oai.responses.stream(model=MODEL, input="Hi", max_output_tokens=4) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed",
                                                            "response.incomplete")
    # (The SDK's get_final_response() knows only response.completed; at the output limit the
    # stream ends, as OpenAI's does, with response.incomplete.)
    final = events[-1].response
    assert final.usage.output_tokens <= 4
    assert [e.sequence_number for e in events] == list(range(len(events)))
    oai.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(first.id)


def test_anthropic_routes_and_count_tokens(claude, frontend_stub):
    message = claude.messages.create(model=MODEL, max_tokens=5, system="sys",
                                     messages=[{"role": "user", "content": "Hello there"}],
                                     thinking={"type": "disabled"},
                                     extra_body={"temperature": 0})
    assert message.type == "message" and message.usage.output_tokens <= 5
    assert message.stop_reason in ("end_turn", "max_tokens")
    with claude.messages.stream(model=MODEL, max_tokens=5, thinking={"type": "disabled"},
                                messages=[{"role": "user", "content": "Hello there"}]) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert final.usage.output_tokens <= 5
    counted = claude.messages.count_tokens(model=MODEL, system="sys", messages=[
        {"role": "user", "content": "Hello there"}], thinking={"type": "disabled"})
    expected = frontend_stub.CountTokens(frontend_pb2.CountTokensRequest(
        model=MODEL, chat=frontend_pb2.ChatInput(messages=[
            frontend_pb2.ChatMessage(role="system", text="sys"),
            frontend_pb2.ChatMessage(role="user", text="Hello there")],
            chat_template_kwargs_json='{"enable_thinking":false}')), timeout=30)
    assert counted.input_tokens == expected.input_tokens > 0
    # The message's own prompt is what count_tokens counted (no cache read split here).
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == \
        counted.input_tokens


def test_ollama_routes(stack):
    client = ollama.Client(host=stack.url, timeout=120)
    assert [m.model for m in client.list().models] == [MODEL]
    shown = client.show(MODEL)
    assert "completion" in shown.capabilities
    assert any(k.endswith(".context_length") for k in shown.modelinfo)
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                        think=False, stream=False, options={"num_predict": 4, "temperature": 0})
    assert reply.done and reply.eval_count <= 4 and reply.prompt_eval_count > 0
    parts = list(client.generate(model=MODEL, prompt="Hello", stream=True,
                                 options={"num_predict": 4}))
    assert parts[-1].done and parts[-1].context
    assert httpx.get(stack.url + "/api/version").json()["version"]
    assert httpx.head(stack.url + "/").status_code == 200


def import_litellm():
    """LiteLLM, without its start-up fetch of the model price map (no network in tests)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm
    return litellm


@pytest.mark.parametrize("provider", ["ollama", "ollama_chat"])
def test_litellm_ollama_providers(stack, provider):
    """LiteLLM's `ollama/` (/api/generate) and `ollama_chat/` (/api/chat) providers send their
    JSON bodies without a content type (issue 20 item 1): every call got a 400 before."""
    litellm = import_litellm()
    kwargs = {"model": f"{provider}/{MODEL}", "api_base": stack.url, "max_tokens": 4,
              "temperature": 0, "timeout": 120,
              "messages": [{"role": "user", "content": "Why is the sky blue?"}]}
    reply = litellm.completion(**kwargs)
    assert isinstance(reply.choices[0].message.content, str)
    assert 0 < reply.usage.completion_tokens <= 4 and reply.usage.prompt_tokens > 0
    chunks = list(litellm.completion(**kwargs, stream=True))
    assert len(chunks) >= 2
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert isinstance("".join(c.choices[0].delta.content or "" for c in chunks), str)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def test_tool_call_round_trip(oai, claude, frontend_stub):
    """The assistant's tool call and the tool's result, sent back the way each SDK sends them,
    reach the real chat template: the prompt the engine ran is exactly the frontend's
    rendering of that conversation, tool call and tool response included."""
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    reply = oai.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                        max_tokens=4, extra_body=NO_THINK)
    chat = frontend_pb2.ChatInput(
        messages=[frontend_pb2.ChatMessage(role="user", text="Weather in Paris?"),
                  frontend_pb2.ChatMessage(role="assistant", text="", tool_calls=[frontend_pb2.ToolCall(
                      id="call_1", type="function", name="get_weather",
                      arguments_json='{"city": "Paris"}')]),
                  frontend_pb2.ChatMessage(role="tool", tool_call_id="call_1",
                                           text="sunny, 21 C")],
        tools=[frontend_pb2.ToolDefinition(type="function", name="get_weather",
                                           description="Current weather for a city",
                                           parameters_json=json.dumps(
                                               TOOLS[0]["function"]["parameters"],
                                               separators=(",", ":")))],
        chat_template_kwargs_json='{"enable_thinking":false}')
    rendered = frontend_stub.RenderChat(frontend_pb2.RenderChatRequest(model=MODEL, chat=chat),
                                        timeout=30)
    assert "get_weather" in rendered.prompt and "Paris" in rendered.prompt
    assert "sunny, 21 C" in rendered.prompt
    assert reply.usage.prompt_tokens == len(rendered.token_ids)
    choice = reply.choices[0]
    if choice.message.tool_calls:           # a random model may still call: then it parses
        assert choice.finish_reason == "tool_calls"
        json.loads(choice.message.tool_calls[0].function.arguments)
    # The same round trip in Anthropic's shape renders the same conversation.
    message = claude.messages.create(model=MODEL, max_tokens=4, thinking={"type": "disabled"},
                                     tools=[{"name": "get_weather",
                                             "description": "Current weather for a city",
                                             "input_schema": TOOLS[0]["function"]["parameters"]}],
                                     messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1",
                                           "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                      "content": "sunny, 21 C"}]}])
    total = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert total == len(rendered.token_ids)    # arguments reach the template as an object


def test_error_classes(oai, claude, stack, tmp_path):
    with pytest.raises(openai.BadRequestError) as info:     # 400: context overflow, counted
        oai.chat.completions.create(model=MODEL, max_tokens=10_000_000,
                                    messages=[{"role": "user", "content": "Hi"}])
    assert info.value.body["code"] in ("context_length_exceeded", "invalid_value")
    with pytest.raises(openai.NotFoundError):                 # 404: unknown model
        oai.chat.completions.create(model="no-such-model", messages=[{"role": "user",
                                                                       "content": "Hi"}])
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="no-such-model", max_tokens=4,
                               messages=[{"role": "user", "content": "Hi"}])
    # 401 and 429 at an edge gateway with a key and one admission permit, in front of the
    # same frontend; 503 from a gateway whose frontend is gone.
    port = free_port()
    with ServiceProcess.start(["serve", "gateway", "--port", str(port), "--api-key", "key",
                               "--max-active", "1", "--queue-capacity", "0",
                               "--frontend-address", stack.addresses["frontend"]],
                              tmp_path / "edge.log") as edge:
        url = f"http://127.0.0.1:{port}"
        edge.wait_http(url + "/health")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="bad", max_retries=0).models.list()
        keyed = openai.OpenAI(base_url=url + "/v1", api_key="key", max_retries=0, timeout=120)
        with keyed.chat.completions.create(model=MODEL, max_tokens=2000, stream=True,
                                           extra_body=EXACT, messages=[
                                               {"role": "user", "content": "Hi"}]) as stream:
            next(iter(stream))
            with pytest.raises(openai.RateLimitError) as info:
                keyed.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                                                      "content": "Hi"}])
            assert int(info.value.response.headers["retry-after"]) >= 1
    port = free_port()
    with ServiceProcess.start(["serve", "gateway", "--port", str(port), "--frontend-address",
                               f"unix://{tmp_path}/nobody.sock"], tmp_path / "dead.log") as dead:
        url = f"http://127.0.0.1:{port}"
        dead.wait_http(url + "/health", status=503)
        with pytest.raises(openai.InternalServerError) as info:
            openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0).chat.completions \
                .create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
        assert info.value.status_code == 503 and info.value.response.headers["retry-after"]


def test_disconnect_frees_the_engine_slot(oai, stack):
    before = engine_load(stack)
    with oai.chat.completions.create(model=MODEL, max_tokens=3000, stream=True,
                                     extra_body=EXACT, messages=[
                                         {"role": "user", "content": "Count"}]) as stream:
        chunks = iter(stream)
        for _ in range(3):
            next(chunks)
        assert engine_load(stack).slots_live >= 1
    wait_for(lambda: engine_load(stack).slots_live == 0)
    after = engine_load(stack)
    assert after.requests_cancelled >= before.requests_cancelled + 1


def test_200_concurrent_streams(stack):
    async def one(client: openai.AsyncOpenAI, number: int) -> tuple[int, int, str]:
        stream = await client.chat.completions.create(
            model=MODEL, max_tokens=8, stream=True, logprobs=True,
            stream_options={"include_usage": True}, extra_body={**EXACT, **NO_THINK},
            messages=[{"role": "user", "content": f"Request {number}"}])
        tokens, usage, finish = 0, 0, ""
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage.completion_tokens
            for choice in chunk.choices:
                tokens += len(choice.logprobs.content) if choice.logprobs else 0
                finish = choice.finish_reason or finish
        return tokens, usage, finish

    async def main():
        client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0,
                                    timeout=300)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(200)))
        finally:
            await client.close()

    results = asyncio.run(main())
    # None lost (200 answers), none truncated (8 tokens each, finish length), none duplicated
    # (each token's logprob arrived exactly once).
    assert results == [(8, 8, "length")] * 200
    wait_for(lambda: engine_load(stack).slots_live == 0)


def padding_row_prompts(model_dir, vocab: int, count: int) -> list[list[int]]:
    """Prompts after which the demo model's own argmax is one of its embedding's padding rows
    (found with transformers: about 1 random prompt in 500)."""
    import random

    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rng, found = random.Random(0), []
    with torch.inference_mode():
        while len(found) < count:
            prompts = [[rng.randrange(vocab) for _ in range(3)] for _ in range(128)]
            best = model(torch.tensor(prompts)).logits[:, -1].argmax(-1).tolist()
            found += [p for p, b in zip(prompts, best, strict=True) if b >= vocab]
    return found[:count]


def test_sampled_ids_stay_inside_the_tokenizer_vocabulary(stack, demo_model_dir, oai):
    """The demo model's embedding has 151,936 rows for 151,669 tokens: the padding rows are
    never emitted, not even where the model's own argmax is one of them (greedy), nor in
    high-temperature draws, and every vocabulary message, engine and frontend, names the
    tokenizer's size."""
    import re

    import tokenizers

    from services.common.pb import common_pb2

    vocab = tokenizers.Tokenizer.from_file(str(demo_model_dir / "tokenizer.json")) \
        .get_vocab_size(with_added_tokens=True)
    assert vocab == 151669
    requests = [engine_pb2.EngineGenerateRequest(
        request_id=f"vocab-greedy-{k}", prompt_token_ids=prompt,
        sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True,
                                           logprobs=True, top_logprobs=5))
        for k, prompt in enumerate(padding_row_prompts(demo_model_dir, vocab, 4))]
    requests.append(engine_pb2.EngineGenerateRequest(
        request_id="vocab-sampled", prompt_token_ids=[9707, 11, 1879], n=8,
        sampling=common_pb2.SamplingParams(temperature=2.0, seed=3, max_tokens=40,
                                           ignore_eos=True)))
    sampled: list[int] = []
    alternatives: list[int] = []
    with grpc.insecure_channel(stack.addresses["engine"]) as channel:
        engine = engine_pb2_grpc.EngineStub(channel)
        for request in requests:
            for message in engine.Generate(request, timeout=300):
                for output in message.outputs:
                    sampled.extend(output.token_ids)
                    alternatives += [t.token_id for lp in output.logprobs for t in lp.top]
        assert len(sampled) == 4 * 3 + 8 * 40 and len(alternatives) == 4 * 3 * 5
        assert max(sampled) < vocab and max(alternatives) < vocab, \
            [t for t in sampled + alternatives if t >= vocab]
        with pytest.raises(grpc.RpcError) as refused:
            engine.Generate(engine_pb2.EngineGenerateRequest(
                request_id="vocab-bad", prompt_token_ids=[1, vocab + 30],
                sampling=common_pb2.SamplingParams(max_tokens=2)), timeout=60).next()

    messages = [refused.value.details()]
    chat = [{"role": "user", "content": "hi"}]
    for extra in ({"logit_bias": {str(vocab + 30): 5}},
                  {"extra_body": {"stop_token_ids": [vocab + 30]}}):
        with pytest.raises(openai.BadRequestError) as error:
            oai.chat.completions.create(model=MODEL, messages=chat, max_tokens=2, **extra)
        messages.append(error.value.message)
    with pytest.raises(openai.BadRequestError) as error:
        oai.completions.create(model=MODEL, prompt=[1, vocab + 30], max_tokens=2)
    messages.append(error.value.message)
    named = [re.search(r"\(0\.\.(\d+)\)", m) for m in messages]
    assert all(named), messages
    assert {int(m.group(1)) for m in named if m} == {vocab - 1}, messages
