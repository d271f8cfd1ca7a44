"""Content text around tool calls: whitespace between and after calls is formatting.

Models put newlines before, between and after tool calls. `ContentGate` holds back trailing
whitespace of content until it knows what follows: more content (sent), a tool call or the end
of an output that made calls (dropped). Once a call was made, leading whitespace of later
content is dropped too.
"""

from __future__ import annotations

from services.frontend.parsers.tool_calls import ContentText, ToolItem


class ContentGate:
    def __init__(self) -> None:
        self._space = ""
        self.calls_seen = False
        self._after_call = False   # the next content starts right after a call

    def emit(self, out: list[ToolItem], text: str) -> None:
        if not text:
            return
        text = self._space + text
        self._space = ""
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        body = text.rstrip()
        self._space = text[len(body):]
        if body:
            if out and isinstance(out[-1], ContentText):
                out[-1] = ContentText(out[-1].text + body)
            else:
                out.append(ContentText(body))

    def call_started(self) -> None:
        self._space = ""
        self.calls_seen = True
        self._after_call = True

    def flush(self, out: list[ToolItem]) -> None:
        space, self._space = self._space, ""
        if space and not self.calls_seen:
            out.append(ContentText(space))
