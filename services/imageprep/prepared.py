"""A prepared image: identity, geometry and tensors, and its byte form for the cache tiers.

Tensors are numpy arrays, little-endian and C-ordered, exactly the bytes `FetchPixels` ships:

| name               | shape              | dtype   | what                                          |
|--------------------|--------------------|---------|-----------------------------------------------|
| `pixel_values`     | [N, C*T*P*P]       | float32 | normalised patches, merge-block order         |
| `grid_thw`         | [1, 3]             | int64   | (1, grid_h, grid_w) before the spatial merge  |
| `vision_positions` | [N, 2]             | int64   | (row, column) of each patch                   |
| `interp_indices`   | [N, 4]             | int64   | position-table taps (profiles with a table)   |
| `interp_weights`   | [N, 4]             | float32 | bilinear weights of those taps                |
| `cu_patches`       | [2]                | int32   | cumulative patch offsets (0, N)               |

`encode_record` / `decode_record` give one self-describing blob per image (magic, JSON header,
CRC-32 of the payload, raw tensor bytes) that the disk and Redis tiers store; decoding is
zero-copy (arrays view the blob) and refuses a corrupt or foreign blob.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass

import numpy as np

TENSOR_ORDER = ("pixel_values", "grid_thw", "vision_positions", "interp_indices",
                "interp_weights", "cu_patches")
_DTYPES: dict[str, np.dtype] = {"float32": np.dtype("<f4"), "int64": np.dtype("<i8"), "int32": np.dtype("<i4")}
_MAGIC = b"HELIOSIMG1\n"
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
    tensors: dict[str, np.ndarray]        # name -> array, in TENSOR_ORDER (absent ones omitted)

    @property
    def pixel_bytes(self) -> int:
        return int(self.tensors["pixel_values"].nbytes)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.tensors.values())

    def named_tensors(self) -> list[tuple[str, np.ndarray]]:
        return [(name, self.tensors[name]) for name in TENSOR_ORDER if name in self.tensors]


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
    for name, array in image.named_tensors():
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
        return PreparedImage(identity, str(header["profile"]), geometry, tensors)
    except CorruptRecord:
        raise
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise CorruptRecord(f"malformed prepared-image record: {exc}") from exc
