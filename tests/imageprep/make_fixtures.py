"""Write the parity fixture images (deterministic) and their SHA-256s.

    .venv/bin/python tests/imageprep/make_fixtures.py            # (re)write tests/imageprep/fixtures/
    .venv/bin/python tests/imageprep/make_fixtures.py --check    # verify the committed files

The encoded files are committed (an encoder upgrade must not silently change the fixtures);
this script documents exactly how each was made and `--check` proves the committed bytes are
the ones listed in fixtures/fixtures.json. Content is synthetic and asymmetric (gradients,
shapes, a noise patch, a checkerboard) so every EXIF orientation yields different pixels and the
antialiased resize has edges and fine detail to get right.

Coverage: sizes at and around the Qwen3-VL min-pixel boundary, sizes that need up- and
down-scaling, half-even rounding of sides, extreme aspect ratios, every PNG colour mode
(1, L, LA, P, P + tRNS, RGB, RGBA, I;16), EXIF orientations 1-8 (JPEG, plus PNG and WebP
carriers), baseline 4:2:0 / 4:4:4, progressive, greyscale and CMYK JPEG, lossy and lossless
(alpha) WebP.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

FIXTURE_DIR = Path(__file__).resolve().parent / "fixtures"
INDEX = FIXTURE_DIR / "fixtures.json"


def pattern(width: int, height: int, seed: int) -> np.ndarray:
    """[H, W, 3] uint8 synthetic picture, asymmetric in both axes."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    fx, fy = x / max(width - 1, 1), y / max(height - 1, 1)
    r = 255 * fx
    g = 255 * fy * (0.6 + 0.4 * np.sin(6.0 * fx))
    b = 127.5 + 127.5 * np.cos(9.0 * fx * fy + seed)
    img = np.stack([r, g, b], axis=-1)
    # A filled disc in the upper-left quadrant and a bar near the bottom: hard edges.
    disc = (x - width * 0.3) ** 2 + (y - height * 0.3) ** 2 < (min(width, height) * 0.18) ** 2
    img[disc] = (250, 40, 30)
    bar = (y > height * 0.78) & (y < height * 0.84) & (x > width * 0.1)
    img[bar] = (20, 20, 200)
    # A checkerboard (1-pixel cells) and a noise patch on the right: aliasing bait.
    check = (x > width * 0.6) & (x < width * 0.75) & (y > height * 0.1) & (y < height * 0.3)
    img[check] = (((x + y) % 2) * 255)[check][:, None]
    noise = (x > width * 0.8) & (y > height * 0.5) & (y < height * 0.65)
    img[noise] = rng.integers(0, 256, size=(int(noise.sum()), 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def rgb(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(pattern(width, height, seed), "RGB")


def with_alpha(base: Image.Image, seed: int) -> Image.Image:
    alpha = pattern(base.width, base.height, seed)[:, :, 2]
    image = base.copy()
    image.putalpha(Image.fromarray(alpha, "L"))
    return image


def orientation_exif(value: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def grey16(width: int, height: int) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    samples = (x * 65535 // max(width - 1, 1) ^ (y * 977)) & 0xFFFF
    return Image.fromarray(samples.astype(np.uint16))


def _fixtures() -> dict[str, Callable[[], bytes]]:
    base = rgb(160, 120, 3)
    jpeg_q = {"quality": 90}
    fixtures: dict[str, Callable[[], bytes]] = {
        # Geometry: boundaries, rounding, aspect ratios (RGB PNG).
        "rgb_643x481.png": lambda: encode(rgb(643, 481, 1), "PNG"),
        "rgb_256x256.png": lambda: encode(rgb(256, 256, 2), "PNG"),
        "rgb_257x255.png": lambda: encode(rgb(257, 255, 4), "PNG"),
        "rgb_300x200.png": lambda: encode(rgb(300, 200, 5), "PNG"),
        "rgb_10x10.png": lambda: encode(rgb(10, 10, 6), "PNG"),
        "rgb_150x1.png": lambda: encode(rgb(150, 1, 7), "PNG"),
        "rgb_1000x90.png": lambda: encode(rgb(1000, 90, 8), "PNG"),
        "rgb_90x700.png": lambda: encode(rgb(90, 700, 9), "PNG"),
        "rgb_464x336.png": lambda: encode(rgb(464, 336, 10), "PNG"),   # 14.5 / 10.5 x 32
        "rgb_434x350.png": lambda: encode(rgb(434, 350, 11), "PNG"),   # 15.5 / 12.5 x 28
        "rgb_352x352.png": lambda: encode(rgb(352, 352, 12), "PNG"),
        # PNG colour modes.
        "mode_1.png": lambda: encode(base.convert("L").convert("1"), "PNG"),
        "mode_L.png": lambda: encode(base.convert("L"), "PNG"),
        "mode_LA.png": lambda: encode(with_alpha(base.convert("L"), 13), "PNG"),
        "mode_P.png": lambda: encode(base.quantize(64), "PNG"),
        "mode_P_trns.png": lambda: encode(base.quantize(32), "PNG", transparency=0),
        "mode_RGBA.png": lambda: encode(with_alpha(base, 14), "PNG"),
        "mode_I16.png": lambda: encode(grey16(150, 110), "PNG"),
        # JPEG kinds.
        "baseline_420.jpg": lambda: encode(rgb(400, 300, 15), "JPEG", subsampling=2, **jpeg_q),
        "baseline_444.jpg": lambda: encode(rgb(333, 251, 16), "JPEG", subsampling=0, **jpeg_q),
        "progressive.jpg": lambda: encode(rgb(400, 300, 17), "JPEG", progressive=True,
                                          **jpeg_q),
        "grey.jpg": lambda: encode(rgb(220, 180, 18).convert("L"), "JPEG", **jpeg_q),
        "cmyk.jpg": lambda: encode(rgb(200, 150, 19).convert("CMYK"), "JPEG", **jpeg_q),
        # WebP.
        "lossy.webp": lambda: encode(rgb(320, 240, 20), "WEBP", quality=80, method=4),
        "lossless_alpha.webp": lambda: encode(with_alpha(rgb(200, 160, 21), 22), "WEBP",
                                              lossless=True),
        # EXIF orientation carriers other than JPEG.
        "exif6.png": lambda: encode(rgb(240, 160, 23), "PNG", exif=orientation_exif(6)),
        "exif8.webp": lambda: encode(rgb(240, 160, 24), "WEBP", lossless=True,
                                     exif=orientation_exif(8)),
    }
    for value in range(1, 9):
        fixtures[f"exif{value}.jpg"] = (
            lambda value=value: encode(rgb(240, 160, 30), "JPEG", exif=orientation_exif(value),
                                       **jpeg_q))
    return fixtures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="verify the committed fixtures")
    args = parser.parse_args(argv)
    if args.check:
        index = json.loads(INDEX.read_text())
        bad = [name for name, sha in index["sha256"].items()
               if hashlib.sha256((FIXTURE_DIR / name).read_bytes()).hexdigest() != sha]
        print("ok" if not bad else f"mismatch: {bad}")
        return 1 if bad else 0
    FIXTURE_DIR.mkdir(parents=True, exist_ok=True)
    digests = {}
    for name, make in _fixtures().items():
        data = make()
        (FIXTURE_DIR / name).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    import PIL
    INDEX.write_text(json.dumps({"pillow": PIL.__version__, "sha256": digests}, indent=1,
                                sort_keys=True) + "\n")
    total = sum((FIXTURE_DIR / n).stat().st_size for n in digests)
    print(f"{len(digests)} fixtures, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
