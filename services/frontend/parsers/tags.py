"""Finding marker strings (tags) in streamed text without emitting half of one."""

from __future__ import annotations

from collections.abc import Iterable


def partial_tag_suffix(text: str, tags: Iterable[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    longest = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:size]):
                longest = size
                break
    return longest


def find_first(text: str, tags: Iterable[str]) -> tuple[int, str]:
    """The earliest occurrence of any tag: (index, tag), or (-1, "")."""
    best, found = -1, ""
    for tag in tags:
        at = text.find(tag)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, tag
    return best, found
