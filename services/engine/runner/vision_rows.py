"""A vision-language model's step inputs on the GraphRunner: mRoPE positions and image rows.

    offsets = graph_offsets(step, layout, prompts)     # [T] or None (the step runs eagerly)
    rows = eager_rows(step, layout, prompts)           # [3 * T]: the T, H, W rows in turn
    embeds = step_embeds(step, layout, prompts, vision)   # ImageEmbeds | None

An mRoPE model reads three position rows per token. Text tokens have the same value v on all
three; past the prompt v = p + rope_delta (p the token's index). So a decode step (or a
verification of drafts) needs one int per row, `v - p`, added to the index on every row
inside the CUDA graph (step_body: positions + rope_offsets); a step that feeds image rows,
or prompt rows whose three values differ, runs eagerly with its [3, T] rows and the image
features of its image rows. `prompts` holds each slot's multimodal prompt (None: text only).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from services.engine.model.vision.inputs import ImageEmbeds
from services.engine.runner.layout import StepLayout
from services.engine.scheduler.plan import Step
from services.engine.vision.prompt import MultimodalPrompt
from services.engine.vision.stage import VisionStage, step_positions

Prompts = Mapping[int, MultimodalPrompt | None]


def graph_offsets(step: Step, layout: StepLayout, prompts: Prompts) -> list[int] | None:
    """Each fed row's position minus its index (the same on all three rows), or None when
    some fed row is an image row or has differing rows (the step must run eagerly)."""
    offsets: list[int] = []
    for index in layout.forward_seqs:
        seq = step.seqs[index]
        count = seq.end - seq.start
        prompt = prompts.get(seq.handle.slot)
        if prompt is None:
            offsets.extend([0] * count)
        elif seq.start >= prompt.prompt_len:                  # generated tokens
            offsets.extend([prompt.rope_delta] * count)
        else:
            if next(prompt.spans_in(seq.start, seq.end), None) is not None:
                return None
            rows = prompt.position_rows(seq.start, seq.end)
            if not ((rows[0] == rows[1]).all() and (rows[0] == rows[2]).all()):
                return None
            offsets.extend((rows[0] - np.arange(seq.start, seq.end)).tolist())
    return offsets


def _fed(step: Step, layout: StepLayout, prompts: Prompts
         ) -> list[tuple[MultimodalPrompt | None, int, int]]:
    return [(prompts.get(step.seqs[i].handle.slot), step.seqs[i].start, step.seqs[i].end)
            for i in layout.forward_seqs]


def eager_rows(step: Step, layout: StepLayout, prompts: Prompts) -> np.ndarray:
    """int64 [3 * T]: the step's [3, T] mRoPE positions, row after row."""
    return step_positions(_fed(step, layout, prompts)).reshape(-1)


def step_embeds(step: Step, layout: StepLayout, prompts: Prompts, vision: VisionStage | None
                ) -> ImageEmbeds | None:
    """The image features of the step's image rows (the vision stage's: prepared before the
    step was committed, cached, or encoded now); None when it feeds none."""
    with_images = [(first, prompt, start, end) for first, (prompt, start, end)
                   in zip(layout.query_start_loc, _fed(step, layout, prompts), strict=False)
                   if prompt is not None]
    if not with_images:
        return None
    if vision is None:
        from services.common.errors import WorkerFailure

        raise WorkerFailure("a step feeds image tokens but the runner has no vision stage")
    return vision.embeds(with_images, step.fence)
