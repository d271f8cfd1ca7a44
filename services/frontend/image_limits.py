"""The core manifest's per-request image limits, checked before imageprep decodes anything.

    check_image_limits(images, manifest.image_limits)    # ValidationError (400) naming the limit

Counting images and measuring a data URL's encoded size need no decoding, so they are checked
here; the decoded-pixel limit needs the image header, so it travels to imageprep with the
Prepare request (`prepare_images_to_pb`), which applies it beside its own configured limits.
Each refusal states the limit and that it comes from the model core's manifest.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.api.chat import ImagePart
from services.common.core import ImageLimits
from services.common.errors import ValidationError


def encoded_size(image: ImagePart) -> int:
    """Encoded bytes of an image: raw data as sent, a data URL's payload from its base64
    length (4 characters hold 3 bytes; padding subtracted)."""
    if not image.url:
        return len(image.data)
    payload = image.url.partition(",")[2]
    length = len(payload) - sum(payload.count(c) for c in " \r\n\t")
    return length // 4 * 3 - payload.rstrip()[-2:].count("=")


def check_image_limits(images: Sequence[ImagePart], limits: ImageLimits) -> None:
    if limits.max_images and len(images) > limits.max_images:
        raise ValidationError(
            f"{len(images)} images in one request; the limit is {limits.max_images} images "
            f"per request, set by {ImageLimits.source('max_images')}", param="messages")
    if not limits.max_image_bytes:
        return
    for index, image in enumerate(images):
        size = encoded_size(image)
        if size > limits.max_image_bytes:
            raise ValidationError(
                f"image {index} is {size} bytes encoded; the limit is "
                f"{limits.max_image_bytes} bytes per image, set by "
                f"{ImageLimits.source('max_image_bytes')}", param=f"messages.images[{index}]")
