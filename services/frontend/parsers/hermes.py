"""Hermes / Qwen tool calls: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`."""

from __future__ import annotations

from services.frontend.parsers.content import ContentGate
from services.frontend.parsers.tags import partial_tag_suffix
from services.frontend.parsers.tool_calls import (
    CallObjectStream,
    MalformedCall,
    ToolCallDelta,
    ToolItem,
)

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser:
    _CONTENT, _CALL, _AFTER = range(3)

    def __init__(self, allowed_names: frozenset[str] | None = None) -> None:
        self.allowed_names = allowed_names
        self.num_calls = 0          # calls whose name was sent
        self.completed_calls = 0    # calls whose arguments object closed
        self._state = self._CONTENT
        self._pending = ""
        self._call: CallObjectStream | None = None
        self._gate = ContentGate()

    def push(self, text: str) -> list[ToolItem]:
        out: list[ToolItem] = []
        buffer, self._pending = self._pending + text, ""
        while buffer:
            if self._state == self._CONTENT:
                at = buffer.find(START)
                if at < 0:
                    hold = partial_tag_suffix(buffer, (START,))
                    self._gate.emit(out, buffer[:len(buffer) - hold])
                    self._pending = buffer[len(buffer) - hold:]
                    return out
                self._gate.emit(out, buffer[:at])
                buffer = buffer[at + len(START):]
                self._call = CallObjectStream(self.num_calls, allowed_names=self.allowed_names)
                self._state = self._CALL
            elif self._state == self._CALL:
                buffer = self._feed_call(out, buffer)
            else:  # _AFTER: whitespace, then the closing tag
                stripped = buffer.lstrip()
                if stripped.startswith(END):
                    buffer = stripped[len(END):]
                    self._state = self._CONTENT
                elif not stripped or END.startswith(stripped):
                    self._pending = buffer
                    return out
                else:  # no closing tag: what follows is content
                    self._state = self._CONTENT
                    buffer = stripped
        return out

    def _feed_call(self, out: list[ToolItem], buffer: str) -> str:
        call = self._call
        assert call is not None
        raw_before = len(call.raw)
        try:
            items, used = call.feed(buffer)
        except MalformedCall:  # broke before its name was sent: the call is text after all
            self._gate.emit(out, START + call.raw)
            self._call, self._state = None, self._CONTENT
            return buffer[len(call.raw) - raw_before:]
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
            self._call, self._state = None, self._AFTER
        return buffer[used:]

    def flush(self) -> list[ToolItem]:
        out: list[ToolItem] = []
        pending, self._pending = self._pending, ""
        if self._state == self._CONTENT:
            self._gate.emit(out, pending)
        elif self._state == self._CALL and self._call is not None:
            if self._call.committed:
                self.num_calls += 1
            else:
                self._gate.emit(out, START + self._call.raw + pending)
            self._call = None
        self._gate.flush(out)
        return out
