"""Greedy parity of the Qwen2.5-VL and Qwen3-VL engine models with transformers `generate`
(float32, CPU), through the real loader on saved safetensors checkpoints, with pixels from
imageprep's own pipeline and positions from its prompt expansion: text only, one image at
several sizes and aspect ratios, two images in one prompt; each alone, then all of them
together in one batch with chunked prefill (chunks cut image spans and mix with decodes)."""

from __future__ import annotations

from typing import Any

import pytest

from services.engine.model.vision.inputs import ImageFeatures, VisionInput
from tests.engine.model.vision.checkpoints import SPECS
from tests.engine.model.vision.driver import VLDriver
from tests.engine.model.vision.prompts import Prompt, build_prompt, reference_generate

NEW_TOKENS = 6
# (height, width) of the source pictures per prompt; () is text only
CASES = {"text": (), "one-wide": ((150, 230),), "one-tall": ((300, 120),),
         "two": ((140, 140), (120, 260))}


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
    return {name: {case: reference_generate(vl_reference_models[name], prompt, NEW_TOKENS)
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
