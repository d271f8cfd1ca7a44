"""Images from each protocol's shape into `ImagePart` (a base64 data URL for the frontend).

The gateway never fetches remote URLs and never decodes pixels: imageprep decodes with its
limits. Here we only check the shape (a `data:image/...;base64,` URL) so a wrong one fails
early with a 400 that names the field.
"""

from __future__ import annotations

import base64
import binascii
import re

from services.common.api.chat import ImagePart
from services.common.errors import UnsupportedError, ValidationError

_DATA_URL = re.compile(r"^data:(image/[A-Za-z0-9.+-]+);base64,", re.IGNORECASE)
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
          (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))


def image_from_url(url: str, *, detail: str = "", param: str) -> ImagePart:
    """OpenAI `image_url.url` / Responses `image_url`: only base64 data URLs are accepted."""
    if _DATA_URL.match(url):
        return ImagePart(url=url, detail=detail or "")
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
    if not data:
        raise ValidationError("image data is empty", param=param + ".data")
    return ImagePart(url=f"data:{media_type};base64,{data}")


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
    if _DATA_URL.match(data):
        return ImagePart(url=data)
    return ImagePart(url=f"data:{sniff_media_type(data, param=param)};base64,{data}")
