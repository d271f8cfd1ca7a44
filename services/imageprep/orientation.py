"""EXIF orientation: read and validate the tag, and turn decoded pixels upright.

The eight EXIF orientations describe how the stored pixels map onto the upright picture;
5-8 swap the axes (the stored image is sideways) and 2, 4, 5, 7 are mirrored. Orientation is
applied to the decoded RGB array before any resize, so the model sees the picture the way a
viewer shows it. A tag that is not an integer 1-8 is refused rather than guessed.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from services.common.errors import ImageDecodeError

ORIENTATION_TAG = 0x0112  # EXIF IFD0 Orientation (Pillow also maps XMP tiff:Orientation here)


def read_orientation(image: Image.Image) -> int:
    """The image's EXIF orientation (1 when absent); ImageDecodeError when invalid."""
    try:
        exif = image.getexif()
        value = exif.get(ORIENTATION_TAG)
    except Exception as exc:  # Pillow raises a variety of types for a broken EXIF block
        raise ImageDecodeError(f"cannot read the image's EXIF metadata: {exc}") from exc
    if value is None:
        return 1
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 8:
        return value
    raise ImageDecodeError(f"invalid EXIF orientation {value!r}: it must be an integer 1-8")


def apply_orientation(rgb: np.ndarray, orientation: int) -> np.ndarray:
    """Turn a stored [H, W, C] array upright; returns a C-contiguous array."""
    if orientation == 1:
        upright = rgb
    elif orientation == 2:       # mirrored left-right
        upright = rgb[:, ::-1]
    elif orientation == 3:       # rotated 180
        upright = rgb[::-1, ::-1]
    elif orientation == 4:       # mirrored top-bottom
        upright = rgb[::-1]
    elif orientation == 5:       # transposed (mirror along the main diagonal)
        upright = rgb.transpose(1, 0, 2)
    elif orientation == 6:       # stored rotated 90 counter-clockwise: rotate 90 clockwise
        upright = np.rot90(rgb, k=-1)
    elif orientation == 7:       # transversed (mirror along the anti-diagonal)
        upright = rgb[::-1, ::-1].transpose(1, 0, 2)
    elif orientation == 8:       # stored rotated 90 clockwise: rotate 90 counter-clockwise
        upright = np.rot90(rgb, k=1)
    else:
        raise ImageDecodeError(f"invalid EXIF orientation {orientation}: it must be 1-8")
    return np.ascontiguousarray(upright)
