"""Generate end to end through the real frontend servicer against a scripted fake engine."""

from __future__ import annotations

import asyncio
import json
import random

import grpc
import pytest

from services.common.errors import (
    CapacityError,
    ContextOverflowError,
    GrammarError,
    NotFoundError,
    UnsupportedError,
    ValidationError,
    WorkerFailure,
)
from services.common.grpc_errors import error_from_rpc
from services.common.pb import common_pb2, frontend_pb2
from tests.frontend.conftest import frontend_assets
from tests.frontend.fakes import FakeEngine, FrontendHarness, Script, ScriptedChoice, UpstreamServer

pytestmark = pytest.mark.timeout(120)
EOS = 151645  # <|im_end|>
TOOL = frontend_pb2.ToolDefinition(
    type="function", name="get_weather", description="Weather",
    parameters_json='{"type": "object", "properties": {"city": {"type": "string"}}}')


def tokens(text: str) -> list[int]:
    return frontend_assets("qwen3").tokenizer.encode(text)


def chunked(ids: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    chunks, at = [], 0
    while at < len(ids):
        size = rng.randint(1, 3)
        chunks.append(ids[at:at + size])
        at += size
    return chunks or [[]]


def reply(text: str, *, seed: int = 0, eos: bool = True, **kwargs) -> ScriptedChoice:
    ids = tokens(text) + ([EOS] if eos else [])
    return ScriptedChoice(chunked(ids, seed), stop_token_id=EOS if eos else None, **kwargs)


def chat_request(*messages: frontend_pb2.ChatMessage, **fields) -> frontend_pb2.GenerateRequest:
    chat = fields.pop("chat", None) or frontend_pb2.ChatInput(messages=list(messages))
    return frontend_pb2.GenerateRequest(request_id="r1", chat=chat, **fields)


def user(text: str) -> frontend_pb2.ChatMessage:
    return frontend_pb2.ChatMessage(role="user", text=text)


async def collect(stub, request) -> list[frontend_pb2.GenerateEvent]:
    return [event async for event in stub.Generate(request)]


def text_of(events, index=0, kind="text") -> str:
    return "".join(getattr(e, kind).text for e in events
                   if e.index == index and e.WhichOneof("event") == kind)


def kinds(events) -> list[str]:
    return [e.WhichOneof("event") for e in events]


@pytest.fixture
async def stack(demo_core, demo_frontend_model):
    engine = FakeEngine(max_model_len=4096)
    async with UpstreamServer(engine) as upstream, \
            FrontendHarness(demo_core, upstream.address, loaded=demo_frontend_model) as frontend:
        yield engine, frontend


async def test_chat_streams_text_with_started_finish_and_usage(stack):
    engine, frontend = stack
    engine.script = Script([reply("Hello there! 😀 How can I help?", seed=1)])
    request = chat_request(frontend_pb2.ChatMessage(role="system", text="Be nice."), user("Hi"),
                           chat=None, parse_reasoning=False)
    events = await collect(frontend.stub, request)
    assert kinds(events)[0] == "started" and kinds(events)[-2:] == ["finish", "usage"]
    assert text_of(events) == "Hello there! 😀 How can I help?"
    finish = events[-2].finish
    assert finish.reason == common_pb2.FINISH_REASON_STOP and finish.stop_token_id == EOS
    rendered = await frontend.stub.RenderChat(frontend_pb2.RenderChatRequest(chat=request.chat))
    sent = engine.requests[0]
    assert list(sent.prompt_token_ids) == list(rendered.token_ids)
    assert list(sent.checkpoint_token_ends) == list(rendered.message_token_ends)
    assert len(sent.checkpoint_token_ends) == 2           # system and user messages
    assert sent.sampling.max_tokens == 4096 - len(rendered.token_ids)
    started, usage = events[0].started, events[-1].usage
    assert started.prompt_tokens == len(rendered.token_ids) and started.model == "helios-demo"
    assert usage.completion_tokens == len(tokens("Hello there! 😀 How can I help?")) + 1
    assert usage.prompt_tokens == len(rendered.token_ids)


async def test_stop_string_across_tokens_ends_the_choice_and_cancels_the_engine(stack):
    engine, frontend = stack
    text = "The answer is 42.\nUser: and then more text that must never arrive"
    choice = reply(text, seed=3)
    # The engine would go on (it hangs before its last message): the frontend must cancel it.
    engine.script = Script([choice], hang_after_messages=len(choice.chunks) - 1)
    events = await collect(frontend.stub, chat_request(user("Q"), stop=["\nUser:", "zzz"]))
    assert text_of(events) == "The answer is 42."
    finish = [e.finish for e in events if e.WhichOneof("event") == "finish"]
    assert finish[0].reason == common_pb2.FINISH_REASON_STOP_STRING
    assert finish[0].stop_sequence == "\nUser:"
    await asyncio.wait_for(engine.cancelled.wait(), 10)
    usage = events[-1].usage
    assert 0 < usage.completion_tokens < len(tokens(text))


async def test_include_stop_str_in_output(stack):
    engine, frontend = stack
    engine.script = Script([reply("abc STOP def", seed=2)])
    events = await collect(frontend.stub, chat_request(
        user("Q"), stop=["STOP"], include_stop_str_in_output=True))
    assert text_of(events) == "abc STOP"


async def test_reasoning_and_tool_calls(stack):
    engine, frontend = stack
    output = ('<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n'
              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    engine.script = Script([reply(output, seed=5)])
    chat = frontend_pb2.ChatInput(messages=[user("Weather in Paris?")], tools=[TOOL])
    events = await collect(frontend.stub, chat_request(chat=chat))
    assert text_of(events, kind="reasoning") == "The user wants weather."
    assert text_of(events) == "Let me check."
    calls = [e.tool_call for e in events if e.WhichOneof("event") == "tool_call"]
    assert calls[0].name == "get_weather" and calls[0].id.startswith("call_")
    assert calls[0].arguments == ""
    assert json.loads("".join(c.arguments for c in calls)) == {"city": "Paris"}
    finish = next(e.finish for e in events if e.WhichOneof("event") == "finish")
    assert finish.reason == common_pb2.FINISH_REASON_TOOL_CALLS
    usage = events[-1].usage
    assert 0 < usage.reasoning_tokens < usage.completion_tokens


async def test_enable_thinking_false_leaves_content_unparsed(stack):
    engine, frontend = stack
    engine.script = Script([reply("Plain answer.")])
    chat = frontend_pb2.ChatInput(messages=[user("Q")],
                                  chat_template_kwargs_json='{"enable_thinking": false}')
    events = await collect(frontend.stub, chat_request(chat=chat))
    assert text_of(events) == "Plain answer." and text_of(events, kind="reasoning") == ""
    assert events[-1].usage.reasoning_tokens == 0
    prompt = frontend_assets("qwen3").tokenizer.decode(engine.requests[0].prompt_token_ids)
    assert prompt.endswith("<think>\n\n</think>\n\n")


async def test_n_choices_logprobs_and_continuous_usage(stack):
    engine, frontend = stack
    engine.script = Script([reply("First choice é", seed=1, logprobs=True),
                            reply("Second, longer choice ü!", seed=9, logprobs=True)])
    request = chat_request(user("Q"), n=2, continuous_usage=True,
                           sampling=common_pb2.SamplingParams(logprobs=True, top_logprobs=1,
                                                              max_tokens=50))
    events = await collect(frontend.stub, request)
    assert engine.requests[0].n == 2 and engine.requests[0].sampling.max_tokens == 50
    assert text_of(events, 0) == "First choice é"
    assert text_of(events, 1) == "Second, longer choice ü!"
    assert [e.index for e in events if e.WhichOneof("event") == "finish"] == [0, 1] or \
        sorted(e.index for e in events if e.WhichOneof("event") == "finish") == [0, 1]
    tokenizer = frontend_assets("qwen3").tokenizer
    for index, text in ((0, "First choice é"), (1, "Second, longer choice ü!")):
        logprobs = [lp for e in events if e.index == index for lp in e.logprobs]
        assert [lp.token_id for lp in logprobs] == [*tokens(text), EOS]
        assert b"".join(lp.token_bytes for lp in logprobs[:-1]) == text.encode()
        assert all(lp.token == tokenizer.token_piece(lp.token_id)[0] for lp in logprobs)
        assert all(len(lp.top) == 2 for lp in logprobs)
    deltas = [e for e in events if e.WhichOneof("event") in ("text", "finish")]
    assert all(e.HasField("usage_so_far") for e in deltas)
    counts = [e.usage_so_far.completion_tokens for e in deltas]
    assert counts == sorted(counts)
    assert events[-1].usage.completion_tokens == len(tokens("First choice é")) + len(
        tokens("Second, longer choice ü!")) + 2


async def test_context_overflow_is_typed_with_counts_and_hint(stack):
    engine, frontend = stack
    request = chat_request(user("Hi"), sampling=common_pb2.SamplingParams(max_tokens=5000))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(frontend.stub, request)
    error = error_from_rpc(info.value)
    assert isinstance(error, ContextOverflowError)
    assert error.max_tokens == 5000 and error.context_length == 4096
    assert error.prompt_tokens > 0
    assert error.hint == frontend.config.context_hint and error.hint in str(info.value.details())
    assert engine.requests == []


async def test_engine_context_limit_is_adopted(demo_core, demo_frontend_model):
    engine = FakeEngine(max_model_len=64)
    async with UpstreamServer(engine) as upstream, \
            FrontendHarness(demo_core, upstream.address, loaded=demo_frontend_model) as frontend:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(frontend.stub, chat_request(user("word " * 80)))
        error = error_from_rpc(info.value)
        assert isinstance(error, ContextOverflowError) and error.context_length == 64
        models = await frontend.stub.ListModels(frontend_pb2.ListModelsRequest())
        assert models.models[0].max_model_len == 64


async def test_engine_errors_reach_the_caller_typed(stack):
    engine, frontend = stack
    engine.script = Script([reply("x")], admission_error=CapacityError(
        "no free slot", hint="raise --max-num-seqs", retry_after_s=2.0))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(frontend.stub, chat_request(user("Q")))
    error = error_from_rpc(info.value)
    assert isinstance(error, CapacityError)
    assert error.hint == "raise --max-num-seqs" and error.retry_after_s == 2.0
    assert error.service == "engine"

    engine.script = Script([reply("some long text here for the error", seed=4)],
                           error_after_messages=2, stream_error=WorkerFailure("GPU fell over"))
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for event in frontend.stub.Generate(chat_request(user("Q"))):
            received.append(event)
    assert isinstance(error_from_rpc(info.value), WorkerFailure)
    assert received[0].WhichOneof("event") == "started"


async def test_client_cancel_cancels_the_engine_stream(stack):
    engine, frontend = stack
    engine.script = Script([reply("tick tock " * 20)], hang_after_messages=3)
    call = frontend.stub.Generate(chat_request(user("Q")))
    seen = 0
    async for event in call:
        seen += 1
        if event.WhichOneof("event") == "text":
            break
    call.cancel()
    await asyncio.wait_for(engine.cancelled.wait(), 10)
    assert seen >= 2


@pytest.mark.parametrize(("request_fields", "error_type", "param"), [
    ({"chat": frontend_pb2.ChatInput(messages=[
        user("Q"), frontend_pb2.ChatMessage(role="assistant", tool_calls=[
            frontend_pb2.ToolCall(id="c", name="f", arguments_json='["not", "object"]')])])},
     ValidationError, "messages[1].tool_calls[0].arguments"),
    ({"chat": frontend_pb2.ChatInput(messages=[
        user("Q"), frontend_pb2.ChatMessage(role="assistant", tool_calls=[
            frontend_pb2.ToolCall(id="c", name="f", arguments_json='{"a": ')])])},
     ValidationError, "messages[1].tool_calls[0].arguments"),
    ({"model": "gpt-4"}, NotFoundError, "model"),
    ({"chat": frontend_pb2.ChatInput(messages=[frontend_pb2.ChatMessage(
        role="user", parts=frontend_pb2.ContentParts(parts=[frontend_pb2.ContentPart(
            image=frontend_pb2.ImageInput(url="data:image/png;base64,AAAA"))]))])},
     UnsupportedError, "messages"),
    ({"response_format": frontend_pb2.ResponseFormat(
        type=frontend_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA, schema_json="{oops")},
     GrammarError, "response_format.schema"),
    ({"response_format": frontend_pb2.ResponseFormat(
        type=frontend_pb2.RESPONSE_FORMAT_TYPE_CHOICE)}, ValidationError,
     "response_format.choices"),
    ({"stop": [""]}, ValidationError, "stop[0]"),
    ({"n": 0}, ValidationError, "n"),
    ({"chat": frontend_pb2.ChatInput(messages=[user("Q")],
                                     chat_template_kwargs_json='{"messages": []}')},
     ValidationError, "chat_template_kwargs"),
    ({"chat": frontend_pb2.ChatInput()}, ValidationError, "messages"),
])
async def test_invalid_requests_are_rejected_before_the_engine(stack, request_fields, error_type,
                                                                param):
    engine, frontend = stack
    fields = {"chat": frontend_pb2.ChatInput(messages=[user("Q")]), **request_fields}
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(frontend.stub, frontend_pb2.GenerateRequest(request_id="bad", **fields))
    error = error_from_rpc(info.value)
    assert isinstance(error, error_type), error
    assert error.param == param
    assert engine.requests == []


async def test_completion_text_echo_and_token_ids(stack):
    engine, frontend = stack
    engine.script = Script([reply(" world", eos=False, finish=common_pb2.FINISH_REASON_LENGTH)])
    request = frontend_pb2.GenerateRequest(
        request_id="c1", completion=frontend_pb2.CompletionInput(text="Hello", echo=True))
    events = await collect(frontend.stub, request)
    assert events[0].started.prompt_text == "Hello"
    assert list(engine.requests[0].prompt_token_ids) == tokens("Hello")
    assert text_of(events) == " world"
    assert events[-2].finish.reason == common_pb2.FINISH_REASON_LENGTH

    engine.script = Script([reply("!", seed=0)])
    ids = tokens("<|im_start|>user\nHi")
    request = frontend_pb2.GenerateRequest(request_id="c2", completion=frontend_pb2.CompletionInput(
        token_ids=common_pb2.TokenIds(ids=ids)))
    events = await collect(frontend.stub, request)
    assert list(engine.requests[1].prompt_token_ids) == ids and text_of(events) == "!"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(frontend.stub, frontend_pb2.GenerateRequest(
            completion=frontend_pb2.CompletionInput(token_ids=common_pb2.TokenIds(ids=[10**7]))))
    assert error_from_rpc(info.value).param == "prompt"


async def test_special_tokens_kept_when_asked(stack):
    engine, frontend = stack
    engine.script = Script([reply("<|im_start|>x", seed=0)])
    events = await collect(frontend.stub, chat_request(user("Q"), skip_special_tokens=False,
                                                       parse_reasoning=False))
    # the ending EOS is never text; other special tokens are, when not skipped
    assert text_of(events) == "<|im_start|>x"


async def test_template_that_opens_the_think_block_starts_in_reasoning(demo_core,
                                                                       demo_frontend_model):
    """Thinking templates (Qwen3 thinking models, DeepSeek-R1) end the prompt with `<think>`:
    the output starts inside the reasoning block and `</think>` ends it."""
    from services.frontend.assets import FrontendAssets
    from services.frontend.chat.template import ChatTemplate
    from services.frontend.model import FrontendModel

    base = demo_frontend_model
    source = base.assets.templates["default"].source.replace(
        "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}")
    assert source != base.assets.templates["default"].source
    thinking = FrontendModel(base.manifest, FrontendAssets(
        base.tokenizer, {"default": ChatTemplate(source)}))
    engine = FakeEngine()
    engine.script = Script([reply("Let me plan.\n</think>\n\nThe answer is 4.", seed=2)])
    async with UpstreamServer(engine) as upstream, \
            FrontendHarness(demo_core, upstream.address, loaded=thinking) as frontend:
        events = await collect(frontend.stub, chat_request(user("2+2?")))
        assert text_of(events, kind="reasoning") == "Let me plan."
        assert text_of(events) == "The answer is 4."
        unparsed = await collect(frontend.stub, chat_request(user("2+2?"),
                                                             parse_reasoning=False))
        assert text_of(unparsed) == "Let me plan.\n</think>\n\nThe answer is 4."
