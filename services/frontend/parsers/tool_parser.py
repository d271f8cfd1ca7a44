"""What the Hermes, Llama 3 JSON and DeepSeek tool-call formats share.

Every format is a small state machine over streamed content text. `ToolCallParser` owns what
is the same for all of them:

- the counters (`num_calls`: calls whose name was sent; `completed_calls`: calls whose
  arguments object closed), the allowed tool names, the content gate (whitespace around calls);
- `push`: prepend what was held back, then run the format's `_step` until the text is used up
  or a step must wait for more (it holds the undecided tail in `_pending`);
- `flush`: the format's `_flush` for its state, then the content gate's; with `truncated`
  (the output was cut off at the length limit) a call in progress is a partial call, never
  text: its tags do not leak into content;
- `_send_name`: a call starts with a delta carrying id, type and name.

`CallObjectParser` adds the life of a call written as one JSON object,
`{"name": ..., "arguments": {...}}` (Hermes, Llama 3), streamed by a `CallObjectStream`: a call
that breaks before its name was sent is text after all (the format's `_call_was_text` says how
it gives the text back), one that breaks later keeps what was sent, one that completes moves
the format to its `_AFTER_CALL` state. DeepSeek names the call in its own header and streams a
bare arguments object, so it uses `ToolCallParser` alone.
"""

from __future__ import annotations

import abc
from typing import ClassVar

from services.frontend.parsers.content import ContentGate
from services.frontend.parsers.tool_calls import (
    CallObjectStream,
    MalformedCall,
    ToolCallDelta,
    ToolItem,
    new_call_id,
)


class ToolCallParser(abc.ABC):
    _CONTENT: ClassVar[int]        # the format's state for plain content (the first state)

    def __init__(self, allowed_names: frozenset[str] | None = None) -> None:
        self.allowed_names = allowed_names
        self.num_calls = 0          # calls whose name was sent
        self.completed_calls = 0    # calls whose arguments object closed
        self._state = self._CONTENT
        self._pending = ""          # text held back until more arrives
        self._gate = ContentGate()

    # -- the stream ---------------------------------------------------------------------------

    def push(self, text: str) -> list[ToolItem]:
        out: list[ToolItem] = []
        buffer, self._pending = self._pending + text, ""
        while buffer:
            rest = self._step(out, buffer)
            if rest is None:
                break
            buffer = rest
        return out

    def flush(self, *, truncated: bool = False) -> list[ToolItem]:
        out: list[ToolItem] = []
        pending, self._pending = self._pending, ""
        self._flush(out, pending, truncated)
        self._gate.flush(out)
        return out

    @abc.abstractmethod
    def _step(self, out: list[ToolItem], buffer: str) -> str | None:
        """Consume from `buffer` in the current state; return the rest, or None to wait for
        more text (after holding what must wait in `_pending`)."""

    @abc.abstractmethod
    def _flush(self, out: list[ToolItem], pending: str, truncated: bool) -> None:
        """The end of the output in the current state (`pending`: text held back;
        `truncated`: cut off at the length limit)."""

    def _send_name(self, out: list[ToolItem], name: str) -> None:
        """A call starts: its first delta carries id, type and name."""
        self._gate.call_started()
        out.append(ToolCallDelta(self.num_calls, new_call_id(), "function", name))
        self.num_calls += 1


class CallObjectParser(ToolCallParser):
    _AFTER_CALL: ClassVar[int]     # where a completed call object leaves the format

    def __init__(self, allowed_names: frozenset[str] | None = None) -> None:
        super().__init__(allowed_names)
        self._call: CallObjectStream | None = None

    def _open_call(self, *, argument_keys: tuple[str, ...] = ("arguments",)) -> None:
        self._call = CallObjectStream(self.num_calls, argument_keys=argument_keys,
                                      allowed_names=self.allowed_names)

    def _feed_call(self, out: list[ToolItem], buffer: str) -> str:
        """Feed the open call object; return the text after what it consumed."""
        call = self._call
        assert call is not None
        raw_before = len(call.raw)
        try:
            items, used = call.feed(buffer)
        except MalformedCall:  # broke before its name was sent: the call is text after all
            self._call, self._state = None, self._CONTENT
            return self._call_was_text(out, call.raw, buffer[len(call.raw) - raw_before:])
        if any(isinstance(item, ToolCallDelta) and item.name for item in items):
            self._gate.call_started()
        out.extend(items)
        if call.broken:  # broke after its name was sent: it keeps what was sent
            self.num_calls += 1
            self._call, self._state = None, self._CONTENT
        elif call.done:
            self.num_calls += 1
            self.completed_calls += 1
            self._call, self._state = None, self._AFTER_CALL
        return buffer[used:]

    def _flush_call(self, out: list[ToolItem], pending: str, truncated: bool) -> None:
        """The output ended inside a call object (cut off: what it has is a partial call)."""
        call, self._call = self._call, None
        if call is None:
            return
        partial = call.cut_off() if truncated and not call.committed else None
        if partial is not None:
            self._gate.call_started()
            out.extend(partial)
            self.num_calls += 1
        elif call.committed:
            self.num_calls += 1
        else:
            self._gate.emit(out, self._call_was_text(out, call.raw, pending))

    @abc.abstractmethod
    def _call_was_text(self, out: list[ToolItem], raw: str, rest: str) -> str:
        """A call object that broke before its name was sent: give its text back; return the
        text to continue with (the format's content state reads it)."""
