"""Decompression bombs are refused cheaply: the process's peak memory barely moves.

Measured in a fresh subprocess with the peak resident set size (VmHWM in /proc/self/status),
which counts C allocations (Pillow's pixel buffers) that tracemalloc cannot see. (Not
ru_maxrss: Linux carries the parent's peak across fork/exec, so a large pytest process would
mask everything.) Fully decoding the 81 M-pixel
PNG below would allocate >= 81 MB (grey) plus 243 MB (RGB); the refusal must stay far below.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.processes import REPO_ROOT

SCRIPT = r"""
import json, sys
from services.common.errors import ImageDecodeError
from services.imageprep.decode import DecodeLimits, decode_image
from services.imageprep.sources import EncodedImage
from tests.imageprep.images import png_bomb, synthetic_jpeg

def peak_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")

limits = DecodeLimits(max_encoded_bytes=1 << 24, max_decoded_pixels=64 << 20)
bombs = {"png_9000x9000": ("image/png", png_bomb(9000, 9000)),
         "png_40000x40000": ("image/png", png_bomb(40000, 40000)),
         "jpeg_65000x65000": ("image/jpeg", synthetic_jpeg(0xC0, 1, width=65000, height=65000))}
# Warm the decode path (imports, Pillow plugin registration) on a small image first.
try:
    decode_image(EncodedImage("image/png", png_bomb(64, 64)), limits)
except ImageDecodeError:
    pass
report = {}
for name, (media_type, data) in bombs.items():
    before = peak_kib()
    try:
        decode_image(EncodedImage(media_type, data), limits)
        refused = ""
    except ImageDecodeError as exc:
        refused = str(exc)
    report[name] = {"encoded_bytes": len(data), "refused": refused,
                    "peak_growth_kib": peak_kib() - before}
# Control: a legitimate 4000x3000 image (36 MB of RGB) must show up in the measurement.
before = peak_kib()
decode_image(EncodedImage("image/png", png_bomb(4000, 3000)), limits)
report["control_4000x3000"] = {"peak_growth_kib": peak_kib() - before}
json.dump(report, sys.stdout)
"""


def test_bombs_are_refused_without_allocating_pixels():
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    control = report.pop("control_4000x3000")
    assert control["peak_growth_kib"] > 36 * 1024, report  # the measurement does see pixels
    for name, entry in report.items():
        assert entry["refused"], f"{name} was decoded"
        assert "limit" in entry["refused"], entry
        # The bombs themselves are built before `before`; refusal adds at most a few MB.
        assert entry["peak_growth_kib"] < 16 * 1024, (name, entry)
