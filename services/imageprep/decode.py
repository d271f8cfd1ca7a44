"""Safe decoding: encoded PNG / JPEG / static WebP -> upright RGB8 pixels, or a typed refusal.

The order of checks is the point of this module; each rule is enforced before the work it
protects:

1. the declared format is the only decoder Pillow may use (`formats=[...]`);
2. JPEG: the marker walk refuses lossless, arithmetic-coded and hierarchical JPEGs and more than
   `max_progressive_scans` scans, before libjpeg sees the data;
3. the decoded-pixel limit is checked on the header's width x height, before any pixel buffer is
   allocated (a decompression bomb costs a header parse);
4. animated PNG / WebP are refused (a multi-picture JPEG keeps its primary picture);
5. pixels are decoded, the EXIF orientation read and validated (1-8), converted to RGB (alpha dropped,
   no embedded colour profile applied; 16-bit grey keeps its high byte, as Pillow does for 16-bit
   colour), and turned upright.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, UnidentifiedImageError

from services.common.errors import ImageDecodeError
from services.imageprep.jpeg_markers import inspect_jpeg
from services.imageprep.orientation import apply_orientation, read_orientation
from services.imageprep.sources import JPEG, PNG, WEBP, EncodedImage

_PILLOW_FORMAT = {PNG: "PNG", JPEG: "JPEG", WEBP: "WEBP"}
# Modes Pillow's own RGB conversion handles; alpha and padding bands are dropped, never blended.
_CONVERTIBLE_MODES = {"1", "L", "LA", "La", "P", "PA", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr"}
_SIXTEEN_BIT_GREY = {"I;16", "I;16L", "I;16B", "I;16N", "I"}
# What Pillow raises for corrupt or truncated data.
_DECODER_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError,
                   TypeError, ZeroDivisionError)


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    max_encoded_bytes: int          # checked by sources.py before base64 decoding
    max_decoded_pixels: int         # width x height from the header, before allocation
    max_progressive_scans: int = 100
    # who set each limit (a refusal names it): imageprep's settings, or the model core's
    # manifest when a Prepare request carries tighter limits (`narrowed`)
    bytes_source: str = "imageprep's max_encoded_bytes setting"
    pixels_source: str = "imageprep's max_decoded_pixels setting"

    def narrowed(self, max_bytes: int | None, max_pixels: int | None, origin: str
                 ) -> DecodeLimits:
        """These limits with a caller's tighter ones (None or 0: no limit of its own), which
        come from `origin` (the model core's manifest: its image_limits)."""
        limits = self
        if max_bytes and max_bytes < limits.max_encoded_bytes:
            limits = replace(limits, max_encoded_bytes=max_bytes,
                             bytes_source=f"image_limits.max_image_bytes of {origin}")
        if max_pixels and max_pixels < limits.max_decoded_pixels:
            limits = replace(limits, max_decoded_pixels=max_pixels,
                             pixels_source=f"image_limits.max_image_pixels of {origin}")
        return limits


@dataclass(frozen=True, slots=True)
class DecodedImage:
    """Upright RGB pixels of one image, as the processor consumes them."""

    rgb: np.ndarray                 # [H, W, 3] uint8, C-contiguous
    source_mode: str                # Pillow mode before conversion ("RGBA", "P", "I;16" ...)
    orientation: int                # EXIF orientation that was applied (1 = none)

    @property
    def height(self) -> int:
        return int(self.rgb.shape[0])

    @property
    def width(self) -> int:
        return int(self.rgb.shape[1])


def _to_rgb(image: Image.Image) -> np.ndarray:
    mode = image.mode
    if mode == "RGB":
        return np.asarray(image)
    if mode in _CONVERTIBLE_MODES:
        return np.asarray(image.convert("RGB"))
    if mode in _SIXTEEN_BIT_GREY:
        samples = np.asarray(image).astype(np.int64, copy=False)
        grey = (np.clip(samples, 0, 65535) >> 8).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    raise ImageDecodeError(f"unsupported pixel mode {mode!r}")


def _open(image: EncodedImage, limits: DecodeLimits) -> Image.Image:
    try:
        return Image.open(io.BytesIO(image.data), formats=[_PILLOW_FORMAT[image.media_type]])
    except Image.DecompressionBombError as exc:
        raise ImageDecodeError(
            f"the image is larger than the decoded-pixel limit of {limits.max_decoded_pixels} "
            f"pixels, set by {limits.pixels_source} ({exc})") from exc
    except UnidentifiedImageError as exc:
        raise ImageDecodeError(f"cannot decode the {image.media_type} image: not a valid "
                               "image of that type") from exc
    except _DECODER_ERRORS as exc:
        raise ImageDecodeError(f"cannot decode the {image.media_type} image: {exc}") from exc


def _check_header(pil: Image.Image, limits: DecodeLimits) -> None:
    width, height = pil.size
    if width < 1 or height < 1:
        raise ImageDecodeError(f"the image has no pixels ({width}x{height})")
    if width * height > limits.max_decoded_pixels:
        raise ImageDecodeError(
            f"the image is {width}x{height} = {width * height} pixels; the decoded-pixel limit "
            f"is {limits.max_decoded_pixels}, set by {limits.pixels_source}")
    # A multi-picture JPEG (MPO: a phone photo with a depth map or a second view) is a still
    # image: its primary picture is the JPEG stream itself, the only one decoded.
    animated = getattr(pil, "is_animated", False) or getattr(pil, "n_frames", 1) > 1
    if animated and pil.format != "MPO":
        raise ImageDecodeError(f"animated images are not supported ({pil.format}, "
                               f"{getattr(pil, 'n_frames', '?')} frames)")
    mode = pil.mode
    if mode != "RGB" and mode not in _CONVERTIBLE_MODES and mode not in _SIXTEEN_BIT_GREY:
        raise ImageDecodeError(f"unsupported pixel mode {mode!r}")


def check_decoded_pixels(image: EncodedImage, limits: DecodeLimits) -> None:
    """The header checks alone (no pixel decode), with the refusals decode_image gives: for
    an image held already prepared, perhaps under looser limits than this request's."""
    with _open(image, limits) as pil:
        _check_header(pil, limits)


def decode_image(image: EncodedImage, limits: DecodeLimits) -> DecodedImage:
    """Decode one encoded image under `limits`; every refusal is an ImageDecodeError."""
    if image.media_type == JPEG:
        inspect_jpeg(image.data, max_scans=limits.max_progressive_scans)
    with _open(image, limits) as pil:
        _check_header(pil, limits)
        try:
            pil.load()
            orientation = read_orientation(pil)
            stored = _to_rgb(pil)
        except ImageDecodeError:
            raise
        except _DECODER_ERRORS as exc:
            raise ImageDecodeError(f"cannot decode the {image.media_type} image: {exc}") from exc
        source_mode = pil.mode
    return DecodedImage(rgb=apply_orientation(stored, orientation), source_mode=source_mode,
                        orientation=orientation)
