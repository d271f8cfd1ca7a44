"""Protobuf at the edge: helios.v1 engine messages <-> the engine's domain objects.

Only this module and server.py import the generated stubs. Request conversion validates what
can be checked without the scheduler (sampling ranges, vocabulary ids, n, image identities)
and raises typed ValidationErrors naming the field.
"""

from __future__ import annotations

import uuid

import numpy as np

from services.common.core import Manifest
from services.common.errors import ValidationError
from services.common.pb import common_pb2, engine_pb2
from services.engine.config import EngineConfig
from services.engine.core.messages import AdmissionState, CoreInfo, DrainResult
from services.engine.core.telemetry import LoadQuery, LoadSnapshot
from services.engine.grammar.spec import GrammarKind, GrammarSpec
from services.engine.prefix.history import IDENTITY_BYTES, MAX_SALT_CHARS, ConditioningEvent
from services.engine.prefix.records import BlockEvent
from services.engine.sampling import SamplingParams
from services.engine.scheduler.requests import (
    Admitted,
    EngineRequest,
    FinishReason,
    RequestUpdate,
    StopRules,
    Usage,
)
from services.engine.vision.prompt import ImageSpan, MultimodalPrompt

_FINISH = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}


_GRAMMAR_KINDS = {
    engine_pb2.GRAMMAR_KIND_JSON_SCHEMA: GrammarKind.JSON_SCHEMA,
    engine_pb2.GRAMMAR_KIND_JSON_OBJECT: GrammarKind.JSON_OBJECT,
    engine_pb2.GRAMMAR_KIND_REGEX: GrammarKind.REGEX,
    engine_pb2.GRAMMAR_KIND_LARK: GrammarKind.LARK,
}


def grammar_from_pb(message: engine_pb2.Grammar) -> GrammarSpec | None:
    if message.kind == engine_pb2.GRAMMAR_KIND_NONE:
        if message.text:
            raise ValidationError("grammar.text given without a grammar kind",
                                  param="grammar.kind")
        return None
    kind = _GRAMMAR_KINDS.get(message.kind)
    if kind is None:
        raise ValidationError(f"unknown grammar kind {message.kind}", param="grammar.kind")
    return GrammarSpec(kind, message.text, message.lenient)


def split_failure(update: RequestUpdate) -> tuple[RequestUpdate | None, str]:
    """An update without the choices that failed (grammar), and the first failure's message
    ("" when none failed): the stream sends the rest, then ends with the error."""
    failed = [d for d in update.deltas if d.error]
    if not failed:
        return update, ""
    kept = tuple(d for d in update.deltas if not d.error)
    rest = RequestUpdate(update.request_id, kept, update.usage, update.finished) if kept \
        else None
    return rest, failed[0].error


def request_from_pb(message: engine_pb2.EngineGenerateRequest, vocab_size: int
                    ) -> EngineRequest:
    sampling = SamplingParams.from_pb(message.sampling).with_seed()
    sampling.check_vocab(vocab_size)
    n = message.n if message.HasField("n") else 1
    if n < 1:
        raise ValidationError("n must be at least 1", param="n")
    events = []
    for index, image in enumerate(message.multimodal.images):
        if len(image.identity) != IDENTITY_BYTES:
            raise ValidationError(f"image {index} needs a {IDENTITY_BYTES}-byte identity",
                                  param=f"multimodal.images[{index}].identity")
        events.append(ConditioningEvent(image.token_offset, bytes(image.identity)))
    if [e.position for e in events] != sorted(e.position for e in events):
        raise ValidationError("images must be in prompt order", param="multimodal.images")
    multimodal = multimodal_from_pb(message.multimodal, len(message.prompt_token_ids))
    if len(message.cache_salt) > MAX_SALT_CHARS:
        raise ValidationError(f"cache_salt is {len(message.cache_salt)} characters; at most "
                              f"{MAX_SALT_CHARS}", param="cache_salt")
    return EngineRequest(
        request_id=message.request_id or f"engine-{uuid.uuid4().hex}",
        prompt_token_ids=tuple(message.prompt_token_ids),
        sampling=sampling,
        stop=StopRules(max_tokens=sampling.max_tokens, min_tokens=sampling.min_tokens,
                       ignore_eos=sampling.ignore_eos,
                       stop_token_ids=frozenset(sampling.stop_token_ids)),
        seed=sampling.seed,
        logprobs=sampling.logprobs,
        top_logprobs=sampling.num_top_logprobs,
        checkpoint_token_ends=tuple(message.checkpoint_token_ends),
        conditioning=tuple(events),
        n=n,
        priority=message.priority,
        grammar=grammar_from_pb(message.grammar),
        prompt_logprobs=message.prompt_logprobs if message.HasField("prompt_logprobs")
        else None,
        embed=message.embed,
        cache_salt=message.cache_salt,
        speculative=not message.disable_speculation,
        multimodal=multimodal,
    )


def multimodal_from_pb(message: common_pb2.MultimodalInputs, prompt_len: int
                       ) -> MultimodalPrompt | None:
    """The images' spans and identities and the prompt's mRoPE rows (int32 LE [3, L])."""
    if not message.images:
        if message.mrope_positions:
            raise ValidationError("mrope_positions given without images",
                                  param="multimodal.mrope_positions")
        return None
    if not message.mrope_positions:
        return None        # admission refuses: a text model the images, a vision model this
    expected = 3 * prompt_len * 4
    if len(message.mrope_positions) != expected:
        raise ValidationError(
            f"mrope_positions holds {len(message.mrope_positions)} bytes; a {prompt_len}-token "
            f"prompt needs {expected} (int32 [3, {prompt_len}])",
            param="multimodal.mrope_positions")
    positions = np.frombuffer(message.mrope_positions, dtype="<i4").reshape(3, prompt_len)
    spans = tuple(ImageSpan(bytes(image.identity), image.token_offset, image.num_tokens,
                            (image.grid_t, image.grid_h, image.grid_w))
                  for image in message.images)
    return MultimodalPrompt(spans, positions.astype(np.int64), int(message.rope_delta))


def usage_to_pb(usage: Usage) -> common_pb2.Usage:
    return common_pb2.Usage(prompt_tokens=usage.prompt_tokens,
                            completion_tokens=usage.completion_tokens,
                            cached_tokens=usage.cached_tokens,
                            cached_tokens_host=usage.cached_tokens_host)


def admitted_to_pb(admitted: Admitted) -> engine_pb2.EngineGenerateResponse:
    return engine_pb2.EngineGenerateResponse(request_id=admitted.request_id,
                                             usage=usage_to_pb(admitted.usage))


def update_to_pb(update: RequestUpdate) -> engine_pb2.EngineGenerateResponse:
    outputs = []
    for delta in sorted(update.deltas, key=lambda d: d.index):
        output = engine_pb2.EngineOutput(index=delta.index, token_ids=list(delta.token_ids))
        for lp in delta.logprobs:
            output.logprobs.append(common_pb2.SampledLogprobs(
                token_id=lp.token_id, logprob=lp.logprob,
                top=[common_pb2.TokenLogprob(token_id=t.token_id, logprob=t.logprob)
                     for t in lp.top]))
        if delta.finish_reason is not None:
            output.finish_reason = _FINISH[delta.finish_reason]
        if delta.stop_token_id is not None:
            output.stop_token_id = delta.stop_token_id
        for entry in delta.prompt_logprobs:
            output.prompt_logprobs.append(common_pb2.PromptLogprob(
                position=entry.position, token_id=entry.token_id, logprob=entry.logprob,
                rank=entry.rank,
                top=[common_pb2.TokenLogprob(token_id=t.token_id, logprob=t.logprob)
                     for t in entry.top]))
        output.embedding.extend(delta.embedding)
        outputs.append(output)
    return engine_pb2.EngineGenerateResponse(request_id=update.request_id, outputs=outputs,
                                             usage=usage_to_pb(update.usage))


def model_info_to_pb(manifest: Manifest, info: CoreInfo, config: EngineConfig
                     ) -> engine_pb2.ModelInfo:
    caps = manifest.capabilities
    return engine_pb2.ModelInfo(
        model_id=manifest.model_id, served_names=list(manifest.served_names),
        identity=manifest.identity_bytes, architecture=manifest.architecture,
        dtype=info.dtype, max_model_len=info.max_model_len, vocab_size=info.vocab_size,
        eos_token_ids=list(manifest.eos_token_ids),
        capabilities=common_pb2.Capabilities(tools=caps.tools,
                                             vision=caps.vision and info.vision,
                                             reasoning=caps.reasoning),
        max_num_seqs=info.max_num_seqs, page_size=info.page_size, num_pages=info.num_pages,
        prefill_chunk_size=info.prefill_chunk_size, device=info.device,
        context_hint=manifest.context_hint or config.context_hint,
        capacity_hint=manifest.capacity_hint or config.capacity_hint,
        num_parameters=manifest.num_parameters, weight_bytes=manifest.weight_bytes,
        max_waiting=config.waiting_capacity)


def load_query_from_pb(message: engine_pb2.GetLoadRequest) -> LoadQuery:
    after = message.completions_after if message.HasField("completions_after") else None
    return LoadQuery(message.include_requests, message.include_graphs, after)


def load_to_pb(load: LoadSnapshot) -> engine_pb2.LoadSnapshot:
    message = engine_pb2.LoadSnapshot(
        session_id=load.session_id, sample_time_s=load.sample_time_s, uptime_s=load.uptime_s,
        slots_total=load.slots_total, slots_live=load.slots_live, slots_free=load.slots_free,
        slots_retiring=load.slots_retiring, num_running=load.num_running,
        num_waiting=load.num_waiting, pages_total=load.pages_total,
        pages_free=load.pages_free, pages_cached=load.pages_cached,
        pages_retiring=load.pages_retiring, checkpoints_cached=load.checkpoints_cached,
        kv_cache_usage=load.kv_cache_usage, requests_admitted=load.requests_admitted,
        requests_completed=load.requests_completed,
        requests_cancelled=load.requests_cancelled, requests_failed=load.requests_failed,
        requests_rejected=load.requests_rejected, prefix_lookups=load.prefix_lookups,
        prefix_hits=load.prefix_hits, prefix_misses=load.prefix_misses,
        prefix_reused_tokens=load.prefix_reused_tokens,
        prefix_query_tokens=load.prefix_query_tokens,
        checkpoints_published=load.checkpoints_published,
        checkpoints_evicted=load.checkpoints_evicted, prompt_tokens=load.prompt_tokens,
        generation_tokens=load.generation_tokens, preemptions=load.preemptions,
        launches_by_kind=load.launches_by_kind, tokens_last_minute=load.tokens_last_minute,
        admission_paused=load.admission_paused, draining=load.draining,
        dropped_updates=load.dropped_updates, expert_tokens=load.expert_tokens,
        moe_layers=load.moe_layers, experts_per_token=load.experts_per_token)
    for g in load.graphs:
        message.graphs.append(engine_pb2.GraphStats(
            kind=g.kind, label=g.label, batch_capacity=g.batch_capacity,
            token_capacity=g.token_capacity, calls=g.calls, mean_gpu_ms=g.mean_gpu_ms,
            max_gpu_ms=g.max_gpu_ms, untimed=g.untimed, requests_total=g.requests_total,
            stale=g.stale, total_gpu_ms=g.total_gpu_ms))
    for r in load.requests:
        message.requests.append(engine_pb2.RequestRow(
            slot=r.slot, generation=r.generation, phase=r.phase,
            prompt_consumed=r.prompt_consumed, prompt_len=r.prompt_len,
            output_tokens=r.output_tokens, gap_ms=r.gap_ms, out_ms=r.out_ms, bursts=r.bursts))
    for c in load.completions:
        message.completions.append(engine_pb2.CompletionRecord(
            sequence=c.sequence, time_s=c.time_s, kind=c.kind, label=c.label, gpu_ms=c.gpu_ms,
            requests=[engine_pb2.RequestRef(slot=h.slot, generation=h.generation)
                      for h in c.requests],
            prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens))
    if load.host_tier is not None:
        h = load.host_tier
        message.host_tier.CopyFrom(engine_pb2.HostTierLoad(
            pages_total=h.pages_total, pages_cached=h.pages_cached,
            blocks_offloaded=h.blocks_offloaded, blocks_dropped=h.blocks_dropped,
            blocks_evicted=h.blocks_evicted, hits=h.hits, reused_tokens=h.reused_tokens))
    if load.speculative is not None:
        v = load.speculative
        message.speculative.CopyFrom(engine_pb2.SpeculativeLoad(
            method=v.method, num_speculative_tokens=v.num_speculative_tokens,
            num_drafts=v.num_drafts, num_draft_tokens=v.num_draft_tokens,
            num_accepted_tokens=v.num_accepted_tokens,
            num_accepted_tokens_per_pos=list(v.num_accepted_tokens_per_pos),
            verification_steps=v.verification_steps, drafter_steps=v.drafter_steps,
            rounds=v.rounds, depth=v.depth, switched_off=v.switched_off))
    return message


def admission_to_pb(state: AdmissionState) -> engine_pb2.AdmissionState:
    return engine_pb2.AdmissionState(paused=state.paused, draining=state.draining,
                                     active_requests=state.active_requests)


def drain_to_pb(result: DrainResult) -> engine_pb2.DrainResponse:
    return engine_pb2.DrainResponse(drained=result.drained,
                                    cancelled_requests=result.cancelled_requests,
                                    message=result.message)


def prefix_event_to_pb(event: BlockEvent, sequence: int, session_id: str,
                       block_tokens: int) -> engine_pb2.PrefixEvent:
    message = engine_pb2.PrefixEvent(sequence=sequence, session_id=session_id)
    if event.cleared:
        message.cleared.CopyFrom(engine_pb2.CacheCleared())
    elif event.stored:
        message.stored.CopyFrom(engine_pb2.BlocksStored(
            block_hashes=list(event.block_keys), parent_hash=event.parent_key,
            block_tokens=block_tokens, medium=event.medium))
    else:
        message.removed.CopyFrom(engine_pb2.BlocksRemoved(block_hashes=list(event.block_keys),
                                                          medium=event.medium))
    return message
