"""Hermes / Qwen tool calls: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`."""

from __future__ import annotations

from services.frontend.parsers.tags import partial_tag_suffix
from services.frontend.parsers.tool_calls import ToolItem
from services.frontend.parsers.tool_parser import CallObjectParser

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(CallObjectParser):
    _CONTENT, _CALL, _AFTER = range(3)
    _AFTER_CALL = _AFTER

    def _step(self, out: list[ToolItem], buffer: str) -> str | None:
        if self._state == self._CONTENT:
            at = buffer.find(START)
            if at < 0:
                hold = partial_tag_suffix(buffer, (START,))
                self._gate.emit(out, buffer[:len(buffer) - hold])
                self._pending = buffer[len(buffer) - hold:]
                return None
            self._gate.emit(out, buffer[:at])
            self._open_call()
            self._state = self._CALL
            return buffer[at + len(START):]
        if self._state == self._CALL:
            return self._feed_call(out, buffer)
        # _AFTER: whitespace, then the closing tag
        stripped = buffer.lstrip()
        if stripped.startswith(END):
            self._state = self._CONTENT
            return stripped[len(END):]
        if not stripped or END.startswith(stripped):
            self._pending = buffer
            return None
        self._state = self._CONTENT  # no closing tag: what follows is content
        return stripped

    def _call_was_text(self, out: list[ToolItem], raw: str, rest: str) -> str:
        self._gate.emit(out, START + raw)
        return rest

    def _flush(self, out: list[ToolItem], pending: str, truncated: bool) -> None:
        if self._state == self._CONTENT:
            self._gate.emit(out, pending)
        elif self._state == self._CALL:
            self._flush_call(out, pending, truncated)
