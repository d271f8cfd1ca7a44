"""Message token endpoints: character marks -> token indices, without re-tokenizing.

A mark at character position p becomes the token index k only when no token crosses p: the
token before k ends at or before p and token k starts at or after p (the reference design's
rule). Byte-level tokenizers give the several tokens of one multi-byte character the same
character span, and BPE merges can swallow a boundary; both make a mark unusable, and it is
dropped. The prompt's bytes and token ids are never changed.

Token offsets are monotone (starts and ends never decrease along the prompt), so checking the
two tokens around the cut is enough: the cost is two lookups per mark, independent of the prompt
length (the Rust encoding answers `char_to_token` / `token_to_chars` directly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class SpanIndex(Protocol):
    """What `tokenizers.Encoding` offers: the token holding a character, a token's span."""

    def char_to_token(self, char_pos: int) -> int | None: ...
    def token_to_chars(self, token_index: int) -> tuple[int, int] | None: ...


class OffsetSpans:
    """A SpanIndex over a plain list of (start, end) character spans."""

    def __init__(self, offsets: Sequence[tuple[int, int]]) -> None:
        self.offsets = list(offsets)

    def char_to_token(self, char_pos: int) -> int | None:
        for index, (start, end) in enumerate(self.offsets):
            if start <= char_pos < end:
                return index
        return None

    def token_to_chars(self, token_index: int) -> tuple[int, int] | None:
        return self.offsets[token_index]


def token_ends(spans: SpanIndex, num_tokens: int, char_ends: Sequence[int]) -> tuple[int, ...]:
    """Token indices (sorted, unique, 0 < k < num_tokens) where a mark falls between tokens."""
    result: list[int] = []
    for position in char_ends:
        k = spans.char_to_token(position)
        if k is None or not 0 < k < num_tokens or (result and result[-1] >= k):
            continue
        this, before = spans.token_to_chars(k), spans.token_to_chars(k - 1)
        if this is not None and before is not None and this[0] >= position >= before[1]:
            result.append(k)
    return tuple(result)
