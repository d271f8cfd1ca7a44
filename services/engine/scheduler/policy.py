"""The token-budget policy: which resident sequences advance this step, and by how much.

0. A finished choice that saves its terminal state runs a zero-token capture.
1. Every resident sequence that is decoding (or resuming sampling from a snapshot) advances by
   one token (zero for a resume), oldest first.
2. Sequences with prompt (or, after preemption, replayed) tokens left get chunks, oldest first:
   up to `prefill_chunk_size`, never past their known tokens (nor, with `checkpoint_stops`,
   their next checkpoint endpoint: without it a chunk captures the boundaries it crosses,
   scheduler.py), within the step's `max_num_batched_tokens`. The oldest such sequence always
   gets at least one 64-token chunk, so decodes can never starve a prompt. A chunk never splits an
   image span: it stops before one, or takes one whole; only the oldest may take a span past
   the budget (up to `max_image_tokens`), so a step never feeds more than the budget plus
   one image.
3. Pages come from the free pool, then from evicting unpinned cache leaves, then from
   preempting younger resident sequences (youngest first). A sequence never preempts an older
   one, so the oldest request always progresses: nobody starves.

With a proposer (`SchedulerConfig.proposer`), a decode also feeds the drafts it proposes and
may emit them all plus one (a verification step, plan.py): as many as the request's
acceptance statistics make worth it (speculation.py: zero included; none for a request that
opted out), only drafts its grammar accepts, and none at all when the cost model says this
batch decodes faster than it verifies.

Order is arrival time shifted by priority (state.order_key). With the cost model on
(`SchedulerConfig.cost_model`), the prefill allowance of a step is the candidate token
capacity with the most useful work per measured duration (costs.chunk_budget). With overlap on,
a decode may be planned behind a sequence's in-flight step (`can_follow`).
"""

from __future__ import annotations

import time
from typing import cast

from services.engine.scheduler.costs import capacity, chunk_budget, shape_label
from services.engine.scheduler.plan import PlannedSeq
from services.engine.scheduler.proposals import Proposer, choice_drafter
from services.engine.scheduler.residency import drop_waiting_pins, preempt
from services.engine.scheduler.sequence import Phase, Sequence
from services.engine.scheduler.speculation import (
    COPY,
    DEFAULT_ROW_COST,
    choose_width,
    extra_row_cost,
    plan_width,
    verify_label,
    worth_verifying,
)
from services.engine.scheduler.state import SchedulerState, order_key

MIN_CHUNK = 64


def select(state: SchedulerState) -> list[PlannedSeq]:
    config = state.config
    res = state.resources
    candidates = sorted((s for s in state.running.values()
                         if not s.in_flight or can_follow(state, s)), key=order_key)
    # finished choices saving their terminal state: zero tokens, no pages, free a slot soon
    chosen = [_planned(s, 0) for s in candidates if s.phase is Phase.CAPTURING]
    candidates = [s for s in candidates if s.phase is Phase.RUNNING]
    decoding = [s for s in candidates
                if s.in_flight or s.progress.resume_snapshot is not None or s.is_decoding]
    prefilling = [s for s in candidates if s not in decoding]
    chosen_seqs: set[int] = {id(state.running[p.handle.slot]) for p in chosen}
    budget = config.max_num_batched_tokens
    reserved = 0                                   # pages promised to chosen sequences

    def obtain(seq: Sequence, pages: int) -> bool:
        nonlocal reserved
        if pages <= 0:
            return True
        pins_dropped = False
        while not res.reclaim(pages=reserved + pages):
            if not pins_dropped:
                pins_dropped = True
                if drop_waiting_pins(state):
                    continue
            victim = _youngest_victim(state, seq, chosen_seqs)
            if victim is None:
                return False
            preempt(state, victim)
        reserved += pages
        return True

    row_cost = _row_cost(state, len(decoding))
    # drafts share what the step budget leaves after one token per decoding sequence
    draft_room = max(0, config.max_num_batched_tokens - len(decoding))
    for seq in decoding:
        if seq.handle is None or seq.handle.slot not in state.running:
            continue                                # preempted by an older sequence
        if seq.in_flight:                           # behind its in-flight step (overlap)
            planned = PlannedSeq(seq.handle, seq.epoch, seq.progress.scheduled_end, 1,
                                 max_emit=1, follows=True)
            _close_round(state, seq, 0, row_cost)
        elif seq.progress.resume_snapshot is not None:
            planned = _planned(seq, 0)
        else:
            planned = _with_drafts(state, seq, _planned(seq, 1), row_cost, draft_room)
            draft_room -= len(planned.draft_token_ids)
        if obtain(seq, res.pages_for(planned.start + planned.num_tokens) - len(seq.page_ids)):
            chosen.append(planned)
            chosen_seqs.add(id(seq))
            budget -= planned.num_tokens
    if config.cost_model and any(p.draft_token_ids for p in chosen):
        budget += _switch_off(state, chosen, row_cost)
    if config.cost_model and prefilling and budget > MIN_CHUNK:
        budget = chunk_budget(state.costs, num_seqs=len(chosen),
                              num_outputs=sum(p.max_emit for p in chosen),
                              num_tokens=sum(p.num_tokens for p in chosen), budget=budget,
                              min_chunk=MIN_CHUNK,
                              output_value=config.output_token_value)
    first_prefill = True
    for seq in prefilling:
        if seq.handle is None or seq.handle.slot not in state.running:
            continue
        allowance = max(budget, MIN_CHUNK) if first_prefill else budget
        # the room a whole image span may take (it may outgrow the chunk size)
        room = max(allowance, config.max_image_tokens) if first_prefill else allowance
        tokens = _chunk(seq, config.prefill_chunk_size, allowance, room,
                        stops=config.checkpoint_stops)
        if tokens <= 0:
            break
        pages = res.pages_for(seq.num_computed + tokens) - len(seq.page_ids)
        if not obtain(seq, pages):
            # take what fits in the pages we can get without preempting anyone
            spare = res.pages.num_free + res.cache.num_evictable_pages - reserved
            tokens = _whole_images(seq, min(
                tokens, (len(seq.page_ids) + max(0, spare)) * res.page_size -
                seq.num_computed), room)
            if tokens <= 0 or not obtain(seq, res.pages_for(seq.num_computed + tokens) -
                                         len(seq.page_ids)):
                continue
        chosen.append(_planned(seq, tokens))
        chosen_seqs.add(id(seq))
        budget -= tokens
        first_prefill = False
    return chosen


def can_follow(state: SchedulerState, seq: Sequence) -> bool:
    """Two-frame overlap: may a decode be planned behind this sequence's in-flight step?

    Only behind one step that emits exactly one token and captures nothing (a verification
    step's length is unknown until it completes), and only when that token cannot be the
    last by count (max_tokens, context): a token that ends the choice by stop
    rule (EOS, stop ids) wastes the one decode behind it, which completion then drops. Never
    for a choice with a grammar: its next bitmask needs the in-flight token committed (the
    reference's "a grammar submission requires an empty window", per choice)."""
    progress = seq.progress
    if not state.config.overlap or len(progress.in_flight_fences) != 1 or \
            not progress.can_follow:
        return False
    if seq.matcher is not None or wants_drafts(state, seq):
        return False
    if seq.phase is not Phase.RUNNING or seq.finish_reason is not None:
        return False
    outputs = len(seq.output_ids) + 1                   # with the in-flight step's token
    if outputs >= (seq.request.stop.max_tokens or 0):
        return False
    if seq.prompt_len + outputs >= state.config.max_model_len:
        return False
    return progress.scheduled_end + 1 not in seq.cache.target_snapshots


def _chunk(seq: Sequence, chunk_size: int, allowance: int, room: int, *,
           stops: bool = False) -> int:
    """Tokens to feed: up to the chunk size and allowance, stopping at the next checkpoint
    when `stops` (else the chunk captures what it crosses), and never inside an image span
    (one that starts the chunk is taken whole when it fits `room`)."""
    limit = seq.total_len
    for target in seq.cache.targets if stops else ():
        if target > seq.num_computed:
            limit = min(limit, target)
            break
    tokens = max(0, min(limit - seq.num_computed, chunk_size, allowance))
    return _whole_images(seq, tokens, room)


def _whole_images(seq: Sequence, tokens: int, room: int) -> int:
    """A prefill chunk never ends inside an image span (vision/prompt.py chunk_end): it
    stops before the span, or, starting at or inside it, takes the whole span when that fits
    `room` (else nothing: the sequence waits for a step with room)."""
    multimodal = seq.request.request.multimodal
    if multimodal is None or tokens <= 0:
        return tokens
    start = seq.num_computed
    tokens = multimodal.chunk_end(start, start + tokens) - start
    return tokens if tokens <= room else 0


def _planned(seq: Sequence, tokens: int) -> PlannedSeq:
    assert seq.handle is not None
    # the prompt's last chunk samples the first token, unless the request scores the prompt
    # alone (max_tokens 0): then every chunk only feeds
    return PlannedSeq(seq.handle, seq.epoch, seq.num_computed, tokens,
                      max_emit=int(seq.num_computed + tokens == seq.total_len and
                                   not seq.prompt_only))


def _with_drafts(state: SchedulerState, seq: Sequence, planned: PlannedSeq,
                 row_cost: float, room: int) -> PlannedSeq:
    """A decode that also verifies the proposer's drafts, within the output and context the
    choice has left, cut to the prefix its grammar accepts and to the width its acceptance
    statistics choose, or a funded probe's (speculation.py); the plain decode when that is
    zero."""
    proposer = state.config.proposer
    if proposer is None or not seq.request.request.speculative or batch_switched_off(state):
        return planned
    stats = seq.speculation
    source = getattr(proposer, "source", COPY)
    drafter = choice_drafter(proposer)
    if drafter is not None:
        # a draft model's forwards cost time: the width first, then only that many drafts
        stats.proposed = True
        width = plan_width(stats, source, min(room, drafter.num_tokens), row_cost)
        drafts = _proposals(state, seq, width) if width else ()
    else:
        drafts = _proposals(state, seq, room)
        stats.proposed = bool(drafts)
        drafts = drafts[:plan_width(stats, source, len(drafts), row_cost)]
    _close_round(state, seq, len(drafts), row_cost)
    if not drafts:
        return planned
    return PlannedSeq(planned.handle, planned.epoch, planned.start, 1 + len(drafts),
                      max_emit=1 + len(drafts), draft_token_ids=drafts)


def _proposals(state: SchedulerState, seq: Sequence, room: int) -> tuple[int, ...]:
    proposer = state.config.proposer
    assert proposer is not None
    left = min((seq.request.stop.max_tokens or 0) - len(seq.output_ids) - 1,
               state.config.max_model_len - seq.total_len - 1, room)
    if left <= 0:
        return ()
    tokens = seq.tokens(0, seq.total_len)
    drafter = choice_drafter(proposer)
    if drafter is not None:                          # a draft model: per-choice KV
        assert seq.handle is not None
        drafts, forwards = drafter.propose_for(seq.handle, tokens, left, seq.page_ids)
        state.counters.spec_drafter_steps += forwards
    else:
        drafts = tuple(cast(Proposer, proposer).propose(tokens, left))
    drafts = drafts[:left]
    if drafts and seq.matcher is not None:       # never a draft the grammar rejects
        drafts = drafts[:seq.matcher.valid_prefix(drafts)]
    return drafts


def wants_drafts(state: SchedulerState, seq: Sequence) -> bool:
    """Whether the next round of this choice should propose drafts rather than decode behind
    its in-flight step (overlap): its last proposal found drafts worth verifying, or a probe
    is due (decided when this round was planned)."""
    proposer = state.config.proposer
    if proposer is None or not seq.request.request.speculative or batch_switched_off(state):
        return False
    stats = seq.speculation
    if stats.probe_cost:
        return True
    limit = getattr(proposer, "num_tokens", 1)
    return stats.proposed and choose_width(stats, getattr(proposer, "source", COPY), limit,
                                           _row_cost(state, 1)) > 0


def batch_switched_off(state: SchedulerState) -> bool:
    """Whether the last batch switch-off still holds: the resident choices fill the batch
    capacity the stripped batch had (the cost model's shape bucket: a batch that size
    verifies at a loss whatever its requests accept, so no choice probes; requests finishing
    and arriving inside the bucket do not end it), until that verification's estimate goes
    stale (then one round proposes, and is measured again: worth_verifying)."""
    off = state.speculation_off_at
    if off is None:
        return False
    if capacity(len(state.running)) < capacity(off[0]):
        state.speculation_off_at = None           # a smaller batch: per-request widths
        return False
    return not state.costs.is_stale("verify", verify_label(*off), time.monotonic())


def _close_round(state: SchedulerState, seq: Sequence, width: int, row_cost: float) -> None:
    """A speculating choice's round of `width` drafts is planned (speculation.py
    `close_round`: its statistics age, its probe budget earns credit)."""
    proposer = state.config.proposer
    if proposer is None or not seq.request.request.speculative or batch_switched_off(state):
        return
    seq.speculation.close_round(getattr(proposer, "source", COPY), width,
                                getattr(proposer, "num_tokens", 1), row_cost)


def _row_cost(state: SchedulerState, num_seqs: int) -> float:
    """An extra verified row's relative cost (plus, for a draft model, its forward per
    draft): measured with the cost model on (CUDA), the default estimate otherwise (CPU
    timings are host noise, and plans stay deterministic)."""
    if not state.config.cost_model:
        return DEFAULT_ROW_COST
    proposer = state.config.proposer
    width = 1 + getattr(proposer, "num_tokens", 1)
    cost = extra_row_cost(state.costs, max(1, num_seqs), width, time.monotonic())
    # a draft model's forward per draft, relative to this batch's decode (unmeasured while
    # every round verifies: then to its verification, a decode's upper bound)
    forward_s = getattr(proposer, "forward_s", 0.0)
    batch = max(1, num_seqs)
    decode_s = state.costs.estimated_duration_s("decode", shape_label(batch, batch)) or \
        state.costs.estimated_duration_s("verify", verify_label(batch, width))
    if forward_s and decode_s:
        cost += forward_s / decode_s
    return cost


def _switch_off(state: SchedulerState, chosen: list[PlannedSeq], row_cost: float) -> int:
    """The batch switch-off (speculation.worth_verifying): strip every draft when this batch
    decodes faster than it verifies; returns the tokens given back to the budget. A choice
    verifying more drafts than its ordinary width is probing and counts by the upper
    estimates that chose its width (by its means, a probe never pays, and stripping it
    would keep the choice from learning otherwise, for as long as the switch-off holds)."""
    decodes = [i for i, p in enumerate(chosen) if p.max_emit >= 1 and p.num_tokens >= 1]
    width = 1 + max(len(chosen[i].draft_token_ids) for i in decodes)
    source = getattr(state.config.proposer, "source", COPY)
    expected = 0.0
    for i in decodes:
        p = chosen[i]
        stats = state.running[p.handle.slot].speculation
        drafts = len(p.draft_token_ids)
        probing = drafts > choose_width(stats, source, drafts, row_cost)
        expected += 1.0 + stats.expected_accepted(source, drafts, optimistic=probing)
    if worth_verifying(state.costs, len(decodes), width, expected, time.monotonic()):
        state.speculation_off_at = None
        return 0
    state.speculation_off_at = (len(decodes), width)
    freed = 0
    for i in decodes:
        p = chosen[i]
        if p.draft_token_ids:
            freed += len(p.draft_token_ids)
            # as a zero width: overlap resumes until the next probe (a probe switched off
            # was paid all the same: else every round would wait to propose)
            state.running[p.handle.slot].speculation.proposed = False
            chosen[i] = PlannedSeq(p.handle, p.epoch, p.start, 1, max_emit=1)
    state.counters.speculation_off += 1
    return freed


def _youngest_victim(state: SchedulerState, requester: Sequence,
                     chosen: set[int]) -> Sequence | None:
    mine = order_key(requester)
    victims = [s for s in state.running.values()
               if id(s) not in chosen and s is not requester and not s.in_flight
               and s.phase is Phase.RUNNING and order_key(s) > mine]
    return max(victims, key=order_key) if victims else None
