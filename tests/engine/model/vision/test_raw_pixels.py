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
