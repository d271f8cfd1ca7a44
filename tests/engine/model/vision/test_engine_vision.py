"""The tiny Qwen2.5-VL / Qwen3-VL checkpoints through the whole engine core (wire's
multimodal conversion, scheduler, TorchRunner with the vision stage), against transformers'
greedy generate: concurrent text and image requests with small prefill chunks (no chunk
cuts an image span), decode positions from the rope delta, a prefix hit across an image (no
encoding), the feature cache (the same image twice: the encoder runs once), two requests
that differ only in the image (no KV shared past it), and refusals."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from services.common.core import open_model
from services.common.errors import UnsupportedError, ValidationError
from services.common.pb import common_pb2
from services.engine.core.telemetry import Telemetry
from services.engine.prefix.history import ConditioningEvent
from services.engine.scheduler.requests import EngineRequest
from services.engine.wire import multimodal_from_pb
from tests.engine.model.vision.checkpoints import SPECS, prepared_image
from tests.engine.model.vision.prompts import Prompt, compose, random_text, reference_generate
from tests.engine.runner.conftest import greedy_request, make_engine

NEW = 5


class DictPixels:
    """The pixel source, served from prepared images in memory (counts what is fetched):
    pixel_values, or with `raw` what FetchPixels' uint8 form sends (the engine's default)."""

    def __init__(self, raw: bool = False) -> None:
        self.images: dict[bytes, dict[str, np.ndarray]] = {}
        self.fetched: list[bytes] = []
        self.raw = raw

    def add(self, prompt: Prompt) -> None:
        for image in prompt.images:
            self.images[image.identity] = image.raw_tensors() if self.raw else \
                dict(image.named_tensors())

    def fetch(self, identities):
        self.fetched += list(identities)
        return [self.images[i] for i in identities]


def to_pb(prompt: Prompt) -> common_pb2.MultimodalInputs:
    message = common_pb2.MultimodalInputs(
        mrope_positions=np.asarray(prompt.positions, dtype="<i4").tobytes(),
        rope_delta=prompt.rope_delta)
    for offset, image in zip(prompt.offsets, prompt.images, strict=True):
        g = image.geometry
        message.images.append(common_pb2.ImageDescriptor(
            identity=image.identity, token_offset=offset, num_tokens=g.num_tokens,
            grid_t=g.grid_t, grid_h=g.grid_h, grid_w=g.grid_w))
    return message


def request(rid: str, prompt: Prompt, ends: tuple[int, ...] = ()) -> EngineRequest:
    base = greedy_request(rid, prompt.ids, NEW, ends=ends)
    if not prompt.images:
        return base
    events = tuple(ConditioningEvent(o, i.identity)
                   for o, i in zip(prompt.offsets, prompt.images, strict=True))
    return dataclasses.replace(base, conditioning=events,
                               multimodal=multimodal_from_pb(to_pb(prompt), len(prompt.ids)))


def drive(engine: Any, telemetry: Telemetry | None = None
          ) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Plan, submit, complete until idle (as the core loop does, recording each completed
    step for the dashboard when given a telemetry)."""
    tokens: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    scheduler, runner = engine.scheduler, engine.runner
    for _ in range(5_000):
        plan = scheduler.plan()
        if plan is not None:
            runner.submit(scheduler.commit(plan, scheduler.state.resources.fences.next_fence))
        updates = []
        while (completion := runner.poll()) is not None:
            step = scheduler.state.in_flight.get(completion.fence)
            updates += scheduler.complete(completion)
            if telemetry is not None and step is not None:
                telemetry.record(step, completion, {})
        for update in updates:
            for delta in update.deltas:
                tokens.setdefault(update.request_id, []).extend(delta.token_ids)
            cached[update.request_id] = max(cached.get(update.request_id, 0),
                                            update.usage.cached_tokens)
        if not engine.scheduler.has_work:
            return tokens, cached
    raise AssertionError("did not finish")


@pytest.fixture(scope="module", params=sorted(SPECS))
def setup(request: Any, vl_checkpoint_dirs: Any, vl_reference_models: Any):
    name = request.param
    source = open_model(vl_checkpoint_dirs[name])
    engine = make_engine(source, page_size=4, prefill_chunk_size=64,
                         max_num_batched_tokens=64, imageprep_address="127.0.0.1:9")
    pixels = DictPixels()
    engine.runner.vision.pixels = pixels
    spans: list[tuple[int, int, int]] = []        # (first feature row, count, span tokens)
    embeds = engine.runner.vision.embeds

    def recording(rows, fence):
        for _, prompt, start, end in rows:
            spans.extend((first, count, image.num_tokens)
                         for image, first, count in prompt.spans_in(start, end))
        return embeds(rows, fence)

    engine.runner.vision.embeds = recording
    return name, engine, pixels, spans, vl_reference_models[name]


def test_concurrent_text_and_images(setup) -> None:
    name, engine, pixels, spans, reference = setup
    profile = SPECS[name].profile
    prompts = {
        "text": compose([random_text(20, 1)]),
        "one": compose([random_text(4, 2), prepared_image(profile, 150, 230, 1),
                        random_text(6, 3)]),
        "two": compose([random_text(3, 4), prepared_image(profile, 140, 140, 2),
                        random_text(2, 5), prepared_image(profile, 300, 120, 3),
                        random_text(4, 6)]),
    }
    for rid, prompt in prompts.items():
        pixels.add(prompt)
        engine.scheduler.admit(request(rid, prompt))
    telemetry = Telemetry("test", enabled_until=float("inf"))
    tokens, _ = drive(engine, telemetry)
    for rid, prompt in prompts.items():
        assert tokens[rid] == reference_generate(reference, prompt, NEW)[0], rid
    # the dashboard's vision rows: one record per step that ran the encoder, with its time
    vision = [r for r in telemetry.records if r.kind == "vision"]
    assert sum(int(r.label.split()[0]) for r in vision) == 3
    assert all(r.gpu_ms > 0 for r in vision)
    # every image went through in one step, whole (64-token chunks and budget would cut them)
    assert spans and all(first == 0 and count == total for first, count, total in spans)
    assert len(pixels.fetched) == 3


def test_prefix_hit_feature_cache_and_image_identity(setup) -> None:
    name, engine, pixels, _, reference = setup
    profile = SPECS[name].profile
    red, blue = prepared_image(profile, 200, 200, 11), prepared_image(profile, 200, 200, 12)
    head, tail = random_text(5, 20), random_text(6, 21)
    first = compose([head, red, tail])
    same_pixels_new_text = compose([random_text(7, 22), red, tail])
    other_image = compose([head, blue, tail])
    follow_up = compose([head, red, tail, random_text(9, 23)])
    for prompt in (first, other_image):
        pixels.add(prompt)
    end = len(first.ids) - 2                       # a checkpoint past the image
    stage = engine.runner.vision
    before = stage.counters.images_encoded
    engine.scheduler.admit(request("first", first, ends=(end,)))
    tokens, _ = drive(engine)
    assert stage.counters.images_encoded == before + 1
    # the same picture after other text: the prefix misses, the feature cache hits
    engine.scheduler.admit(request("cache-hit", same_pixels_new_text))
    more, _ = drive(engine)
    tokens.update(more)
    assert stage.counters.images_encoded == before + 1
    # a later turn of the conversation: KV reused across the image, nothing fetched
    fetched = len(pixels.fetched)
    engine.scheduler.admit(request("follow-up", follow_up, ends=(end,)))
    more, cached = drive(engine)
    tokens.update(more)
    assert cached["follow-up"] >= end > first.offsets[0] + red.geometry.num_tokens
    assert len(pixels.fetched) == fetched
    # the same tokens with another image: nothing past the image's position is shared
    engine.scheduler.admit(request("other-image", other_image, ends=(end,)))
    more, cached = drive(engine)
    tokens.update(more)
    assert cached.get("other-image", 0) <= first.offsets[0]
    for rid, prompt in (("first", first), ("cache-hit", same_pixels_new_text),
                        ("follow-up", follow_up), ("other-image", other_image)):
        assert tokens[rid] == reference_generate(reference, prompt, NEW)[0], rid
    assert tokens["other-image"] != tokens["first"]


def test_refusals(setup, demo_core) -> None:
    name = setup[0]
    prompt = compose([random_text(4, 30), prepared_image(SPECS[name].profile, 120, 120, 31),
                      random_text(3, 32)])
    message = to_pb(prompt)
    short = common_pb2.MultimodalInputs()
    short.CopyFrom(message)
    short.mrope_positions = message.mrope_positions[:-4]
    with pytest.raises(ValidationError, match="mrope_positions holds"):
        multimodal_from_pb(short, len(prompt.ids))
    outside = common_pb2.MultimodalInputs()
    outside.CopyFrom(message)
    outside.images[0].token_offset = len(prompt.ids) - 2
    with pytest.raises(ValidationError, match="outside the"):
        multimodal_from_pb(outside, len(prompt.ids))
    # a text model refuses images
    text_engine = make_engine(open_model(demo_core, verify=()))
    with pytest.raises(UnsupportedError, match="does not accept images"):
        text_engine.scheduler.admit(request("img", dataclasses.replace(
            prompt, ids=[i % 100 for i in prompt.ids])))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_raw_pixels_give_transformers_tokens(name, vl_checkpoint_dirs, vl_reference_models):
    """The engine's default pixel path: the stage fetches the raw uint8 image and the tower
    computes pixel_values itself; the tokens are transformers' greedy ones."""
    source = open_model(vl_checkpoint_dirs[name])
    engine = make_engine(source, page_size=4, prefill_chunk_size=64,
                         max_num_batched_tokens=64, imageprep_address="127.0.0.1:9")
    pixels = DictPixels(raw=True)
    engine.runner.vision.pixels = pixels
    profile = SPECS[name].profile
    prompt = compose([random_text(4, 12), prepared_image(profile, 170, 250, 12),
                      random_text(5, 13)])
    pixels.add(prompt)
    assert "pixels_hwc" in pixels.images[prompt.images[0].identity]
    engine.scheduler.admit(request("raw", prompt))
    tokens, _ = drive(engine, Telemetry("test", enabled_until=float("inf")))
    assert tokens["raw"] == reference_generate(vl_reference_models[name], prompt, NEW)[0]
    assert pixels.fetched == [prompt.images[0].identity]
