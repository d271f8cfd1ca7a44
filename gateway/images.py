"""Images from each protocol's shape into `ImagePart`: the encoded bytes and their media type.

The gateway never fetches remote URLs and never decodes pixels: imageprep decodes with its
limits. It checks the shape (a `data:image/...;base64,` URL, or base64 with a media type) and
decodes the base64 (services/common/base64_payload.py), so a wrong one fails here with a 400
that names the field, and the image crosses the frontend and imageprep hops as bytes: three
quarters of its base64 size (a 1.7 MB PNG's 2.3 MB data URL took ~10 ms a hop through gRPC on
the CPU box).
"""

from __future__ import annotations

import base64
import binascii
import re

from services.common.api.chat import ImagePart
from services.common.base64_payload import decode_base64
from services.common.errors import UnsupportedError, ValidationError

_DATA_URL = re.compile(r"^data:(image/[A-Za-z0-9.+-]+);base64,", re.IGNORECASE)
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
          (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))


def image_from_url(url: str, *, detail: str = "", param: str) -> ImagePart:
    """OpenAI `image_url.url` / Responses `image_url`: only base64 data URLs are accepted."""
    match = _DATA_URL.match(url)
    if match:
        return _decoded(url[match.end():], match.group(1).lower(), param=param, detail=detail)
    if url.startswith(("http://", "https://")):
        raise UnsupportedError("remote image URLs are not fetched (Helios takes inline images "
                               "only: the gateway never downloads); send the image as a "
                               "base64 data URL (data:image/png;base64,...)", param=param)
    raise ValidationError("image URL must be a base64 data URL "
                          "(data:image/png;base64,...)", param=param)


def image_from_base64(data: str, media_type: str, *, param: str) -> ImagePart:
    """Anthropic `{"type": "base64", "media_type", "data"}` sources."""
    if not media_type.startswith("image/"):
        raise ValidationError(f"media_type must be an image type, not {media_type!r}",
                              param=param + ".media_type")
    return _decoded(data, media_type, param=param + ".data")


def sniff_media_type(data: str, *, param: str) -> str:
    """The media type of bare base64 image bytes (Ollama's `images`), from magic numbers."""
    head = data[:64].strip()
    head = head[: len(head) - len(head) % 4]
    try:
        raw = base64.b64decode(head, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValidationError("image is not valid base64", param=param) from exc
    for magic, media_type in _MAGIC:
        if raw.startswith(magic):
            return media_type
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "image/webp"
    raise ValidationError("image must be PNG, JPEG or WebP bytes in base64", param=param)


def image_from_bare_base64(data: str, *, param: str) -> ImagePart:
    """Ollama's `images`: bare base64 (the media type from its magic number) or a data URL."""
    if _DATA_URL.match(data):
        return image_from_url(data, param=param)
    return _decoded(data, sniff_media_type(data, param=param), param=param)


def _decoded(payload: str, media_type: str, *, param: str, detail: str = "") -> ImagePart:
    """The image's bytes from its base64 payload (400 naming `param` when it is not base64)."""
    try:
        data = decode_base64(payload)
    except ValueError as exc:
        raise ValidationError(f"image data is not valid base64 ({exc})", param=param) from exc
    if not data:
        raise ValidationError("image data is empty", param=param)
    return ImagePart(data=data, media_type=media_type, detail=detail or "")
