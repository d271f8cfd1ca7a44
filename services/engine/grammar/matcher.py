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
