"""Reasoning and tool-call parsers on streamed model output: every format, any chunking,
partial, interleaved and malformed output."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.frontend.parsers.deepseek_v3 import DeepSeekV3ToolParser
from services.frontend.parsers.hermes import HermesToolParser
from services.frontend.parsers.json_scan import JsonScanner, JsonSyntaxError
from services.frontend.parsers.llama3_json import Llama3JsonToolParser
from services.frontend.parsers.reasoning import ReasoningParser, starts_in_reasoning
from services.frontend.parsers.tool_calls import ContentText, ToolCallDelta

TOOLS = frozenset({"get_weather", "search"})


@dataclass
class Parsed:
    content: str = ""
    calls: list[dict] = field(default_factory=list)

    def summary(self):
        return self.content, tuple((c["name"], c["arguments"]) for c in self.calls)


def run(parser, chunks) -> Parsed:
    parsed = Parsed()
    items = [item for chunk in chunks for item in parser.push(chunk)] + parser.flush()
    for item in items:
        if isinstance(item, ContentText):
            parsed.content += item.text
            continue
        assert isinstance(item, ToolCallDelta)
        if item.name:  # the first delta of a call: id, type and name, before any arguments
            assert item.tool_index == len(parsed.calls)
            assert item.id.startswith("call_") and item.type == "function"
            assert item.arguments == ""
            parsed.calls.append({"name": item.name, "arguments": ""})
        else:
            assert item.tool_index == len(parsed.calls) - 1, "arguments before the name"
            assert not item.id and not item.type
            parsed.calls[-1]["arguments"] += item.arguments
    assert parser.num_calls == len(parsed.calls)
    return parsed


def chunkings(text: str):
    yield [text]
    yield list(text)
    for i in range(0, len(text) + 1, max(1, len(text) // 40)):
        yield [text[:i], text[i:]]


def check_all_chunkings(make_parser, text):
    results = {run(make_parser(), chunks).summary() for chunks in chunkings(text)}
    assert len(results) == 1, results
    return run(make_parser(), [text])


def args_of(parsed: Parsed, index: int = 0):
    return json.loads(parsed.calls[index]["arguments"])


# ---------------------------------------------------------------------------------------------
# Hermes / Qwen


def hermes():
    return HermesToolParser(TOOLS)


def test_hermes_single_call_after_content():
    text = ('Let me check the weather.\n\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "unit": "celsius"}}\n</tool_call>')
    parsed = check_all_chunkings(hermes, text)
    assert parsed.content == "Let me check the weather."
    assert [c["name"] for c in parsed.calls] == ["get_weather"]
    assert parsed.calls[0]["arguments"] == '{"city": "Paris", "unit": "celsius"}'


def test_hermes_parallel_calls_arguments_before_name_and_string_arguments():
    text = ('<tool_call>\n{"arguments": {"q": "ünï 😀", "n": [1, 2.5e3, null]}, '
            '"name": "search"}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
            '"arguments": "{\\"city\\": \\"Rome\\"}"}\n</tool_call>\n')
    parsed = check_all_chunkings(hermes, text)
    assert parsed.content == ""
    assert [c["name"] for c in parsed.calls] == ["search", "get_weather"]
    assert args_of(parsed, 0) == {"q": "ünï 😀", "n": [1, 2500.0, None]}
    assert args_of(parsed, 1) == {"city": "Rome"}


def test_hermes_call_without_arguments_gets_an_empty_object():
    parsed = check_all_chunkings(hermes, '<tool_call>{"name": "search"}</tool_call>')
    assert parsed.calls == [{"name": "search", "arguments": "{}"}]


@pytest.mark.parametrize("text", [
    "Use the <tool_call> tag like this.",
    "<tool_call>\nnot json at all\n</tool_call> trailing",
    '<tool_call>{"arguments": {"a": 1}}</tool_call>',
    '<tool_call>{"name": 42, "arguments": {}}</tool_call>',
    '<tool_call>["get_weather"]</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
])
def test_hermes_malformed_calls_come_back_as_text(text):
    parsed = check_all_chunkings(hermes, text)
    assert parsed.calls == []
    assert parsed.content == text


def test_hermes_truncated_call_keeps_what_was_sent():
    text = '<tool_call>\n{"name": "search", "arguments": {"q": "par'
    parsed = check_all_chunkings(hermes, text)
    assert parsed.calls == [{"name": "search", "arguments": '{"q": "par'}]
    assert parsed.content == ""


def test_hermes_unknown_tool_name_is_text():
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert check_all_chunkings(hermes, text).content == text


def test_hermes_content_between_calls_and_partial_tag_at_end():
    text = ('A<tool_call>{"name": "search", "arguments": {}}</tool_call>\n\nThen more.\n'
            '<tool_c')
    parsed = check_all_chunkings(hermes, text)
    assert parsed.content == "AThen more.\n<tool_c"
    assert len(parsed.calls) == 1


# ---------------------------------------------------------------------------------------------
# Llama 3.x JSON


def llama():
    return Llama3JsonToolParser(TOOLS)


@pytest.mark.parametrize("prefix", ["", "  \n", "<|python_tag|>"])
def test_llama3_json_calls(prefix):
    text = (prefix + '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
            '{"name": "search", "arguments": {"q": "x"}}')
    parsed = check_all_chunkings(llama, text)
    assert [c["name"] for c in parsed.calls] == ["get_weather", "search"]
    assert args_of(parsed, 0) == {"city": "Paris"} and args_of(parsed, 1) == {"q": "x"}
    assert parsed.content == ""


@pytest.mark.parametrize("text", [
    '{"answer": 42, "name": "x"}',
    '  {"name": "unknown_tool", "parameters": {}}',
    "The answer is {x}.",
    "{not json",
    "<|python_tag|>print('hi')",
])
def test_llama3_json_non_calls_stay_content(text):
    parsed = check_all_chunkings(llama, text)
    assert parsed.calls == []
    assert parsed.content == text


def test_llama3_json_text_after_calls_is_content():
    parsed = check_all_chunkings(llama, '{"name": "search", "parameters": {}} Done!')
    assert len(parsed.calls) == 1 and parsed.content == "Done!"


# ---------------------------------------------------------------------------------------------
# DeepSeek V3

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def deepseek():
    return DeepSeekV3ToolParser(TOOLS)


def test_deepseek_v3_calls():
    text = (f"Checking.{B}{CB}function{SEP}get_weather\n```json\n"
            f'{{"city": "Paris", "days": [1, 2]}}\n```{CE}\n{CB}function{SEP}search\n'
            f'```json\n{{"q": "cats"}}\n```{CE}{E}')
    parsed = check_all_chunkings(deepseek, text)
    assert parsed.content == "Checking."
    assert [c["name"] for c in parsed.calls] == ["get_weather", "search"]
    assert args_of(parsed, 0) == {"city": "Paris", "days": [1, 2]}
    assert args_of(parsed, 1) == {"q": "cats"}


def test_deepseek_v3_1_layout():
    text = f'{B}{CB}search{SEP}{{"q": "x"}}{CE}{E}'
    parsed = check_all_chunkings(deepseek, text)
    assert parsed.calls == [{"name": "search", "arguments": '{"q": "x"}'}]


@pytest.mark.parametrize("text", [
    f"{B}{CB}no separator here{CE}{E}",
    f"{B}{CB}function{SEP}not_a_tool\n```json\n{{}}\n```{CE}{E}",
    f"{B} stray text",
])
def test_deepseek_v3_malformed_is_text(text):
    parsed = check_all_chunkings(deepseek, text)
    assert parsed.calls == []
    assert parsed.content == text.rstrip() or parsed.content == text


def test_deepseek_v3_truncated_arguments():
    parsed = check_all_chunkings(deepseek, f'{B}{CB}function{SEP}search\n```json\n{{"q": "ca')
    assert parsed.calls == [{"name": "search", "arguments": '{"q": "ca'}]


# ---------------------------------------------------------------------------------------------
# Reasoning


def run_reasoning(chunks, **kwargs):
    parser = ReasoningParser(**kwargs)
    segments = [s for chunk in chunks for s in parser.push(chunk)] + parser.flush()
    reasoning = "".join(s.text for s in segments if s.kind == "reasoning")
    content = "".join(s.text for s in segments if s.kind == "content")
    return reasoning, content


@pytest.mark.parametrize(("text", "kwargs", "expected"), [
    ("<think>\nLet me think.\n</think>\n\nThe answer.", {}, ("Let me think.", "The answer.")),
    ("  <think>a</think>b", {}, ("a", "b")),
    ("Opened by the prompt.\n</think>\n\nAnswer", {"in_reasoning": True},
     ("Opened by the prompt.", "Answer")),
    ("No reasoning here.", {}, ("", "No reasoning here.")),
    ("Text with <think>inside</think> is content.", {},
     ("", "Text with <think>inside</think> is content.")),
    ("<think>\nunfinished thought\n", {}, ("unfinished thought", "")),
    ("<think>a\n\nb\n</think>", {}, ("a\n\nb", "")),
    ("<thin", {}, ("", "<thin")),
    ("", {"in_reasoning": True}, ("", "")),
])
def test_reasoning_split(text, kwargs, expected):
    results = {run_reasoning(chunks, **kwargs) for chunks in chunkings(text)}
    assert results == {expected}


def test_reasoning_start_from_prompt():
    assert starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n")
    assert starts_in_reasoning("old <think>x</think> turn\n<|Assistant|><think>\n")


def test_interleaved_reasoning_then_tool_call():
    """Reasoning first; tool calls are parsed in the content only (a call inside the
    reasoning stays reasoning text)."""
    text = ('<think>\nMaybe <tool_call>{"name": "search"}</tool_call>?\n</think>\n\n'
            'Sure.<tool_call>\n{"name": "search", "arguments": {"q": "a"}}\n</tool_call>')
    for chunks in chunkings(text):
        reasoning_parser, tools = ReasoningParser(), hermes()
        reasoning, items = "", []
        segments = [s for c in chunks for s in reasoning_parser.push(c)] + reasoning_parser.flush()
        for segment in segments:
            if segment.kind == "reasoning":
                reasoning += segment.text
            else:
                items += tools.push(segment.text)
        items += tools.flush()
        assert reasoning == 'Maybe <tool_call>{"name": "search"}</tool_call>?'
        content = "".join(i.text for i in items if isinstance(i, ContentText))
        assert content == "Sure."
        assert [i.name for i in items if isinstance(i, ToolCallDelta) and i.name] == ["search"]


# ---------------------------------------------------------------------------------------------
# JSON scanner and chunking invariance


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                       children, max_size=3),
    max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(value=st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=4),
       indent=st.sampled_from([None, 2]), ascii_only=st.booleans())
def test_scanner_accepts_every_json_object_and_finds_its_end(value, indent, ascii_only):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    scanner = JsonScanner()
    assert scanner.feed(text + ' {"next": 1}') == len(text)
    assert scanner.done
    assert [m.key for m in scanner.members] == list(value)
    for member in scanner.members:
        assert json.loads(text[member.start:member.end]) == value[member.key]


@pytest.mark.parametrize("bad", ['{"a" 1}', '{"a": tru}', '{"a": 01}', '{"a": [1,]}',
                                 '{"a": "x\ny"}', '{,}', '{"a": 1}}', '{"a": -}', "[1 2]"])
def test_scanner_rejects_invalid_json(bad):
    scanner = JsonScanner()
    with pytest.raises(JsonSyntaxError):
        scanner.feed(bad)
        if scanner.done and len(bad) > scanner.pos:
            raise JsonSyntaxError("trailing")


@settings(max_examples=80, deadline=None)
@given(args=st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3),
       content=st.text(max_size=12).filter(lambda s: "<" not in s), data=st.data())
def test_hermes_output_is_chunking_invariant(args, content, data):
    text = (content + '<tool_call>\n' + json.dumps({"name": "search", "arguments": args},
                                                   ensure_ascii=False) + "\n</tool_call>")
    points = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    parsed = run(hermes(), chunks)
    assert [c["name"] for c in parsed.calls] == ["search"]
    assert args_of(parsed) == args
    assert parsed.content == content.strip() or parsed.content == content.rstrip()
