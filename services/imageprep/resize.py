"""Smart resize: the target size within min/max pixels, and the uint8 bicubic antialiased resize.

`smart_resize` keeps the aspect ratio as closely as the patch grid allows: round each side to a
multiple of `factor` (Python's round: halves go to the even multiple), then scale both sides
down (floor) when the area exceeds max_pixels or up (ceil) when it is below min_pixels.

`resize_rgb` is PyTorch's own uint8 antialiased bicubic path (`F.interpolate` on a uint8
tensor, align_corners=False), which is what torchvision - and so transformers' fast image
processors - run on CPU. Same call, same bytes. The input is handed over channels-last (the
decoded [H, W, 3] memory, viewed as [1, 3, H, W]): PyTorch's uint8 kernel works on
channels-last pixels and converts a contiguous input to that layout first, so this skips two
full copies of the image (ours to channel-first, PyTorch's back) and yields the same bytes; the
output is a contiguous [1, 3, height, width] tensor either way.
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
    """[H, W, 3] uint8 array -> [1, 3, H, W] uint8 tensor over the same pixels, channels-last
    (no copy, unless `rgb` is read-only or not C-contiguous)."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"rgb_to_tensor takes an [H, W, 3] uint8 array, got {rgb.shape} "
                         f"{rgb.dtype}")
    # Pillow's pixels arrive read-only and torch wants writable memory: a plain copy there
    # (a memcpy, far cheaper than the channel-first transpose this replaces).
    if not rgb.flags.writeable or not rgb.flags.c_contiguous:
        rgb = np.array(rgb, order="C")
    return torch.from_numpy(rgb).permute(2, 0, 1).unsqueeze(0)


def resize_rgb(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[1, 3, h, w] uint8 -> [1, 3, height, width] uint8, bicubic with antialiasing."""
    if image.dtype != torch.uint8 or image.dim() != 4 or image.shape[:2] != (1, 3):
        raise ValueError(f"resize_rgb takes a [1, 3, H, W] uint8 tensor, got "
                         f"{tuple(image.shape)} {image.dtype}")
    if tuple(image.shape[-2:]) == (height, width):
        return image  # torchvision skips the resize for an unchanged size; so must we
    return F.interpolate(image, size=(height, width), mode="bicubic", align_corners=False,
                         antialias=True)
