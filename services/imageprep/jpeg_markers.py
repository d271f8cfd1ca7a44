"""JPEG marker walk: what kind of JPEG this is, before any pixel is decoded.

libjpeg-turbo (Pillow's decoder) can decode lossless and arithmetic-coded JPEGs and any number
of progressive scans; the admission rules accept only Huffman-coded baseline, extended and
progressive frames with at most `max_scans` scans (a JPEG with thousands of tiny progressive
scans costs a full-image pass per scan). This walk reads marker segments by their lengths and
skips entropy-coded data to the next marker, so it touches each byte at most once and stops at
the first rule broken.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.common.errors import ImageDecodeError

_SOI, _EOI, _SOS, _DAC = 0xD8, 0xD9, 0xDA, 0xCC
_STANDALONE = {0x01, *range(0xD0, 0xD8)}           # TEM, RST0..7: no length field
_HUFFMAN_FRAMES = {0xC0: "baseline", 0xC1: "extended sequential", 0xC2: "progressive"}
_LOSSLESS_FRAMES = {0xC3}
_DIFFERENTIAL_FRAMES = {0xC5, 0xC6, 0xC7}
_ARITHMETIC_FRAMES = {0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
# A marker inside entropy-coded data: 0xFF then anything but a stuffed zero or a restart.
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7]")


@dataclass(frozen=True, slots=True)
class JpegStructure:
    frame: str          # "baseline" | "extended sequential" | "progressive"
    num_scans: int      # SOS markers seen


def _refuse(message: str) -> ImageDecodeError:
    return ImageDecodeError(f"JPEG refused: {message}")


def inspect_jpeg(data: bytes, *, max_scans: int) -> JpegStructure:
    """Walk the markers of `data`; raise ImageDecodeError for a refused JPEG kind.

    Truncated or malformed streams past the header are left to the decoder, which refuses them
    with its own message; this walk only decides admission rules.
    """
    if data[:2] != b"\xff\xd8":
        raise _refuse("missing start-of-image marker")
    frame = ""
    num_scans = 0
    pos = 2
    end = len(data)
    while pos < end:
        if data[pos] != 0xFF:
            # Extraneous bytes before a marker: libjpeg skips them with a warning; so do we.
            pos = data.find(b"\xff", pos)
            if pos < 0:
                break
        while pos < end and data[pos] == 0xFF:  # fill bytes before a marker
            pos += 1
        if pos >= end:
            break
        marker = data[pos]
        pos += 1
        if marker == _EOI:
            break
        if marker in _STANDALONE or marker == _SOI:
            continue
        if pos + 2 > end:
            break
        length = int.from_bytes(data[pos:pos + 2], "big")
        if length < 2:
            raise _refuse(f"marker 0xFF{marker:02X} has an invalid length {length}")
        if marker in _LOSSLESS_FRAMES:
            raise _refuse("lossless JPEG (SOF3) is not supported")
        if marker in _DIFFERENTIAL_FRAMES:
            raise _refuse(f"hierarchical (differential) JPEG (SOF{marker - 0xC0}) is not supported")
        if marker in _ARITHMETIC_FRAMES or marker == _DAC:
            raise _refuse("arithmetic-coded JPEG is not supported")
        if marker in _HUFFMAN_FRAMES:
            if frame:
                raise _refuse("more than one frame header")
            frame = _HUFFMAN_FRAMES[marker]
        pos += length
        if marker == _SOS:
            if not frame:
                raise _refuse("scan before the frame header")
            num_scans += 1
            if num_scans > max_scans:
                raise _refuse(f"more than {max_scans} scans (progressive scan limit)")
            found = _NEXT_MARKER.search(data, pos)
            if found is None:
                break
            pos = found.start()
    if not frame:
        raise _refuse("no frame header (SOF) before the end of the data")
    return JpegStructure(frame=frame, num_scans=num_scans)
