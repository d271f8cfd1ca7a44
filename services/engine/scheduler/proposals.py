"""Proposals for verification steps: tokens a decode may check in one step (plan.py's step
semantics: a sequence feeding its pending token plus k drafts may emit up to k + 1).

    drafts = proposer.propose(tokens, limit)     # tuple of at most `limit` token ids

`NgramProposer` is prompt lookup (copy proposals): the longest recent n-gram of the sequence
that occurred earlier in it proposes the tokens that followed that occurrence (continuing
the repeat past the sequence's end when the occurrence is recent). A proposer
sees only the sequence's known tokens; the policy bounds `limit` by the output and context
left and cuts the drafts to the width the request's acceptance statistics choose
(speculation.py). `source` names the proposal source those statistics are kept under.
Off unless `SchedulerConfig.proposer` is set (`--speculative-method ngram`).

A `SequenceProposer` keeps state per live choice (a draft model's KV: runner/drafter.py; an
EAGLE-3 head's: runner/eagle3_drafter.py): the policy names the choice (its slot handle and
its target pages) and counts the model forwards it ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from services.engine.scheduler.plan import SlotHandle


class Proposer(Protocol):
    @property
    def num_tokens(self) -> int: ...       # drafts per step at most

    @property
    def source(self) -> str: ...           # proposal source (speculation.COPY, .DRAFT)

    def propose(self, tokens: Sequence[int], limit: int) -> tuple[int, ...]: ...


@runtime_checkable
class SequenceProposer(Protocol):
    @property
    def num_tokens(self) -> int: ...

    @property
    def source(self) -> str: ...

    # drafts, forwards run; target_pages: the choice's pages in the target's KV pool (an
    # EAGLE-3 head reads the target's hidden states stored by page: runner/eagle3_drafter.py)
    def propose_for(self, handle: SlotHandle, tokens: Sequence[int], limit: int,
                    target_pages: Sequence[int] = ()) -> tuple[tuple[int, ...], int]: ...


@dataclass(frozen=True, slots=True)
class NgramProposer:
    num_tokens: int = 4        # drafts per step at most
    max_ngram: int = 3         # longest suffix looked up
    min_ngram: int = 1
    window: int = 4096         # how far back the lookup reaches
    source: str = "copy"       # copy proposals (speculation.COPY)

    def propose(self, tokens: Sequence[int], limit: int) -> tuple[int, ...]:
        limit = min(limit, self.num_tokens)
        if limit <= 0:
            return ()
        recent = list(tokens[-self.window:])
        for n in range(min(self.max_ngram, len(recent) - 1), self.min_ngram - 1, -1):
            suffix = recent[-n:]
            # the latest earlier occurrence (its continuation is likelier to repeat)
            for start in range(len(recent) - n - 1, -1, -1):
                if recent[start:start + n] == suffix:
                    return _copy(recent, start + n, limit)
        return ()


def _copy(recent: list[int], begin: int, limit: int) -> tuple[int, ...]:
    """`limit` tokens copied from `begin` on; past the end the copy continues from what it
    copied (a repeat of period len(recent) - begin: "a b a b" proposes "a b a b ...")."""
    extended = list(recent)
    for i in range(limit):
        extended.append(extended[begin + i])
    return tuple(extended[len(recent):])
