"""Message token endpoints: character marks -> token indices, without re-tokenizing.

A mark at character position p becomes the token index k only when no token crosses p: every
token before k ends at or before p and every token from k on starts at or after p (the
reference design's rule). Byte-level tokenizers give the several tokens of one multi-byte
character the same character span, and BPE merges can swallow a boundary; both make a mark
unusable, and it is dropped. The prompt's bytes and token ids are never changed.

Cost: one pass over the token offsets plus a binary search per mark.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def token_ends(offsets: Sequence[tuple[int, int]], char_ends: Sequence[int]) -> tuple[int, ...]:
    """Token indices (sorted, unique, 0 < k < len(offsets)) where a mark falls between tokens."""
    num_tokens = len(offsets)
    if num_tokens < 2 or not char_ends:
        return ()
    starts = [start for start, _ in offsets]
    # prefix_end[k]: the furthest end among tokens [0, k); suffix_start[k]: the earliest start
    # among tokens [k, n).
    prefix_end = [0] * (num_tokens + 1)
    furthest = 0
    for index, (_, end) in enumerate(offsets):
        furthest = max(furthest, end)
        prefix_end[index + 1] = furthest
    suffix_start = [0] * (num_tokens + 1)
    earliest = offsets[-1][1]
    suffix_start[num_tokens] = earliest
    for index in range(num_tokens - 1, -1, -1):
        earliest = min(earliest, offsets[index][0])
        suffix_start[index] = earliest
    result: list[int] = []
    for position in char_ends:
        k = bisect.bisect_left(starts, position)
        is_clean = 0 < k < num_tokens and prefix_end[k] <= position <= suffix_start[k]
        if is_clean and (not result or result[-1] != k):
            result.append(k)
    return tuple(result)
