"""Forced tool calls: a grammar that writes calls in the syntax of the model's tool parser, so
the parser that reads ordinary output reads these too; each call names an offered tool and its
arguments follow that tool's JSON schema (lenient unless the tool is strict).

| parser        | one call                                                                    |
|---------------|-----------------------------------------------------------------------------|
| `hermes`      | `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, calls joined by "\n" |
| `llama3_json` | `{"name": "f", "parameters": {...}}`, calls joined by "; "                  |
| `deepseek_v3` | `<｜tool▁calls▁begin｜>` + `<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```<｜tool▁call▁end｜>`... + `<｜tool▁calls▁end｜>` |
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from services.common.api.chat import ToolDefinition
from services.common.errors import UnsupportedError
from services.frontend.parsers import deepseek_v3, hermes
from services.frontend.structured.grammar import COMPACT_JSON, inline_json, literal, tag
from services.frontend.tokenizer import Tokenizer


def _arguments(tool: ToolDefinition) -> str:
    schema = tool.parameters if tool.parameters is not None else {"type": "object"}
    return inline_json(schema, {**COMPACT_JSON, "lenient": not tool.strict})


def tool_call_rules(parser: str, tools: Sequence[ToolDefinition], *, parallel: bool,
                    tokenizer: Tokenizer) -> list[str]:
    """Lark rules whose `calls` rule is one call (or several when `parallel`) to `tools`."""
    if not tools:
        raise UnsupportedError("a forced tool call needs tools", param="tool_choice")
    rules: list[str] = []
    names: list[str] = []
    for k, tool in enumerate(tools):
        name = json.dumps(tool.name, ensure_ascii=False)
        rules.append(f"args{k}: {_arguments(tool)}")
        if parser == "hermes":
            body = literal(f'{{"name": {name}, "arguments": ') + f" args{k} " + literal("}")
        elif parser == "llama3_json":
            body = literal(f'{{"name": {name}, "parameters": ') + f" args{k} " + literal("}")
        elif parser == "deepseek_v3":
            body = (tag(tokenizer, deepseek_v3.CALL_BEGIN) + " " + literal("function") + " "
                    + tag(tokenizer, deepseek_v3.SEP) + " " + literal(f"{tool.name}\n```json\n")
                    + f" args{k} " + literal("\n```") + " "
                    + tag(tokenizer, deepseek_v3.CALL_END))
        else:
            raise UnsupportedError(f"forced tool calls need a tool-call format this frontend "
                                   f"knows; the model's is {parser or 'none'}",
                                   param="tool_choice")
        rules.append(f"call{k}: {body}")
        names.append(f"call{k}")
    rules.append("call: " + " | ".join(names))
    if parser == "hermes":
        rules.append("one: " + tag(tokenizer, hermes.START) + ' "\\n" call "\\n" '
                     + tag(tokenizer, hermes.END))
        rules.append('calls: one ("\\n" one)*' if parallel else "calls: one")
    elif parser == "llama3_json":
        rules.append('calls: call ("; " call)*' if parallel else "calls: call")
    else:
        begin = tag(tokenizer, deepseek_v3.CALLS_BEGIN)
        end = tag(tokenizer, deepseek_v3.CALLS_END)
        rules.append(f"calls: {begin} call+ {end}" if parallel else
                     f"calls: {begin} call {end}")
    return rules
