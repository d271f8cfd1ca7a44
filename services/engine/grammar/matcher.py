"""GrammarMatcher: one choice's position in its grammar, and the batched bitmask fill.

The scheduler owns one matcher per constrained choice. Before a step samples it, the matcher's
allowed tokens become a bitmask row (`fill_bitmasks`: all rows of a step in one call, computed
in parallel by llguidance's threads without the GIL); after the step, the committed token
advances it (`accept`). A matcher never raises for grammar reasons: a token it cannot accept,
or a limit it hits, puts it in an error state that `error` describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class GrammarMatcher:
    __slots__ = ("_matcher",)

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher          # llguidance.LLMatcher

    def accept(self, token_id: int) -> bool:
        """Advance by one committed token; False: the grammar cannot continue."""
        return bool(self._matcher.consume_token(token_id))

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` the grammar accepts in order from here (state unchanged):
        speculative drafts are cut to this prefix."""
        return int(self._matcher.validate_tokens(list(tokens))) if tokens else 0

    def draft_bitmasks(self, drafts: Sequence[int], words: int, executor: Any) -> np.ndarray:
        """The allowed-token bitmask of each row of a verification step, int32
        [len(drafts) + 1, words]: row o is the mask after drafts[:o] (the grammar must
        accept every draft: `valid_prefix`); the matcher ends where it started."""
        masks = np.zeros((len(drafts) + 1, words), dtype=np.int32)
        consumed = 0
        try:
            for row in range(len(drafts) + 1):
                executor.unsafe_compute_mask_ptr([(self._matcher, 0)],
                                                 masks[row].ctypes.data, words * 4, 1)
                if row < len(drafts):
                    if not self._matcher.consume_token(drafts[row]):
                        raise ValueError(f"draft {row} ({drafts[row]}) is not in the grammar")
                    consumed += 1
        finally:
            if consumed:
                self._matcher.rollback(consumed)
        return masks

    @property
    def is_stopped(self) -> bool:
        """The grammar is complete: no token but EOS could follow."""
        return bool(self._matcher.is_stopped())

    @property
    def is_accepting(self) -> bool:
        return bool(self._matcher.is_accepting())

    @property
    def error(self) -> str:
        """Why the matcher cannot continue ("" while it can)."""
        return self._matcher.get_error() if self._matcher.is_error() else ""

    @property
    def raw(self) -> Any:
        return self._matcher


def fill_bitmasks(matchers: Sequence[GrammarMatcher], words: int, executor: Any
                  ) -> np.ndarray:
    """The allowed-token bitmask of each matcher: int32 [len(matchers), words]."""
    masks = np.zeros((len(matchers), words), dtype=np.int32)
    if matchers:
        executor.unsafe_compute_mask_ptr([(m.raw, i) for i, m in enumerate(matchers)],
                                         masks.ctypes.data, words * 4, len(matchers))
    return masks
