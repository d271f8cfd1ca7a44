"""A prepared image: identity, geometry and tensors, and its byte form for the cache tiers.

Tensors are numpy arrays, little-endian and C-ordered, exactly the bytes `FetchPixels` ships.
`pixel_values` is not stored: the image keeps its resized uint8 pixels (`PixelPatches`, an
eighth of the bytes) and computes it on demand (`tensors`, or by rows of merge blocks for
FetchPixels' chunks); the others are `stored`:

| name               | shape              | dtype   | what                                          |
|--------------------|--------------------|---------|-----------------------------------------------|
| `pixel_values`     | [N, C*T*P*P]       | float32 | normalised patches, merge-block order         |
| `grid_thw`         | [1, 3]             | int64   | (1, grid_h, grid_w) before the spatial merge  |
| `vision_positions` | [N, 2]             | int64   | (row, column) of each patch                   |
| `interp_indices`   | [N, 4]             | int64   | position-table taps (profiles with a table)   |
| `interp_weights`   | [N, 4]             | float32 | bilinear weights of those taps                |
| `cu_patches`       | [2]                | int32   | cumulative patch offsets (0, N)               |

`encode_record` / `decode_record` give one self-describing blob per image (magic, JSON header
with the patch constants, CRC-32 of the payload, raw tensor bytes: the stored tensors and the
uint8 pixels) that the disk and Redis tiers store; decoding is zero-copy (arrays view the blob)
and refuses a corrupt or foreign blob (records of the float32 format before, HELIOSIMG1, too:
those images are prepared again).
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from services.common.pixel_patches import PATCH_LAYOUT, PIXEL_NORM, RAW_PIXELS
from services.imageprep.patches import PixelPatches

TENSOR_ORDER = ("pixel_values", "grid_thw", "vision_positions", "interp_indices",
                "interp_weights", "cu_patches")
_DTYPES: dict[str, np.dtype] = {"float32": np.dtype("<f4"), "int64": np.dtype("<i8"),
                                "int32": np.dtype("<i4"), "uint8": np.dtype("u1")}
_MAGIC = b"HELIOSIMG2\n"
_LEN = struct.Struct("<I")


class CorruptRecord(ValueError):
    """A cached blob that is not a valid prepared-image record."""


@dataclass(frozen=True, slots=True)
class ImageGeometry:
    height: int          # resized height in pixels
    width: int           # resized width in pixels
    grid_t: int          # 1 for still images (temporal copies live in the patch vector)
    grid_h: int          # patch rows = height / patch_size
    grid_w: int          # patch columns = width / patch_size
    merge_size: int      # M: M x M patches form one LLM token

    @property
    def num_patches(self) -> int:
        return self.grid_t * self.grid_h * self.grid_w

    @property
    def num_tokens(self) -> int:
        return self.num_patches // (self.merge_size * self.merge_size)

    @property
    def llm_grid(self) -> tuple[int, int, int]:
        """(t, h, w) of the merged token grid, as the mRoPE positions count it."""
        return self.grid_t, self.grid_h // self.merge_size, self.grid_w // self.merge_size


@dataclass(frozen=True, slots=True)
class PreparedImage:
    identity: bytes                       # 32-byte semantic identity
    profile: str
    geometry: ImageGeometry
    stored: dict[str, np.ndarray]         # every tensor but pixel_values (absent ones omitted)
    pixels: PixelPatches                  # pixel_values, computed on demand

    @property
    def pixel_bytes(self) -> int:
        """pixel_values' float32 bytes (what FetchPixels ships as float32)."""
        return self.pixels.nbytes

    @property
    def nbytes(self) -> int:
        """The bytes the image holds (retention's accounting)."""
        return sum(int(a.nbytes) for a in self.stored.values()) + int(self.pixels.pixels.nbytes)

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor by name in TENSOR_ORDER, pixel_values computed (whole: tests, tools;
        FetchPixels computes it by chunks)."""
        computed = {"pixel_values": self.pixels.values(), **self.stored}
        return {name: computed[name] for name in TENSOR_ORDER if name in computed}

    def named_tensors(self) -> list[tuple[str, np.ndarray]]:
        return list(self.tensors.items())

    def raw_tensors(self) -> dict[str, np.ndarray]:
        """What FetchPixels' `pixel_dtype: "uint8"` sends in pixel_values' place, then the
        stored tensors: the resized image, the fused mean and std, the patch layout
        (services/common/pixel_patches.py makes pixel_values of them)."""
        pixels = self.pixels
        raw = {RAW_PIXELS: pixels.pixels,
               PIXEL_NORM: np.array([pixels.mean, pixels.std], dtype=np.float32),
               PATCH_LAYOUT: np.array([pixels.patch_size, pixels.merge_size, pixels.temporal],
                                      dtype=np.int64)}
        return {**raw, **{name: self.stored[name] for name in TENSOR_ORDER
                          if name in self.stored}}


def dtype_name(array: np.ndarray) -> str:
    for name, dtype in _DTYPES.items():
        if array.dtype == dtype:
            return name
    raise TypeError(f"unsupported tensor dtype {array.dtype}")


def encode_record(image: PreparedImage) -> bytes:
    """The image as one blob: magic, header length, JSON header, tensor bytes."""
    tensors = []
    chunks: list[bytes | memoryview] = []
    offset = 0
    stored = [(name, image.stored[name]) for name in TENSOR_ORDER if name in image.stored]
    for name, array in [*stored, (RAW_PIXELS, image.pixels.pixels)]:
        data = np.ascontiguousarray(array).data.cast("B")
        tensors.append({"name": name, "dtype": dtype_name(array), "shape": list(array.shape),
                        "offset": offset, "nbytes": data.nbytes})
        chunks.append(data)
        offset += data.nbytes
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    header = json.dumps({
        "identity": image.identity.hex(), "profile": image.profile,
        "geometry": [image.geometry.height, image.geometry.width, image.geometry.grid_t,
                     image.geometry.grid_h, image.geometry.grid_w, image.geometry.merge_size],
        "tensors": tensors, "payload_bytes": offset, "crc32": crc,
        "patches": {"patch_size": image.pixels.patch_size,
                    "merge_size": image.pixels.merge_size, "temporal": image.pixels.temporal,
                    "mean": list(image.pixels.mean), "std": list(image.pixels.std)},
    }, separators=(",", ":")).encode()
    return b"".join([_MAGIC, _LEN.pack(len(header)), header, *chunks])


def decode_record(blob: bytes | memoryview) -> PreparedImage:
    """Inverse of encode_record; CorruptRecord for anything that does not check out."""
    view = memoryview(blob)
    try:
        if bytes(view[:len(_MAGIC)]) != _MAGIC:
            raise CorruptRecord("not a prepared-image record")
        (header_len,) = _LEN.unpack_from(view, len(_MAGIC))
        start = len(_MAGIC) + _LEN.size
        header = json.loads(bytes(view[start:start + header_len]))
        payload = view[start + header_len:]
        if len(payload) != header["payload_bytes"]:
            raise CorruptRecord(f"payload is {len(payload)} bytes, header says "
                                f"{header['payload_bytes']}")
        if zlib.crc32(payload) != header["crc32"]:
            raise CorruptRecord("payload checksum mismatch")
        tensors = {}
        for spec in header["tensors"]:
            dtype = _DTYPES[spec["dtype"]]
            raw = payload[spec["offset"]:spec["offset"] + spec["nbytes"]]
            tensors[spec["name"]] = np.frombuffer(raw, dtype=dtype).reshape(spec["shape"])
        identity = bytes.fromhex(header["identity"])
        geometry = ImageGeometry(*(int(v) for v in header["geometry"]))
        spec = header["patches"]
        pixels = PixelPatches(tensors.pop(RAW_PIXELS), int(spec["patch_size"]),
                              int(spec["merge_size"]), int(spec["temporal"]),
                              tuple(float(v) for v in spec["mean"]),  # type: ignore[arg-type]
                              tuple(float(v) for v in spec["std"]))   # type: ignore[arg-type]
        return PreparedImage(identity, str(header["profile"]), geometry, tensors, pixels)
    except CorruptRecord:
        raise
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise CorruptRecord(f"malformed prepared-image record: {exc}") from exc
