"""InflightBlocks: complete prompt blocks that resident sequences are prefilling and have
promised to publish, so that a waiting prompt sharing them waits instead of computing them
again (requests in flight share prefill).

A resident sequence promises the blocks between its prefix hit and its last checkpoint target
(`promise`); publishing a checkpoint fulfils the blocks it covers (they are cached now:
`fulfil`), and release withdraws the rest (finish, cancel, preemption: `withdraw`). Residency
defers a waiting sequence while the run of promised blocks right after its own hit is at
least half of its uncached prompt (`worth_waiting`): the leader computes them once, the
follower then hits them; a small overlap is not worth the wait. Keys are `PrefixHistory`
block keys, so images and the model identity are part of the match.
"""

from __future__ import annotations

from collections.abc import Hashable

from services.engine.prefix.history import BLOCK_TOKENS, PrefixHistory


class InflightBlocks:
    def __init__(self) -> None:
        self._holders: dict[bytes, int] = {}                       # block key -> promisers
        self._promised: dict[Hashable, tuple[int, list[bytes]]] = {}   # seq -> (first, keys)

    def __len__(self) -> int:
        return len(self._holders)

    def promise(self, seq: Hashable, history: PrefixHistory, start: int, end: int) -> None:
        """`seq` will publish the complete blocks of `history` over [start, end) tokens."""
        self.withdraw(seq)
        first, last = start // BLOCK_TOKENS, min(end, len(history)) // BLOCK_TOKENS
        keys = [history.block_key(b) for b in range(first, last)]
        if not keys:
            return
        self._promised[seq] = (first, keys)
        for key in keys:
            self._holders[key] = self._holders.get(key, 0) + 1

    def fulfil(self, seq: Hashable, endpoint: int) -> None:
        """`seq` published a checkpoint at `endpoint`: the blocks before it are cached."""
        promised = self._promised.get(seq)
        if promised is None:
            return
        first, keys = promised
        done = max(0, min(len(keys), endpoint // BLOCK_TOKENS - first))
        self._release(keys[:done])
        if done == len(keys):
            del self._promised[seq]
        else:
            self._promised[seq] = (first + done, keys[done:])

    def withdraw(self, seq: Hashable) -> None:
        promised = self._promised.pop(seq, None)
        if promised is not None:
            self._release(promised[1])

    def worth_waiting(self, history: PrefixHistory, reused: int, prompt_len: int) -> bool:
        """Whether the promised run after `reused` covers half the uncached prompt (only
        blocks strictly before the prompt end count: the last token is always computed)."""
        if not self._holders:
            return False
        first, last = reused // BLOCK_TOKENS, (prompt_len - 1) // BLOCK_TOKENS
        run = 0
        while first + run < last and history.block_key(first + run) in self._holders:
            run += 1
        shared = (first + run) * BLOCK_TOKENS - reused
        return run > 0 and 2 * shared >= prompt_len - reused

    def _release(self, keys: list[bytes]) -> None:
        for key in keys:
            count = self._holders[key] - 1
            if count:
                self._holders[key] = count
            else:
                del self._holders[key]
