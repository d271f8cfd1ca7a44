"""The harmony format of gpt-oss: streamed output -> reasoning, content and tool calls.

The prompt ends with `<|start|>assistant`, so the output is a sequence of messages

    HEADER <|message|> BODY END   (<|start|>assistant HEADER <|message|> BODY END)*

with HEADER = `<|channel|>CHANNEL`, optionally with a recipient ` to=functions.NAME` before or
after the channel and a content type (` <|constrain|>json`), and END one of `<|end|>` (more
messages follow), `<|call|>` (a tool call: the model stops), `<|return|>` (the final answer:
the model stops). The stop token that ends the output is not decoded (it is the engine's
stop), so the stream may also just end inside a body.

- channel `analysis`: reasoning;
- channel `final`, and `commentary` without a recipient (a preamble to the user): content;
- a message addressed to `functions.NAME` (the commentary channel): a tool call, when tools are
  parsed and NAME was offered; its name is sent when the header ends, its body streams as the
  arguments, checked as it goes (`JsonScanner`), so every fragment sent is a valid prefix of a
  JSON object: from the first character that breaks it, the body is content; an empty body is
  `{}`. Addressed to anything else, the body is content, as it was written.

Special tokens must be visible (the choice's detokenizer keeps them); a marker split across
pushes is held back. Malformed output is never an error: text outside any header, an unknown
channel or a header that never ends comes back as content.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.frontend.parsers.json_scan import JsonScanner, JsonSyntaxError
from services.frontend.parsers.tags import find_first, partial_tag_suffix
from services.frontend.parsers.tool_calls import ContentText, ToolCallDelta, new_call_id

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
ENDS = (END, CALL, RETURN)
STOP_TOKENS = (RETURN, CALL)      # what ends an assistant turn (the engine's stop tokens)
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
FUNCTIONS = "functions."


@dataclass(frozen=True, slots=True)
class ReasoningText:
    text: str


HarmonyItem = ReasoningText | ContentText | ToolCallDelta


class HarmonyParser:
    _HEADER, _BODY, _BETWEEN = range(3)

    def __init__(self, tool_names: frozenset[str] | None = None, *,
                 parse_tools: bool = True) -> None:
        self.tool_names = tool_names
        self.parse_tools = parse_tools
        self.num_calls = 0          # calls whose name was sent
        self.completed_calls = 0    # calls whose body ended with <|call|> / <|end|>
        self._state = self._HEADER  # the prompt opened the first message
        self._header = ""
        self._kind = "content"      # the body's route: reasoning | content | call
        self._call_index = 0
        self._scanner = JsonScanner()   # the current call's arguments
        self._sent_arguments = False
        self._tail = ""                 # body text after the arguments object closed
        self._pending = ""
        self.turn_ended = ""        # the <|call|> / <|return|> that ended the turn, if decoded

    @property
    def in_reasoning(self) -> bool:
        return self._state == self._BODY and self._kind == "reasoning"

    def push(self, text: str) -> list[HarmonyItem]:
        out: list[HarmonyItem] = []
        buffer, self._pending = self._pending + text, ""
        while buffer:
            if self._state == self._HEADER:
                at = buffer.find(MESSAGE)
                if at < 0:
                    hold = partial_tag_suffix(buffer, (MESSAGE,))
                    self._header += buffer[:len(buffer) - hold]
                    self._pending = buffer[len(buffer) - hold:]
                    return out
                self._header += buffer[:at]
                buffer = buffer[at + len(MESSAGE):]
                self._open_body(out)
            elif self._state == self._BODY:
                at, marker = find_first(buffer, ENDS)
                if at < 0:
                    hold = partial_tag_suffix(buffer, ENDS)
                    self._emit(out, buffer[:len(buffer) - hold])
                    self._pending = buffer[len(buffer) - hold:]
                    return out
                self._emit(out, buffer[:at])
                buffer = buffer[at + len(marker):]
                self._close_body(out)
                if marker in STOP_TOKENS:   # the turn is over, whatever follows
                    self.turn_ended = marker
                    return out
            else:   # between messages: `<|start|>assistant` (or any author) opens the next
                at = buffer.find(START)
                if at < 0:
                    hold = partial_tag_suffix(buffer, (START,))
                    if buffer[:len(buffer) - hold].strip():
                        self._emit_content(out, buffer[:len(buffer) - hold])
                    self._pending = buffer[len(buffer) - hold:]
                    return out
                if buffer[:at].strip():
                    self._emit_content(out, buffer[:at])
                buffer = buffer[at + len(START):]
                self._state, self._header = self._HEADER, ""
        return out

    def flush(self) -> list[HarmonyItem]:
        """The output ended (the stop token is not decoded): a call in progress is complete."""
        out: list[HarmonyItem] = []
        pending, self._pending = self._pending, ""
        if self._state == self._BODY:
            self._emit(out, pending)
            self._close_body(out)
        elif self._state == self._HEADER and (self._header + pending).strip():
            self._emit_content(out, self._header + pending)  # a header that never ended
            self._header = ""
        elif pending.strip():
            self._emit_content(out, pending)
        return out

    # -- internals ----------------------------------------------------------------------------

    def _open_body(self, out: list[HarmonyItem]) -> None:
        header, self._header = self._header, ""
        # the author of a continued message comes first (`assistant`); drop it
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        name = recipient.group(1) if recipient else ""
        self._state = self._BODY
        if name.startswith(FUNCTIONS) and self._offered(name[len(FUNCTIONS):]):
            self._kind = "call"
            self._scanner, self._sent_arguments, self._tail = JsonScanner(), False, ""
            self._call_index = self.num_calls
            self.num_calls += 1
            out.append(ToolCallDelta(self._call_index, new_call_id(), "function",
                                     name[len(FUNCTIONS):]))
        elif channel is not None and channel.group(1) == "analysis" and not name:
            self._kind = "reasoning"
        else:
            self._kind = "content"

    def _offered(self, name: str) -> bool:
        return self.parse_tools and bool(name) and (self.tool_names is None
                                                    or name in self.tool_names)

    def _close_body(self, out: list[HarmonyItem] | None = None) -> None:
        if self._kind == "call":
            self.completed_calls += 1
            if out is not None:
                if not self._sent_arguments:
                    out.append(ToolCallDelta(self._call_index, arguments="{}"))
                if self._tail.strip():    # whitespace after the object is formatting
                    self._emit_content(out, self._tail)
            self._tail = ""
        self._state, self._kind = self._BETWEEN, "content"

    def _emit(self, out: list[HarmonyItem], text: str) -> None:
        if not text:
            return
        if self._kind == "reasoning":
            _append(out, ReasoningText(text))
        elif self._kind == "call":
            self._emit_arguments(out, text)
        else:
            self._emit_content(out, text)

    def _emit_arguments(self, out: list[HarmonyItem], text: str) -> None:
        """The valid JSON-object prefix of `text` as arguments; the rest (a broken or finished
        object's tail) as content."""
        scanner = self._scanner
        if scanner.done:
            self._tail += text
            return
        if not self._sent_arguments:
            text = text.lstrip()
            if not text:
                return
        start = scanner.pos
        try:
            if not self._sent_arguments and text[0] != "{":
                raise JsonSyntaxError("the arguments are not an object")
            used = scanner.feed(text)
        except JsonSyntaxError:
            used = scanner.pos - start
            self._kind = "content"         # the rest of this body is text
        if used:
            out.append(ToolCallDelta(self._call_index, arguments=text[:used]))
            self._sent_arguments = True
        rest = text[used:]
        if self._kind == "content":
            self._emit_content(out, rest)
        else:
            self._tail += rest

    @staticmethod
    def _emit_content(out: list[HarmonyItem], text: str) -> None:
        if text:
            _append(out, ContentText(text))


def _append(out: list[HarmonyItem], item: ReasoningText | ContentText) -> None:
    if out and type(out[-1]) is type(item):
        out[-1] = type(item)(out[-1].text + item.text)   # type: ignore[union-attr]
    else:
        out.append(item)
