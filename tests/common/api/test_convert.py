"""The shared API-neutral domain and its protobuf edge: what the gateway writes, the frontend
reads back as the same objects (and the other way for events); unset optionals stay unset on
the wire; malformed requests are rejected naming the field."""

from __future__ import annotations

import pytest

from services.common.api.chat import (
    ChatInput,
    ChatMessage,
    CompletionInput,
    ImagePart,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
)
from services.common.api.convert import (
    chat_input_from_pb,
    chat_input_to_pb,
    event_from_pb,
    event_to_pb,
    finish_reason_from_pb,
    generate_request_from_pb,
    generate_request_to_pb,
    model_card_from_pb,
    model_card_to_pb,
    sampling_from_pb,
    sampling_to_pb,
)
from services.common.api.events import (
    Finish,
    FinishReason,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
    UsageReport,
)
from services.common.api.generate import (
    GenerateRequest,
    ResponseFormat,
    ResponseFormatType,
    Sampling,
)
from services.common.api.json_values import json_text, parse_json, parse_json_object
from services.common.api.model_card import ModelCard
from services.common.errors import ValidationError
from services.common.pb import common_pb2, frontend_pb2

CHAT = ChatInput(
    messages=(
        ChatMessage("system", "be brief"),
        ChatMessage("user", (TextPart("what is this"),
                             ImagePart(url="data:image/png;base64,iVBORw0KGgo=", detail="low"),
                             ImagePart(data=b"\x89PNG", media_type="image/png"))),
        ChatMessage("assistant", "let me look",
                    tool_calls=(ToolCall("c1", "lookup", '{"q": "ünï", "n": [1, 2.5]}'),),
                    reasoning_content="thinking"),
        ChatMessage("tool", "found", name="lookup", tool_call_id="c1"),
    ),
    tools=(ToolDefinition("lookup", description="look up",
                          parameters={"type": "object", "properties": {"q": {"type": "string"}}},
                          strict=True),
           ToolDefinition("noop")),
    tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "lookup", parallel_tool_calls=False),
    add_generation_prompt=True,
    template_kwargs={"enable_thinking": False, "z": 1, "a": [None]},
    documents=[{"title": "t", "text": "x"}],
)

REQUEST = GenerateRequest(
    request_id="req-1", model="helios-demo", input=CHAT,
    sampling=Sampling(temperature=0.5, top_p=0.75, top_k=20, min_p=0.25, presence_penalty=0.5,
                      frequency_penalty=0.25, repetition_penalty=1.5, seed=7, max_tokens=50,
                      min_tokens=2, ignore_eos=True, stop_token_ids=(5, 9), logprobs=True,
                      top_logprobs=3, logit_bias=((42, 3.0), (7, -1.0))),
    stop=("END", "STOP"), include_stop_str_in_output=True, skip_special_tokens=False,
    spaces_between_special_tokens=False, n=3,
    response_format=ResponseFormat(ResponseFormatType.JSON_SCHEMA, '{"type":"object"}', "r",
                                   True),
    parse_reasoning=False, continuous_usage=True, priority=-2, parse_tool_calls=True)


def through_wire(request: GenerateRequest) -> GenerateRequest:
    wire = frontend_pb2.GenerateRequest.FromString(
        generate_request_to_pb(request).SerializeToString())
    return generate_request_from_pb(wire)


def test_a_full_request_reads_back_as_the_same_objects():
    assert through_wire(REQUEST) == REQUEST
    completion = GenerateRequest("r2", input=CompletionInput(token_ids=(1, 2, 3), echo=True))
    assert through_wire(completion) == completion
    text = GenerateRequest("r3", input=CompletionInput(text="Once upon"))
    assert through_wire(text) == text


def test_unset_optionals_stay_unset_on_the_wire():
    request = GenerateRequest("r", input=ChatInput((ChatMessage("user", "hi"),)))
    pb = generate_request_to_pb(request)
    for name in ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed"):
        assert not pb.sampling.HasField(name), name
    for name in ("n", "skip_special_tokens", "spaces_between_special_tokens",
                 "parse_reasoning", "parse_tool_calls"):
        assert not pb.HasField(name), name
    assert not pb.chat.HasField("add_generation_prompt")
    assert not pb.chat.tool_choice.HasField("parallel_tool_calls")
    assert pb.chat.chat_template_kwargs_json == "" and pb.chat.documents_json == ""
    back = through_wire(request)
    assert back == request
    assert (back.num_choices, back.skips_special_tokens) == (1, True)
    assert back.chat is not None and back.completion is None
    assert back.chat.tool_choice.allows_parallel_calls


def test_json_values_are_written_compactly_in_the_callers_key_order():
    pb = chat_input_to_pb(CHAT)
    assert pb.chat_template_kwargs_json == '{"enable_thinking":false,"z":1,"a":[null]}'
    assert pb.tools[0].parameters_json == \
        '{"type":"object","properties":{"q":{"type":"string"}}}'
    assert pb.tools[1].parameters_json == "" and not pb.tools[1].HasField("strict")
    # tool-call arguments are text: sent exactly as given
    assert pb.messages[2].tool_calls[0].arguments_json == '{"q": "ünï", "n": [1, 2.5]}'
    assert json_text({"ü": "😀"}) == '{"ü":"😀"}'


def test_a_tool_call_only_assistant_turn_is_sent_with_empty_text():
    chat = ChatInput((ChatMessage("user", "hi"),
                      ChatMessage("assistant", None, tool_calls=(ToolCall("c", "f", "{}"),)),
                      ChatMessage("user", None)))
    pb = chat_input_to_pb(chat)
    assert pb.messages[1].WhichOneof("content") == "text" and pb.messages[1].text == ""
    assert pb.messages[2].WhichOneof("content") is None
    back = chat_input_from_pb(pb)
    assert back.messages[1].content == "" and back.messages[2].content is None


def test_negative_seeds_wrap_to_uint64_and_sampling_reads_back():
    assert sampling_to_pb(Sampling(seed=-1)).seed == 2**64 - 1
    sampling = REQUEST.sampling
    assert sampling_from_pb(sampling_to_pb(sampling)) == sampling


def _chat_pb(**fields) -> frontend_pb2.ChatInput:
    pb = chat_input_to_pb(ChatInput((ChatMessage("user", "hi"),)))
    for name, value in fields.items():
        setattr(pb, name, value)
    return pb


def _with_call(arguments: str) -> frontend_pb2.ChatInput:
    return chat_input_to_pb(ChatInput((ChatMessage("user", "hi"), ChatMessage(
        "assistant", "", tool_calls=(ToolCall("c", "f", arguments),)))))


@pytest.mark.parametrize(("pb", "param"), [
    (frontend_pb2.ChatInput(), "messages"),
    (frontend_pb2.ChatInput(messages=[frontend_pb2.ChatMessage(text="x")]), "messages[0].role"),
    (_with_call("[1]"), "messages[1].tool_calls[0].arguments"),
    (_with_call('{"a": NaN}'), "messages[1].tool_calls[0].arguments"),
    (_with_call("{nope"), "messages[1].tool_calls[0].arguments"),
    (_chat_pb(chat_template_kwargs_json="[]"), "chat_template_kwargs"),
    (_chat_pb(documents_json='{"a": 1}'), "documents"),
    (chat_input_to_pb(ChatInput((ChatMessage("user", "hi"),), tools=(ToolDefinition("f"),),
                                tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "g"))),
     "tool_choice"),
    (frontend_pb2.ChatInput(messages=[frontend_pb2.ChatMessage(
        role="user", parts=frontend_pb2.ContentParts(parts=[frontend_pb2.ContentPart(
            image=frontend_pb2.ImageInput())]))]), "messages[0].content[0]"),
    # an empty parts list (a direct gRPC caller; the gateway refuses it first)
    (chat_input_to_pb(ChatInput((ChatMessage("user", "hi"), ChatMessage("user", ())))),
     "messages[1].content"),
])
def test_malformed_chat_input_names_the_field(pb, param):
    with pytest.raises(ValidationError) as info:
        chat_input_from_pb(pb)
    assert info.value.param == param


def test_a_blank_arguments_text_is_an_empty_object_and_text_is_kept_verbatim():
    back = chat_input_from_pb(_with_call("  "))
    assert back.messages[1].tool_calls[0].arguments_json == "  "
    assert chat_input_from_pb(_with_call(' {"a":1} ')).messages[1].tool_calls[0] \
        .arguments_json == ' {"a":1} '


def test_request_level_validation():
    pb = generate_request_to_pb(GenerateRequest("r", input=CompletionInput(text="x")))
    pb.completion.ClearField("text")
    with pytest.raises(ValidationError) as info:
        generate_request_from_pb(pb)
    assert info.value.param == "prompt"
    pb = generate_request_to_pb(GenerateRequest("r", input=CompletionInput(text="x")))
    pb.response_format.type = 99  # type: ignore[assignment]
    with pytest.raises(ValidationError) as info:
        generate_request_from_pb(pb)
    assert info.value.param == "response_format"
    assert generate_request_from_pb(frontend_pb2.GenerateRequest(request_id="r")).input is None


LOGPROBS = (TokenLogprob(7, "Hel", b"Hel", -0.5, (TopLogprob(7, "Hel", b"Hel", -0.5),
                                                  TopLogprob(8, "\ufffd", b"\xe2", -1.5))),)
SO_FAR = Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=3, reasoning_tokens=1)


@pytest.mark.parametrize("event", [
    Started(0, "req", "helios-demo", 12, 4, "echo"),
    TextDelta(1, "Hello", LOGPROBS, SO_FAR),
    TextDelta(0, ""),
    ReasoningDelta(2, "hmm", LOGPROBS),
    ToolCallDelta(0, 1, "call_1", "function", "lookup", "", (), SO_FAR),
    ToolCallDelta(0, 1, arguments='{"q": '),
    Finish(0, FinishReason.STOP_STRING, stop_sequence="END", logprobs=LOGPROBS),
    Finish(3, FinishReason.STOP, stop_token_id=0, usage_so_far=SO_FAR),
    Finish(0, FinishReason.LENGTH),
    UsageReport(SO_FAR),
])
def test_events_read_back_as_the_same_objects(event):
    wire = frontend_pb2.GenerateEvent.FromString(event_to_pb(event).SerializeToString())
    assert event_from_pb(wire) == event


def test_unknown_or_unset_events_keep_the_stream_going():
    assert event_from_pb(frontend_pb2.GenerateEvent(index=2)) == TextDelta(2, "")
    finish = frontend_pb2.GenerateEvent(finish=frontend_pb2.Finish())
    assert event_from_pb(finish) == Finish(0, FinishReason.STOP)
    assert finish_reason_from_pb(common_pb2.FINISH_REASON_UNSPECIFIED) is None
    assert finish_reason_from_pb(common_pb2.FINISH_REASON_TOOL_CALLS) is FinishReason.TOOL_CALLS


def test_model_cards_read_back():
    card = ModelCard(id="helios-demo", aliases=("helios-demo", "demo"), root="org/demo",
                     max_model_len=4096, tools=True, reasoning=True, created=1_700_000_000,
                     architecture="Qwen3ForCausalLM", family="qwen3", num_parameters=123,
                     dtype="bfloat16", size_bytes=456, digest="ab" * 16, chat_template="{{x}}")
    assert model_card_from_pb(model_card_to_pb(card)) == card
    assert card.answers_to("demo") and card.answers_to("org/demo") and not card.answers_to("x")
    assert model_card_from_pb(frontend_pb2.ModelCard(id="m")).owned_by == "helios"


def test_strict_json_parsing():
    assert list(parse_json_object('{"b": 1, "a": 2}', param="p")) == ["b", "a"]
    for bad in ("NaN", "[Infinity]", "{", ""):
        with pytest.raises(ValidationError) as info:
            parse_json(bad, param="documents")
        assert info.value.param == "documents"
    with pytest.raises(ValidationError, match="the thing must be a JSON object, got list"):
        parse_json_object("[1]", param="p", what="the thing")


def test_every_enum_member_has_its_proto_twin():
    for reason in FinishReason:
        assert event_from_pb(event_to_pb(Finish(0, reason))) == Finish(0, reason)
    tools = (ToolDefinition("f"),)
    for mode in ToolChoiceMode:
        chat = ChatInput((ChatMessage("user", "hi"),), tools=tools,
                         tool_choice=ToolChoice(mode, "f" if mode is ToolChoiceMode.FUNCTION
                                                else ""))
        assert chat_input_from_pb(chat_input_to_pb(chat)) == chat
    for kind in ResponseFormatType:
        request = GenerateRequest("r", input=CompletionInput(text="x"),
                                  response_format=ResponseFormat(kind))
        assert through_wire(request) == request
    structured = (ResponseFormat(ResponseFormatType.REGEX, pattern="[a-z]+"),
                  ResponseFormat(ResponseFormatType.CHOICE, choices=("yes", "no")),
                  ResponseFormat(ResponseFormatType.GRAMMAR, grammar='start: "x"'))
    for response_format in structured:
        request = GenerateRequest("r", input=CompletionInput(text="x"),
                                  response_format=response_format)
        assert through_wire(request) == request
