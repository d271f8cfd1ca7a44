"""Reasoning parsing: `<think>...</think>` blocks in streamed output become reasoning text.

- The block may be opened by the model (at the start of its output, after optional
  whitespace) or already by the prompt (templates that end the generation prompt with
  `<think>\\n`, DeepSeek-R1 style, Qwen3 thinking models): `starts_in_reasoning(prompt)` tells.
- A template that closes the block in the prompt (Qwen3 with `enable_thinking=false` renders
  `<think>\\n\\n</think>\\n\\n`) leaves the output as plain content.
- Newlines right after `<think>`, right before `</think>` and right after `</think>` are
  formatting, not text: they are dropped (held back until the next character decides).
- Tags split across chunks are held back; an unclosed block at the end stays reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.frontend.parsers.tags import partial_tag_suffix

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True, slots=True)
class Segment:
    kind: str    # "reasoning" | "content"
    text: str


def starts_in_reasoning(prompt: str, start: str = THINK_START, end: str = THINK_END) -> bool:
    """True when the prompt leaves a reasoning block open for the model to continue."""
    opened = prompt.rfind(start)
    return opened >= 0 and prompt.rfind(end) < opened


class ReasoningParser:
    _LEADING, _REASONING, _AFTER_END, _CONTENT = range(4)

    def __init__(self, *, in_reasoning: bool = False, start: str = THINK_START,
                 end: str = THINK_END) -> None:
        self.start_tag, self.end_tag = start, end
        # _LEADING: output start, a <think> may still open the block.
        self._state = self._REASONING if in_reasoning else self._LEADING
        self._pending = ""        # text not yet decided (partial tag, newlines, leading ws)
        self._reasoning_started = in_reasoning
        self.saw_reasoning = in_reasoning

    @property
    def in_reasoning(self) -> bool:
        return self._state == self._REASONING

    def push(self, text: str) -> list[Segment]:
        out: list[Segment] = []
        buffer = self._pending + text
        self._pending = ""
        while buffer:
            state = self._state
            if state == self._LEADING:
                stripped = buffer.lstrip()
                if not stripped:
                    self._pending = buffer
                    return out
                if stripped.startswith(self.start_tag):
                    self._state = self._REASONING
                    self._reasoning_started = True
                    self.saw_reasoning = True
                    buffer = stripped[len(self.start_tag):].lstrip("\n")
                    if not buffer:
                        return out
                    continue
                if self.start_tag.startswith(stripped):
                    self._pending = buffer
                    return out
                self._state = self._CONTENT
                continue
            if state == self._CONTENT:
                _emit(out, "content", buffer)
                return out
            if state == self._AFTER_END:
                buffer = buffer.lstrip("\n")
                if not buffer:
                    return out
                self._state = self._CONTENT
                continue
            # _REASONING
            if self._reasoning_started:
                buffer = buffer.lstrip("\n")
                if not buffer:
                    return out
                self._reasoning_started = False
            at = buffer.find(self.end_tag)
            if at >= 0:
                _emit(out, "reasoning", buffer[:at].rstrip("\n"))
                self._state = self._AFTER_END
                buffer = buffer[at + len(self.end_tag):]
                continue
            hold = partial_tag_suffix(buffer, (self.end_tag,))
            body = buffer[:len(buffer) - hold]
            trailing = len(body) - len(body.rstrip("\n"))
            hold += trailing
            _emit(out, "reasoning", buffer[:len(buffer) - hold])
            self._pending = buffer[len(buffer) - hold:]
            return out
        return out

    def flush(self) -> list[Segment]:
        pending, self._pending = self._pending, ""
        if not pending:
            return []
        if self._state == self._REASONING:
            return [Segment("reasoning", pending.rstrip("\n"))] if pending.rstrip("\n") else []
        if self._state == self._AFTER_END:
            pending = pending.lstrip("\n")
        return [Segment("content", pending)] if pending else []


def _emit(out: list[Segment], kind: str, text: str) -> None:
    if not text:
        return
    if out and out[-1].kind == kind:
        out[-1] = Segment(kind, out[-1].text + text)
    else:
        out.append(Segment(kind, text))
