"""Tool-call parsing shared by every format: output items and the call-object streamer.

A tool parser (`tool_parser.py`) turns streamed content text into `ContentText` and
`ToolCallDelta` items, which the choice processor turns into events of its choice. Every
call streams its name first (a delta with id, type and name and no arguments), then argument
fragments whose concatenation is the arguments JSON object. `CallObjectStream` does this for
calls written as one JSON object, `{"name": ..., "arguments": {...}}` (Hermes/Qwen, Llama 3),
validating the JSON as it goes so every fragment sent is a valid prefix.

Malformed output is never an error: a call that breaks before its name was sent comes back as
content text, unchanged; once the name is out, the call keeps what was sent and the rest of the
text comes back as content.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from services.frontend.parsers.json_scan import JsonScanner, JsonSyntaxError, Member


@dataclass(frozen=True, slots=True)
class ContentText:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    tool_index: int
    id: str = ""           # first delta of a call only
    type: str = ""         # "function", first delta only
    name: str = ""         # first delta only
    arguments: str = ""    # JSON fragment


ToolItem = ContentText | ToolCallDelta


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class MalformedCall(ValueError):
    pass


class CallObjectStream:
    """Streams one call object; `feed` returns items and how many characters it consumed."""

    def __init__(self, tool_index: int, *, argument_keys: tuple[str, ...] = ("arguments",),
                 allowed_names: frozenset[str] | None = None) -> None:
        self.tool_index = tool_index
        self.argument_keys = argument_keys
        self.allowed_names = allowed_names
        self.scanner = JsonScanner()
        self.raw = ""                     # every character consumed (the fallback text)
        self.name: str | None = None      # set once the name delta was produced
        self._sent_upto = -1              # absolute position of argument text already sent
        self._args_done = False
        self.broken = False               # broke after its name was sent

    @property
    def committed(self) -> bool:
        return self.name is not None

    @property
    def done(self) -> bool:
        return self.scanner.done

    def feed(self, text: str) -> tuple[list[ToolItem], int]:
        """Consume `text` up to the end of the object.

        Raises MalformedCall when the call breaks before its name was sent; a call that breaks
        later is marked `broken` and returns what it produced up to the break.
        """
        before = self.scanner.pos
        error: MalformedCall | None = None
        try:
            used = self.scanner.feed(text)
        except JsonSyntaxError as exc:
            used = self.scanner.pos - before          # what was valid before the error
            error = MalformedCall(str(exc))
        self.raw += text[:used]
        items: list[ToolItem] = []
        try:
            self._advance(items)
        except MalformedCall as exc:
            error = error or exc
        if error is not None:
            if not self.committed:
                raise error
            self.broken = True
        return items, used

    def cut_off(self) -> list[ToolItem] | None:
        """The output ended inside this uncommitted call (the length limit): the partial call
        (its name as far as it was written, the arguments prefix), or None when what was
        written cannot be the start of a call (then it is text)."""
        if self.scanner.first not in ("", "{"):
            return None
        members = {m.key: m for m in self.scanner.members}
        name = _partial_string(self.raw, members.get("name"))
        if name is None:
            return None
        allowed = self.allowed_names
        if allowed is not None and name and not any(n.startswith(name) for n in allowed):
            return None
        items: list[ToolItem] = [ToolCallDelta(self.tool_index, new_call_id(), "function", name)]
        args = next((members[k] for k in self.argument_keys if k in members), None)
        if args is not None and args.start >= 0 and self.raw[args.start] == "{":
            items.append(ToolCallDelta(self.tool_index, arguments=self.raw[args.start:]
                                       if args.end < 0 else self.raw[args.start:args.end]))
        self.name = name
        return items

    def _advance(self, items: list[ToolItem]) -> None:
        if self.scanner.first and self.scanner.first != "{":
            raise MalformedCall("a tool call must be a JSON object")
        members = {m.key: m for m in self.scanner.members}
        args = next((members[k] for k in self.argument_keys if k in members), None)
        if args is not None and args.start >= 0 and self.raw[args.start] not in '{"':
            raise MalformedCall("arguments must be a JSON object")
        if self.name is None:
            name_member = members.get("name")
            if name_member is None or name_member.end < 0:
                if self.scanner.done:
                    raise MalformedCall("the tool call has no name")
                return
            name = json.loads(self.raw[name_member.start:name_member.end])
            if not isinstance(name, str) or not name:
                raise MalformedCall("the tool call's name must be a non-empty string")
            if self.allowed_names is not None and name not in self.allowed_names:
                raise MalformedCall(f"unknown tool {name!r}")
            if not (self.scanner.done or (args is not None and args.start >= 0)):
                return  # send the name once the arguments are known to be an object
            self.name = name
            items.append(ToolCallDelta(self.tool_index, new_call_id(), "function", name))
        fragment = self._arguments_fragment(args)
        if fragment:
            items.append(ToolCallDelta(self.tool_index, arguments=fragment))

    def _arguments_fragment(self, args: Member | None) -> str:
        if self._args_done:
            return ""
        if args is None or args.start < 0:
            if self.scanner.done:
                self._args_done = True
                return "{}"
            return ""
        text = self.raw
        if text[args.start] == '"':  # arguments given as a JSON string holding the object
            if args.end < 0:
                return ""
            self._args_done = True
            try:
                inner = json.loads(json.loads(text[args.start:args.end]))
            except ValueError as exc:
                raise MalformedCall("string arguments are not JSON") from exc
            if not isinstance(inner, dict):
                raise MalformedCall("arguments must be a JSON object")
            return json.dumps(inner, ensure_ascii=False)
        end = args.end if args.end >= 0 else len(text)
        begin = max(self._sent_upto, args.start)
        self._sent_upto = end
        if args.end >= 0:
            self._args_done = True
        return text[begin:end]


def _partial_string(raw: str, member: Member | None) -> str | None:
    """A string member's value as far as it was written ('' when not started; None when the
    value is not a string)."""
    if member is None or member.start < 0:
        return ""
    if raw[member.start] != '"':
        return None
    if member.end >= 0:
        value = json.loads(raw[member.start:member.end])
        return value if isinstance(value, str) else None
    body = raw[member.start:]
    for cut in range(len(body), max(0, len(body) - 12), -1):   # drop a half-written escape
        try:
            return str(json.loads(body[:cut] + '"'))
        except ValueError:
            continue
    return ""
