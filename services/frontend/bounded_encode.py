"""Bounded tokenization: refuse a prompt far beyond the context without tokenizing all of it.

Two guards, both derived once from `tokenizer.json` when the tokenizer loads (`TokenBounds`):

1. A character bound. No token covers more than `max_token_chars` characters of normalized
   text (the longest vocabulary or added token; byte-level tokens count one character per
   byte, so this over-counts, which keeps the bound safe), and a Unicode normalizer shrinks
   text by at most `NORMALIZER_SHRINK` characters to one (NFC composes at most a base and three
   marks). A text of `c` characters therefore has at least `ceil(c / (T * S))` tokens: when that
   exceeds the limit, it is refused before any tokenization. Tokenizers whose normalizer,
   pre-tokenizer or model can delete text (whitespace splitting, stripping, fused unknowns)
   get no character bound.
2. Chunked tokenization. The text is encoded in chunks cut before a single space that sits
   between two non-space characters, where no token can cross: the cut is checked against
   every vocabulary token that holds a non-space character followed by a space (`spanning`,
   a handful per vocabulary, all listed at load). Encoding stops as soon as the running count
   exceeds the limit. Chunks are concatenated (ids, and offsets moved to the whole text), so a
   prompt that fits costs one tokenization, as before. Where the tokenizer's shape does not
   allow exact cuts (added tokens that strip or hold spaces, unknown pre-tokenizers, text
   prepended to every input), the text is encoded whole after the character bound.

tests/frontend/test_bounded_encode.py checks chunked == whole on every pinned tokenizer.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from typing import Any

NORMALIZER_SHRINK = 4
# Normalizers that never delete text (lengths may change by at most NORMALIZER_SHRINK).
_UNICODE_NORMALIZERS = {"NFC", "NFKC", "NFD", "NFKD"}
_SAFE_NORMALIZERS = _UNICODE_NORMALIZERS | {"Lowercase", "Prepend", "Replace", "Precompiled"}
_SAFE_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Punctuation", "Metaspace",
                        "UnicodeScripts"}
# Pre-tokenizers whose cuts before a space (after a non-space) are boundaries or are absent.
_CHUNKABLE_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Punctuation"}
_SPACE_MARKS = ("\u0120", "\u2581", " ")
MIN_CHUNK_CHARS = 1 << 16
MAX_CHUNK_CHARS = 1 << 22


class PromptTooLong(Exception):
    """The text has more than `limit` tokens: at least `at_least` of them."""

    def __init__(self, at_least: int, limit: int) -> None:
        super().__init__(f"at least {at_least} tokens (limit {limit})")
        self.at_least = at_least
        self.limit = limit


def _components(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    if not node:
        return []
    if node.get("type") == "Sequence":
        return [c for child in node.get(key, []) for c in _components(child, key)]
    return [node]


@dataclass(frozen=True, slots=True)
class TokenBounds:
    max_token_chars: int                   # longest token, in characters of normalized text
    shrink: int | None                     # normalizer shrink factor; None: no char bound
    chunkable: bool                        # exact cuts before spaces are possible
    spanning: tuple[tuple[str, int], ...]  # (token text, index of each space it crosses)
    ascii_before_cut: bool = False         # cuts only after ASCII characters

    @property
    def chars_per_token(self) -> int | None:
        return None if self.shrink is None else self.max_token_chars * self.shrink

    def lower_bound(self, num_chars: int) -> int:
        """Fewest tokens a text of `num_chars` characters can have (0: no bound known)."""
        per = self.chars_per_token
        return math.ceil(num_chars / per) if per else 0

    @classmethod
    def from_tokenizer(cls, tokenizer_json: str, token_text: Any) -> TokenBounds:
        """From the tokenizer.json text; `token_text(id) -> str` decodes one token."""
        data = json.loads(tokenizer_json)
        model = data.get("model") or {}
        vocab = model.get("vocab") or {}
        added = data.get("added_tokens") or []
        words = vocab.keys() if isinstance(vocab, dict) else (w for w, _ in vocab)
        longest = max((len(w) for w in words), default=1)
        longest = max([longest, *(len(a.get("content", "")) for a in added)])
        normalizers = {n.get("type") for n in _components(data.get("normalizer"), "normalizers")}
        pre = _components(data.get("pre_tokenizer"), "pretokenizers")
        pre_types = {p.get("type") for p in pre}
        deletes = (
            not normalizers <= _SAFE_NORMALIZERS
            or not pre_types <= _SAFE_PRE_TOKENIZERS
            or any(p.get("behavior") == "Removed" for p in pre)
            or any(_shortens(n) for n in _components(data.get("normalizer"), "normalizers"))
            or model.get("type") != "BPE"
            or (model.get("fuse_unk") and not model.get("byte_fallback")))
        shrink = None if deletes else (NORMALIZER_SHRINK if normalizers & _UNICODE_NORMALIZERS
                                       else 1)
        chunkable = (
            not deletes
            and pre_types <= _CHUNKABLE_PRE_TOKENIZERS
            and "Prepend" not in normalizers
            and not any(p.get("add_prefix_space") for p in pre)
            and not any(p.get("type") == "Split" and p.get("behavior") != "Isolated"
                        and p.get("pattern", {}).get("String") != " " for p in pre)
            and not any(a.get("rstrip") for a in added))
        spanning: list[tuple[str, int]] = []
        ascii_only = False
        if chunkable:
            # Only tokens whose vocabulary form holds a space's mark past their start can
            # cross a cut: the byte-level space (U+0120), the metaspace, or a space.
            items = vocab.items() if isinstance(vocab, dict) else (
                (w, i) for i, (w, _) in enumerate(vocab))
            texts = [token_text(token_id) for word, token_id in items
                     if any(mark in word[1:] for mark in _SPACE_MARKS)]
            texts += [a.get("content", "") for a in added]
            for text in texts:
                for i in range(1, len(text)):
                    if text[i] == " " and not text[i - 1].isspace():
                        # A token ending in part of a character, then a space: a cut after
                        # any non-ASCII character might be crossed.
                        ascii_only = ascii_only or text[i - 1] == "\ufffd"
                        spanning.append((text, i))
            chunkable = len(spanning) <= 256
        return cls(longest, shrink, chunkable, tuple(spanning) if chunkable else (),
                   ascii_only)

    # -- cuts -----------------------------------------------------------------------------------

    def is_cut(self, text: str, i: int) -> bool:
        """A cut before position i: a single space between non-spaces no token crosses."""
        if not (0 < i < len(text) - 1 and text[i] == " " and not text[i - 1].isspace()
                and not text[i + 1].isspace()):
            return False
        if self.ascii_before_cut and not text[i - 1].isascii():
            return False
        for token, at in self.spanning:
            start = i - at
            if start >= 0 and text.startswith(token, start):
                return False
        return True

    def find_cut(self, text: str, target: int, floor: int) -> int | None:
        """The last cut at or before `target` and after `floor`."""
        lowest = floor + 1
        i = text.rfind(" ", lowest, target + 1)
        while i != -1:
            if self.is_cut(text, i):
                return i
            i = text.rfind(" ", lowest, i)
        return None


def _shortens(normalizer: dict[str, Any]) -> bool:
    """A Replace normalizer whose replacement is shorter than its (string) pattern."""
    if normalizer.get("type") != "Replace":
        return False
    pattern = normalizer.get("pattern", {})
    if "String" not in pattern:
        return True
    return len(normalizer.get("content", "")) < len(pattern["String"])


class ChunkedSpans:
    """`char_to_token` / `token_to_chars` over the encodings of consecutive chunks."""

    def __init__(self) -> None:
        self.char_starts: list[int] = []
        self.token_starts: list[int] = []
        self.encodings: list[Any] = []

    def add(self, char_start: int, token_start: int, encoding: Any) -> None:
        self.char_starts.append(char_start)
        self.token_starts.append(token_start)
        self.encodings.append(encoding)

    def char_to_token(self, char_pos: int) -> int | None:
        k = bisect.bisect_right(self.char_starts, char_pos) - 1
        if k < 0:
            return None
        local = self.encodings[k].char_to_token(char_pos - self.char_starts[k])
        return None if local is None else local + self.token_starts[k]

    def token_to_chars(self, token_index: int) -> tuple[int, int] | None:
        k = bisect.bisect_right(self.token_starts, token_index) - 1
        if k < 0:
            return None
        span = self.encodings[k].token_to_chars(token_index - self.token_starts[k])
        if span is None:
            return None
        return span[0] + self.char_starts[k], span[1] + self.char_starts[k]

    @property
    def offsets(self) -> list[tuple[int, int]]:
        return [(s + c, e + c) for c, enc in zip(self.char_starts, self.encodings, strict=True)
                for s, e in enc.offsets]


def chunk_chars(limit: int | None) -> int:
    """Chunk size for a token limit: a few chunks reach the limit, none is huge."""
    if limit is None:
        return MAX_CHUNK_CHARS
    return min(MAX_CHUNK_CHARS, max(MIN_CHUNK_CHARS, limit * 16))
