"""Smart resize: the target size within min/max pixels, and the uint8 bicubic antialiased resize.

`smart_resize` keeps the aspect ratio as closely as the patch grid allows: round each side to a
multiple of `factor` (Python's round: halves go to the even multiple), then scale both sides
down (floor) when the area exceeds max_pixels or up (ceil) when it is below min_pixels.

`resize_rgb` is PyTorch's own uint8 antialiased bicubic path (`F.interpolate` on a uint8
tensor, align_corners=False), which is what torchvision - and so transformers' fast image
processors - run on CPU. Same call, same layout ([1, 3, H, W] contiguous), same bytes.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from services.common.errors import ValidationError

MAX_ASPECT_RATIO = 200


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """(resized_height, resized_width): multiples of `factor` within the pixel bounds."""
    if height < 1 or width < 1:
        raise ValidationError(f"an image of {width}x{height} pixels cannot be resized")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValidationError(
            f"the image's aspect ratio {ratio:.1f} ({width}x{height}) is above the limit of "
            f"{MAX_ASPECT_RATIO}")
    resized_h = round(height / factor) * factor
    resized_w = round(width / factor) * factor
    if resized_h * resized_w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        resized_h = max(factor, math.floor(height / beta / factor) * factor)
        resized_w = max(factor, math.floor(width / beta / factor) * factor)
    elif resized_h * resized_w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        resized_h = math.ceil(height * beta / factor) * factor
        resized_w = math.ceil(width * beta / factor) * factor
    return resized_h, resized_w


def rgb_to_tensor(rgb: np.ndarray) -> torch.Tensor:
    """[H, W, 3] uint8 array -> [1, 3, H, W] contiguous uint8 tensor (the processor's layout)."""
    # The channel-first copy is made by numpy, so the tensor owns writable memory even when
    # `rgb` is a read-only view of Pillow's buffer.
    return torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1))).unsqueeze(0)


def resize_rgb(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[1, 3, h, w] uint8 -> [1, 3, height, width] uint8, bicubic with antialiasing."""
    if image.dtype != torch.uint8 or image.dim() != 4 or image.shape[:2] != (1, 3):
        raise ValueError(f"resize_rgb takes a [1, 3, H, W] uint8 tensor, got "
                         f"{tuple(image.shape)} {image.dtype}")
    if tuple(image.shape[-2:]) == (height, width):
        return image  # torchvision skips the resize for an unchanged size; so must we
    return F.interpolate(image, size=(height, width), mode="bicubic", align_corners=False,
                         antialias=True)
