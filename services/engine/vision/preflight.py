"""Before a step is committed: the image features it will feed, prepared on the core's thread.

    failed = prepare_plan_images(scheduler, stage, plan, fence)   # [] or failure updates

For each planned sequence that feeds image rows (positions [start, end) of a prompt with
images), the images' features are taken from the feature cache or fetched from imageprep and
encoded now (VisionStage.prepare), before anything is committed. When imageprep cannot return
an image (it was evicted from every retention tier, or imageprep is down), only the requests
needing it fail, with `unavailable` and the reason; the others keep their prepared features
and the plan is made again without the failed ones.
"""

from __future__ import annotations

import dataclasses
import logging

from services.engine.scheduler.plan import Plan
from services.engine.scheduler.requests import FinishReason, RequestUpdate
from services.engine.scheduler.scheduler import Scheduler
from services.engine.vision.pixels import ImageUnavailable
from services.engine.vision.stage import VisionStage

log = logging.getLogger(__name__)


def plan_images(scheduler: Scheduler, plan: Plan) -> dict[str, list[bytes]]:
    """request id -> identities of the images the plan's fed rows hold."""
    wanted: dict[str, list[bytes]] = {}
    for planned in plan.seqs:
        if not planned.num_tokens:
            continue
        seq = scheduler.state.running.get(planned.handle.slot)
        if seq is None:
            continue
        request = seq.request.request
        prompt = request.multimodal
        if prompt is None:
            continue
        images = [image.identity for image, _, _ in prompt.spans_in(planned.start, planned.end)]
        if images:
            wanted.setdefault(request.request_id, []).extend(images)
    return wanted


def prepare_plan_images(scheduler: Scheduler, stage: VisionStage, plan: Plan, fence: int
                        ) -> list[RequestUpdate]:
    wanted = plan_images(scheduler, plan)
    if not wanted:
        return []
    try:
        stage.prepare([i for images in wanted.values() for i in images], fence)
        return []
    except ImageUnavailable:
        pass
    updates = []
    for request_id, images in wanted.items():       # find the requests whose images fail
        try:
            stage.prepare(images, fence)
        except ImageUnavailable as exc:
            log.warning("request %s: %s", request_id, exc)
            update = scheduler.cancel(request_id, FinishReason.ERROR)
            if update is not None:
                updates.append(dataclasses.replace(update, deltas=tuple(
                    dataclasses.replace(d, error=str(exc), error_kind="unavailable")
                    for d in update.deltas)))
    return updates
