"""Small image builders for the imageprep tests (encoded in memory, deterministic)."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
from PIL import Image

from services.imageprep.decode import DecodedImage, DecodeLimits, decode_image
from services.imageprep.sources import EncodedImage


def gradient(width: int, height: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1),
                     (x ^ y) & 0xFF], axis=-1).astype(np.uint8)


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def png(width: int = 64, height: int = 48, **params) -> bytes:
    return encode(Image.fromarray(gradient(width, height)), "PNG", **params)


def jpeg(width: int = 64, height: int = 48, **params) -> bytes:
    return encode(Image.fromarray(gradient(width, height)), "JPEG", quality=90, **params)


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def exif_orientation(value: object) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return (struct.pack(">I", len(payload)) + kind + payload +
            struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF))


def png_bomb(width: int, height: int) -> bytes:
    """A 1-bit greyscale PNG of width x height zero pixels: tiny file, huge decoded size."""
    row = b"\x00" * (1 + (width + 7) // 8)            # filter byte + packed bits
    compressor = zlib.compressobj(9)
    parts = [compressor.compress(row) for _ in range(height)]
    parts.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) +
            _chunk(b"IDAT", b"".join(parts)) + _chunk(b"IEND", b""))


def jpeg_segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def jpeg_frame(sof: int, width: int = 16, height: int = 16) -> bytes:
    """A frame header (one 8-bit grey component) for SOFn = 0xC0 + n."""
    return jpeg_segment(sof, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")


def synthetic_jpeg(sof: int, num_scans: int, *, width: int = 16, height: int = 16,
                   extra: bytes = b"") -> bytes:
    """SOI, frame, `num_scans` scans with a few entropy bytes each, EOI (not decodable)."""
    scan = jpeg_segment(0xDA, b"\x01\x01\x00\x00\x3f\x00") + b"\x12\xff\x00\x34"
    return (b"\xff\xd8" + extra + jpeg_frame(sof, width, height) + scan * num_scans +
            b"\xff\xd9")


def with_sof(jpeg_bytes: bytes, sof: int) -> bytes:
    """A real baseline JPEG with its SOF0 marker rewritten to another frame type."""
    at = jpeg_bytes.index(b"\xff\xc0")
    return jpeg_bytes[:at + 1] + bytes([sof]) + jpeg_bytes[at + 2:]


def decode(data: bytes, media_type: str, **limits: int) -> DecodedImage:
    defaults = {"max_encoded_bytes": 1 << 24, "max_decoded_pixels": 1 << 24}
    return decode_image(EncodedImage(media_type, data), DecodeLimits(**{**defaults, **limits}))


def prepared_image(width: int = 64, height: int = 64, *, seed: int = 0,
                   profile: str = "qwen3_vl", max_pixels: int | None = None):
    """A PreparedImage of a small seeded picture (the real processor, no file involved)."""
    from services.imageprep.processor import process_image
    from services.imageprep.profiles import builtin_profile

    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    settings = builtin_profile(profile).with_pixel_bounds(None, max_pixels)
    return process_image(DecodedImage(rgb=rgb, source_mode="RGB", orientation=1), settings)
