"""Raw pixels (FetchPixels' `pixel_dtype: "uint8"`, the engine's default): RawPixels computes
the float32 pixel_values imageprep would have sent, bit for bit, at several sizes and with each
profile's normalisation (transformers' own fingerprints: tests/imageprep/test_grpc.py); the
engine's client falls back to pixel_values when an imageprep refuses "uint8"; malformed raw
tensors are refused with what is wrong; `vision_pixels` chooses the path."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch

from services.common.errors import ValidationError
from services.engine.config import EngineConfig
from services.engine.model.vision.inputs import RawPixels, VisionInput
from services.engine.vision.pixels import ImagePrepPixels, assemble
from services.imageprep.convert import chunk_to_pb
from tests.imageprep.images import png
from tests.imageprep.test_service import make_service, request, url_image


async def _fetched(width: int, height: int, profile: str, dtype: str):
    service = make_service()
    try:
        result = await service.prepare(request(url_image(png(width, height)), profile=profile))
        identity = result.images[0].identity
        [image] = await service.fetch([identity])
        chunks = [chunk_to_pb(c) async for c in service.stream([image], dtype)]
    finally:
        service.close()
    [tensors] = assemble(chunks, [identity])
    return identity, tensors, sum(len(c.data) for c in chunks)


@pytest.mark.parametrize("profile", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize(("width", "height"), [(300, 200), (64, 640), (1024, 768)])
async def test_raw_pixels_compute_the_float32_pixel_values(profile, width, height):
    identity, raw, raw_bytes = await _fetched(width, height, profile, "uint8")
    _, values, values_bytes = await _fetched(width, height, profile, "float32")
    image = VisionInput.from_tensors(identity, raw, 2)
    assert isinstance(image.pixel_values, RawPixels)
    assert image.pixel_values.shape == values["pixel_values"].shape
    computed = image.pixel_values.values("cpu")
    assert computed.dtype == torch.float32
    assert np.array_equal(computed.numpy().view(np.int32),
                          values["pixel_values"].view(np.int32))
    assert raw_bytes < values_bytes / 7                      # ~an eighth on the wire
    reference = VisionInput.from_tensors(identity, values, 2)
    assert image.grid == reference.grid
    assert torch.equal(image.positions, reference.positions)


def test_raw_pixels_are_checked():
    hwc = np.zeros((56, 28, 3), dtype=np.uint8)
    good = {"pixels_hwc": hwc, "pixel_norm": np.ones((2, 3), np.float32),
            "patch_layout": np.array([14, 2, 2], np.int64),
            "grid_thw": np.array([[1, 4, 2]], np.int64)}
    assert VisionInput.from_tensors(b"i" * 32, good, 2).num_patches == 8
    with pytest.raises(ValueError, match="spatial merge of 2; this model merges 4"):
        VisionInput.from_tensors(b"i" * 32, good, 4)
    with pytest.raises(ValueError, match="uint8"):
        VisionInput.from_tensors(b"i" * 32, {**good, "pixels_hwc": hwc.astype(np.float32)}, 2)
    with pytest.raises(ValueError, match="not a multiple of patch x merge"):
        VisionInput.from_tensors(b"i" * 32, {**good, "pixels_hwc": hwc[:42]}, 2)
    with pytest.raises(ValueError, match="pixel_norm"):
        VisionInput.from_tensors(b"i" * 32, {**good, "pixel_norm": np.ones(3, np.float32)}, 2)
    with pytest.raises(ValueError, match="grid"):
        VisionInput.from_tensors(b"i" * 32, {**good, "grid_thw": np.array([[1, 4, 4]])}, 2)


class _Refused(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self):
        return "pixel_dtype 'uint8' is not one of float32, bfloat16"


class _OldImagePrep:
    """FetchPixels of an imageprep from before raw pixels: "uint8" is an invalid argument."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def FetchPixels(self, request, timeout):
        self.asked.append(request.pixel_dtype)
        if request.pixel_dtype == "uint8":
            raise _Refused()
        return iter(self.chunks[request.pixel_dtype])


async def test_an_imageprep_without_raw_pixels_is_asked_for_values(caplog):
    service = make_service()
    try:
        result = await service.prepare(request(url_image(png(300, 200))))
        identity = result.images[0].identity
        [image] = await service.fetch([identity])
        old = _OldImagePrep()
        old.chunks = {dtype: [chunk_to_pb(c) async for c in service.stream([image], dtype)]
                      for dtype in ("bfloat16", "float32")}
    finally:
        service.close()
    client = ImagePrepPixels("unix:///nowhere", fallback_dtype="bfloat16")
    client._stub = old
    [first] = client.fetch([identity])
    [second] = client.fetch([identity])
    client.close()
    assert old.asked == ["uint8", "bfloat16", "bfloat16"]     # asked for raw pixels once
    assert first["pixel_values"].dtype == torch.bfloat16
    assert torch.equal(first["pixel_values"], second["pixel_values"])
    assert "does not send raw pixels" in caplog.text


def test_other_fetch_errors_are_not_retried():
    class Gone(_OldImagePrep):
        def FetchPixels(self, request, timeout):
            self.asked.append(request.pixel_dtype)
            raise type("NotFound", (_Refused,), {
                "code": lambda self: grpc.StatusCode.NOT_FOUND,
                "details": lambda self: "image is not retained"})()

    from services.engine.vision.pixels import ImageUnavailable

    client = ImagePrepPixels("unix:///nowhere")
    client._stub = gone = Gone()
    with pytest.raises(ImageUnavailable, match="NOT_FOUND: image is not retained"):
        client.fetch([b"i" * 32])
    client.close()
    assert gone.asked == ["uint8"]


def test_vision_pixels_setting(tmp_path):
    assert EngineConfig(model=str(tmp_path)).vision_pixels == "raw"
    assert EngineConfig(model=str(tmp_path), vision_pixels="values").vision_pixels == "values"
    with pytest.raises(ValidationError, match="vision_pixels must be raw or values"):
        EngineConfig(model=str(tmp_path), vision_pixels="float16")


@pytest.mark.parametrize("fault", ["unavailable", "wrong merge", "wrong patch", "no grid"])
def test_a_bad_image_fails_its_request_alone(fault, vl_checkpoint_dirs):
    """imageprep cannot return an image, or returns tensors this tower cannot take (a
    profile prepared for another model): the requests needing that image end with an
    `unavailable` error that says so; the others, text and image, finish; the engine lives."""
    from services.common.core import open_model
    from services.engine.scheduler.requests import FinishReason
    from services.engine.vision.pixels import ImageUnavailable
    from services.engine.vision.preflight import prepare_plan_images
    from tests.engine.model.vision.checkpoints import prepared_image
    from tests.engine.model.vision.prompts import compose, random_text
    from tests.engine.model.vision.test_engine_vision import DictPixels, request
    from tests.engine.runner.conftest import make_engine

    engine = make_engine(open_model(vl_checkpoint_dirs["qwen2_5_vl"]), page_size=4,
                         prefill_chunk_size=64, max_num_batched_tokens=64,
                         imageprep_address="127.0.0.1:9")
    bad_image, good_image = (prepared_image("qwen2_5_vl", 140, 140, s) for s in (7, 8))

    class Faulty(DictPixels):
        def fetch(self, identities):
            got = super().fetch(identities)
            if bad_image.identity not in identities:
                return got
            if fault == "unavailable":
                raise ImageUnavailable("imageprep lost it")
            index = list(identities).index(bad_image.identity)
            got[index] = tensors = dict(got[index])       # the stored ones stay whole
            if fault == "wrong merge":
                tensors["patch_layout"] = np.array([14, 4, 2], np.int64)
            elif fault == "wrong patch":
                tensors["patch_layout"] = np.array([7, 2, 2], np.int64)
                tensors["grid_thw"] = np.array([[1, 20, 20]], np.int64)
            else:
                del tensors["grid_thw"]
            return got

    pixels = Faulty(raw=True)
    engine.runner.vision.pixels = pixels
    prompts = {"bad": compose([random_text(3, 1), bad_image, random_text(4, 2)]),
               "good": compose([random_text(5, 3), good_image, random_text(2, 4)]),
               "text": compose([random_text(12, 5)])}
    for rid, prompt in prompts.items():
        pixels.add(prompt)
        engine.scheduler.admit(request(rid, prompt))
    scheduler, runner = engine.scheduler, engine.runner
    finished, errors = {}, {}
    while scheduler.has_work:
        plan = scheduler.plan()
        if plan is not None:
            fence = scheduler.state.resources.fences.next_fence
            for update in prepare_plan_images(scheduler, runner.vision, plan, fence):
                errors[update.request_id] = update.deltas[0]
                finished[update.request_id] = update.deltas[0].finish_reason
            plan = scheduler.plan()
            if plan is not None:
                runner.submit(scheduler.commit(plan, fence))
        if runner.outstanding:
            for update in scheduler.complete(runner.wait()):
                for delta in update.deltas:
                    if delta.finish_reason is not None:
                        finished[update.request_id] = delta.finish_reason
    assert finished["bad"] == FinishReason.ERROR
    assert errors["bad"].error_kind == "unavailable"
    expected = "imageprep lost it" if fault == "unavailable" else "cannot use"
    assert expected in errors["bad"].error
    assert finished["good"] != FinishReason.ERROR and finished["text"] != FinishReason.ERROR
