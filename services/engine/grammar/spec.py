"""GrammarSpec: what a request asks its output to match, validated at the protobuf edge."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from services.common.errors import ValidationError

MAX_GRAMMAR_BYTES = 1 << 20      # a grammar or schema larger than 1 MiB is refused


class GrammarKind(enum.Enum):
    JSON_SCHEMA = "json_schema"  # text: a JSON Schema
    JSON_OBJECT = "json_object"  # any JSON object; no text
    REGEX = "regex"              # text: a regular expression the whole output matches
    LARK = "lark"                # text: llguidance Lark (inline %json, <[id]> tokens) or GBNF


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """One structured-output constraint; equal specs share one compiled grammar."""

    kind: GrammarKind
    text: str = ""
    lenient: bool = False        # JSON Schema: unsupported keywords are ignored, not errors

    def __post_init__(self) -> None:
        if self.kind is GrammarKind.JSON_OBJECT:
            if self.text:
                raise ValidationError("a json_object grammar takes no text",
                                      param="grammar.text")
            return
        if not self.text.strip():
            raise ValidationError(f"a {self.kind.value} grammar needs its text",
                                  param="grammar.text")
        if len(self.text.encode()) > MAX_GRAMMAR_BYTES:
            raise ValidationError(f"the grammar is larger than {MAX_GRAMMAR_BYTES} bytes",
                                  param="grammar.text")

    def describe(self) -> str:
        """A short label for logs (never the whole text)."""
        return f"{self.kind.value}({len(self.text)} chars{', lenient' if self.lenient else ''})"
