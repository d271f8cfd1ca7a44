"""Scheduler: the live-request scheduler's verbs.

    admitted = scheduler.admit(request)       # validate, look up the prefix, queue (or raise)
    plan = scheduler.plan()                   # who advances by how many tokens (or None)
    step = scheduler.commit(plan, fence)      # reserve pages/rows, record use -> runner input
    update = scheduler.complete(completion)   # validate, commit tokens, publish, finish
    scheduler.cancel(request_id)              # stop now; resources retire after last use

The scheduler sees token counts, not phases: a sequence has `num_computed` tokens of KV and
`total_len` known tokens; a step feeds some of the difference and samples when it reaches the
end. Chunked prefill, prefix hits (num_computed starts at the hit), resumption after preemption
and decode (one token) are the same arithmetic. Plain Python: no torch, no devices.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import time
from typing import Any

from services.common.errors import CapacityError, InternalError, ValidationError
from services.engine.grammar import CompiledGrammar, GrammarCompiler, fill_bitmasks
from services.engine.prefix.history import PrefixHistory, salted_identity
from services.engine.scheduler import completion as completing
from services.engine.scheduler.admission import AdmissionLimits, validate_request
from services.engine.scheduler.plan import (
    NO_TRANSFERS,
    PENDING_TOKEN,
    Capture,
    Completion,
    KVTransfers,
    Plan,
    PlanInvalidated,
    PlannedSeq,
    Restore,
    SamplingInit,
    SeqStep,
    Step,
)
from services.engine.scheduler.policy import select
from services.engine.scheduler.requests import (
    Admitted,
    ChoiceDelta,
    EngineRequest,
    FinishReason,
    RequestUpdate,
    Usage,
)
from services.engine.scheduler.residency import admit_waiting
from services.engine.scheduler.resources import KVResources
from services.engine.scheduler.sequence import (
    CacheHold,
    Choice,
    Output,
    Phase,
    RequestState,
    Sequence,
)
from services.engine.scheduler.slots import SlotTable
from services.engine.scheduler.state import PRIORITY_STEP_S, SchedulerConfig, SchedulerState

_scheduler_ids = itertools.count(1)


def choice_seed(seed: int, index: int) -> int:
    """Choice 0 uses the request's seed; further choices derive independent seeds from it."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Scheduler:
    def __init__(self, config: SchedulerConfig, resources: KVResources,
                 model_identity: bytes, grammars: GrammarCompiler | None = None) -> None:
        self.id = next(_scheduler_ids)
        self.grammars = grammars          # structured outputs (None: the model has none)
        self.num_constrained = 0          # live requests with a grammar (0: no mask work)
        self.state = SchedulerState(config, resources, SlotTable(config.max_num_seqs))
        self.identity = model_identity
        self.limits = AdmissionLimits(
            vocab_size=config.vocab_size, max_model_len=config.max_model_len,
            page_size=resources.page_size, num_pages=resources.pages.capacity,
            max_waiting=config.max_waiting, context_hint=config.context_hint,
            capacity_hint=config.capacity_hint, supports_images=config.supports_images,
            pooling=config.pooling, pooling_hint=config.pooling_hint)

    # -- admission --------------------------------------------------------------------------
    def admit(self, request: EngineRequest, *, grammar: CompiledGrammar | None = None,
              now: float | None = None) -> Admitted:
        """Queue a request. A request with a grammar brings it compiled (`grammar`): each
        choice gets its own matcher."""
        state = self.state
        now = time.monotonic() if now is None else now
        try:
            if (request.grammar is None) != (grammar is None) or (
                    grammar is not None and grammar.spec != request.grammar):
                raise InternalError("a request's grammar must be admitted compiled")
            stop = validate_request(request, self.limits)
            if request.request_id in state.requests:
                raise ValidationError(f"request id {request.request_id!r} is already live",
                                      param="request_id")
            # requests that will wait: queued ones beyond the slots free right now
            queued = sum(1 for r in state.requests.values()
                         if all(s.phase is Phase.QUEUED for s in r.seqs))
            if queued - state.slots.num_free >= state.config.max_waiting:
                raise CapacityError(
                    f"the engine's waiting queue is full ({state.config.max_waiting} requests)",
                    hint=state.config.capacity_hint, retry_after_s=1.0)
        except Exception:
            state.counters.requests_rejected += 1
            raise
        history = PrefixHistory(salted_identity(self.identity, request.cache_salt),
                                request.prompt_token_ids, request.conditioning)
        record = RequestState(request, history, stop,
                              arrival=now - PRIORITY_STEP_S * request.priority,
                              serial=state.next_serial)
        state.next_serial += 1
        hit = state.resources.cache.lookup(history, 0 if request.scores_prompt else
                                           len(history))
        if hit.checkpoint is not None:
            record.admission_pin = state.resources.cache.pin(hit.checkpoint)
            record.cached_tokens = hit.endpoint
        seed = request.seed if request.seed is not None else secrets.randbits(63)
        record.seqs = [Sequence(Choice(record, i, choice_seed(seed, i)), output=Output(
            matcher=grammar.matcher() if grammar is not None else None),
            scoring=i == 0 and request.scores_prompt)
            for i in range(request.n)]
        state.requests[request.request_id] = record
        if grammar is not None:
            self.num_constrained += 1
        for seq in record.seqs:
            state.enqueue(seq)
        state.counters.requests_admitted += 1
        return Admitted(request.request_id, self._usage(record))

    def cancel(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED
               ) -> RequestUpdate | None:
        """Stop a request now (idempotent: None when it is not live)."""
        record = self.state.requests.get(request_id)
        if record is None:
            return None
        record.cancelled = True
        deltas = []
        for seq in record.seqs:
            if not seq.is_finished:
                completing.finish(self.state, seq, reason)
                deltas.append(ChoiceDelta(request_id, seq.index, finish_reason=reason))
            elif seq.phase is Phase.CAPTURING:
                completing.finish(self.state, seq, None)
        self._retire_request(record)
        return RequestUpdate(request_id, tuple(deltas), self._usage(record), finished=True)

    def fail_all(self) -> list[RequestUpdate]:
        """Finish every live request with ERROR (the engine cannot continue)."""
        self.abandon_captures()
        return [u for rid in list(self.state.requests)
                if (u := self.cancel(rid, FinishReason.ERROR)) is not None]

    def abandon_captures(self) -> None:
        """Drop pending terminal captures (drain, shutdown): their choices already finished."""
        for seq in list(self.state.running.values()):
            if seq.phase is Phase.CAPTURING:
                completing.finish(self.state, seq, None)

    # -- the step ---------------------------------------------------------------------------
    def plan(self) -> Plan | None:
        admit_waiting(self.state)
        selected = select(self.state)
        if not selected:
            return None
        return Plan(self.id, tuple(selected))

    def commit(self, plan: Plan, fence: int) -> Step:
        state = self.state
        res = state.resources
        if plan.scheduler_id != self.id:
            raise PlanInvalidated("the plan belongs to another scheduler")
        seqs: list[Sequence] = []
        for planned in plan.seqs:
            seq = state.resident(planned.handle)
            if seq is None or seq.epoch != planned.epoch or (
                    seq.in_flight and not planned.follows):
                raise PlanInvalidated(f"slot {planned.handle} changed after planning")
            seqs.append(seq)
        if fence != res.fences.next_fence:
            raise PlanInvalidated(f"fence {fence} is not the next fence "
                                  f"({res.fences.next_fence})")
        needed = sum(max(0, res.pages_for(p.start + p.num_tokens) - len(s.page_ids))
                     for p, s in zip(plan.seqs, seqs, strict=True))
        if not res.reclaim(pages=needed):
            raise PlanInvalidated(f"{needed} pages are no longer available")
        res.fences.issue()
        masks = self._grammar_masks(plan, seqs)
        steps = tuple(self._commit_seq(seq, planned, fence, masks.get(i))
                      for i, (planned, seq) in enumerate(zip(plan.seqs, seqs, strict=True)))
        step = Step(fence, _step_kind(steps), steps, self._transfers(seqs, fence))
        state.in_flight[fence] = step
        state.counters.launches_by_kind[step.kind] += 1
        return step

    def _transfers(self, seqs: list[Sequence], fence: int) -> KVTransfers:
        """The host tier's copies for this step: pending offloads, then the host blocks the
        committed sequences bring back (unpinned now: their last reader is this step)."""
        res = self.state.resources
        if res.host is None:
            return NO_TRANSFERS
        onload: list[tuple[int, int]] = []
        for seq in seqs:
            copies, blocks = seq.cache.take_onload()
            if blocks:
                onload.extend(copies)
                res.host.release(blocks, fence)
        offload = res.take_transfers(fence)
        if not offload and not onload:
            return NO_TRANSFERS
        return KVTransfers(offload, tuple(onload))

    def _grammar_masks(self, plan: Plan, seqs: list[Sequence]) -> dict[int, Any]:
        """The allowed-token bitmask of every sampling row whose choice has a grammar (from
        its committed tokens: such a choice never has a step in flight here)."""
        if not self.num_constrained:
            return {}
        rows = [i for i, (p, s) in enumerate(zip(plan.seqs, seqs, strict=True))
                if p.sample and s.matcher is not None]
        if not rows:
            return {}
        grammars = self.grammars
        if grammars is None:
            raise InternalError("a constrained choice is running without a grammar compiler")
        plain = [i for i in rows if not plan.seqs[i].draft_token_ids]
        masks = fill_bitmasks([seqs[i].matcher for i in plain],  # type: ignore[misc]
                              grammars.words, grammars.executor)
        out: dict[int, Any] = {i: masks[k] for k, i in enumerate(plain)}
        for i in rows:              # a verification row o is masked after drafts[:o]
            if plan.seqs[i].draft_token_ids:
                out[i] = seqs[i].matcher.draft_bitmasks(  # type: ignore[union-attr]
                    plan.seqs[i].draft_token_ids, grammars.words, grammars.executor)
        return out

    def _commit_seq(self, seq: Sequence, planned: PlannedSeq, fence: int,
                    allowed_tokens: Any = None) -> SeqStep:
        start, num_tokens, max_emit = planned.start, planned.num_tokens, planned.max_emit
        drafts = planned.draft_token_ids
        if drafts and (planned.follows or max_emit != len(drafts) + 1 or
                       num_tokens != len(drafts) + 1 or (
                           seq.matcher is not None and
                           seq.matcher.valid_prefix(drafts) != len(drafts))):
            raise PlanInvalidated(f"slot {planned.handle}: a verification step needs its "
                                  "known token, max_emit = drafts + 1, and drafts its "
                                  "grammar accepts")
        # a decode behind the in-flight step: its token is that step's, one output later
        outputs = len(seq.output_ids) + (1 if planned.follows else 0)
        res = self.state.resources
        size = res.page_size
        cache, progress = seq.cache, seq.progress
        cache.grow(res.pages.allocate(max(0, res.pages_for(start + num_tokens) -
                                          len(cache.page_ids))))
        restore = None
        if num_tokens and progress.restore is not None:
            snapshot_id, rows = progress.take_restore()  # type: ignore[misc]
            restore = Restore(snapshot_id, cache.page_ids[start // size], rows)
        end = start + num_tokens
        capture = None
        if end in cache.target_snapshots and (num_tokens or seq.phase is Phase.CAPTURING):
            capture = _capture(cache, end, size)
        # targets the chunk runs past (checkpoint_stops off): their partial pages only
        tail_captures = tuple(_capture(cache, t, size) for t in cache.targets
                              if start < t < end) if num_tokens > 1 else ()
        init = None
        if progress.take_init():
            request = seq.request.request
            init = SamplingInit(request.sampling, request.prompt_token_ids,
                                tuple(seq.output_ids), seq.seed, request.logprobs,
                                request.top_logprobs, request.multimodal)
        rules = seq.request.stop
        suppress: tuple[int, ...] = ()
        if max_emit and outputs < rules.min_tokens:
            ids = set(rules.stop_token_ids)
            if not rules.ignore_eos:
                ids |= self.state.config.eos_token_ids
            suppress = tuple(sorted(ids))
        score_targets: tuple[int, ...] = ()
        score_top, pool = 0, ""
        if seq.scoring and num_tokens and not planned.follows:
            score_targets, pool = self._scoring(seq, start, end)
            score_top = seq.request.request.prompt_logprobs or 0
        for pin in cache.pins:
            res.cache.mark_used(pin.checkpoint, fence)
        progress.submitted(fence, end, can_follow=max_emit == 1 and capture is None)
        seq.bump()
        if planned.follows:
            token_ids: tuple[int, ...] = (PENDING_TOKEN,)
        else:
            token_ids = seq.tokens(start, end - len(drafts)) + drafts
        assert seq.handle is not None
        return SeqStep(
            handle=seq.handle, start=start, token_ids=token_ids,
            page_ids=tuple(cache.page_ids), max_emit=max_emit, output_index=outputs,
            suppress_token_ids=suppress,
            resume_snapshot=progress.resume_snapshot if num_tokens == 0 else None,
            restore=restore, capture=capture, tail_captures=tail_captures, init=init,
            allowed_tokens=allowed_tokens,
            score_targets=score_targets, score_top=score_top, pool=pool)

    def _scoring(self, seq: Sequence, start: int, end: int) -> tuple[tuple[int, ...], str]:
        """A scoring sequence's step over [start, end): the next prompt token of each fed
        prompt row that has one, and the pooling of its prompt rows."""
        request = seq.request.request
        prompt_len = seq.prompt_len
        stop = min(end + 1, prompt_len)
        targets = seq.tokens(start + 1, stop) if request.prompt_logprobs is not None and \
            stop > start + 1 else ()
        pool = ""
        if request.embed and start < prompt_len:
            mode = self.state.config.pooling
            if mode == "mean" or end >= prompt_len:
                pool = mode
        return targets, pool

    def complete(self, completion: Completion) -> list[RequestUpdate]:
        state = self.state
        step = completing.validate(state, completion)
        del state.in_flight[completion.fence]
        state.resources.advance_completed(completion.fence)
        state.slots.advance_completed(completion.fence)
        completing.observe_duration(state, step, completion)
        if any(s.max_emit > 1 for s in step.seqs):
            state.counters.spec_verify_steps += 1
        now = time.monotonic()
        touched: dict[str, list[ChoiceDelta]] = {}
        for planned, result in zip(step.seqs, completion.results, strict=True):
            delta = completing.apply_result(state, step, planned, result, now)
            if delta is not None:
                touched.setdefault(delta.request_id, []).append(delta)
        updates = []
        for request_id, deltas in touched.items():
            record = state.requests[request_id]
            finished = record.is_finished
            if finished:
                self._retire_request(record)
            updates.append(RequestUpdate(request_id, tuple(deltas), self._usage(record),
                                         finished))
        return updates

    # -- reading ----------------------------------------------------------------------------
    @property
    def num_active(self) -> int:
        return len(self.state.requests)

    @property
    def has_work(self) -> bool:
        state = self.state
        return bool(state.requests) or bool(state.running) or bool(state.in_flight)

    def _usage(self, record: RequestState) -> Usage:
        return Usage(len(record.request.prompt_token_ids), record.completion_tokens,
                     record.cached_tokens, record.cached_tokens_host)

    def _retire_request(self, record: RequestState) -> None:
        state = self.state
        if state.requests.pop(record.request_id, None) is None:
            return
        if record.request.grammar is not None:
            self.num_constrained -= 1
        if record.admission_pin is not None:
            state.resources.cache.unpin(record.admission_pin)
            record.admission_pin = None
        reasons = {s.finish_reason for s in record.seqs}
        if FinishReason.ERROR in reasons:
            state.counters.requests_failed += 1
        elif record.cancelled:
            state.counters.requests_cancelled += 1
        else:
            state.counters.requests_completed += 1


def _capture(cache: CacheHold, endpoint: int, page_size: int) -> Capture:
    """The capture of target `endpoint` into its reserved snapshot row: the page holding its
    partial tail (-1 when the endpoint is page aligned) and that tail's length."""
    partial = endpoint % page_size
    return Capture(cache.target_snapshots[endpoint],
                   cache.page_ids[endpoint // page_size] if partial else -1, partial, endpoint)


def _step_kind(seqs: tuple[SeqStep, ...]) -> str:
    """decode, prefill or mixed by the fed tokens (verify: decodes of which some check
    drafts; with a prefill chunk beside them the step is mixed);
    resume (sampling from snapshots only) and snapshot (terminal captures only) for steps
    that feed none."""
    fed = [s for s in seqs if s.token_ids]
    if not fed:
        return "resume" if any(s.sample for s in seqs) else "snapshot"
    decode = sum(1 for s in fed if s.sample and len(s.token_ids) == 1 and s.output_index > 0)
    verify = sum(1 for s in fed if s.max_emit > 1)
    if verify and decode + verify == len(fed):
        return "verify"
    if decode == len(fed):
        return "decode"
    return "prefill" if decode + verify == 0 else "mixed"
