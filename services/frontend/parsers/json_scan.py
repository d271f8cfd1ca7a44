"""An incremental JSON syntax checker for streamed tool-call arguments.

`JsonScanner.feed(text)` consumes characters of one JSON value as they arrive and raises
`JsonSyntaxError` at the first character that cannot continue valid JSON, so text streamed to a
client is always a valid JSON prefix. It stops at the character that completes the value
(`done`) and reports, for the members of a top-level object, where each key's value starts and
ends (`members`), which is all the tool-call parsers need to pull out `name` and `arguments`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_WS = " \t\n\r"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_HEX = frozenset("0123456789abcdefABCDEF")
_LITERALS = {"t": "true", "f": "false", "n": "null"}

# states
_VALUE, _OBJ_FIRST, _OBJ_KEY, _COLON, _AFTER, _ARR_FIRST = range(6)
_STRING, _ESCAPE, _UNICODE, _NUMBER_STATE, _LITERAL, _DONE = range(6, 12)


class JsonSyntaxError(ValueError):
    pass


@dataclass(slots=True)
class Member:
    """One member of the top-level object: key, and its value's [start, end) positions."""

    key: str
    start: int = -1
    end: int = -1   # -1 while the value is still open


class JsonScanner:
    def __init__(self) -> None:
        self.pos = 0                       # characters consumed so far
        self.done = False
        self.members: list[Member] = []    # members of a top-level object, in order
        self.first = ""                    # first character of the top-level value
        self._stack: list[str] = []
        self._state = _VALUE
        self._is_key = False
        self._key: list[str] = []
        self._number: list[str] = []
        self._literal = ""
        self._unicode_left = 0

    def feed(self, text: str) -> int:
        """Consume characters until the value completes; return how many were consumed."""
        for index, char in enumerate(text):
            if self.done:
                return index
            self._step(char)
            self.pos += 1
        return len(text)

    # -- internals ----------------------------------------------------------------------------

    def _fail(self, char: str) -> None:
        raise JsonSyntaxError(f"unexpected {char!r} at position {self.pos}")

    def _at_member_level(self) -> bool:
        return len(self._stack) == 1 and self._stack[0] == "{"

    def _value_start(self, char: str) -> None:
        if not self._stack and not self.first:
            self.first = char
        if self._at_member_level() and self.members:
            self.members[-1].start = self.pos

    def _value_end(self, end: int) -> None:
        if not self._stack:
            self.done = True
            self._state = _DONE
            return
        if self._at_member_level() and self.members:
            self.members[-1].end = end
        self._state = _AFTER

    def _begin_value(self, char: str) -> None:
        if char == "{":
            self._value_start(char)
            self._stack.append("{")
            self._state = _OBJ_FIRST
        elif char == "[":
            self._value_start(char)
            self._stack.append("[")
            self._state = _ARR_FIRST
        elif char == '"':
            self._value_start(char)
            self._is_key = False
            self._state = _STRING
        elif char == "-" or char.isdigit():
            self._value_start(char)
            self._number = [char]
            self._state = _NUMBER_STATE
        elif char in _LITERALS:
            self._value_start(char)
            self._literal = _LITERALS[char][1:]
            self._state = _LITERAL
        else:
            self._fail(char)

    def _step(self, char: str) -> None:
        state = self._state
        if state == _STRING:
            if char == "\\":
                self._state = _ESCAPE
            elif char == '"':
                if self._is_key:
                    self._end_key()
                else:
                    self._value_end(self.pos + 1)
            elif ord(char) < 0x20:
                self._fail(char)
            elif self._is_key:
                self._key.append(char)
            return
        if state == _ESCAPE:
            if char == "u":
                self._unicode_left = 4
                self._state = _UNICODE
            elif char in '"\\/bfnrt':
                self._state = _STRING
            else:
                self._fail(char)
            if self._is_key:
                self._key.append("\\" + char)
            return
        if state == _UNICODE:
            if char not in _HEX:
                self._fail(char)
            if self._is_key:
                self._key.append(char)
            self._unicode_left -= 1
            if self._unicode_left == 0:
                self._state = _STRING
            return
        if state == _NUMBER_STATE:
            if char in _NUMBER_CHARS:
                self._number.append(char)
                return
            if not _NUMBER.fullmatch("".join(self._number)):
                self._fail(char)
            self._value_end(self.pos)
            self._step(char)  # the delimiter belongs to the enclosing container
            return
        if state == _LITERAL:
            if not self._literal or char != self._literal[0]:
                self._fail(char)
            self._literal = self._literal[1:]
            if not self._literal:
                self._value_end(self.pos + 1)
            return
        if char in _WS:
            return
        if state == _VALUE:
            self._begin_value(char)
        elif state in (_OBJ_FIRST, _OBJ_KEY):
            if char == '"':
                self._is_key = True
                self._key = []
                self._state = _STRING
            elif char == "}" and state == _OBJ_FIRST:
                self._close("{")
            else:
                self._fail(char)
        elif state == _COLON:
            if char != ":":
                self._fail(char)
            self._state = _VALUE
        elif state == _ARR_FIRST:
            if char == "]":
                self._close("[")
            else:
                self._begin_value(char)
        elif state == _AFTER:
            top = self._stack[-1]
            if char == ",":
                self._state = _OBJ_KEY if top == "{" else _VALUE
            elif (char == "}" and top == "{") or (char == "]" and top == "["):
                self._close(top)
            else:
                self._fail(char)
        else:  # _DONE
            self._fail(char)

    def _end_key(self) -> None:
        if self._at_member_level():
            self.members.append(Member(json.loads('"' + "".join(self._key) + '"')))
        self._state = _COLON

    def _close(self, opener: str) -> None:
        self._stack.pop()
        self._value_end(self.pos + 1)
