"""Hashes that name images: the encoded-source key and the semantic identity.

- `source_key`: SHA-256 over the declared media type, the encoded bytes and the processor
  settings. It keys the retention cache, so a re-sent image skips decoding entirely.
- `semantic_identity`: SHA-256 over the processor settings and the decoded, upright RGB
  pixels (with their geometry). Two encodings of the same picture (PNG vs lossless WebP, or an
  EXIF-rotated JPEG vs the same pixels stored upright) share it; the prefix cache folds it into
  its keys as the image's conditioning, and `FetchPixels` looks tensors up by it.

Each hash starts with a domain tag and length-prefixes every part, so no two different inputs
serialise to the same byte stream. SHA-256 rather than BLAKE2b: with the CPU's SHA extensions it
hashes a 2048x1536 image's 9.4 MB about twice as fast as hashlib's BLAKE2b.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from services.imageprep.profiles import ProcessorSettings

IDENTITY_BYTES = 32


def _part(hasher: hashlib._Hash, data: bytes | memoryview) -> None:
    hasher.update(struct.pack("<Q", len(data)))
    hasher.update(data)


def source_key(media_type: str, data: bytes, settings: ProcessorSettings) -> bytes:
    hasher = hashlib.sha256(b"helios.imageprep.source.v1\0")
    _part(hasher, media_type.encode())
    _part(hasher, settings.fingerprint())
    _part(hasher, data)
    return hasher.digest()


def semantic_identity(rgb: np.ndarray, settings: ProcessorSettings) -> bytes:
    """Identity of upright RGB8 pixels [H, W, 3] under `settings`."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or not rgb.flags.c_contiguous:
        raise ValueError("semantic_identity takes a C-contiguous [H, W, C] uint8 array")
    hasher = hashlib.sha256(b"helios.imageprep.identity.v1\0")
    _part(hasher, settings.fingerprint())
    _part(hasher, struct.pack("<III", *rgb.shape))
    _part(hasher, rgb.data.cast("B"))
    return hasher.digest()
