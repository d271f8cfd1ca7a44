"""PixelPrefetcher (vision/pixels.py): fetches started at admission on worker threads are
what the encode takes (one fetch per image, none repeated); a fetch that failed ahead is tried
again when needed, and only that second failure reaches the request; the oldest held image
is dropped past the limit; the engine core starts fetches at admission for the images past
the cached prefix only."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from services.engine.vision.pixels import ImageUnavailable, PixelPrefetcher


class CountingSource:
    def __init__(self, fail: set[bytes] | None = None) -> None:
        self.calls: list[tuple[bytes, ...]] = []
        self.fail = fail or set()
        self.lock = threading.Lock()

    def fetch(self, identities):
        with self.lock:
            self.calls.append(tuple(identities))
        if self.fail & set(identities):
            raise ImageUnavailable("gone")
        return [{"pixel_values": np.full((2, 3), i[0], dtype=np.float32)} for i in identities]


def test_fetches_started_ahead_are_used_once() -> None:
    source = CountingSource()
    ahead = PixelPrefetcher(lambda: source)
    ahead.start([b"a", b"b"])
    ahead.start([b"a"])                       # already started: not fetched twice
    got = ahead.fetch([b"b", b"c", b"a"])
    assert [int(t["pixel_values"][0, 0]) for t in got] == [ord("b"), ord("c"), ord("a")]
    assert sorted(source.calls) == [(b"a",), (b"b",), (b"c",)]   # c: now, in one call
    assert ahead.started == 2 and ahead.used == 2
    ahead.fetch([b"a"])                       # taken: a later need fetches it again
    assert source.calls.count((b"a",)) == 2
    ahead.close()


def test_a_failed_prefetch_is_tried_again_when_needed() -> None:
    source = CountingSource(fail={b"x"})
    ahead = PixelPrefetcher(lambda: source)
    ahead.start([b"x"])
    with pytest.raises(ImageUnavailable):
        ahead.fetch([b"x"])                   # failed ahead, failed again: the answer
    assert source.calls.count((b"x",)) == 2
    source.fail.clear()
    ahead.start([b"x"])
    assert len(ahead.fetch([b"x"])) == 1
    ahead.close()


def test_the_oldest_held_image_is_dropped_past_the_limit() -> None:
    source = CountingSource()
    ahead = PixelPrefetcher(lambda: source, limit=2)
    ahead.start([b"1", b"2", b"3"])
    ahead.fetch([b"1", b"2", b"3"])
    assert source.calls.count((b"1",)) in (1, 2) and not ahead._ahead
    assert ahead.used == 2            # "1" was dropped: fetched when needed (again if it ran)
    ahead.close()


def test_no_source_starts_nothing() -> None:
    ahead = PixelPrefetcher(lambda: None)
    ahead.start([b"a"])
    assert ahead.started == 0
    with pytest.raises(ImageUnavailable):
        ahead.fetch([b"a"])


def test_the_stage_prefetches_images_past_the_cached_prefix(vl_checkpoint_dirs) -> None:
    from services.common.core import open_model
    from tests.engine.model.vision.checkpoints import SPECS, prepared_image
    from tests.engine.model.vision.prompts import compose, random_text
    from tests.engine.model.vision.test_engine_vision import request
    from tests.engine.runner.conftest import make_engine

    engine = make_engine(open_model(vl_checkpoint_dirs["qwen2_5_vl"]),
                         imageprep_address="127.0.0.1:9")
    stage = engine.runner.vision
    source = CountingSource()
    stage.pixels = source
    profile = SPECS["qwen2_5_vl"].profile
    prompt = compose([random_text(3, 1), prepared_image(profile, 150, 230, 1),
                      random_text(3, 2), prepared_image(profile, 140, 140, 2),
                      random_text(3, 3)])
    multimodal = request("r", prompt).multimodal
    first, second = multimodal.images
    stage.prefetch(multimodal, cached=first.end)      # the first image lies in the prefix
    stage.ahead.fetch([second.identity])
    assert source.calls == [(second.identity,)]
    stage.prefetch(multimodal, cached=0)
    stage.ahead.fetch([first.identity, second.identity])
    assert source.calls.count((first.identity,)) == 1
    stage.ahead.close()


async def test_bfloat16_pixels_assemble_to_the_towers_own_cast() -> None:
    """FetchPixels with pixel_dtype bfloat16 (a bf16 tower's request): the engine's
    `assemble` gives a torch bfloat16 tensor equal to torch's cast of the float32 pixels, and
    VisionInput keeps it bfloat16 (the cast the tower would do; half the bytes moved)."""
    import torch

    from services.engine.model.vision.inputs import VisionInput
    from services.engine.vision.pixels import assemble
    from services.imageprep.convert import chunk_to_pb
    from tests.imageprep.images import png
    from tests.imageprep.test_service import make_service, request, url_image

    service = make_service()
    try:
        result = await service.prepare(request(url_image(png(300, 200))))
        identity = result.images[0].identity
        [image] = await service.fetch([identity])
        chunks = [chunk_to_pb(chunk) async for chunk in service.stream([image], "bfloat16")]
        [float32] = assemble([chunk_to_pb(c) async for c in service.stream([image])],
                             [identity])
    finally:
        service.close()
    [tensors] = assemble(chunks, [identity])
    pixels = tensors["pixel_values"]
    want = torch.from_numpy(float32["pixel_values"].copy()).to(torch.bfloat16)
    assert pixels.dtype == torch.bfloat16 and torch.equal(pixels.view(torch.int16),
                                                          want.view(torch.int16))
    for name, array in float32.items():
        if name != "pixel_values":
            assert np.array_equal(tensors[name], array)
    merged = VisionInput.from_tensors(identity, tensors, 2)
    assert merged.pixel_values.dtype == torch.bfloat16
    assert VisionInput.from_tensors(identity, float32, 2).pixel_values.dtype == torch.float32
