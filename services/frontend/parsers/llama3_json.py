"""Llama 3.x JSON tool calls: the output *is* the call, `{"name": ..., "parameters": {...}}`.

Llama 3.1/3.2/3.3 answer a tool request with a bare JSON object (optionally after
`<|python_tag|>`, visible only when special tokens are kept), several calls separated by `;`.
Only output that starts with such an object is a call, and only when the name is one of the
offered tools: an ordinary JSON answer stays content.
"""

from __future__ import annotations

from services.frontend.parsers.content import ContentGate
from services.frontend.parsers.tool_calls import (
    CallObjectStream,
    ContentText,
    MalformedCall,
    ToolCallDelta,
    ToolItem,
)

PYTHON_TAG = "<|python_tag|>"
ARGUMENT_KEYS = ("parameters", "arguments")


class Llama3JsonToolParser:
    _LEADING, _CALL, _BETWEEN, _CONTENT = range(4)

    def __init__(self, allowed_names: frozenset[str] | None = None) -> None:
        self.allowed_names = allowed_names
        self.num_calls = 0
        self.completed_calls = 0
        self._state = self._LEADING
        self._pending = ""
        self._lead = ""            # text consumed before the first call (given back if none)
        self._call: CallObjectStream | None = None
        self._gate = ContentGate()

    def _new_call(self) -> None:
        self._call = CallObjectStream(self.num_calls, argument_keys=ARGUMENT_KEYS,
                                      allowed_names=self.allowed_names)
        self._state = self._CALL

    def push(self, text: str) -> list[ToolItem]:
        out: list[ToolItem] = []
        buffer, self._pending = self._pending + text, ""
        while buffer:
            if self._state in (self._LEADING, self._BETWEEN):
                separators = " \t\r\n" if self._state == self._LEADING else " \t\r\n;"
                stripped = buffer.lstrip(separators)
                skipped = buffer[:len(buffer) - len(stripped)]
                if not stripped or PYTHON_TAG.startswith(stripped):
                    self._pending = buffer
                    return out
                if self._state == self._LEADING:
                    self._lead += skipped
                if stripped.startswith(PYTHON_TAG):
                    if self._state == self._LEADING:
                        self._lead += PYTHON_TAG
                    stripped = stripped[len(PYTHON_TAG):]
                    buffer = stripped
                    continue
                if stripped.startswith("{"):
                    self._new_call()
                    buffer = stripped
                    continue
                self._state = self._CONTENT
                buffer = (self._lead if not self.num_calls else "") + stripped
                self._lead = ""
            elif self._state == self._CALL:
                buffer = self._feed_call(out, buffer)
            else:
                self._gate.emit(out, buffer)
                return out
        return out

    def _feed_call(self, out: list[ToolItem], buffer: str) -> str:
        call = self._call
        assert call is not None
        raw_before = len(call.raw)
        try:
            items, used = call.feed(buffer)
        except MalformedCall:  # broke before its name was sent: the text is content after all
            rest = buffer[len(call.raw) - raw_before:]
            self._call, self._state = None, self._CONTENT
            given_back = (self._lead if not self.num_calls else "") + call.raw
            self._lead = ""
            return given_back + rest
        if any(isinstance(item, ToolCallDelta) and item.name for item in items):
            self._gate.call_started()
        out.extend(items)
        if call.broken:  # broke after its name was sent: it keeps what was sent
            self.num_calls += 1
            self._call, self._state = None, self._CONTENT
            return buffer[used:]
        if call.done:
            self.num_calls += 1
            self.completed_calls += 1
            self._call, self._state = None, self._BETWEEN
        return buffer[used:]

    def flush(self) -> list[ToolItem]:
        out: list[ToolItem] = []
        pending, self._pending = self._pending, ""
        if self._state == self._LEADING:
            self._gate.emit(out, self._lead + pending)
        elif self._state == self._CALL and self._call is not None:
            if self._call.committed:
                self.num_calls += 1
            else:
                self._gate.emit(out, (self._lead if not self.num_calls else "")
                                + self._call.raw + pending)
        elif self._state == self._CONTENT:
            self._gate.emit(out, pending)
        self._call = None
        self._gate.flush(out)
        return [item for item in out if not (isinstance(item, ContentText) and not item.text)]
