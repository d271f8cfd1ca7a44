"""Engine and imageprep messages <-> frontend domain objects.

Requests from the gateway and the events sent back are converted by the shared
`services.common.api.convert` (the servicer calls it); this module is the frontend's own
protobuf edge towards its upstreams, reusing the shared sampling, usage and finish-reason
conversions.
"""

from __future__ import annotations

from services.common.api.chat import ImagePart
from services.common.api.convert import finish_reason_from_pb, sampling_to_pb, usage_from_pb
from services.common.core import NO_IMAGE_LIMITS, ImageLimits
from services.common.pb import engine_pb2, imageprep_pb2
from services.frontend.generate.types import (
    ChoiceStep,
    EngineRequest,
    EngineStep,
    ExpandedPrompt,
    PromptLogprobEntry,
    SampledLogprob,
)
from services.frontend.structured.grammar import GrammarKind

_GRAMMAR_KINDS = {
    GrammarKind.JSON_SCHEMA: engine_pb2.GRAMMAR_KIND_JSON_SCHEMA,
    GrammarKind.JSON_OBJECT: engine_pb2.GRAMMAR_KIND_JSON_OBJECT,
    GrammarKind.REGEX: engine_pb2.GRAMMAR_KIND_REGEX,
    GrammarKind.LARK: engine_pb2.GRAMMAR_KIND_LARK,
}


def engine_request_to_pb(request: EngineRequest) -> engine_pb2.EngineGenerateRequest:
    message = engine_pb2.EngineGenerateRequest(
        request_id=request.request_id,
        prompt_token_ids=request.prompt_token_ids,
        sampling=sampling_to_pb(request.sampling),
        checkpoint_token_ends=list(request.checkpoint_token_ends),
        n=request.n,
        priority=request.priority,
        embed=request.embed,
        cache_salt=request.cache_salt,
    )
    if request.prompt_logprobs is not None:
        message.prompt_logprobs = request.prompt_logprobs
    if request.multimodal:
        message.multimodal.ParseFromString(request.multimodal)
    if request.grammar is not None:
        message.grammar.CopyFrom(engine_pb2.Grammar(
            kind=_GRAMMAR_KINDS[request.grammar.kind], text=request.grammar.text,
            lenient=request.grammar.lenient))
    return message


def engine_step_from_pb(response: engine_pb2.EngineGenerateResponse) -> EngineStep:
    outputs = []
    for output in response.outputs:
        logprobs = tuple(
            SampledLogprob(lp.token_id, lp.logprob,
                           tuple((top.token_id, top.logprob) for top in lp.top))
            for lp in output.logprobs)
        outputs.append(ChoiceStep(
            index=output.index,
            token_ids=tuple(output.token_ids),
            logprobs=logprobs,
            finish_reason=finish_reason_from_pb(output.finish_reason),
            stop_token_id=output.stop_token_id if output.HasField("stop_token_id") else None,
            prompt_logprobs=tuple(
                PromptLogprobEntry(e.position, e.token_id, e.logprob, e.rank,
                                   tuple((t.token_id, t.logprob) for t in e.top))
                for e in output.prompt_logprobs),
            embedding=tuple(output.embedding),
        ))
    return EngineStep(tuple(outputs), usage_from_pb(response.usage))


def prepare_images_to_pb(*, request_id: str, profile: str, images: tuple[ImagePart, ...],
                         prompt_token_ids: list[int], image_token_id: int,
                         vision_start_token_id: int | None,
                         message_token_ends: tuple[int, ...],
                         limits: ImageLimits = NO_IMAGE_LIMITS) -> imageprep_pb2.PrepareRequest:
    message = imageprep_pb2.PrepareRequest(
        request_id=request_id, profile=profile, prompt_token_ids=prompt_token_ids,
        image_token_id=image_token_id, message_token_ends=list(message_token_ends))
    if limits.max_image_pixels:      # the core's limits, applied by imageprep beside its own
        message.max_image_pixels = limits.max_image_pixels
    if limits.max_image_bytes:
        message.max_image_bytes = limits.max_image_bytes
    if limits.max_image_pixels or limits.max_image_bytes:
        message.limits_source = ImageLimits.ORIGIN
    if vision_start_token_id is not None:
        message.vision_start_token_id = vision_start_token_id
    for image in images:        # added in place: a data URL of megabytes is copied once
        if image.url:
            message.images.add(data_url=image.url, media_type=image.media_type)
        else:
            message.images.add(data=image.data, media_type=image.media_type)
    return message


def expanded_prompt_from_pb(response: imageprep_pb2.PrepareResponse) -> ExpandedPrompt:
    return ExpandedPrompt(list(response.expanded_token_ids),
                          tuple(response.message_token_ends),
                          response.multimodal.SerializeToString())
