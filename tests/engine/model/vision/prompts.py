"""Multimodal test prompts: random text around image placeholders, expanded by imageprep
(ids, modality, mRoPE rows, rope delta, span offsets) with imageprep-prepared pictures, and
transformers' greedy reference for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from services.imageprep.expansion import expand_prompt
from tests.engine.model.vision.checkpoints import (
    IMAGE_TOKEN,
    VISION_END,
    VISION_START,
    prepared_image,
)


@dataclass
class Prompt:
    ids: list[int]
    modality: list[int]
    positions: list[list[int]]
    rope_delta: int
    offsets: tuple[int, ...]
    images: list[Any]          # PreparedImage


def compose(segments: list[Any]) -> Prompt:
    """A prompt from text (lists of ids) and images (PreparedImage, each written as
    vision-start, placeholder, vision-end), expanded by imageprep."""
    ids: list[int] = []
    images = []
    for segment in segments:
        if isinstance(segment, list):
            ids += segment
        else:
            ids += [VISION_START, IMAGE_TOKEN, VISION_END]
            images.append(segment)
    expanded = expand_prompt(ids, [image.geometry for image in images],
                             image_token_id=IMAGE_TOKEN, vision_start_token_id=VISION_START)
    return Prompt(expanded.token_ids.tolist(), expanded.modality_ids.tolist(),
                  expanded.mrope_positions.astype("int64").tolist(), expanded.rope_delta,
                  expanded.token_offsets, images)


def random_text(count: int, seed: int) -> list[int]:
    return torch.randint(0, 290, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def build_prompt(profile: str, sizes: tuple[tuple[int, int], ...], seed: int) -> Prompt:
    segments: list[Any] = []
    for index, (h, w) in enumerate(sizes):
        segments += [random_text(3 + index, seed * 100 + index),
                     prepared_image(profile, h, w, seed * 10 + index)]
    return compose([*segments, random_text(5, seed * 100 + 99)])


def reference_generate(reference: Any, prompt: Prompt, new_tokens: int
                       ) -> tuple[list[int], list[float]]:
    ids = torch.tensor([prompt.ids])
    kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids)}
    if prompt.images:
        kwargs["pixel_values"] = torch.cat([torch.from_numpy(i.tensors["pixel_values"])
                                            for i in prompt.images])
        kwargs["image_grid_thw"] = torch.cat([torch.from_numpy(i.tensors["grid_thw"])
                                              for i in prompt.images])
        kwargs["mm_token_type_ids"] = torch.tensor([prompt.modality])
    with torch.no_grad():
        out = reference.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                                 return_dict_in_generate=True, output_logits=True, **kwargs)
    tokens = out.sequences[0, len(prompt.ids):].tolist()
    logprobs = [float(torch.log_softmax(step[0].float(), -1)[t])
                for step, t in zip(out.logits, tokens, strict=True)]
    return tokens, logprobs


