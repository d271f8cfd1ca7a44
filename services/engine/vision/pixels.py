"""Where the engine gets an image's prepared tensors: imageprep's `FetchPixels`, by identity.

    source = ImagePrepPixels("127.0.0.1:50053")
    tensors = source.fetch([identity, ...])     # one {name: ndarray} per identity, in order

Called from the engine core (its runner's thread), only for images whose features are not
already cached and whose token span lies past the request's cached prefix. A failure (imageprep
gone, the image no longer retained) raises `ImageUnavailable`, which fails the requests that
needed the image, not the engine.

    ahead = PixelPrefetcher(lambda: source)     # fetches on worker threads, ahead of need
    ahead.start([identity, ...])                # at admission
    tensors = ahead.fetch([identity, ...])      # the started ones' results, the rest now

The prefetcher overlaps a fetch (gRPC: 2.3 MB of raw uint8 pixels for a 1024x768 image, or
~19 MB of float32 pixel_values) with the steps that run before the image's prefill, and puts
the pixels in pinned host memory there, so the encoder's copy to the device does not block the
core's thread.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from services.common.errors import UnavailableError
from services.common.pixel_patches import RAW_DTYPE

log = logging.getLogger(__name__)

_DTYPES: dict[str, np.dtype] = {"float32": np.dtype("<f4"), "int64": np.dtype("<i8"),
                                "int32": np.dtype("<i4"), "bfloat16": np.dtype("<u2"),
                                "uint8": np.dtype("u1")}


class ImageUnavailable(UnavailableError):
    """The pixels of an image could not be fetched."""


class PixelSource(Protocol):
    def fetch(self, identities: Sequence[bytes]) -> list[dict[str, Any]]: ...


def _bfloat16(bits: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)


def assemble(chunks: Sequence[object], identities: Sequence[bytes]
             ) -> list[dict[str, Any]]:
    """PixelChunk messages -> one {tensor name: array} per identity, checked for shape
    (numpy arrays; a bfloat16 tensor as a torch tensor)."""
    buffers: dict[bytes, dict[str, tuple[bytearray, str, tuple[int, ...]]]] = {}
    for chunk in chunks:
        identity = bytes(chunk.identity)                             # type: ignore[attr-defined]
        name = str(chunk.tensor)                                     # type: ignore[attr-defined]
        tensors = buffers.setdefault(identity, {})
        if name not in tensors:
            tensors[name] = (bytearray(), str(chunk.dtype),          # type: ignore[attr-defined]
                             tuple(int(s) for s in chunk.shape))     # type: ignore[attr-defined]
        data, _, _ = tensors[name]
        if int(chunk.offset) != len(data):                           # type: ignore[attr-defined]
            raise ImageUnavailable(f"image {identity.hex()[:16]}: tensor {name} arrived out "
                                   "of order")
        data.extend(chunk.data)                                      # type: ignore[attr-defined]
    result = []
    for identity in identities:
        found = buffers.get(bytes(identity))
        if not found:
            raise ImageUnavailable(f"imageprep sent no tensors for image "
                                   f"{bytes(identity).hex()[:16]}")
        arrays = {}
        for name, (data, dtype, shape) in found.items():
            kind = _DTYPES.get(dtype)
            if kind is None or len(data) != kind.itemsize * int(np.prod(shape)):
                raise ImageUnavailable(f"image {bytes(identity).hex()[:16]}: tensor {name} "
                                       f"has {len(data)} bytes for {dtype} {list(shape)}")
            array = np.frombuffer(data, dtype=kind).reshape(shape)   # no copy
            # bfloat16 has no numpy dtype: its bits travel as uint16, a torch view reads them
            arrays[name] = _bfloat16(array) if dtype == "bfloat16" else array
        result.append(arrays)
    return result


class ImagePrepPixels:
    """A synchronous FetchPixels client (the prefetcher's threads, or the core's thread when
    an image was not fetched ahead). `pixel_dtype` "uint8" (the default) fetches the resized
    image's raw pixels, an eighth of float32's bytes, and the tower computes pixel_values on
    its device (model/vision/inputs.py RawPixels); an imageprep that does not know "uint8"
    (one from before it) is then asked for `fallback_dtype` from that call on. "bfloat16" (a
    bf16 tower) halves float32's bytes: imageprep rounds as the tower's own cast would."""

    def __init__(self, address: str, timeout_s: float = 60.0, pixel_dtype: str = RAW_DTYPE,
                 fallback_dtype: str = "") -> None:
        import grpc

        from services.common.pb import imageprep_pb2_grpc

        self.address = address
        self.timeout_s = timeout_s
        self.pixel_dtype = pixel_dtype
        self.fallback_dtype = fallback_dtype
        self._channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", 64 << 20)])
        self._stub = imageprep_pb2_grpc.ImagePrepStub(self._channel)

    def fetch(self, identities: Sequence[bytes]) -> list[dict[str, Any]]:
        import grpc

        from services.common.pb import imageprep_pb2

        request = imageprep_pb2.FetchPixelsRequest(identities=list(identities),
                                                   pixel_dtype=self.pixel_dtype)
        try:
            try:
                chunks = list(self._stub.FetchPixels(request, timeout=self.timeout_s))
            except grpc.RpcError as exc:
                if not (self.pixel_dtype == RAW_DTYPE and
                        exc.code() == grpc.StatusCode.INVALID_ARGUMENT and
                        "pixel_dtype" in (exc.details() or "")):
                    raise
                log.warning("imageprep at %s does not send raw pixels (%s); fetching "
                            "pixel_values instead", self.address, exc.details())
                self.pixel_dtype = request.pixel_dtype = self.fallback_dtype
                chunks = list(self._stub.FetchPixels(request, timeout=self.timeout_s))
        except grpc.RpcError as exc:
            raise ImageUnavailable(
                f"imageprep at {self.address} could not return the image pixels "
                f"({exc.code().name}: {exc.details()}); send the request again") from exc
        return assemble(chunks, identities)

    def close(self) -> None:
        self._channel.close()


PREFETCH_WORKERS = 2
PREFETCH_IMAGES = 32       # fetched-ahead images held at most (2.3 MB each at 1024x768 raw)


def pinned(tensors: dict[str, Any]) -> dict[str, Any]:
    """The arrays (numpy or torch) as torch tensors in pinned host memory (CUDA present),
    so the copy to the device is asynchronous; plain tensors elsewhere."""
    import torch

    out: dict[str, Any] = {}
    for name, array in tensors.items():
        if isinstance(array, np.ndarray):
            array = np.ascontiguousarray(array)
            if not array.flags.writeable:       # torch.from_numpy wants a writable buffer
                array = array.copy()
            tensor = torch.from_numpy(array)
        else:
            tensor = array.contiguous()
        out[name] = tensor.pin_memory() if torch.cuda.is_available() else tensor
    return out


class PixelPrefetcher:
    """Fetches started ahead of need on worker threads, each one image (`source()` is the
    stage's current pixel source). At most PREFETCH_IMAGES are held: the oldest is dropped
    (fetched again when needed). A fetch that failed ahead is tried again when needed, so a
    transient failure costs a retry, not the request."""

    def __init__(self, source: Callable[[], PixelSource | None],
                 workers: int = PREFETCH_WORKERS, limit: int = PREFETCH_IMAGES) -> None:
        self.source = source
        self.limit = limit
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: OrderedDict[bytes, Future[dict[str, Any]]] = OrderedDict()
        self.started = 0          # fetches started ahead
        self.used = 0             # of those, taken by an encode

    def _fetch_one(self, identity: bytes) -> dict[str, Any]:
        source = self.source()
        if source is None:
            raise ImageUnavailable("no pixel source")
        return pinned(source.fetch([identity])[0])

    def start(self, identities: Sequence[bytes]) -> None:
        if self.source() is None:
            return
        for identity in identities:
            if identity in self._ahead:
                continue
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="pixels")
            self._ahead[identity] = self._pool.submit(self._fetch_one, identity)
            self.started += 1
        while len(self._ahead) > self.limit:
            _, dropped = self._ahead.popitem(last=False)
            dropped.cancel()

    def fetch(self, identities: Sequence[bytes]) -> list[dict[str, Any]]:
        """Every image's tensors, in order: the fetched-ahead ones when they succeeded, the
        others in one call now (ImageUnavailable when that fails)."""
        found: dict[bytes, dict[str, Any]] = {}
        for identity in identities:
            future = self._ahead.pop(identity, None)
            if future is None or future.cancelled():
                continue
            try:
                found[identity] = future.result()
                self.used += 1
            except Exception as exc:     # fetched again below; that failure is the answer
                log.debug("prefetch of image %s failed: %s", identity.hex()[:16], exc)
        rest = [i for i in identities if i not in found]
        if rest:
            source = self.source()
            if source is None:
                raise ImageUnavailable("no pixel source")
            found.update(zip(rest, (pinned(t) for t in source.fetch(rest)), strict=True))
        return [found[i] for i in identities]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
