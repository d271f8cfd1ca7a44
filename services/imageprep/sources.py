"""Encoded image sources: base64 data URLs or raw bytes with a declared media type.

Only `image/png`, `image/jpeg` and `image/webp` are accepted; remote URLs are unsupported
(imageprep never fetches). The encoded-byte limit is checked on the base64 text *before* it is
decoded, so an oversized upload costs no decode buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.base64_payload import decode_base64, without_whitespace
from services.common.errors import ImageDecodeError, UnsupportedError, ValidationError

PNG = "image/png"
JPEG = "image/jpeg"
WEBP = "image/webp"
MEDIA_TYPES = (PNG, JPEG, WEBP)
BYTES_SOURCE = "imageprep's max_encoded_bytes setting"

# Magic numbers of each accepted format (WebP: RIFF....WEBP).
_SIGNATURES = {PNG: (b"\x89PNG\r\n\x1a\n",), JPEG: (b"\xff\xd8\xff",)}


@dataclass(frozen=True, slots=True)
class EncodedImage:
    """One image as the client sent it: declared media type and the encoded bytes."""

    media_type: str     # one of MEDIA_TYPES
    data: bytes


def _check_media_type(media_type: str, param: str) -> str:
    normalized = media_type.strip().lower()
    if normalized not in MEDIA_TYPES:
        raise UnsupportedError(
            f"unsupported image media type {media_type!r}; send image/png, image/jpeg or "
            "image/webp", param=param)
    return normalized


def _check_size(num_bytes: int, limit: int, param: str, source: str) -> None:
    if num_bytes > limit:
        raise ImageDecodeError(
            f"encoded image is {num_bytes} bytes; the limit is {limit} bytes, set by {source}",
            param=param)


def sniff_media_type(data: bytes) -> str | None:
    """The format the bytes actually hold (by magic number), or None."""
    for media_type, signatures in _SIGNATURES.items():
        if data.startswith(signatures):
            return media_type
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return WEBP
    return None


def _check_content(image: EncodedImage, param: str) -> EncodedImage:
    if not image.data:
        raise ImageDecodeError("the image is empty", param=param)
    actual = sniff_media_type(image.data)
    if actual is None:
        raise ImageDecodeError(
            f"the data is not a PNG, JPEG or WebP image (declared {image.media_type})",
            param=param)
    if actual != image.media_type:
        raise ImageDecodeError(
            f"the image is declared as {image.media_type} but the data is {actual}", param=param)
    return image


def parse_data_url(url: str, *, max_encoded_bytes: int, param: str = "image",
                   source: str = BYTES_SOURCE) -> EncodedImage:
    """`data:image/png;base64,....` -> EncodedImage (limits checked before decoding). The
    payload is copied once (a 2 MB image's: partitioning, splitting and joining it had taken
    three copies); whitespace (MIME line breaks) is removed only when the payload has any."""
    comma = url.find(",")
    head = url[:comma] if comma >= 0 else url[:64]
    scheme = head[:5].lower()
    if scheme != "data:":
        if head.lower().startswith(("http://", "https://", "ftp://", "file:")):
            raise UnsupportedError(
                "remote image URLs are not supported; send the image inline as a base64 data "
                "URL (data:image/png;base64,...)", param=param)
        raise ValidationError("an image URL must be a base64 data URL (data:<type>;base64,...)",
                              param=param)
    if comma < 0:
        raise ValidationError("malformed data URL: no ',' before the data", param=param)
    media_type, *params = head[5:].split(";")
    if not any(p.strip().lower() == "base64" for p in params):
        raise ValidationError("image data URLs must be base64-encoded (;base64,)", param=param)
    media_type = _check_media_type(media_type, param)
    payload = url[comma + 1:]
    # Each 4 base64 characters hold 3 bytes: refuse by the decoded length before decoding
    # (counted without whitespace when the whole length is over the limit).
    if _decoded_length(payload) > max_encoded_bytes:
        payload = without_whitespace(payload)
        _check_size(_decoded_length(payload), max_encoded_bytes, param, source)
    try:
        data = decode_base64(payload)
    except ValueError as exc:
        raise ValidationError(f"image data URL holds invalid base64: {exc}", param=param) from exc
    return _check_content(EncodedImage(media_type, data), param)


def _decoded_length(payload: str) -> int:
    return len(payload) // 4 * 3 - payload[-2:].count("=")


def from_bytes(data: bytes, media_type: str, *, max_encoded_bytes: int,
               param: str = "image", source: str = BYTES_SOURCE) -> EncodedImage:
    """Raw encoded bytes with their declared media type -> EncodedImage."""
    if not media_type:
        raise ValidationError("media_type is required with raw image bytes", param=param)
    media_type = _check_media_type(media_type, param)
    _check_size(len(data), max_encoded_bytes, param, source)
    return _check_content(EncodedImage(media_type, bytes(data)), param)
