"""Prompt expansion: one placeholder token per image -> the image's token span and mRoPE rows.

The rendered prompt holds one `image_token_id` per image (after `vision_start_token_id`, as
Qwen-VL templates write it). Expansion replaces placeholder i by `num_tokens(i)` copies of the
placeholder and computes what the model's multimodal rotary embedding needs, exactly as
transformers' Qwen-VL `get_rope_index` does for still images:

- text tokens advance one position on all three rows (T, H, W);
- an image of merged grid (t, h, w) starting at position s gets T = s + frame, H = s + row,
  W = s + column over its tokens in row-major order, and the next token starts at s + max(h, w);
- `rope_delta` = (largest position + 1) - expanded length: generated token k sits at
  position (expanded length + k + rope_delta) on every row.

Message endpoints (token counts at message boundaries) move past the spans in one ordered pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.common.errors import ValidationError
from services.imageprep.prepared import ImageGeometry

TEXT, IMAGE = 0, 1


@dataclass(frozen=True, slots=True)
class ExpandedPrompt:
    token_ids: np.ndarray                 # [L] int64: the prompt with every span expanded
    modality_ids: np.ndarray              # [L] uint8: 0 text, 1 image
    mrope_positions: np.ndarray           # [3, L] int32: T, H, W rows
    rope_delta: int
    token_offsets: tuple[int, ...]        # per image: position of its first span token
    message_token_ends: tuple[int, ...]   # endpoints after expansion


def _placeholders(ids: np.ndarray, num_images: int, image_token_id: int,
                  vision_start_token_id: int | None) -> np.ndarray:
    found = np.flatnonzero(ids == image_token_id)
    if len(found) != num_images:
        raise ValidationError(
            f"the prompt holds {len(found)} image placeholder token(s) (id {image_token_id}) but "
            f"{num_images} image(s) were sent", param="prompt_token_ids")
    if len(found) > 1 and np.any(np.diff(found) == 1):
        raise ValidationError("image placeholders must not be adjacent: each image is one "
                              "placeholder token in its own vision block", param="prompt_token_ids")
    if vision_start_token_id is not None:
        bad = [int(p) for p in found if p == 0 or ids[p - 1] != vision_start_token_id]
        if bad:
            raise ValidationError(
                f"image placeholder at prompt position {bad[0]} does not follow the vision-start "
                f"token (id {vision_start_token_id})", param="prompt_token_ids")
    return found


def _shift_endpoints(ends: Sequence[int], placeholders: np.ndarray, extra: Sequence[int],
                     prompt_len: int) -> tuple[int, ...]:
    """Move each endpoint past the extra tokens of every placeholder before it (one pass)."""
    shifted: list[int] = []
    added = 0
    next_image = 0
    previous = -1
    for end in ends:
        if end <= previous or end > prompt_len:
            raise ValidationError(
                f"message_token_ends must increase strictly and stay within the prompt "
                f"({prompt_len} tokens); got {list(ends)}", param="message_token_ends")
        while next_image < len(placeholders) and placeholders[next_image] < end:
            added += extra[next_image]
            next_image += 1
        shifted.append(end + added)
        previous = end
    return tuple(shifted)


def expand_prompt(prompt_token_ids: Sequence[int], images: Sequence[ImageGeometry], *,
                  image_token_id: int, vision_start_token_id: int | None = None,
                  message_token_ends: Sequence[int] = ()) -> ExpandedPrompt:
    ids = np.asarray(prompt_token_ids, dtype=np.int64)
    placeholders = _placeholders(ids, len(images), image_token_id, vision_start_token_id)
    spans = [g.num_tokens for g in images]
    total = len(ids) + sum(spans) - len(images)
    token_ids = np.empty(total, dtype=np.int64)
    modality = np.zeros(total, dtype=np.uint8)
    positions = np.empty((3, total), dtype=np.int64)
    offsets: list[int] = []
    source = out = position = 0
    for index, geometry in zip(placeholders.tolist(), images, strict=True):
        text = index - source                            # text tokens before this image
        token_ids[out:out + text] = ids[source:index]
        positions[:, out:out + text] = np.arange(position, position + text)
        out += text
        position += text
        t, h, w = geometry.llm_grid
        span = t * h * w
        token_ids[out:out + span] = image_token_id
        modality[out:out + span] = IMAGE
        positions[0, out:out + span] = position + np.repeat(np.arange(t), h * w)
        positions[1, out:out + span] = position + np.tile(np.repeat(np.arange(h), w), t)
        positions[2, out:out + span] = position + np.tile(np.arange(w), t * h)
        offsets.append(out)
        out += span
        position += max(h, w)
        source = index + 1
    tail = len(ids) - source
    token_ids[out:] = ids[source:]
    positions[:, out:] = np.arange(position, position + tail)
    rope_delta = int(positions.max()) + 1 - total if total else 0
    if total and positions.max() >= 2**31:
        raise ValidationError("the expanded prompt is too long for int32 positions")
    ends = _shift_endpoints(message_token_ends, placeholders, [s - 1 for s in spans], len(ids))
    return ExpandedPrompt(token_ids=token_ids, modality_ids=modality,
                          mrope_positions=positions.astype(np.int32), rope_delta=rope_delta,
                          token_offsets=tuple(offsets), message_token_ends=ends)
