"""build_grammar: one request's structured-output constraint for the engine (None: none).

    response_format json_object / json_schema / regex / choice / grammar -> the output
    tool_choice required (any offered tool) / function (that one)       -> tool calls only
    tool_choice auto with tools and a structured response format      -> content or calls

A reasoning model (its reasoning parser on for the request) first gets its thinking block:
required when the prompt left `<think>` open, optional when the model may open one, none when
the template closed it (thinking off). The constraint applies after it, as vLLM does. A
`grammar` response format is the caller's whole grammar: nothing is added to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.common.api.chat import ToolChoiceMode
from services.common.api.generate import GenerateRequest, ResponseFormat, ResponseFormatType
from services.common.errors import GrammarError, ValidationError
from services.frontend.parsers.reasoning import THINK_END, THINK_START
from services.frontend.structured.grammar import (
    JSON_WHITESPACE,
    EngineGrammar,
    GrammarKind,
    inline_json,
    is_token,
    literal,
    parse_schema,
    regex_terminal,
    tag,
)
from services.frontend.structured.tool_calls import tool_call_rules
from services.frontend.tokenizer import Tokenizer

if TYPE_CHECKING:
    from services.frontend.generate.types import OutputOptions

MAX_CHOICES = 1024


def build_grammar(request: GenerateRequest, *, tokenizer: Tokenizer, tool_parser: str,
                  prompt: str, output: OutputOptions) -> EngineGrammar | None:
    fmt = request.response_format
    chat = request.chat
    mode = chat.tool_choice.mode if chat is not None and chat.tools else ToolChoiceMode.NONE
    rules: list[str] = []
    if mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.FUNCTION):
        assert chat is not None
        tools = chat.tools if mode is ToolChoiceMode.REQUIRED else tuple(
            t for t in chat.tools if t.name == chat.tool_choice.function_name)
        parallel = mode is ToolChoiceMode.REQUIRED and chat.tool_choice.allows_parallel_calls
        rules += tool_call_rules(tool_parser, tools, parallel=parallel, tokenizer=tokenizer)
        body = "calls"
    else:
        if fmt.type is ResponseFormatType.TEXT:
            return None
        if fmt.type is ResponseFormatType.GRAMMAR:
            if not fmt.grammar.strip():
                raise ValidationError("the grammar is empty", param="response_format.grammar")
            return EngineGrammar(GrammarKind.LARK, fmt.grammar)
        prefix = _reasoning_prefix(tokenizer, prompt, output)
        either = mode is ToolChoiceMode.AUTO and bool(output.tool_parser)
        if not prefix and not either:
            return _direct(fmt)
        rules.append("content: " + _content(fmt))
        body = "content"
        if either:
            assert chat is not None
            rules += tool_call_rules(tool_parser, chat.tools,
                                     parallel=chat.tool_choice.allows_parallel_calls,
                                     tokenizer=tokenizer)
            body = "content | calls"
    prefix = _reasoning_prefix(tokenizer, prompt, output)
    start = f"start: {prefix[0]} ({body})" if prefix else f"start: {body}"
    return EngineGrammar(GrammarKind.LARK, "\n".join([start, *prefix[1:], *rules]) + "\n")


def _direct(fmt: ResponseFormat) -> EngineGrammar:
    """A response format alone: the engine's own grammar kinds where one fits."""
    if fmt.type is ResponseFormatType.JSON_OBJECT:
        return EngineGrammar(GrammarKind.JSON_OBJECT)
    if fmt.type is ResponseFormatType.JSON_SCHEMA:
        parse_schema_or_fail(fmt)
        return EngineGrammar(GrammarKind.JSON_SCHEMA, fmt.schema_json or '{"type": "object"}',
                             lenient=not fmt.strict)
    if fmt.type is ResponseFormatType.REGEX:
        if not fmt.pattern:
            raise ValidationError("the regex is empty", param="response_format.pattern")
        return EngineGrammar(GrammarKind.REGEX, fmt.pattern)
    return EngineGrammar(GrammarKind.LARK, "start: " + _content(fmt) + "\n")


def _content(fmt: ResponseFormat) -> str:
    """The right-hand side of a rule matching the formatted content."""
    if fmt.type is ResponseFormatType.JSON_OBJECT:
        return inline_json({"type": "object"}, {"whitespace_pattern": JSON_WHITESPACE})
    if fmt.type is ResponseFormatType.JSON_SCHEMA:
        return inline_json(parse_schema_or_fail(fmt), {"whitespace_pattern": JSON_WHITESPACE,
                                                       "lenient": not fmt.strict})
    if fmt.type is ResponseFormatType.REGEX:
        if not fmt.pattern:
            raise ValidationError("the regex is empty", param="response_format.pattern")
        return regex_terminal(fmt.pattern)
    if not 1 <= len(fmt.choices) <= MAX_CHOICES or any(not c for c in fmt.choices):
        raise ValidationError(f"choice needs 1 to {MAX_CHOICES} non-empty strings",
                              param="response_format.choices")
    return " | ".join(literal(choice) for choice in dict.fromkeys(fmt.choices))


def parse_schema_or_fail(fmt: ResponseFormat) -> object:
    try:
        return parse_schema(fmt.schema_json, "response_format.schema")
    except ValidationError as exc:   # an unusable schema is the grammar's failure (400)
        raise GrammarError(exc.message, param=exc.param) from exc


def _reasoning_prefix(tokenizer: Tokenizer, prompt: str, output: OutputOptions
                      ) -> list[str]:
    """[what precedes the body in `start`, rules it needs]; [] when nothing does."""
    if not output.reasoning:
        return []
    if not output.starts_in_reasoning and prompt.rstrip().endswith(THINK_END):
        return []                               # the template closed the block: no thinking
    close = tag(tokenizer, THINK_END)
    if is_token(tokenizer, THINK_END):
        thought = f"/(.|\\n)*/ {close}"
        rules = []
    else:                                       # a text tag: the thought stops at its first
        thought = "thought"                     # occurrence
        rules = ["thought[lazy]: " + regex_terminal(r"(.|\n)*" + _escape(THINK_END))]
    rules.append(r"GAP: /[ \t\r\n]{1,4}/")
    if output.starts_in_reasoning:
        return [f"{thought} GAP?", *rules]
    rules.insert(0, f"think: {tag(tokenizer, THINK_START)} {thought} GAP?")
    return ["think?", *rules]


def _escape(text: str) -> str:
    return "".join(c if c.isalnum() else f"[{c}]" for c in text)
