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
from typing import Protocol, cast, runtime_checkable

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


def choice_drafter(proposer: object) -> SequenceProposer | None:
    """`proposer` as a `SequenceProposer` when it drafts per live choice (`propose_for`),
    else None (a `Proposer`: drafts from the token list alone). An attribute probe: the
    runtime Protocol check walks every member, about 10 us on each round's planning."""
    if callable(getattr(proposer, "propose_for", None)):
        return cast(SequenceProposer, proposer)
    return None


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
        begin = _latest_match(recent, self.min_ngram, self.max_ngram)
        return _copy(recent, begin, limit) if begin is not None else ()


def _latest_match(recent: list[int], min_ngram: int, max_ngram: int) -> int | None:
    """Where the copy begins: after the latest earlier occurrence of the longest suffix of
    `recent` (max_ngram .. min_ngram tokens) that occurred before, or None.

    The scan runs backwards over the occurrences of the last token only, each found by
    `list.index` (in C) on the reversed window: a Python loop over every start of a 2k-token
    window that finds nothing took ~1.2 ms, per sequence and step, which the step after a
    verification waits for. An occurrence k tokens back from the end matches m tokens of
    the suffix; the copy begins k tokens before the end for whichever n it serves."""
    reverse = recent[::-1]
    size = len(reverse)
    top = min(max_ngram, size - 1)
    if top < min_ngram:
        return None
    latest: dict[int, int] = {}            # n -> the nearest k whose occurrence matches n
    k = 0
    while True:
        try:
            k = reverse.index(reverse[0], k + 1)
        except ValueError:
            break
        m = 1
        while m < top and k + m < size and reverse[k + m] == reverse[m]:
            m += 1
        for n in range(min_ngram, m + 1):
            latest.setdefault(n, k)
        if m >= top:                       # the longest suffix: nothing later beats it
            break
    return size - latest[max(latest)] if latest else None


def _copy(recent: list[int], begin: int, limit: int) -> tuple[int, ...]:
    """`limit` tokens copied from `begin` on; past the end the copy continues from what it
    copied (a repeat of period len(recent) - begin: "a b a b" proposes "a b a b ...")."""
    extended = list(recent)
    for i in range(limit):
        extended.append(extended[begin + i])
    return tuple(extended[len(recent):])
