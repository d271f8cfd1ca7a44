"""ImagePrepService in-process: Prepare, expansion, identities, admission, fetch chunking."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from PIL import Image

from services.common.errors import (
    CapacityError,
    ImageDecodeError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
    ValidationError,
)
from services.imageprep import preparer as preparer_module
from services.imageprep.cache.memory import MemoryTier
from services.imageprep.cache.retention import RetentionCache
from services.imageprep.config import ImagePrepConfig
from services.imageprep.model_profile import ProfileResolver
from services.imageprep.requests import ImageInput, PrepareRequest, PromptInput
from services.imageprep.service import ImagePrepService
from tests.imageprep.images import (
    data_url,
    encode,
    exif_orientation,
    gradient,
    jpeg,
    png,
    png_bomb,
)

IMAGE_PAD, VISION_START = 151655, 151652


def make_service(**overrides) -> ImagePrepService:
    config = ImagePrepConfig(**{"memory_cache_bytes": 1 << 30, **overrides})
    return ImagePrepService(config, ProfileResolver(),
                            RetentionCache(MemoryTier(config.memory_cache_bytes)))


@pytest.fixture
def service():
    svc = make_service()
    yield svc
    svc.close()


def request(*images: ImageInput, profile: str = "qwen3_vl", **kwargs) -> PrepareRequest:
    return PrepareRequest(request_id="r", profile=profile, images=tuple(images), **kwargs)


def url_image(data: bytes, media_type: str = "image/png") -> ImageInput:
    return ImageInput(data_url=data_url(data, media_type))


@pytest.fixture
def count_decodes(monkeypatch):
    calls = []
    original = preparer_module.decode_image

    def counting(encoded, limits):
        calls.append(encoded.media_type)
        return original(encoded, limits)

    monkeypatch.setattr(preparer_module, "decode_image", counting)
    return calls


async def test_prepare_describes_images_in_order(service, count_decodes):
    a, b = png(300, 200), jpeg(64, 48)
    result = await service.prepare(request(url_image(a), ImageInput(data=b, media_type="image/jpeg"),
                                           url_image(a)))
    first, second, third = result.images
    assert [d.source_index for d in result.images] == [0, 1, 2]
    assert (first.geometry.height, first.geometry.width) == (224, 320)
    assert first.geometry.num_tokens == 14 * 20 // 4
    assert first.pixel_bytes == 14 * 20 * 1536 * 4
    assert first.identity == third.identity != second.identity
    assert len(first.identity) == 32
    assert count_decodes == ["image/png", "image/jpeg"]      # the repeat was not decoded again
    again = await service.prepare(request(ImageInput(data=a, media_type="image/png")))
    assert again.images[0].identity == first.identity and len(count_decodes) == 2


async def test_identity_is_semantic(service):
    stored = gradient(40, 30)
    rotated = encode(Image.fromarray(stored), "PNG", exif=exif_orientation(6))
    upright = encode(Image.fromarray(np.rot90(stored, -1).copy()), "PNG")
    webp = encode(Image.fromarray(np.rot90(stored, -1).copy()), "WEBP", lossless=True)
    result = await service.prepare(request(url_image(rotated), url_image(upright),
                                           url_image(webp, "image/webp")))
    assert len({d.identity for d in result.images}) == 1
    # Identity covers the processor settings, not only the pixels.
    other = await service.prepare(request(url_image(upright), max_pixels=65536))
    assert other.images[0].identity != result.images[0].identity
    qwen25 = await service.prepare(request(url_image(upright), profile="qwen2_5_vl"))
    assert qwen25.images[0].identity != result.images[0].identity


async def test_errors_name_the_image(service):
    with pytest.raises(ImageDecodeError) as caught:
        await service.prepare(request(url_image(png()), url_image(png_bomb(9000, 9000))))
    assert caught.value.param == "images[1]"
    assert caught.value.message.startswith("images[1]: the image is 9000x9000")
    with pytest.raises(UnsupportedError) as caught:
        await service.prepare(request(ImageInput(data_url="https://x/cat.png")))
    assert caught.value.param == "images[0]"
    with pytest.raises(ValidationError, match="aspect ratio 201.0"):
        await service.prepare(request(url_image(png(201, 1))))


async def test_profiles_and_pixel_bounds(service):
    with pytest.raises(ValidationError, match="profile is required"):
        await service.prepare(request(url_image(png()), profile=""))
    with pytest.raises(UnsupportedError, match="unknown image profile 'llava'"):
        await service.prepare(request(url_image(png()), profile="llava"))
    with pytest.raises(ValidationError, match="above the qwen3_vl limit"):
        await service.prepare(request(url_image(png()), max_pixels=16777217))
    with pytest.raises(ValidationError, match="min_pixels 5000 is above max_pixels 4096"):
        await service.prepare(request(url_image(png()), min_pixels=5000, max_pixels=4096))
    with pytest.raises(ValidationError, match="min_pixels 65536 is above max_pixels 16384"):
        await service.prepare(request(url_image(png()), max_pixels=16384))
    small = await service.prepare(request(url_image(png(640, 480)), min_pixels=1024,
                                          max_pixels=32 * 32 * 16))
    assert small.images[0].geometry.height * small.images[0].geometry.width <= 32 * 32 * 16


async def test_prompt_expansion_through_the_service(service):
    prompt = PromptInput(token_ids=(7, VISION_START, IMAGE_PAD, 8, 9, VISION_START, IMAGE_PAD, 10),
                         image_token_id=IMAGE_PAD, vision_start_token_id=VISION_START,
                         message_token_ends=(2, 5, 8))
    result = await service.prepare(request(url_image(png(300, 200)), url_image(png(64, 64)),
                                           prompt=prompt))
    spans = [d.geometry.num_tokens for d in result.images]
    assert spans == [70, 64]
    expanded = result.expanded
    assert [d.token_offset for d in result.images] == [2, 2 + 70 + 3]
    assert len(expanded.token_ids) == 8 + 70 + 64 - 2
    assert expanded.message_token_ends == (2, 5 + 69, 8 + 69 + 63)
    assert (expanded.token_ids[2:72] == IMAGE_PAD).all() and expanded.modality_ids.sum() == 134
    # Image 1 (7 x 10 merged tokens) starts at position 2; text resumes at 2 + max(7, 10).
    positions = expanded.mrope_positions
    assert positions[:, 71].tolist() == [2, 2 + 6, 2 + 9]
    assert positions[:, 72].tolist() == [12, 12, 12]
    assert expanded.rope_delta == int(positions.max()) + 1 - len(expanded.token_ids)


@pytest.mark.parametrize("prompt, text", [
    (PromptInput((1, IMAGE_PAD, 2), IMAGE_PAD), "holds 1 image placeholder token"),
    (PromptInput((1, VISION_START, IMAGE_PAD, IMAGE_PAD), IMAGE_PAD), "must not be adjacent"),
    (PromptInput((1, IMAGE_PAD, 2, IMAGE_PAD), IMAGE_PAD, VISION_START), "does not follow"),
    (PromptInput((IMAGE_PAD, 2, 3, IMAGE_PAD), IMAGE_PAD, None, (3, 2)), "increase strictly"),
    (PromptInput((IMAGE_PAD, 2, 3, IMAGE_PAD), IMAGE_PAD, None, (2, 5)), "within the prompt"),
])
async def test_prompt_expansion_refusals(service, prompt, text):
    images = [url_image(png())] * 2
    with pytest.raises(ValidationError, match=text):
        await service.prepare(request(*images, prompt=prompt))


async def test_fetch_chunks_reassemble_exactly(service):
    result = await service.prepare(request(url_image(png(300, 200))))
    identity = result.images[0].identity
    service.config = ImagePrepConfig(fetch_chunk_bytes=1024)
    [image] = await service.fetch([identity])
    pieces: dict[str, bytearray] = {}
    for chunk in service.chunks([image]):
        assert len(chunk.data) <= 1024 and chunk.identity == identity
        buffer = pieces.setdefault(chunk.tensor, bytearray())
        assert chunk.offset == len(buffer)
        buffer += chunk.data
        if chunk.last:
            assert bytes(buffer) == image.tensors[chunk.tensor].tobytes()
    assert list(pieces) == ["pixel_values", "grid_thw", "vision_positions", "interp_indices",
                            "interp_weights", "cu_patches"]
    with pytest.raises(NotFoundError, match="not retained"):
        await service.fetch([identity, b"\x00" * 32])
    with pytest.raises(ValidationError, match="identities\\[0\\] is 3 bytes"):
        await service.fetch([b"abc"])


async def test_admission_is_bounded(monkeypatch):
    service = make_service(max_pending_images=2, workers=1)
    release = threading.Event()
    original = preparer_module.process_image

    def slow(decoded, settings):
        release.wait(10)
        return original(decoded, settings)

    monkeypatch.setattr(preparer_module, "process_image", slow)
    first = asyncio.create_task(service.prepare(request(url_image(png(32, 32)),
                                                        url_image(png(33, 33)))))
    await asyncio.sleep(0.05)
    with pytest.raises(CapacityError, match="2 images are waiting"):
        await service.prepare(request(url_image(png(34, 34))))
    release.set()
    assert len((await first).images) == 2
    assert len((await service.prepare(request(url_image(png(34, 34))))).images) == 1
    service.stop_admission()
    with pytest.raises(UnavailableError, match="shutting down"):
        await service.prepare(request(url_image(png())))
    assert await service.drain(1.0)
    service.close()


async def test_too_many_images(service):
    with pytest.raises(ValidationError, match="33 images in one request; the limit is 32"):
        await service.prepare(request(*[url_image(png())] * 33))


async def test_concurrent_requests_share_one_preparation(monkeypatch, count_decodes):
    service = make_service(workers=2)
    started, release = threading.Event(), threading.Event()
    original = preparer_module.process_image

    def slow(decoded, settings):
        started.set()
        release.wait(10)
        return original(decoded, settings)

    monkeypatch.setattr(preparer_module, "process_image", slow)
    image = url_image(png(120, 80))
    first = asyncio.create_task(service.prepare(request(image)))
    await asyncio.to_thread(started.wait, 10)
    second = asyncio.create_task(service.prepare(request(image)))
    await asyncio.sleep(0.1)                     # the second is now waiting on the first
    release.set()
    a, b = await first, await second
    assert a.images[0].identity == b.images[0].identity
    assert count_decodes == ["image/png"]
    service.close()


async def test_a_held_image_meets_the_requests_pixel_limit(count_decodes):
    """The source key leaves out the limits: an image held from a request under looser limits
    (another core's) is refused under tighter ones with a fresh image's message, from its
    header (no decode); one within them is still served from the cache."""
    wide = png(600, 400)
    tight = {"max_image_bytes": 1 << 20, "max_image_pixels": 200_000}
    fresh = make_service()
    with pytest.raises(ImageDecodeError) as first:
        await fresh.prepare(request(url_image(wide), **tight))
    fresh.close()
    assert "the image is 600x400 = 240000 pixels; the decoded-pixel limit is 200000, set by " \
        "image_limits.max_image_pixels" in first.value.message
    shared = make_service()
    try:
        loose = await shared.prepare(request(url_image(wide)))     # imageprep's own limits
        decodes = len(count_decodes)
        with pytest.raises(ImageDecodeError) as held:
            await shared.prepare(request(url_image(wide), **tight))
        assert (held.value.message, held.value.param) == (first.value.message,
                                                          first.value.param)
        again = await shared.prepare(request(url_image(wide), max_image_pixels=240_000))
        assert again.images[0].identity == loose.images[0].identity
        assert len(count_decodes) == decodes                       # neither decoded it
    finally:
        shared.close()
