"""FetchPixels' chunk stream in-process: the hand-written wire form, bfloat16 pixel chunks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.common.errors import ValidationError
from services.common.pb import imageprep_pb2
from services.imageprep.config import ImagePrepConfig
from services.imageprep.convert import chunk_to_pb, chunk_to_wire
from services.imageprep.requests import TensorChunk
from services.imageprep.service import pixel_dtype_of
from tests.imageprep.images import png
from tests.imageprep.test_service import make_service, request, url_image


def torch_bits(values: np.ndarray) -> np.ndarray:
    """torch's own CPU float32 -> bfloat16 cast, as bit patterns."""
    converted = torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16)
    return converted.view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("data, last, offset, shape", [
    (b"", True, 0, (0, 4)),
    (b"", False, 0, ()),
    (b"\x01", True, 1, (1,)),
    (bytes(range(256)) * 3, False, 300, (3996, 1176)),
    (memoryview(np.arange(70000, dtype=np.float32)).cast("B"), True, 1 << 33, (70000,)),
])
def test_wire_form_is_protobufs(data, last, offset, shape):
    chunk = TensorChunk(identity=b"\x07" * 32, tensor="pixel_values", dtype="float32",
                        shape=shape, offset=offset, data=data, last=last)
    wire = chunk_to_wire(chunk)
    assert wire == chunk_to_pb(chunk).SerializeToString()
    parsed = imageprep_pb2.PixelChunk.FromString(wire)
    assert (parsed.data, parsed.last, parsed.offset, tuple(parsed.shape)) == \
        (bytes(data), last, offset, shape)


def test_pixel_dtype_names():
    assert pixel_dtype_of("") == "float32" and pixel_dtype_of("float32") == "float32"
    assert pixel_dtype_of("bfloat16") == "bfloat16"
    with pytest.raises(ValidationError, match="not one of") as refused:
        pixel_dtype_of("float16")
    assert refused.value.param == "pixel_dtype"


@pytest.mark.parametrize("chunk_bytes", [1024, 1025, 1 << 20])
async def test_bfloat16_chunks_reassemble_to_torchs_rounding(chunk_bytes):
    service = make_service()
    try:
        result = await service.prepare(request(url_image(png(300, 200))))
        service.config = ImagePrepConfig(fetch_chunk_bytes=chunk_bytes)
        [image] = await service.fetch([result.images[0].identity])
        pieces: dict[str, bytearray] = {}
        dtypes: dict[str, str] = {}
        async for chunk in service.stream([image], "bfloat16"):
            assert len(chunk.data) <= chunk_bytes
            buffer = pieces.setdefault(chunk.tensor, bytearray())
            assert chunk.offset == len(buffer)
            buffer += chunk.data
            dtypes[chunk.tensor] = chunk.dtype
            if chunk.tensor == "pixel_values":     # last exactly when all bfloat16 bytes came
                assert chunk.last == (len(buffer) == 2 * image.tensors["pixel_values"].size)
        pixels = image.tensors["pixel_values"]
        assert dtypes["pixel_values"] == "bfloat16"
        assert bytes(pieces["pixel_values"]) == torch_bits(pixels).tobytes()
        # Everything else goes as prepared, float32 interp_weights included.
        for name, array in image.named_tensors():
            if name != "pixel_values":
                assert bytes(pieces[name]) == array.tobytes() and dtypes[name] != "bfloat16"
        # float32 through stream(): the retained bytes, unchanged.
        float_bytes = bytearray()
        async for chunk in service.stream([image]):
            if chunk.tensor == "pixel_values":
                float_bytes += chunk.data
        assert bytes(float_bytes) == pixels.tobytes()
    finally:
        service.close()
