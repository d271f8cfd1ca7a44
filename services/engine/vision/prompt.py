"""A request's multimodal prompt, as the engine runs it (wire.py builds it from
`MultimodalInputs`).

    prompt = MultimodalPrompt(images, positions [3, L] int64, rope_delta)
    prompt.position_rows(start, end)    # [3, end - start]: the prompt's rows, then p + delta
    prompt.chunk_end(start, end)        # a prefill chunk end that never splits an image span
    prompt.spans_in(start, end)         # the image spans (or parts) among positions [start, end)

Images are in prompt order with disjoint spans `[offset, offset + num_tokens)`; each is
identified by imageprep's 32-byte semantic identity (the prefix-cache conditioning event and
the feature-cache key). Generated token k of an L-token prompt is at position L + k +
rope_delta on every row (transformers' Qwen-VL decode rule).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from services.common.errors import ValidationError


@dataclass(frozen=True, slots=True)
class ImageSpan:
    identity: bytes
    offset: int                     # prompt position of the first image-pad token
    num_tokens: int
    grid: tuple[int, int, int]      # (t, h, w) patches before the spatial merge

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens


@dataclass(frozen=True, slots=True, eq=False)
class MultimodalPrompt:
    images: tuple[ImageSpan, ...]
    positions: np.ndarray           # int64 [3, L]
    rope_delta: int = 0

    def __post_init__(self) -> None:
        if self.positions.ndim != 2 or self.positions.shape[0] != 3:
            raise ValidationError(f"mRoPE positions must be [3, L], got "
                                  f"{list(self.positions.shape)}",
                                  param="multimodal.mrope_positions")
        length = self.positions.shape[1]
        previous = 0
        for index, image in enumerate(self.images):
            if image.num_tokens < 1 or image.offset < previous or image.end > length:
                raise ValidationError(
                    f"image {index}'s span [{image.offset}, {image.end}) is empty, overlaps "
                    f"the previous one or lies outside the {length}-token prompt",
                    param=f"multimodal.images[{index}]")
            previous = image.end

    @property
    def prompt_len(self) -> int:
        return int(self.positions.shape[1])

    def position_rows(self, start: int, end: int) -> np.ndarray:
        """int64 [3, end - start]: positions of tokens start..end-1 (past the prompt:
        p + rope_delta on every row)."""
        length = self.prompt_len
        head = self.positions[:, start:min(end, length)]
        if end <= length:
            return head
        tail = np.arange(max(start, length), end, dtype=np.int64) + self.rope_delta
        return np.concatenate((head, np.broadcast_to(tail, (3, tail.shape[0]))), axis=1)

    def chunk_end(self, start: int, end: int) -> int:
        """The end of a prefill chunk [start, end) moved so no image span is split: back
        to the span's start when the chunk reaches into it from before, else (the chunk
        starts inside or at it) on to the span's end."""
        for image in self.images:
            if image.offset < end < image.end:
                return image.offset if image.offset > start else image.end
        return end

    def spans_in(self, start: int, end: int) -> Iterator[tuple[ImageSpan, int, int]]:
        """(image, first feature row, count) of each image part among positions
        [start, end)."""
        for image in self.images:
            lo, hi = max(start, image.offset), min(end, image.end)
            if lo < hi:
                yield image, lo - image.offset, hi - lo
