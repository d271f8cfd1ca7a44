"""EngineGrammar (what the frontend asks the engine to enforce) and the pieces of llguidance's
Lark dialect the builders write: string literals, special tokens by id, inline JSON schemas."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from services.common.errors import ValidationError
from services.frontend.tokenizer import Tokenizer

# Response-format JSON: whitespace between JSON tokens is bounded (a weak model could write it
# forever); the engine applies the same default to plain JSON schema grammars.
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{1,16}"
# Tool-call arguments: written exactly as models are trained to write them (json.dumps).
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarKind(enum.Enum):
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    LARK = "lark"


@dataclass(frozen=True, slots=True)
class EngineGrammar:
    kind: GrammarKind
    text: str = ""
    lenient: bool = False


def literal(text: str) -> str:
    """A Lark string literal matching `text` exactly (JSON escapes are Lark escapes)."""
    return json.dumps(text, ensure_ascii=False)


def tag(tokenizer: Tokenizer, text: str) -> str:
    """`text` as the model writes it: its added (special) token by id when it is one, which is
    how templates and models emit tags like <tool_call> or <think>; else the literal text."""
    token_id = tokenizer.token_to_id(text)
    if token_id is not None and tokenizer.added_tokens.get(token_id) == text:
        return f"<[{token_id}]>"
    return literal(text)


def is_token(tokenizer: Tokenizer, text: str) -> bool:
    return tag(tokenizer, text).startswith("<[")


def parse_schema(text: str, param: str) -> Any:
    """A JSON schema given as text: an object or a boolean."""
    try:
        schema = json.loads(text) if text.strip() else {"type": "object"}
    except ValueError as exc:
        raise ValidationError(f"{param} is not valid JSON: {exc}", param=param) from exc
    if not isinstance(schema, dict | bool):
        raise ValidationError(f"{param} must be a JSON object", param=param)
    return schema


def inline_json(schema: Any, options: dict[str, Any]) -> str:
    """`%json {...}`: the schema with the compile options it does not set itself (its own
    top-level `x-guidance` wins). Each inline schema keeps its own root (`$ref`s resolve)."""
    if isinstance(schema, dict):
        own = schema.get("x-guidance")
        merged = {**options, **own} if isinstance(own, dict) else dict(options)
        schema = {**schema, "x-guidance": merged}
    return "%json " + json.dumps(schema, ensure_ascii=False)


def regex_terminal(pattern: str) -> str:
    """A Lark regex terminal `/.../` (slashes escaped)."""
    return "/" + pattern.replace("\\/", "/").replace("/", "\\/") + "/"
