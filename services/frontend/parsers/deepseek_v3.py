"""DeepSeek V3 tool calls, written with the model's tool tokens:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {"arg": 1}
    ```<｜tool▁call▁end｜><｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

The V3.1 layout, `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"arg": 1}<｜tool▁call▁end｜>`, is accepted
too. The name is sent when its line ends, then the arguments object streams as it is validated.
"""

from __future__ import annotations

from services.frontend.parsers.json_scan import JsonScanner, JsonSyntaxError
from services.frontend.parsers.tags import find_first, partial_tag_suffix
from services.frontend.parsers.tool_calls import ToolCallDelta, ToolItem
from services.frontend.parsers.tool_parser import ToolCallParser

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
FENCE_OPEN = "```json"
FENCE_CLOSE = "```"
MAX_HEADER = 512


class DeepSeekV3ToolParser(ToolCallParser):
    _CONTENT, _CALLS, _HEADER, _FENCE, _ARGS, _CLOSE = range(6)

    def __init__(self, allowed_names: frozenset[str] | None = None) -> None:
        super().__init__(allowed_names)
        self._raw = ""               # text of the call section not yet committed (fallback)
        self._header = ""
        self._scanner: JsonScanner | None = None

    def _step(self, out: list[ToolItem], buffer: str) -> str | None:
        step = (self._content, self._calls, self._header_step, self._fence, self._args,
                self._close)[self._state]
        return step(out, buffer)

    # Each step consumes from the buffer and returns the rest (None: wait for more text).

    def _content(self, out: list[ToolItem], buffer: str) -> str | None:
        at, tag = find_first(buffer, (CALLS_BEGIN, CALL_BEGIN))
        if at < 0:
            hold = partial_tag_suffix(buffer, (CALLS_BEGIN, CALL_BEGIN))
            self._gate.emit(out, buffer[:len(buffer) - hold])
            self._pending = buffer[len(buffer) - hold:]
            return None
        self._gate.emit(out, buffer[:at])
        self._raw = tag
        if tag == CALLS_BEGIN:
            self._state = self._CALLS
        else:
            self._state, self._header = self._HEADER, ""
        return buffer[at + len(tag):]

    def _calls(self, out: list[ToolItem], buffer: str) -> str | None:
        stripped = buffer.lstrip()
        if not stripped or any(t.startswith(stripped) for t in (CALL_BEGIN, CALLS_END)):
            self._pending = buffer
            return None
        if stripped.startswith(CALL_BEGIN):
            self._raw += buffer[:len(buffer) - len(stripped)] + CALL_BEGIN
            self._state, self._header = self._HEADER, ""
            return stripped[len(CALL_BEGIN):]
        if stripped.startswith(CALLS_END):
            self._state, self._raw = self._CONTENT, ""
            return stripped[len(CALLS_END):]
        return self._give_back(out, buffer)

    def _header_step(self, out: list[ToolItem], buffer: str) -> str | None:
        self._header += buffer
        header = self._header
        sep = header.find(SEP)
        if sep >= 0:
            after = header[sep + len(SEP):]
            stripped = after.lstrip()
            if stripped.startswith("{"):          # V3.1: NAME<sep>{args}
                return self._commit(out, header[:sep].strip(), stripped, fence=False)
            newline = after.find("\n")
            if newline >= 0:                      # V3: TYPE<sep>NAME\n```json\n{args}
                return self._commit(out, after[:newline].strip(), after[newline + 1:],
                                    fence=True)
        if len(header) > MAX_HEADER or CALL_END in header:
            self._header = ""
            return self._give_back(out, header)
        return None

    def _commit(self, out: list[ToolItem], name: str, rest: str, *, fence: bool) -> str:
        if not name or (self.allowed_names is not None and name not in self.allowed_names):
            header, self._header = self._header, ""
            return self._give_back(out, header) or ""
        self._send_name(out, name)
        self._raw, self._header = "", ""
        self._scanner = JsonScanner()
        self._state = self._FENCE if fence else self._ARGS
        return rest

    def _fence(self, out: list[ToolItem], buffer: str) -> str | None:
        stripped = buffer.lstrip()
        if not stripped or FENCE_OPEN.startswith(stripped):
            self._pending = buffer
            return None
        if stripped.startswith(FENCE_OPEN):
            stripped = stripped[len(FENCE_OPEN):]
        self._state = self._ARGS
        return stripped

    def _args(self, out: list[ToolItem], buffer: str) -> str | None:
        scanner = self._scanner
        assert scanner is not None
        if not scanner.first:
            buffer = buffer.lstrip()
            if not buffer:
                return None
        try:
            used = scanner.feed(buffer)
            if scanner.first != "{":
                raise JsonSyntaxError("arguments must be a JSON object")
        except JsonSyntaxError:
            self._state = self._CONTENT       # the call keeps what was sent
            return buffer
        if used:
            out.append(ToolCallDelta(self.num_calls - 1, arguments=buffer[:used]))
        if scanner.done:
            self.completed_calls += 1
            self._state = self._CLOSE
        return buffer[used:] or None

    def _close(self, out: list[ToolItem], buffer: str) -> str | None:
        stripped = buffer.lstrip()
        if stripped.startswith(FENCE_CLOSE):
            stripped = stripped[len(FENCE_CLOSE):].lstrip()
        if not stripped or any(t.startswith(stripped) for t in (FENCE_CLOSE, CALL_END)):
            self._pending = buffer
            return None
        if stripped.startswith(CALL_END):
            self._state = self._CALLS
            return stripped[len(CALL_END):]
        self._state = self._CONTENT
        return stripped

    def _give_back(self, out: list[ToolItem], rest: str) -> str | None:
        """Malformed before a name was sent: the call section is content after all."""
        self._gate.emit(out, self._raw + rest)
        self._raw, self._state = "", self._CONTENT
        return None

    def _flush(self, out: list[ToolItem], pending: str, truncated: bool) -> None:
        if self._state == self._CONTENT:
            self._gate.emit(out, pending)
        elif truncated and self._state == self._CALLS:
            self._raw = ""                # cut off between calls: the tags are not content
        elif truncated and self._state == self._HEADER and self._partial_call(out):
            pass
        elif self._state in (self._CALLS, self._HEADER) and (self._raw or self._header):
            self._gate.emit(out, self._raw + self._header + pending)

    def _partial_call(self, out: list[ToolItem]) -> bool:
        """Cut off inside a call's header: a call named by what the header holds (V3.1
        `NAME<sep>`, V3 `TYPE<sep>NAME`), if that can still be an offered tool's name."""
        header = self._header
        sep = header.find(SEP)
        name = header.strip() if sep < 0 else \
            (header[sep + len(SEP):].strip() or header[:sep].strip())
        if self.allowed_names is not None and \
                not any(allowed.startswith(name) for allowed in self.allowed_names):
            return False
        self._send_name(out, name)
        self._raw = self._header = ""
        return True
