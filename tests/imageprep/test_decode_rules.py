"""Every decoding rule, accepted and refused: sources, limits, JPEG kinds, animation, EXIF, RGB."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image, ImageCms, ImageOps

from services.common.errors import ImageDecodeError, UnsupportedError, ValidationError
from services.imageprep.jpeg_markers import inspect_jpeg
from services.imageprep.sources import from_bytes, parse_data_url
from tests.imageprep.images import (
    data_url,
    decode,
    encode,
    exif_orientation,
    gradient,
    jpeg,
    png,
    png_bomb,
    synthetic_jpeg,
    with_sof,
)

LIMIT = 1 << 20

# -- sources ---------------------------------------------------------------------------------


def test_data_url_round_trip_and_whitespace():
    data = png()
    assert parse_data_url(data_url(data), max_encoded_bytes=LIMIT).data == data
    head, text = data_url(data).split(",")
    wrapped = head + ",\n" + "\r\n".join(text[i:i + 76] for i in range(0, len(text), 76))
    assert parse_data_url(wrapped, max_encoded_bytes=LIMIT).data == data


@pytest.mark.parametrize("url, error, text", [
    ("https://example.com/cat.png", UnsupportedError, "remote image URLs"),
    ("http://example.com/cat.png", UnsupportedError, "remote image URLs"),
    ("file:///etc/passwd", UnsupportedError, "remote image URLs"),
    ("cat.png", ValidationError, "base64 data URL"),
    ("data:image/png,rawtext", ValidationError, "base64"),
    ("data:image/png;base64", ValidationError, "no ','"),
    ("data:image/gif;base64,R0lGODlh", UnsupportedError, "image/gif"),
    ("data:image/svg+xml;base64,PHN2Zz4=", UnsupportedError, r"image/svg\+xml"),
    ("data:image/png;base64,iVBO!!!", ValidationError, "invalid base64"),
    ("data:image/png;base64,", ImageDecodeError, "empty"),
    ("data:image/png;base64,SGVsbG8gd29ybGQh", ImageDecodeError, "not a PNG, JPEG or WebP"),
])
def test_data_url_refusals(url, error, text):
    with pytest.raises(error, match=text):
        parse_data_url(url, max_encoded_bytes=LIMIT)


def test_declared_type_must_match_the_data():
    with pytest.raises(ImageDecodeError, match="declared as image/jpeg but the data is image/png"):
        parse_data_url(data_url(png(), "image/jpeg"), max_encoded_bytes=LIMIT)
    with pytest.raises(ImageDecodeError, match="declared as image/webp"):
        from_bytes(jpeg(), "image/webp", max_encoded_bytes=LIMIT)


def test_encoded_byte_limit_is_checked_before_base64_decoding():
    # Not valid base64 at all: the size refusal proves nothing was decoded first.
    oversized = "data:image/png;base64," + "!" * (4 * 1024)
    with pytest.raises(ImageDecodeError, match="3072 bytes; the limit is 1000 bytes"):
        parse_data_url(oversized, max_encoded_bytes=1000)
    with pytest.raises(ImageDecodeError, match="the limit is 100 bytes"):
        from_bytes(png(), "image/png", max_encoded_bytes=100)


def test_line_breaks_do_not_count_toward_the_byte_limit():
    data = png()
    head, text = data_url(data).split(",")
    wrapped = head + ",\n" + "\r\n".join(text[i:i + 76] for i in range(0, len(text), 76))
    assert (len(wrapped) - len(head) - 1) // 4 * 3 > len(data)    # longer than its bytes
    assert parse_data_url(wrapped, max_encoded_bytes=len(data)).data == data
    with pytest.raises(ImageDecodeError, match=f"{len(data)} bytes; the limit is "):
        parse_data_url(wrapped, max_encoded_bytes=len(data) - 1)


def test_raw_bytes_need_a_media_type():
    with pytest.raises(ValidationError, match="media_type is required"):
        from_bytes(png(), "", max_encoded_bytes=LIMIT)


# -- decoded-pixel limit and bombs -------------------------------------------------------------


def test_decoded_pixel_limit_from_the_header():
    decode(png(64, 48), "image/png", max_decoded_pixels=64 * 48)
    with pytest.raises(ImageDecodeError, match="64x48 = 3072 pixels; the decoded-pixel limit "
                                               "is 3071"):
        decode(png(64, 48), "image/png", max_decoded_pixels=64 * 48 - 1)


def test_png_bomb_refused_by_header():
    bomb = png_bomb(9000, 9000)          # 81 M pixels in ~12 KB
    assert len(bomb) < 64 * 1024
    with pytest.raises(ImageDecodeError, match="9000x9000"):
        decode(bomb, "image/png", max_decoded_pixels=64 << 20)


def test_jpeg_header_bomb_refused():
    huge = synthetic_jpeg(0xC0, 1, width=65000, height=65000)
    with pytest.raises(ImageDecodeError, match="decoded-pixel limit"):
        decode(huge, "image/jpeg")


# -- JPEG kinds ------------------------------------------------------------------------------


def test_baseline_and_progressive_jpeg_accepted():
    assert inspect_jpeg(jpeg(), max_scans=100).frame == "baseline"
    progressive = jpeg(progressive=True)
    structure = inspect_jpeg(progressive, max_scans=100)
    assert structure.frame == "progressive" and 1 < structure.num_scans <= 100
    assert decode(progressive, "image/jpeg").rgb.shape == (48, 64, 3)


@pytest.mark.parametrize("sof, text", [
    (0xC3, "lossless JPEG"),
    (0xC9, "arithmetic-coded"), (0xCA, "arithmetic-coded"), (0xCB, "arithmetic-coded"),
    (0xCD, "arithmetic-coded"), (0xCE, "arithmetic-coded"), (0xCF, "arithmetic-coded"),
    (0xC5, "hierarchical"), (0xC6, "hierarchical"), (0xC7, "hierarchical"),
])
def test_refused_jpeg_frame_types(sof, text):
    with pytest.raises(ImageDecodeError, match=text):
        decode(with_sof(jpeg(), sof), "image/jpeg")


def test_arithmetic_conditioning_marker_refused():
    dac = b"\xff\xcc\x00\x04\x00\x11"
    with pytest.raises(ImageDecodeError, match="arithmetic-coded"):
        decode(synthetic_jpeg(0xC2, 1, extra=dac), "image/jpeg")


def test_progressive_scan_limit():
    assert inspect_jpeg(synthetic_jpeg(0xC2, 100), max_scans=100).num_scans == 100
    with pytest.raises(ImageDecodeError, match="more than 100 scans"):
        decode(synthetic_jpeg(0xC2, 101), "image/jpeg")
    with pytest.raises(ImageDecodeError, match="more than 3 scans"):
        decode(jpeg(progressive=True), "image/jpeg", max_progressive_scans=3)


def test_marker_walk_skips_entropy_data_and_app_segments():
    # A real JPEG with EXIF (an embedded APP1 segment) and 0xFF bytes in its entropy data.
    data = jpeg(256, 256, exif=exif_orientation(1))
    assert inspect_jpeg(data, max_scans=1).num_scans == 1


def test_truncated_and_corrupt_images():
    with pytest.raises(ImageDecodeError, match="cannot decode"):
        decode(png()[:200], "image/png")
    with pytest.raises(ImageDecodeError, match="cannot decode"):
        decode(jpeg()[:300], "image/jpeg")
    with pytest.raises(ImageDecodeError, match="cannot decode"):
        decode(b"RIFF\x10\x00\x00\x00WEBPVP8 garbage", "image/webp")


# -- animation -------------------------------------------------------------------------------


def _frames():
    return [Image.fromarray(gradient(32, 24)), Image.fromarray(255 - gradient(32, 24))]


@pytest.mark.parametrize("fmt, media_type", [("PNG", "image/png"), ("WEBP", "image/webp")])
def test_animated_images_refused(fmt, media_type):
    first, second = _frames()
    animated = encode(first, fmt, save_all=True, append_images=[second], duration=100)
    with pytest.raises(ImageDecodeError, match="animated images are not supported"):
        decode(animated, media_type)
    assert decode(encode(first, fmt), media_type).rgb.shape == (24, 32, 3)


def test_multi_picture_jpeg_uses_its_primary_picture():
    primary = Image.new("RGB", (32, 24), (200, 10, 10))
    second = Image.new("RGB", (32, 24), (10, 200, 10))
    mpo = encode(primary, "MPO", save_all=True, append_images=[second])
    decoded = decode(mpo, "image/jpeg")
    np.testing.assert_array_equal(decoded.rgb, decode(encode(primary, "JPEG"), "image/jpeg").rgb)


# -- EXIF orientation ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 9, 65535])
def test_invalid_orientation_refused(value):
    data = jpeg(exif=exif_orientation(value))
    with pytest.raises(ImageDecodeError, match=f"invalid EXIF orientation {value}"):
        decode(data, "image/jpeg")


def _tiff_orientation_ascii() -> bytes:
    """A TIFF/EXIF block whose Orientation is the ASCII string "6" instead of a SHORT."""
    entry = struct.pack("<HHI", 0x0112, 2, 2) + b"6\x00\x00\x00"
    return b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + entry + b"\x00" * 4


def test_orientation_of_the_wrong_type_refused():
    with pytest.raises(ImageDecodeError, match="invalid EXIF orientation '6'"):
        decode(png(exif=_tiff_orientation_ascii()), "image/png")


@pytest.mark.parametrize("value", range(1, 9))
def test_orientations_swap_and_mirror_like_pillow(value):
    source = Image.fromarray(gradient(40, 20))
    data = encode(source, "PNG", exif=exif_orientation(value))
    decoded = decode(data, "image/png")
    assert decoded.orientation == value
    assert decoded.rgb.shape == ((40, 20, 3) if value >= 5 else (20, 40, 3))
    oracle = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    np.testing.assert_array_equal(decoded.rgb, oracle)
    assert value == 1 or not np.array_equal(decoded.rgb[:20, :20], gradient(40, 20)[:20, :20])


# -- RGB conversion --------------------------------------------------------------------------


def test_alpha_is_dropped_not_blended():
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[..., :3] = (10, 20, 30)          # fully transparent dark pixels
    decoded = decode(encode(Image.fromarray(rgba, "RGBA"), "PNG"), "image/png")
    assert (decoded.rgb == (10, 20, 30)).all()
    webp = encode(Image.fromarray(rgba, "RGBA"), "WEBP", lossless=True, exact=True)
    assert (decode(webp, "image/webp").rgb == (10, 20, 30)).all()


def test_sixteen_bit_grey_keeps_the_high_byte():
    samples = np.array([[0, 255, 256, 65535]], np.uint16)
    decoded = decode(encode(Image.fromarray(samples), "PNG"), "image/png")
    assert decoded.rgb[0, :, 0].tolist() == [0, 0, 1, 255]


def test_embedded_colour_profile_is_not_applied():
    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    pixels = gradient(16, 16)
    data = encode(Image.fromarray(pixels), "PNG", icc_profile=profile)
    assert Image.open(io.BytesIO(data)).info.get("icc_profile")
    np.testing.assert_array_equal(decode(data, "image/png").rgb, pixels)
