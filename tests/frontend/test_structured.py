"""Structured outputs in the frontend: response formats and forced tool calls become engine
grammars that compile against the demo core's real Qwen3 vocabulary, accept what the model's
parsers read back (Hermes tool calls, JSON content), and leave room for its thinking block."""

from __future__ import annotations

import dataclasses
import json

import pytest

from services.common.api.chat import (
    ChatInput,
    ChatMessage,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
)
from services.common.api.generate import GenerateRequest, ResponseFormat, ResponseFormatType
from services.common.errors import GrammarError, UnsupportedError, ValidationError
from services.engine.grammar import GrammarCompiler, GrammarKind, GrammarSpec, GrammarVocabulary
from services.frontend.generate.prepare import RequestPreparer
from services.frontend.model import FrontendModel
from services.frontend.parsers.hermes import HermesToolParser
from services.frontend.parsers.tool_calls import ToolCallDelta

WEATHER = ToolDefinition("get_weather", parameters={
    "type": "object", "properties": {"city": {"type": "string"},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}, strict=True)
ORDER = ToolDefinition("place_order", parameters={
    "$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string"},
                                                          "qty": {"type": "integer"}},
                       "required": ["sku", "qty"]}},
    "type": "object", "properties": {"items": {"type": "array",
                                               "items": {"$ref": "#/$defs/item"}}},
    "required": ["items"]})
NO_THINK = {"enable_thinking": False}
TEXT = ResponseFormat()
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def compiler(demo_core) -> GrammarCompiler:
    return GrammarCompiler(GrammarVocabulary(demo_core / "tokenizer.json", 151936,
                                             (151645, 151643)))


@pytest.fixture(scope="module")
def preparer(demo_frontend_model) -> RequestPreparer:
    return RequestPreparer(demo_frontend_model)


def chat(*, tools=(), mode=ToolChoiceMode.AUTO, name="", parallel=None, kwargs=None,
         response_format=TEXT) -> GenerateRequest:
    return GenerateRequest("r", input=ChatInput(
        (ChatMessage("user", "hi"),), tools=tuple(tools),
        tool_choice=ToolChoice(mode, name, parallel), template_kwargs=kwargs or {}),
        response_format=response_format)


def accepts(compiler, model: FrontendModel, grammar, text: str) -> bool:
    """Whether the grammar takes `text` (as the tokenizer encodes it) and may end there."""
    spec = GrammarSpec(GrammarKind(grammar.kind.value), grammar.text, grammar.lenient)
    matcher = compiler.compile(spec).matcher()
    ids = model.tokenizer.encode(text)
    return all(matcher.accept(t) for t in ids) and matcher.is_accepting


def schema_format(schema, strict=False) -> ResponseFormat:
    return ResponseFormat(ResponseFormatType.JSON_SCHEMA, json.dumps(schema), strict=strict)


def test_response_formats_alone_use_the_engines_grammar_kinds(preparer, compiler,
                                                              demo_frontend_model):
    cases = [
        (ResponseFormat(ResponseFormatType.JSON_OBJECT), "json_object", '{"x": [1]}', "[1]"),
        (schema_format(SCHEMA), "json_schema", '{"a": 7}', '{"a": "7"}'),
        (ResponseFormat(ResponseFormatType.REGEX, pattern="[0-9]{2}/[a-z]+"), "regex",
         "42/ab", "4/ab"),
        (ResponseFormat(ResponseFormatType.CHOICE, choices=("red", "green")), "lark", "green",
         "blue"),
        (ResponseFormat(ResponseFormatType.GRAMMAR, grammar='start: "a"+ "b"'), "lark",
         "aab", "ba"),
    ]
    for response_format, kind, good, bad in cases:
        grammar = preparer.prepare(chat(kwargs=NO_THINK, response_format=response_format)
                                   ).grammar
        assert grammar is not None and grammar.kind.value == kind
        assert accepts(compiler, demo_frontend_model, grammar, good)
        assert not accepts(compiler, demo_frontend_model, grammar, bad)
    assert preparer.prepare(chat(kwargs=NO_THINK)).grammar is None
    strict = preparer.prepare(chat(kwargs=NO_THINK, response_format=schema_format(SCHEMA, True)))
    assert strict.grammar is not None and not strict.grammar.lenient


def test_a_thinking_model_may_think_before_the_constrained_answer(preparer, compiler,
                                                                  demo_frontend_model):
    grammar = preparer.prepare(chat(response_format=schema_format(SCHEMA))).grammar
    assert grammar is not None and grammar.kind.value == "lark"
    for text in ('{"a": 1}', '<think>\nplan it\n</think>\n\n{"a": 1}'):
        assert accepts(compiler, demo_frontend_model, grammar, text), text
    assert not accepts(compiler, demo_frontend_model, grammar, 'no {"a": 1}')


def test_required_tool_choice_forces_hermes_calls_the_parser_reads(preparer, compiler,
                                                                   demo_frontend_model):
    grammar = preparer.prepare(chat(tools=(WEATHER, ORDER), mode=ToolChoiceMode.REQUIRED,
                                    kwargs=NO_THINK)).grammar
    assert grammar is not None
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}' \
          '\n</tool_call>'
    two = one + '\n<tool_call>\n{"name": "place_order", "arguments": {"items": [{"sku": "x",' \
                ' "qty": 2}]}}\n</tool_call>'
    for text in (one, two):
        assert accepts(compiler, demo_frontend_model, grammar, text)
        parser = HermesToolParser(frozenset({"get_weather", "place_order"}))
        calls = [i for i in parser.push(text) + parser.flush() if isinstance(i, ToolCallDelta)]
        assert {c.name for c in calls if c.name} <= {"get_weather", "place_order"}
    for bad in ("plain text", one.replace('"c"', '"k"'), one.replace("get_weather", "nope"),
                one.replace('"city": "Oslo", ', "")):
        assert not accepts(compiler, demo_frontend_model, grammar, bad), bad
    single = preparer.prepare(chat(tools=(WEATHER, ORDER), mode=ToolChoiceMode.REQUIRED,
                                   parallel=False, kwargs=NO_THINK)).grammar
    assert accepts(compiler, demo_frontend_model, single, one)
    assert not accepts(compiler, demo_frontend_model, single, two)


def test_named_function_allows_only_that_tool(preparer, compiler, demo_frontend_model):
    grammar = preparer.prepare(chat(tools=(WEATHER, ORDER), mode=ToolChoiceMode.FUNCTION,
                                    name="place_order", kwargs=NO_THINK)).grammar
    order = '<tool_call>\n{"name": "place_order", "arguments": {"items": []}}\n</tool_call>'
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "A", "unit": "f"}}' \
              '\n</tool_call>'
    assert accepts(compiler, demo_frontend_model, grammar, order)
    assert not accepts(compiler, demo_frontend_model, grammar, weather)


def test_auto_tools_with_a_json_format_allow_either(preparer, compiler, demo_frontend_model):
    grammar = preparer.prepare(chat(tools=(WEATHER,), kwargs=NO_THINK,
                                    response_format=schema_format(SCHEMA))).grammar
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "B", "unit": "c"}}' \
           '\n</tool_call>'
    for text in ('{"a": 3}', call):
        assert accepts(compiler, demo_frontend_model, grammar, text), text
    assert preparer.prepare(chat(tools=(WEATHER,), kwargs=NO_THINK)).grammar is None


def test_unusable_requests_are_typed_errors(preparer, demo_frontend_model):
    with pytest.raises(GrammarError, match="not valid JSON"):
        preparer.prepare(chat(response_format=ResponseFormat(ResponseFormatType.JSON_SCHEMA,
                                                             "{oops")))
    with pytest.raises(ValidationError):
        preparer.prepare(chat(response_format=ResponseFormat(ResponseFormatType.REGEX)))
    no_tools = FrontendModel(demo_frontend_model.manifest, demo_frontend_model.assets,
                             tool_parser="none")
    with pytest.raises(UnsupportedError, match="tool-call format"):
        RequestPreparer(no_tools).prepare(chat(tools=(WEATHER,),
                                               mode=ToolChoiceMode.REQUIRED))
    completion = dataclasses.replace(chat(), input=None)
    with pytest.raises(ValidationError):
        preparer.prepare(completion)
