"""Greedy parity of the Qwen2.5-VL and Qwen3-VL engine models with transformers `generate`
(float32, CPU), through the real loader on saved safetensors checkpoints, with pixels from
imageprep's own pipeline and positions from its prompt expansion: text only, one image at
several sizes and aspect ratios, two images in one prompt; each alone, then all of them
together in one batch with chunked prefill (chunks cut image spans and mix with decodes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from services.engine.model.vision.inputs import ImageFeatures, VisionInput
from services.imageprep.expansion import expand_prompt
from tests.engine.model.vision.checkpoints import (
    IMAGE_TOKEN,
    SPECS,
    VISION_END,
    VISION_START,
    prepared_image,
)
from tests.engine.model.vision.driver import VLDriver

NEW_TOKENS = 6
# (height, width) of the source pictures per prompt; () is text only
CASES = {"text": (), "one-wide": ((150, 230),), "one-tall": ((300, 120),),
         "two": ((140, 140), (120, 260))}


@dataclass
class Prompt:
    ids: list[int]
    modality: list[int]
    positions: list[list[int]]
    rope_delta: int
    offsets: tuple[int, ...]
    images: list[Any]          # PreparedImage


def build_prompt(profile: str, sizes: tuple[tuple[int, int], ...], seed: int) -> Prompt:
    generator = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    images = []
    for index, (h, w) in enumerate(sizes):
        ids += torch.randint(0, 290, (3 + index,), generator=generator).tolist()
        ids += [VISION_START, IMAGE_TOKEN, VISION_END]
        images.append(prepared_image(profile, h, w, seed * 10 + index))
    ids += torch.randint(0, 290, (5,), generator=generator).tolist()
    expanded = expand_prompt(ids, [image.geometry for image in images],
                             image_token_id=IMAGE_TOKEN, vision_start_token_id=VISION_START)
    return Prompt(expanded.token_ids.tolist(), expanded.modality_ids.tolist(),
                  expanded.mrope_positions.astype("int64").tolist(), expanded.rope_delta,
                  expanded.token_offsets, images)


def reference_generate(reference: Any, prompt: Prompt) -> tuple[list[int], list[float]]:
    ids = torch.tensor([prompt.ids])
    kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids)}
    if prompt.images:
        kwargs["pixel_values"] = torch.cat([torch.from_numpy(i.tensors["pixel_values"])
                                            for i in prompt.images])
        kwargs["image_grid_thw"] = torch.cat([torch.from_numpy(i.tensors["grid_thw"])
                                              for i in prompt.images])
        kwargs["mm_token_type_ids"] = torch.tensor([prompt.modality])
    with torch.no_grad():
        out = reference.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                 return_dict_in_generate=True, output_logits=True, **kwargs)
    tokens = out.sequences[0, len(prompt.ids):].tolist()
    logprobs = [float(torch.log_softmax(step[0].float(), -1)[t])
                for step, t in zip(out.logits, tokens, strict=True)]
    return tokens, logprobs


def encode(model: Any, prompt: Prompt) -> list[tuple[int, ImageFeatures]]:
    merge = model.vl_config.vision.spatial_merge_size
    inputs = [VisionInput.from_tensors(i.identity, i.tensors, merge) for i in prompt.images]
    return list(zip(prompt.offsets, model.encode_images(inputs), strict=True))


@pytest.fixture(scope="module")
def prompts() -> dict[str, dict[str, Prompt]]:
    return {name: {case: build_prompt(spec.profile, sizes, seed)
                   for seed, (case, sizes) in enumerate(CASES.items())}
            for name, spec in SPECS.items()}


@pytest.fixture(scope="module")
def expected(prompts: dict[str, dict[str, Prompt]], vl_reference_models: dict[str, Any]
             ) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    return {name: {case: reference_generate(vl_reference_models[name], prompt)
                   for case, prompt in cases.items()} for name, cases in prompts.items()}


def check(seq: Any, want: tuple[list[int], list[float]], label: str) -> None:
    tokens, logprobs = want
    assert seq.generated == tokens, label
    assert seq.logprobs == pytest.approx(logprobs, abs=1e-4), label


@pytest.mark.parametrize("name", sorted(SPECS))
def test_alone(name: str, prompts: dict[str, dict[str, Prompt]], expected: Any,
               vl_engine_models: dict[str, Any]) -> None:
    model = vl_engine_models[name]
    for case, prompt in prompts[name].items():
        driver = VLDriver(model)
        seq = driver.add(prompt.ids, prompt.positions, prompt.rope_delta,
                         encode(model, prompt), NEW_TOKENS)
        driver.run()
        check(seq, expected[name][case], f"{name}/{case}")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_concurrent_chunked(name: str, prompts: dict[str, dict[str, Prompt]], expected: Any,
                            vl_engine_models: dict[str, Any]) -> None:
    """Every case in one batch, prefilled in 13-token chunks (image spans cut across steps,
    prompt chunks beside other sequences' decodes); the images of all prompts encoded in one
    packed tower pass."""
    model = vl_engine_models[name]
    cases = prompts[name]
    merge = model.vl_config.vision.spatial_merge_size
    inputs = [VisionInput.from_tensors(i.identity, i.tensors, merge)
              for p in cases.values() for i in p.images]
    features = iter(model.encode_images(inputs))
    driver = VLDriver(model, seed=3)
    seqs = {}
    for case, prompt in cases.items():
        images = [(offset, next(features)) for offset in prompt.offsets]
        seqs[case] = driver.add(prompt.ids, prompt.positions, prompt.rope_delta, images,
                                NEW_TOKENS + 2 * len(seqs))
    driver.run(chunk_size=13)
    for case, seq in seqs.items():
        want_tokens, want_logprobs = expected[name][case]
        n = NEW_TOKENS
        check(type("S", (), {"generated": seq.generated[:n], "logprobs": seq.logprobs[:n]}),
              (want_tokens, want_logprobs), f"{name}/{case} batched")


def test_image_changes_the_answer(prompts: dict[str, dict[str, Prompt]], expected: Any) -> None:
    """The checkpoints are sensitive to the pixels: a model that ignored the image features
    would not pass the parity tests above by accident."""
    for name in SPECS:
        alone = expected[name]["one-wide"][0]
        assert alone != expected[name]["text"][0] or alone != expected[name]["one-tall"][0]
