"""gpt-oss's harmony format against OpenAI's own implementation (openai-harmony, offline:
tests/frontend/harmony_reference.py): Helios's chat template renders what harmony renders for
the same conversation, and the output parser reads what harmony's parser reads (reasoning,
content, tool calls) over every split of the tokens into engine messages, with the stop
token decoded or not."""

from __future__ import annotations

import itertools
import json

import pytest

from services.common.api.chat import ChatInput, ChatMessage, ToolCall, ToolDefinition
from services.common.api.events import (
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from services.frontend.assets import load_tokenizer_dir
from services.frontend.chat.renderer import ChatRenderer
from services.frontend.generate.choice import ChoiceProcessor
from services.frontend.generate.types import ChoiceStep, OutputOptions
from services.frontend.parsers.select import choose_reasoning_parser, choose_tool_parser
from tests.frontend.harmony_reference import gptoss_dir, harmony_encoding, reference_prompt

WEATHER = ToolDefinition("get_weather", description="Gets the current weather.", parameters={
    "type": "object", "required": ["location"], "properties": {
        "location": {"type": "string", "description": "City and country"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer", "description": "Forecast days", "default": 1},
        "hourly": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"},
                                                   "lon": {"type": "number"}}},
        "either": {"type": ["string", "null"]}}})
CLOCK = ToolDefinition("get_time", description="The time now.")
PLAIN = ToolDefinition("lookup", parameters={"type": "object", "properties": {
    "q": {"type": "string"}}, "required": ["q"]})


def call(call_id: str, name: str, arguments: dict) -> ToolCall:
    return ToolCall(call_id, name, json.dumps(arguments))


CONVERSATIONS = {
    "user-only": ChatInput((ChatMessage("user", "Hello there"),)),
    "system-and-tools": ChatInput((ChatMessage("system", "Answer briefly."),
                                   ChatMessage("user", "Weather in Paris?")),
                                  tools=(WEATHER, CLOCK, PLAIN)),
    "tools-no-system": ChatInput((ChatMessage("user", "Time?"),), tools=(CLOCK,)),
    "tool-round-trip": ChatInput((
        ChatMessage("system", "Be helpful."), ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", None, reasoning_content="I should call get_weather.",
                    tool_calls=(call("c1", "get_weather", {"location": "Paris, FR",
                                                            "unit": "celsius"}),)),
        ChatMessage("tool", '{"temperature": 21, "sky": "clear"}', tool_call_id="c1")),
        tools=(WEATHER,)),
    "two-calls-then-answer-then-user": ChatInput((
        ChatMessage("user", "Weather and time in Oslo?"),
        ChatMessage("assistant", None, reasoning_content="Two tools.", tool_calls=(
            call("a", "get_weather", {"location": "Oslo"}), call("b", "get_time", {}))),
        ChatMessage("tool", "-3C", tool_call_id="a"), ChatMessage("tool", "10:00", tool_call_id="b"),
        ChatMessage("assistant", "It is -3C at 10:00.", reasoning_content="Summarise."),
        ChatMessage("user", "Thanks! And tomorrow?")), tools=(WEATHER, CLOCK)),
    "multi-turn-reasoning-dropped": ChatInput((
        ChatMessage("system", "S"), ChatMessage("user", "a"),
        ChatMessage("assistant", "b", reasoning_content="thinking about a"),
        ChatMessage("user", "c"))),
}


@pytest.fixture(scope="module")
def gptoss():
    return load_tokenizer_dir(gptoss_dir())


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_template_renders_what_harmony_renders(name, gptoss) -> None:
    chat = CONVERSATIONS[name]
    prompt, _ = ChatRenderer(gptoss.tokenizer, gptoss.templates).render_text(chat)
    assert prompt == reference_prompt(chat)


def test_reasoning_effort_kwarg(gptoss) -> None:
    chat = ChatInput((ChatMessage("user", "hi"),), template_kwargs={"reasoning_effort": "high"})
    prompt, _ = ChatRenderer(gptoss.tokenizer, gptoss.templates).render_text(chat)
    assert prompt == reference_prompt(chat, reasoning_effort="high")


def test_harmony_is_chosen_for_the_template(gptoss) -> None:
    template = gptoss.default_template.source
    assert choose_tool_parser("auto", model_type="", architecture="", template=template) == "harmony"
    assert choose_reasoning_parser("auto", template=template, vocabulary=set()) == "harmony"
    assert choose_reasoning_parser("auto", template="", vocabulary=set(),
                                   model_type="gpt_oss") == "harmony"


# ---- output parsing ----

def completion(messages) -> list[int]:
    """The tokens the model writes after `<|start|>assistant` for these assistant messages
    (harmony's own rendering; the first message's `<|start|>assistant` is the prompt's)."""
    encoding = harmony_encoding()
    tokens: list[int] = []
    for message in messages:
        tokens += encoding.render(message)
    start = encoding.encode("<|start|>assistant", allowed_special="all")
    assert tokens[:len(start)] == start
    end, done = (encoding.encode(marker, allowed_special="all")[0]
                 for marker in ("<|end|>", "<|return|>"))
    if tokens[-1] == end:   # a history's final message ends <|end|>; the model's, <|return|>
        tokens[-1] = done
    return tokens[len(start):]


def harmony_messages():
    from openai_harmony import Message, Role

    analysis = Message.from_role_and_content(Role.ASSISTANT, "The user wants Paris weather; "
                                             "call the tool with \"Paris\".").with_channel("analysis")
    tool = (Message.from_role_and_content(Role.ASSISTANT, '{"location":"Paris, FR","days":2}')
            .with_channel("commentary").with_recipient("functions.get_weather")
            .with_content_type("<|constrain|>json"))
    final = Message.from_role_and_content(Role.ASSISTANT, "It is sunny, 21°C — enjoy 🌞.") \
        .with_channel("final")
    preamble = Message.from_role_and_content(Role.ASSISTANT, "Checking the time.") \
        .with_channel("commentary")
    clock = (Message.from_role_and_content(Role.ASSISTANT, "{}").with_channel("commentary")
             .with_recipient("functions.get_time").with_content_type("<|constrain|>json"))
    return {"analysis-then-call": [analysis, tool], "analysis-then-final": [analysis, final],
            "preamble-then-call": [analysis, preamble, clock]}   # a turn ends at its call


def expected_events(messages, offered: frozenset[str]):
    """(reasoning, content, [(name, arguments)]) that harmony's own parser reads."""
    from openai_harmony import Role

    encoding = harmony_encoding()
    tokens = [t for m in messages for t in encoding.render(m)]
    parsed = encoding.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
    reasoning, content, calls = "", "", []
    for message in parsed:
        text = "".join(c.text for c in message.content)
        recipient = message.recipient or ""
        if recipient.startswith("functions.") and recipient[10:] in offered:
            calls.append((recipient[10:], text))
        elif message.channel == "analysis":
            reasoning += text
        else:
            content += text
    return reasoning, content, calls


def run(tokens: list[int], cuts: tuple[int, ...], options: OutputOptions, stop_id: int | None,
        tokenizer):
    processor = ChoiceProcessor(0, tokenizer, options)
    events = []
    bounds = [0, *cuts, len(tokens)]
    for k, (start, end) in enumerate(itertools.pairwise(bounds)):
        last = k == len(bounds) - 2
        events += processor.process(ChoiceStep(
            0, tuple(tokens[start:end]), finish_reason=FinishReason.STOP if last else None,
            stop_token_id=stop_id if last else None))
        if processor.finished:
            break
    return events


def summarize(events):
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ToolCallDelta):
            if event.name:
                assert event.id and event.type == "function" and not event.arguments
                calls[event.tool_index] = [event.name, ""]
            else:
                calls[event.tool_index][1] += event.arguments
    return reasoning, content, [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize("case", ["analysis-then-call", "analysis-then-final",
                                  "preamble-then-call"])
@pytest.mark.parametrize("stop_decoded", [False, True])
def test_parser_reads_what_harmony_reads_over_every_split(case, stop_decoded, gptoss) -> None:
    messages = harmony_messages()[case]
    offered = frozenset({"get_weather", "get_time"})
    tokens = completion(messages)
    stop_id = tokens[-1]   # <|call|> or <|return|>
    assert gptoss.tokenizer.decode([stop_id], skip_special_tokens=False) in ("<|call|>",
                                                                             "<|return|>")
    options = OutputOptions(harmony=True, tool_parser="harmony", tool_names=offered)
    # the engine stops on the stop token (not decoded); without it as a stop, it is decoded
    stream, stop = (tokens, None) if stop_decoded else (tokens, stop_id)
    want = expected_events(messages, offered)
    n = len(stream)
    splits = [()] + [(i,) for i in range(1, n)] + [(i, j) for i in range(1, n, 5)
                                                    for j in range(i + 1, n, 7)]
    for cuts in splits:
        events = run(stream, cuts, options, stop, gptoss.tokenizer)
        assert summarize(events) == want, cuts
        finish = events[-1]
        assert isinstance(finish, Finish)
        assert finish.reason is (FinishReason.TOOL_CALLS if want[2] else FinishReason.STOP)


def test_calls_to_tools_not_offered_are_content(gptoss) -> None:
    messages = harmony_messages()["analysis-then-call"]
    tokens = completion(messages)
    options = OutputOptions(harmony=True, tool_parser="harmony",
                            tool_names=frozenset({"get_time"}))
    reasoning, content, calls = summarize(run(tokens, (), options, tokens[-1], gptoss.tokenizer))
    assert not calls and content == '{"location":"Paris, FR","days":2}' and reasoning
    # no tools parsed at all (none offered): the same
    plain = OutputOptions(harmony=True)
    assert summarize(run(tokens, (), plain, tokens[-1], gptoss.tokenizer))[2] == []


def test_no_special_token_text_leaks(gptoss) -> None:
    tokens = completion(harmony_messages()["preamble-then-call"])
    options = OutputOptions(harmony=True, tool_parser="harmony",
                            tool_names=frozenset({"get_weather", "get_time"}))
    for event in run(tokens, (3, 9), options, None, gptoss.tokenizer):
        text = getattr(event, "text", "") + getattr(event, "arguments", "")
        assert "<|" not in text


def test_call_arguments_are_always_a_valid_json_prefix() -> None:
    """A body that breaks JSON sends its valid prefix as arguments and the rest as content;
    an empty body is {}; text after the closed object is content."""
    from services.frontend.parsers.harmony import HarmonyParser
    from services.frontend.parsers.tool_calls import ContentText
    from services.frontend.parsers.tool_calls import ToolCallDelta as CallItem

    def parse(body: str, pieces: int) -> tuple[str, str, str]:
        parser = HarmonyParser(frozenset({"f"}))
        text = f"<|channel|>commentary to=functions.f <|constrain|>json<|message|>{body}"
        items = []
        step = max(1, len(text) // pieces)
        for at in range(0, len(text), step):
            items += parser.push(text[at:at + step])
        items += parser.flush()
        name = "".join(i.name for i in items if isinstance(i, CallItem))
        arguments = "".join(i.arguments for i in items if isinstance(i, CallItem))
        content = "".join(i.text for i in items if isinstance(i, ContentText))
        return name, arguments, content

    for pieces in (1, 3, 7, 40):
        assert parse('{"a": 1} trailing', pieces) == ("f", '{"a": 1}', " trailing")
        assert parse('{"a": tru}', pieces) == ("f", '{"a": tru', "}")
        assert parse("", pieces) == ("f", "{}", "")
        assert parse("not json", pieces) == ("f", "", "not json")
