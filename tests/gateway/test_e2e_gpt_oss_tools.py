"""A gpt-oss conversation with a tool call round-trips through the OpenAI chat, Responses and
Anthropic APIs (the official python SDKs; the first turn through Ollama's client too).

The gateway, the frontend (its tokenizer: the pinned gptoss files; its chat template: Helios's
harmony template) and the gRPC between them are the real ones. The engine is the scripted
fake (tests/frontend/fakes.py): a random-weight model would not write a tool call, so the
engine "generates" the tokens of a harmony tool call (analysis, then a commentary message to
functions.get_weather ending at <|call|>, the stop token), exactly as harmony's own renderer
writes them. The client then sends the tool's result, and the prompt token ids the engine
receives for the second turn must be what openai-harmony renders for that conversation.
"""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path

import pytest

from gateway.config import GatewayConfig
from services.common.api.chat import ChatInput, ChatMessage, ToolCall, ToolDefinition
from services.common.core import prepare_core
from services.frontend.assets import load_tokenizer_dir
from tests.frontend.fakes import FakeEngine, FrontendHarness, ScriptedChoice, UpstreamServer
from tests.frontend.harmony_reference import gptoss_dir, harmony_encoding, reference_prompt
from tests.gateway.harness import GatewayThread

pytestmark = pytest.mark.timeout(180)

MODEL = "gpt-oss-tiny"
SYSTEM = "You are a weather assistant."
QUESTION = "What is the weather in Paris?"
ARGUMENTS = {"location": "Paris, FR"}
RESULT = '{"temperature_c": 21, "sky": "clear"}'
ANSWER = "It is 21 °C and clear in Paris."
PARAMETERS = {"type": "object", "properties": {
    "location": {"type": "string", "description": "City and country"}}, "required": ["location"]}
WEATHER = ToolDefinition("get_weather", description="Gets the current weather.",
                         parameters=PARAMETERS)
CONFIG = {  # a gpt-oss config (the engine is the fake: only its shape facts are read)
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088,
    "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 128,
    "max_position_embeddings": 4096, "eos_token_id": [200002, 199999, 200012]}


@pytest.fixture(scope="module")
def gpt_oss_core(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpt-oss")
    model = root / "model"
    model.mkdir()
    for path in gptoss_dir().iterdir():
        (model / path.name).write_bytes(path.read_bytes())
    (model / "config.json").write_text(json.dumps(CONFIG))
    (model / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": CONFIG["eos_token_id"]}))
    prepare_core(model, root / "core", model_id=MODEL, served_names=(MODEL,),
                 allow_missing_weights=True)
    return root / "core"


@pytest.fixture(scope="module")
def gpt_oss_frontend_model(gpt_oss_core):
    """The core's FrontendModel, loaded once (a 200k-token vocabulary takes seconds)."""
    from services.common.core import open_model
    from services.frontend.model import FrontendModel

    return FrontendModel.load(open_model(gpt_oss_core))


def harmony_completion(*messages) -> tuple[list[int], int]:
    """The ids the model writes after the prompt's `<|start|>assistant`, and its stop id."""
    encoding = harmony_encoding()
    ids = [t for message in messages for t in encoding.render(message)]
    start = encoding.encode("<|start|>assistant", allowed_special="all")
    assert ids[:len(start)] == start
    ids = ids[len(start):]
    end, done = (encoding.encode(m, allowed_special="all")[0] for m in ("<|end|>", "<|return|>"))
    if ids[-1] == end:          # the model ends its final answer with <|return|>
        ids[-1] = done
    return ids, ids[-1]


def tool_call_turn() -> tuple[list[int], int]:
    from openai_harmony import Message, Role

    return harmony_completion(
        Message.from_role_and_content(Role.ASSISTANT, "The user asks for Paris weather; call "
                                      "get_weather.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, json.dumps(ARGUMENTS, separators=(",", ":")))
        .with_channel("commentary").with_recipient("functions.get_weather")
        .with_content_type("<|constrain|>json"))


def answer_turn() -> tuple[list[int], int]:
    from openai_harmony import Message, Role

    return harmony_completion(
        Message.from_role_and_content(Role.ASSISTANT, ANSWER).with_channel("final"))


def script(engine: FakeEngine, ids: list[int], stop: int) -> None:
    chunks = [ids[i:i + 3] for i in range(0, len(ids), 3)]   # a few tokens per engine message
    engine.script.choices = [ScriptedChoice(chunks, stop_token_id=stop)]


def expected_second_prompt(call_id: str) -> str:
    chat = ChatInput((ChatMessage("system", SYSTEM), ChatMessage("user", QUESTION),
                      ChatMessage("assistant", None, tool_calls=(
                          ToolCall(call_id, "get_weather", json.dumps(ARGUMENTS)),)),
                      ChatMessage("tool", RESULT, tool_call_id=call_id)), tools=(WEATHER,))
    return reference_prompt(chat)


@functools.cache
def _tokenizer():
    return load_tokenizer_dir(gptoss_dir()).tokenizer


def decode(ids) -> str:
    return _tokenizer().decode(list(ids), skip_special_tokens=False)


def openai_round_trip(url: str, engine: FakeEngine) -> None:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    tools = [{"type": "function", "function": {"name": "get_weather",
                                                "description": WEATHER.description,
                                                "parameters": PARAMETERS}}]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    script(engine, *tool_call_turn())
    stream = client.chat.completions.create(model=MODEL, messages=messages, tools=tools,
                                            stream=True)
    reasoning, name, arguments, call_id, finish = "", "", "", "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        assert not delta.content, "no harmony text may leak into content"
        for call in delta.tool_calls or []:
            name += call.function.name or ""
            arguments += call.function.arguments or ""
            call_id = call.id or call_id
        finish = chunk.choices[0].finish_reason or finish
    assert (name, json.loads(arguments), finish) == ("get_weather", ARGUMENTS, "tool_calls")
    assert reasoning == "The user asks for Paris weather; call get_weather."
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": call_id, "type": "function",
                      "function": {"name": name, "arguments": arguments}}]},
                 {"role": "tool", "tool_call_id": call_id, "content": RESULT}]
    script(engine, *answer_turn())
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].finish_reason == "stop"
    assert decode(engine.requests[-1].prompt_token_ids) == expected_second_prompt(call_id)


def responses_round_trip(url: str, engine: FakeEngine) -> None:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    tools = [{"type": "function", "name": "get_weather", "description": WEATHER.description,
              "parameters": PARAMETERS}]
    script(engine, *tool_call_turn())
    first = client.responses.create(model=MODEL, instructions=SYSTEM, input=QUESTION,
                                    tools=tools)
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == ARGUMENTS
    assert any(item.type == "reasoning" for item in first.output)
    script(engine, *answer_turn())
    second = client.responses.create(model=MODEL, instructions=SYSTEM, tools=tools, input=[
        {"role": "user", "content": QUESTION},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": RESULT}])
    assert second.output_text == ANSWER
    assert decode(engine.requests[-1].prompt_token_ids) == expected_second_prompt(
        calls[0].call_id)


def anthropic_round_trip(url: str, engine: FakeEngine) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="x")
    tools = [{"name": "get_weather", "description": WEATHER.description,
              "input_schema": PARAMETERS}]
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    script(engine, *tool_call_turn())
    with client.messages.stream(model=MODEL, max_tokens=256, system=SYSTEM, tools=tools,
                                messages=messages) as stream:
        first = stream.get_final_message()
    uses = [block for block in first.content if block.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].input == ARGUMENTS
    assert first.stop_reason == "tool_use"
    assert any(block.type == "thinking" for block in first.content)
    messages += [{"role": "assistant", "content": [
                     {"type": "tool_use", "id": uses[0].id, "name": "get_weather",
                      "input": uses[0].input}]},
                 {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": uses[0].id, "content": RESULT}]}]
    script(engine, *answer_turn())
    second = client.messages.create(model=MODEL, max_tokens=256, system=SYSTEM, tools=tools,
                                    messages=messages)
    assert [block.text for block in second.content if block.type == "text"] == [ANSWER]
    assert decode(engine.requests[-1].prompt_token_ids) == expected_second_prompt(uses[0].id)


def ollama_first_turn(url: str, engine: FakeEngine) -> None:
    import ollama

    client = ollama.Client(host=url)
    script(engine, *tool_call_turn())
    response = client.chat(model=MODEL, messages=[{"role": "system", "content": SYSTEM},
                                                  {"role": "user", "content": QUESTION}],
                           tools=[{"type": "function", "function": {
                               "name": "get_weather", "description": WEATHER.description,
                               "parameters": PARAMETERS}}])
    calls = response.message.tool_calls or []
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", ARGUMENTS)]
    assert "<|" not in (response.message.content or "")


@pytest.mark.parametrize("api", ["openai", "responses", "anthropic", "ollama"])
async def test_tool_call_round_trip(api, gpt_oss_core, gpt_oss_frontend_model) -> None:
    engine = FakeEngine(max_model_len=4096)
    async with UpstreamServer(engine) as upstream, \
            FrontendHarness(gpt_oss_core, upstream.address,
                            loaded=gpt_oss_frontend_model) as frontend:
        # the gateway's thread starts off this loop, which serves the frontend and the fake
        # engine (the harness's frontend has no gRPC health service: /health is not awaited)
        gateway = await asyncio.to_thread(
            GatewayThread(GatewayConfig(frontend_address=frontend.address)).start,
            wait_healthy=False)
        try:
            run = {"openai": openai_round_trip, "responses": responses_round_trip,
                   "anthropic": anthropic_round_trip, "ollama": ollama_first_turn}[api]
            await asyncio.to_thread(run, gateway.url, engine)
        finally:
            await asyncio.to_thread(gateway.stop)
