"""Incremental detokenization: token ids in, text out, never a broken UTF-8 character.

`IncrementalDetokenizer.push(token_id)` returns the text that is final after that token;
`flush()` returns what was held back (an incomplete character at the end becomes U+FFFD, as in
a full decode). The concatenation of every `push` and the `flush` equals
`tokenizer.decode(all_ids, skip_special_tokens=...)` exactly (property-tested in
tests/frontend/test_detokenizer.py).

- byte-level tokenizers: token bytes feed an incremental UTF-8 decoder with the same
  replacement rule as the Rust decoder (one U+FFFD per maximal invalid subpart);
- sentencepiece-style tokenizers: byte-fallback runs are held until they end (a run is valid
  UTF-8 as a whole or becomes one U+FFFD per byte), the optional leading strip is applied;
- any other decoder (Metaspace, WordPiece, BPE suffix ...): windowed re-decoding, vLLM-style
  (decode the tokens since the last emitted offset with the previous ones as context, hold
  back a trailing U+FFFD); tested equal to a full decode on those decoders.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Sequence

from services.frontend.token_bytes import TokenBytes

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, token_bytes: TokenBytes, special_ids: frozenset[int], *,
                 skip_special_tokens: bool = True,
                 decode: Callable[[Sequence[int], bool], str] | None = None) -> None:
        self._bytes = token_bytes
        self._skip = special_ids if skip_special_tokens else frozenset()
        self._kind = token_bytes.model.kind
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # sentencepiece state
        self._run = bytearray()
        self._run_poisoned = False        # the current byte run can no longer be valid UTF-8
        self._strip_left = token_bytes.model.strip_start
        self._strip_char = token_bytes.model.strip_content
        # generic state
        self._decode = decode
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_id: int) -> str:
        if token_id in self._skip:
            return ""
        if self._kind == "bytelevel":
            return self._utf8.decode(self._bytes.token_bytes(token_id))
        if self._kind == "sentencepiece":
            return self._strip(self._push_sentencepiece(token_id))
        return self._push_generic(token_id)

    def push_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.push(token_id) for token_id in token_ids)

    def flush(self) -> str:
        if self._kind == "bytelevel":
            return self._utf8.decode(b"", final=True)
        if self._kind == "sentencepiece":
            return self._strip(self._close_run())
        return self._flush_generic()

    # -- sentencepiece ------------------------------------------------------------------------

    def _push_sentencepiece(self, token_id: int) -> str:
        piece, is_byte = self._bytes.piece(token_id)
        if is_byte:
            if self._run_poisoned:
                return REPLACEMENT
            self._run += piece
            if not _valid_utf8_prefix(bytes(self._run)):
                self._run_poisoned = True
                text = REPLACEMENT * len(self._run)
                self._run.clear()
                return text
            return ""
        return self._close_run() + piece.decode("utf-8", errors="replace")

    def _close_run(self) -> str:
        self._run_poisoned = False
        if not self._run:
            return ""
        run = bytes(self._run)
        self._run.clear()
        try:
            return run.decode("utf-8")
        except UnicodeDecodeError:
            return REPLACEMENT * len(run)

    def _strip(self, text: str) -> str:
        while self._strip_left > 0 and text:
            if text[0] != self._strip_char:
                self._strip_left = 0
                break
            text = text[1:]
            self._strip_left -= 1
        return text

    # -- generic ------------------------------------------------------------------------------

    def _push_generic(self, token_id: int) -> str:
        assert self._decode is not None, "generic decoding needs the tokenizer's decode"
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset], self._skip_special)
        full = self._decode(self._ids[self._prefix_offset:], self._skip_special)
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT) and full.startswith(prefix):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return full[len(prefix):]
        return ""

    def _flush_generic(self) -> str:
        if self._decode is None or self._read_offset == len(self._ids):
            return ""
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset], self._skip_special)
        full = self._decode(self._ids[self._prefix_offset:], self._skip_special)
        self._read_offset = len(self._ids)
        return full[len(prefix):] if full.startswith(prefix) else ""


def _valid_utf8_prefix(data: bytes) -> bool:
    """True when `data` is valid UTF-8 or a valid UTF-8 text cut inside its last character."""
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError as exc:
        # An error only at the very end ("unexpected end of data") is an incomplete character.
        return exc.end == len(data) and exc.reason == "unexpected end of data"
