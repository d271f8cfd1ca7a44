"""Validating a step completion and applying it to sequence state: progress, tokens,
finish rules (checkpoint publication: publication.py)."""

from __future__ import annotations

import dataclasses
import math
import time

from services.engine.scheduler.costs import capacity
from services.engine.scheduler.plan import Completion, SeqResult, SeqStep, Step, check, fail
from services.engine.scheduler.publication import begin_terminal_capture, publish
from services.engine.scheduler.requests import (
    ChoiceDelta,
    FinishReason,
    PromptLogprob,
    SampledLogprobs,
)
from services.engine.scheduler.residency import release
from services.engine.scheduler.sequence import Phase, Sequence
from services.engine.scheduler.speculation import COPY
from services.engine.scheduler.state import SchedulerState


def validate(state: SchedulerState, completion: Completion) -> Step:
    """Check a completion against the committed step before anything is mutated (each
    message is formatted only when its check fails: this runs on every step's critical
    path)."""
    if not state.in_flight:
        fail(f"fence {completion.fence} completed but nothing is in flight")
    oldest = min(state.in_flight)
    if completion.fence != oldest:
        fail(f"fence {completion.fence} completed before the oldest outstanding fence {oldest}")
    step = state.in_flight[oldest]
    if len(completion.results) != len(step.seqs):
        fail(f"{len(completion.results)} results for a step of {len(step.seqs)} sequences")
    vocab = state.config.vocab_size
    for result, planned in zip(completion.results, step.seqs, strict=True):
        if result.handle != planned.handle:
            fail(f"result for slot {result.handle}, the step ran {planned.handle}")
        emitted = len(result.token_ids)
        if planned.sample:
            if not 1 <= emitted <= planned.max_emit:
                fail(f"slot {planned.handle} emitted {emitted} tokens, the step may emit "
                     f"1..{planned.max_emit}")
            expected = planned.sample_from + emitted
        else:
            if emitted:
                fail(f"slot {planned.handle}: {emitted} tokens from a step that samples "
                     "nothing")
            expected = planned.end
        if result.consumed != expected:
            fail(f"slot {planned.handle} consumed {result.consumed}, expected {expected}")
        if emitted and not (min(result.token_ids) >= 0 and max(result.token_ids) < vocab):
            fail(f"slot {planned.handle}: a token outside the vocabulary in "
                 f"{result.token_ids}")
        if result.logprobs and len(result.logprobs) != emitted:
            fail(f"slot {planned.handle}: {len(result.logprobs)} logprobs for {emitted} "
                 "tokens")
        if planned.score_targets or result.prompt_logprobs:
            check(len(result.prompt_logprobs) == len(planned.score_targets) and
                  all(e.token_id == t for e, t in zip(result.prompt_logprobs,
                                                      planned.score_targets, strict=False)),
                  f"slot {planned.handle}: {len(result.prompt_logprobs)} prompt logprobs for "
                  f"{len(planned.score_targets)} score targets")
        if planned.pool or result.pooled:
            check(bool(result.pooled) == bool(planned.pool),
                  f"slot {planned.handle}: pooled state {'missing' if planned.pool else 'sent'}")
    return step


def apply_result(state: SchedulerState, step: Step, planned: SeqStep, result: SeqResult,
                 now: float) -> ChoiceDelta | None:
    seq = state.resident(result.handle)
    if seq is None or not seq.progress.owns_completion(step.fence):
        return None                    # cancelled or preempted while in flight: discard
    progress = seq.progress
    if planned.feeds_pending and seq.finish_reason is not None:
        # a decode that ran behind the token that finished this choice: drop what it made
        # (its KV lies past the terminal endpoint; its pages retire with the sequence)
        progress.discarded()
        seq.bump()
        return None
    progress.completed(result.consumed, fed=bool(planned.token_ids),
                       resumed=planned.resume_snapshot is not None, now=now)
    prompt_len = seq.prompt_len
    state.counters.prompt_tokens += max(0, min(result.consumed, prompt_len) -
                                        min(planned.start, prompt_len))
    for tail in planned.tail_captures:         # boundaries the chunk ran past, in order
        publish(state, seq, step.fence, tail.endpoint, resumable=False)
    if planned.capture is not None:
        publish(state, seq, step.fence)
    seq.bump()
    if seq.phase is Phase.CAPTURING:          # its terminal state is saved: retire it
        release(state, seq)
        seq.phase = Phase.FINISHED
        return None
    prompt_logprobs = seq.output.scored(result.prompt_logprobs) if result.prompt_logprobs \
        else ()
    if result.pooled:
        seq.output.pool(result.pooled, restart=planned.start == 0,
                        accumulate=planned.pool == "mean")
    if not result.token_ids:
        if seq.prompt_only and seq.num_computed >= prompt_len:
            return _finish_prompt(state, seq, prompt_logprobs)
        return ChoiceDelta(seq.request.request_id, seq.index,
                           prompt_logprobs=prompt_logprobs) if prompt_logprobs else None
    delta = _commit_tokens(state, seq, result, now)
    progress.pending_last(seq.total_len)
    if planned.output_index > 0 and state.config.proposer is not None and \
            seq.request.request.speculative:
        _observe_speculation(state, seq, planned, result, len(delta.token_ids))
    if planned.draft_token_ids and seq.phase is Phase.RUNNING:
        release_draft_pages(state, seq, step.fence)
    if prompt_logprobs:
        delta = dataclasses.replace(delta, prompt_logprobs=prompt_logprobs)
    return delta


def _finish_prompt(state: SchedulerState, seq: Sequence,
                   prompt_logprobs: tuple[PromptLogprob, ...]) -> ChoiceDelta:
    """A prompt-only request (max_tokens 0) consumed its prompt: it ends with length, with
    the last prompt logprobs and the embedding (pooled, normalized)."""
    embedding: tuple[float, ...] = ()
    if seq.request.request.embed:
        pooled = seq.output.pool_sum or []
        if state.config.pooling == "mean":
            pooled = [v / seq.prompt_len for v in pooled]
        if state.config.normalize_embeddings:
            norm = math.sqrt(sum(v * v for v in pooled))
            pooled = [v / norm for v in pooled] if norm > 0 else pooled
        embedding = tuple(pooled)
    finish(state, seq, FinishReason.LENGTH)
    return ChoiceDelta(seq.request.request_id, seq.index, finish_reason=FinishReason.LENGTH,
                       prompt_logprobs=prompt_logprobs, embedding=embedding)


def _commit_tokens(state: SchedulerState, seq: Sequence, result: SeqResult,
                   now: float) -> ChoiceDelta:
    """Commit the emitted tokens in order, each under the finish rules; a token that ends
    the choice drops the ones after it."""
    committed: list[int] = []
    logprobs: list[SampledLogprobs] = []
    reason: FinishReason | None = None
    stop_token: int | None = None
    error = ""
    rules = seq.request.stop
    for position, token in enumerate(result.token_ids):
        output_index = len(seq.output_ids)
        seq.output.append(token)
        committed.append(token)
        if result.logprobs:
            logprobs.append(result.logprobs[position])
        state.counters.add_generated(1, now)
        if seq.matcher is not None and not seq.matcher.accept(token):
            error = (f"the output of choice {seq.index} no longer matches its grammar: "
                     f"{seq.matcher.error or f'token {token} was not allowed'}")
            reason = FinishReason.ERROR
            break
        if output_index >= rules.min_tokens and (
                token in rules.stop_token_ids or
                (not rules.ignore_eos and token in state.config.eos_token_ids)):
            reason, stop_token = FinishReason.STOP, token
        elif seq.matcher is not None and seq.matcher.is_stopped:
            # the grammar is complete: end here rather than spend a step on the EOS token
            reason = FinishReason.STOP
            stop_token = token if token in state.config.eos_token_ids else None
        elif len(seq.output_ids) >= (rules.max_tokens or 0) or \
                seq.total_len >= state.config.max_model_len:
            reason = FinishReason.LENGTH
        if reason is not None:
            break
    seq.output.published(now)
    delta = ChoiceDelta(seq.request.request_id, seq.index, tuple(committed), tuple(logprobs),
                        reason, stop_token, error)
    if reason is FinishReason.ERROR:
        finish(state, seq, FinishReason.ERROR)
    elif reason is not None and (len(committed) < len(result.token_ids) or
                                 not begin_terminal_capture(state, seq, reason)):
        # (a choice that ended inside a verified run keeps no terminal state: the runners
        # keep the hidden state of the run's last emitted row, not of the row it ended at)
        finish(state, seq, reason)
    return delta


def _observe_speculation(state: SchedulerState, seq: Sequence, planned: SeqStep,
                         result: SeqResult, committed: int) -> None:
    """A generation round of a speculating choice: its acceptance statistics (by depth and
    proposal source) and the speculative counters."""
    counters = state.counters
    drafts = planned.draft_token_ids
    counters.spec_rounds += 1
    counters.spec_depth += len(drafts)
    if not drafts:
        return
    emitted = len(result.token_ids)
    source = getattr(state.config.proposer, "source", COPY)
    seq.speculation.observe(source, len(drafts), emitted, committed)
    counters.add_verification(len(drafts), min(emitted - 1, committed))


def release_draft_pages(state: SchedulerState, seq: Sequence, fence: int) -> None:
    """After a verification: pages that only rejected drafts' KV reached go back to the pool
    (the next step writes from the accepted length on; it allocates again if it needs
    them). Nothing else uses them: a verification step is never followed."""
    res = state.resources
    keep = res.pages_for(seq.total_len)
    pages = seq.cache.page_ids
    if len(pages) <= keep:
        return
    extra = pages[keep:]
    if not all(page in seq.cache.private_pages for page in extra):
        return
    del pages[keep:]
    seq.cache.private_pages.difference_update(extra)
    res.retire_pages(extra, fence)


def finish(state: SchedulerState, seq: Sequence, reason: FinishReason | None) -> None:
    """End a choice now (or drop its pending terminal capture); its resources retire behind
    its last submitted step."""
    if seq.is_resident:
        release(state, seq)
    elif seq in state.waiting:
        state.waiting.remove(seq)
    seq.phase = Phase.FINISHED
    seq.output.finish(reason)
    seq.bump()


def observe_duration(state: SchedulerState, step: Step, completion: Completion) -> None:
    batch = capacity(len(step.seqs))
    tokens = batch * step.width if step.kind == "verify" else capacity(step.num_tokens)
    state.costs.observe(kind=step.kind, label=step.label, batch_capacity=batch,
                        token_capacity=tokens, num_requests=len(step.seqs),
                        duration_s=completion.duration_s, now=time.monotonic())
