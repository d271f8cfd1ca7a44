"""Where the engine gets an image's prepared tensors: imageprep's `FetchPixels`, by identity.

    source = ImagePrepPixels("127.0.0.1:50053")
    tensors = source.fetch([identity, ...])     # one {name: ndarray} per identity, in order

Called from the engine core (its runner's thread), only for images whose features are not
already cached and whose token span lies past the request's cached prefix. A failure (imageprep
gone, the image no longer retained) raises `ImageUnavailable`, which fails the requests that
needed the image, not the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from services.common.errors import UnavailableError

_DTYPES: dict[str, np.dtype] = {"float32": np.dtype("<f4"), "int64": np.dtype("<i8"),
                                "int32": np.dtype("<i4")}


class ImageUnavailable(UnavailableError):
    """The pixels of an image could not be fetched."""


class PixelSource(Protocol):
    def fetch(self, identities: Sequence[bytes]) -> list[dict[str, np.ndarray]]: ...


def assemble(chunks: Sequence[object], identities: Sequence[bytes]
             ) -> list[dict[str, np.ndarray]]:
    """PixelChunk messages -> one {tensor name: array} per identity, checked for shape."""
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
            arrays[name] = np.frombuffer(bytes(data), dtype=kind).reshape(shape)
        result.append(arrays)
    return result


class ImagePrepPixels:
    """A synchronous FetchPixels client (the core's runner thread blocks on it)."""

    def __init__(self, address: str, timeout_s: float = 60.0) -> None:
        import grpc

        from services.common.pb import imageprep_pb2_grpc

        self.address = address
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", 64 << 20)])
        self._stub = imageprep_pb2_grpc.ImagePrepStub(self._channel)

    def fetch(self, identities: Sequence[bytes]) -> list[dict[str, np.ndarray]]:
        import grpc

        from services.common.pb import imageprep_pb2

        request = imageprep_pb2.FetchPixelsRequest(identities=list(identities))
        try:
            chunks = list(self._stub.FetchPixels(request, timeout=self.timeout_s))
        except grpc.RpcError as exc:
            raise ImageUnavailable(
                f"imageprep at {self.address} could not return the image pixels "
                f"({exc.code().name}: {exc.details()}); send the request again") from exc
        return assemble(chunks, identities)

    def close(self) -> None:
        self._channel.close()
