"""Llama 3.x JSON tool calls: the output *is* the call, `{"name": ..., "parameters": {...}}`.

Llama 3.1/3.2/3.3 answer a tool request with a bare JSON object (optionally after
`<|python_tag|>`, visible only when special tokens are kept), several calls separated by `;`.
Only output that starts with such an object is a call, and only when the name is one of the
offered tools: an ordinary JSON answer stays content.
"""

from __future__ import annotations

from services.frontend.parsers.tool_calls import ToolItem
from services.frontend.parsers.tool_parser import CallObjectParser

PYTHON_TAG = "<|python_tag|>"
ARGUMENT_KEYS = ("parameters", "arguments")


class Llama3JsonToolParser(CallObjectParser):
    _LEADING, _CALL, _BETWEEN, _CONTENT = range(4)
    _AFTER_CALL = _BETWEEN

    def __init__(self, allowed_names: frozenset[str] | None = None) -> None:
        super().__init__(allowed_names)
        self._state = self._LEADING
        self._lead = ""            # text consumed before the first call (given back if none)

    def _step(self, out: list[ToolItem], buffer: str) -> str | None:
        if self._state in (self._LEADING, self._BETWEEN):
            return self._between_calls(buffer)
        if self._state == self._CALL:
            return self._feed_call(out, buffer)
        self._gate.emit(out, buffer)
        return None

    def _between_calls(self, buffer: str) -> str | None:
        """Before the first call (whitespace, the python tag) or between calls (also `;`)."""
        leading = self._state == self._LEADING
        stripped = buffer.lstrip(" \t\r\n" if leading else " \t\r\n;")
        skipped = buffer[:len(buffer) - len(stripped)]
        if not stripped or PYTHON_TAG.startswith(stripped):
            self._pending = buffer
            return None
        if leading:
            self._lead += skipped
        if stripped.startswith(PYTHON_TAG):
            if leading:
                self._lead += PYTHON_TAG
            return stripped[len(PYTHON_TAG):]
        if stripped.startswith("{"):
            self._open_call(argument_keys=ARGUMENT_KEYS)
            self._state = self._CALL
            return stripped
        self._state = self._CONTENT
        rest = (self._lead if not self.num_calls else "") + stripped
        self._lead = ""
        return rest

    def _call_was_text(self, out: list[ToolItem], raw: str, rest: str) -> str:
        given_back = (self._lead if not self.num_calls else "") + raw
        self._lead = ""
        return given_back + rest

    def _flush(self, out: list[ToolItem], pending: str, truncated: bool) -> None:
        if self._state == self._LEADING:
            self._gate.emit(out, self._lead + pending)
        elif self._state == self._CALL:
            self._flush_call(out, pending, truncated)
        elif self._state == self._CONTENT:
            self._gate.emit(out, pending)
