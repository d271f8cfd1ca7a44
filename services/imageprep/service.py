"""ImagePrepService: Prepare and FetchPixels as asyncio methods over a bounded worker pool.

Prepare: validate -> resolve settings -> admit (at most `max_pending_images` images queued or
running, else CapacityError) -> one worker job per image (ImagePreparer) -> descriptors in
request order -> optional prompt expansion. Decoding, resizing and hashing never run on the event
loop. A failing image fails the request with its index in `param` (images[i]).

FetchPixels: identities -> retained PreparedImages (memory on the loop, disk/Redis on a fetch
thread) -> TensorChunks of at most `fetch_chunk_bytes`, every unknown identity refused before the
first chunk is sent. pixel_values is computed as it is sent, by rows of merge blocks, from the
retained uint8 pixels (patches.PixelPatches), in float32 or, when the caller asks, bfloat16 (each
chunk cast by torch on the CPU), on a fetch thread: never on the event loop. `pixel_dtype`
"uint8" sends no pixel_values but the raw pixels and the constants that make them (an eighth
of float32's bytes; the engine computes pixel_values on its device with the same code,
services/common/pixel_patches.py). The other tensors' chunks view the retained arrays (no copy
until the wire encoding).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence

import numpy as np

from services.common.errors import (
    CapacityError,
    HeliosError,
    NotFoundError,
    UnavailableError,
    ValidationError,
)
from services.common.pixel_patches import RAW_DTYPE
from services.imageprep.cache.retention import RetentionCache
from services.imageprep.config import ImagePrepConfig
from services.imageprep.decode import DecodeLimits
from services.imageprep.expansion import expand_prompt
from services.imageprep.identity import IDENTITY_BYTES
from services.imageprep.metrics import ImagePrepMetrics
from services.imageprep.model_profile import ProfileResolver
from services.imageprep.prepared import TENSOR_ORDER, PreparedImage, dtype_name
from services.imageprep.preparer import ImagePreparer, Prepared
from services.imageprep.requests import (
    ImageDescriptor,
    PrepareRequest,
    PrepareResult,
    TensorChunk,
)

log = logging.getLogger(__name__)

MAX_FETCH_IDENTITIES = 4096
FLOAT32, BFLOAT16 = "float32", "bfloat16"
UINT8 = RAW_DTYPE           # no pixel_values: PreparedImage.raw_tensors, which make them
PIXEL_DTYPES = (FLOAT32, BFLOAT16, UINT8)


def pixel_dtype_of(requested: str) -> str:
    """FetchPixelsRequest.pixel_dtype checked: "" means float32 (pixel_values as prepared)."""
    dtype = requested or FLOAT32
    if dtype not in PIXEL_DTYPES:
        raise ValidationError(f"pixel_dtype {requested!r} is not one of {', '.join(PIXEL_DTYPES)}",
                              param="pixel_dtype")
    return dtype


def _at_image(error: HeliosError, index: int) -> HeliosError:
    """A copy of `error` that names the image it is about (the original may be shared)."""
    located = type(error).__new__(type(error))
    located.__dict__.update(error.__dict__)
    located.message = f"images[{index}]: {error.message}"
    located.param = error.param.replace("image", f"images[{index}]", 1) if error.param else \
        f"images[{index}]"
    located.args = (located.message,)
    located.__cause__ = error.__cause__ or error
    return located


def _next_or_none(chunks: Iterator[TensorChunk]) -> TensorChunk | None:
    return next(chunks, None)


def _array_chunks(identity: bytes, name: str, array: np.ndarray, size: int
                  ) -> Iterator[TensorChunk]:
    """One stored array in chunks of at most `size` bytes (views: no copy until the wire)."""
    array = np.ascontiguousarray(array)
    data = array.data.cast("B")
    total = data.nbytes
    for offset in range(0, max(total, 1), size):
        end = min(offset + size, total)
        yield TensorChunk(identity=identity, tensor=name, dtype=dtype_name(array),
                          shape=tuple(array.shape), offset=offset, data=data[offset:end],
                          last=end >= total)


def _pixel_chunks(image: PreparedImage, pixel_dtype: str, size: int) -> Iterator[TensorChunk]:
    """pixel_values of `image` in `pixel_dtype`, computed by groups of merge-block rows of at
    most `size` bytes (one row at least, sent in pieces of at most `size` when it is larger);
    for UINT8, the raw pixels, the fused mean and std and the patch layout instead."""
    pixels = image.pixels
    itemsize = 2 if pixel_dtype == BFLOAT16 else 4
    row_bytes = pixels.patches_per_block_row * pixels.shape[1] * itemsize
    per_group = max(1, size // row_bytes)
    if pixel_dtype == UINT8:     # the raw pixels and what makes pixel_values of them
        for name, array in image.raw_tensors().items():
            if name not in image.stored:            # those follow, as with pixel_values
                yield from _array_chunks(image.identity, name, array, size)
        return
    for first in range(0, pixels.block_rows, per_group):
        last = min(first + per_group, pixels.block_rows)
        data = pixels.values(first, last, bfloat16=pixel_dtype == BFLOAT16).data.cast("B")
        start = first * row_bytes
        for offset in range(0, data.nbytes, size):
            end = min(offset + size, data.nbytes)
            yield TensorChunk(identity=image.identity, tensor="pixel_values", dtype=pixel_dtype,
                              shape=pixels.shape, offset=start + offset, data=data[offset:end],
                              last=last >= pixels.block_rows and end >= data.nbytes)


class ImagePrepService:
    def __init__(self, config: ImagePrepConfig, resolver: ProfileResolver,
                 cache: RetentionCache, metrics: ImagePrepMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.resolver = resolver
        self.cache = cache
        self.preparer = ImagePreparer(
            DecodeLimits(max_encoded_bytes=config.max_encoded_bytes,
                         max_decoded_pixels=config.max_decoded_pixels,
                         max_progressive_scans=config.max_progressive_scans), cache)
        self._workers = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.num_workers, thread_name_prefix="imageprep-worker")
        self._fetchers = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="imageprep-fetch")
        self._lock = threading.Lock()
        self._pending_images = 0
        self._active_requests = 0
        self._admitting = True

    @property
    def pending_images(self) -> int:
        return self._pending_images

    # -- Prepare --------------------------------------------------------------------------

    def _admit(self, num_images: int) -> None:
        with self._lock:
            if not self._admitting:
                raise UnavailableError("imageprep is shutting down", retry_after_s=1.0)
            busy = self._pending_images
            if busy and busy + num_images > self.config.max_pending_images:
                raise CapacityError(
                    f"imageprep is busy: {busy} images are waiting or in preparation (limit "
                    f"{self.config.max_pending_images})", retry_after_s=0.5,
                    hint="raise imageprep max_pending_images or add imageprep replicas")
            self._pending_images += num_images
            self._active_requests += 1

    def _release(self) -> None:
        with self._lock:
            self._active_requests -= 1

    def _job_done(self, _: concurrent.futures.Future[Prepared]) -> None:
        with self._lock:
            self._pending_images -= 1

    def _validate(self, request: PrepareRequest) -> None:
        if len(request.images) > self.config.max_images_per_request:
            raise ValidationError(
                f"{len(request.images)} images in one request; the limit is "
                f"{self.config.max_images_per_request}", param="images")

    async def prepare(self, request: PrepareRequest) -> PrepareResult:
        started = time.perf_counter()
        self._validate(request)
        settings = self.resolver.resolve(request.profile, request.min_pixels, request.max_pixels)
        limits = self.preparer.limits.narrowed(request.max_image_bytes, request.max_image_pixels,
                                               request.limits_source or "the caller's request")
        self._admit(len(request.images))
        try:
            jobs = []
            for image in request.images:
                job = self._workers.submit(self.preparer.prepare, image, settings, limits)
                job.add_done_callback(self._job_done)
                jobs.append(job)
            outcomes = await asyncio.gather(*(asyncio.wrap_future(j) for j in jobs),
                                            return_exceptions=True)
        finally:
            self._release()
        prepared: list[Prepared] = []
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, HeliosError):
                if self.metrics is not None:
                    self.metrics.images.labels("refused").inc()
                raise _at_image(outcome, index)
            if isinstance(outcome, BaseException):
                raise outcome
            prepared.append(outcome)
        descriptors = [ImageDescriptor(identity=p.image.identity, profile=p.image.profile,
                                       geometry=p.image.geometry, pixel_bytes=p.image.pixel_bytes,
                                       source_index=i) for i, p in enumerate(prepared)]
        expanded = None
        if request.prompt is not None:
            prompt = request.prompt
            expanded = expand_prompt(prompt.token_ids, [d.geometry for d in descriptors],
                                     image_token_id=prompt.image_token_id,
                                     vision_start_token_id=prompt.vision_start_token_id,
                                     message_token_ends=prompt.message_token_ends)
            descriptors = [ImageDescriptor(d.identity, d.profile, d.geometry, d.pixel_bytes,
                                           d.source_index, offset)
                           for d, offset in zip(descriptors, expanded.token_offsets, strict=True)]
        if self.metrics is not None:
            retained = sum(p.cache_hit for p in prepared)
            self.metrics.images.labels("retained").inc(retained)
            self.metrics.images.labels("prepared").inc(len(prepared) - retained)
            self.metrics.prepare_seconds.observe(time.perf_counter() - started)
        log.debug("prepared %d image(s) for %s in %.1f ms (%d retained)", len(prepared),
                  request.request_id, (time.perf_counter() - started) * 1e3,
                  sum(p.cache_hit for p in prepared))
        return PrepareResult(images=tuple(descriptors), expanded=expanded)

    # -- FetchPixels ----------------------------------------------------------------------

    async def fetch(self, identities: Sequence[bytes]) -> list[PreparedImage]:
        if len(identities) > MAX_FETCH_IDENTITIES:
            raise ValidationError(f"at most {MAX_FETCH_IDENTITIES} identities per FetchPixels",
                                  param="identities")
        loop = asyncio.get_running_loop()
        images = []
        for index, identity in enumerate(identities):
            if len(identity) != IDENTITY_BYTES:
                raise ValidationError(
                    f"identities[{index}] is {len(identity)} bytes; an image identity is "
                    f"{IDENTITY_BYTES}", param=f"identities[{index}]")
            image = self.cache.get_from_memory(identity)
            if image is None:
                image = await loop.run_in_executor(self._fetchers, self.cache.get, identity)
            if image is None:
                raise NotFoundError(
                    f"image {identity.hex()} is not retained (never prepared here, or evicted); "
                    "prepare it again", param=f"identities[{index}]")
            images.append(image)
        if self.metrics is not None:
            self.metrics.fetched.inc(len(images))
        return images

    def chunks(self, images: Sequence[PreparedImage], pixel_dtype: str = FLOAT32
               ) -> Iterator[TensorChunk]:
        """The tensors of `images` in chunks of at most fetch_chunk_bytes (pixel_values: at
        least one row of merge blocks), pixel_values first, computed as the iterator advances
        in `pixel_dtype` (UINT8: the raw pixels and their constants in its place)."""
        size = self.config.fetch_chunk_bytes
        for image in images:
            yield from _pixel_chunks(image, pixel_dtype, size)
            for name in TENSOR_ORDER:
                if name in image.stored:
                    yield from _array_chunks(image.identity, name, image.stored[name], size)

    async def stream(self, images: Sequence[PreparedImage], pixel_dtype: str = FLOAT32
                     ) -> AsyncIterator[TensorChunk]:
        """`chunks` for the event loop: each chunk is made on a fetch thread (pixel_values'
        are computed; the others' are views)."""
        chunks = self.chunks(images, pixel_dtype)
        loop = asyncio.get_running_loop()
        while True:
            chunk: TensorChunk | None = await loop.run_in_executor(
                self._fetchers, _next_or_none, chunks)
            if chunk is None:
                return
            yield chunk

    # -- Lifecycle ------------------------------------------------------------------------

    def stop_admission(self) -> None:
        with self._lock:
            self._admitting = False

    async def drain(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._active_requests == 0:
                    return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)

    def close(self) -> None:
        self._workers.shutdown(wait=True, cancel_futures=True)
        self._fetchers.shutdown(wait=True, cancel_futures=True)
        self.cache.close()
