"""Per-stage milliseconds of imageprep for one 1024x768 photo-like image (PNG and JPEG).

    .venv/bin/python benchmarks/profile_imageprep.py                # stages + gRPC service path
    .venv/bin/python benchmarks/profile_imageprep.py --no-grpc      # in-process stages only
    .venv/bin/python benchmarks/profile_imageprep.py --repeats 15   # more samples per median

In-process, each stage of one Prepare is timed alone on the previous stage's output (median of
`--repeats` runs): source key, decode (JPEG marker walk, Pillow decode, RGB, orientation),
semantic identity, channel-first tensor, resize, pixel_values (patchify + normalise), vision
positions, position-table interpolation; then process_image and decode + process as a whole.

Service path: a real `helios serve imageprep` process on a unix socket (as
benchmarks/bench_imageprep.py starts it), with a memory tier: Prepare cold (a fresh image each
call, so every call decodes), then FetchPixels of its tensors (all chunks received), as
float32 and, where the server has FetchPixelsRequest.pixel_dtype, as bfloat16.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_imageprep import LIMITS, encode, photo  # noqa: E402
from services.imageprep.decode import decode_image  # noqa: E402
from services.imageprep.identity import semantic_identity, source_key  # noqa: E402
from services.imageprep.jpeg_markers import inspect_jpeg  # noqa: E402
from services.imageprep.patches import PixelPatches  # noqa: E402
from services.imageprep.positions import table_interpolation, vision_positions  # noqa: E402
from services.imageprep.processor import plan_geometry, process_image  # noqa: E402
from services.imageprep.profiles import BUILTIN_PROFILES  # noqa: E402
from services.imageprep.resize import resize_rgb, rgb_to_tensor  # noqa: E402
from services.imageprep.sources import EncodedImage  # noqa: E402

WIDTH, HEIGHT = 1024, 768
FORMATS = (("png", "image/png"), ("jpeg", "image/jpeg"))


def median_ms(run: Callable[[], object], repeats: int) -> float:
    # The last results stay alive, as the retention cache keeps prepared tensors: otherwise
    # each run reuses the memory the previous one freed and hides first-touch page faults.
    held: collections.deque[object] = collections.deque([run()], maxlen=8)  # warm-up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        held.append(run())
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e3


def stage_rows(data: bytes, media_type: str, profile: str, repeats: int) -> dict[str, float]:
    settings = BUILTIN_PROFILES[profile]
    encoded = EncodedImage(media_type, data)
    decoded = decode_image(encoded, LIMITS)
    geometry = plan_geometry(decoded.height, decoded.width, settings)
    tensor = rgb_to_tensor(decoded.rgb)
    resized = resize_rgb(tensor, geometry.height, geometry.width)
    positions = vision_positions(geometry)
    rows = {
        "source_key": median_ms(lambda: source_key(media_type, data, settings), repeats),
        "decode (total)": median_ms(lambda: decode_image(encoded, LIMITS), repeats),
    }
    if media_type == "image/jpeg":
        rows["  jpeg marker walk"] = median_ms(lambda: inspect_jpeg(data, max_scans=100),
                                               repeats)
    rows.update({
        "semantic_identity": median_ms(lambda: semantic_identity(decoded.rgb, settings),
                                       repeats),
        "rgb_to_tensor": median_ms(lambda: rgb_to_tensor(decoded.rgb), repeats),
        "resize_rgb": median_ms(lambda: resize_rgb(tensor, geometry.height, geometry.width),
                                repeats),
        # FetchPixels' work since pixel_values is computed per fetch (whole image here)
        "pixel_values": median_ms(
            lambda: PixelPatches.from_resized(resized, settings).values(), repeats),
        "vision_positions": median_ms(lambda: vision_positions(geometry), repeats),
    })
    if settings.position_table_side:
        side = settings.position_table_side
        rows["table_interpolation"] = median_ms(
            lambda: table_interpolation(positions, geometry, side), repeats)
    rows["process_image (total)"] = median_ms(lambda: process_image(decoded, settings), repeats)
    rows["decode + process"] = median_ms(
        lambda: process_image(decode_image(encoded, LIMITS), settings), repeats)
    return rows


def grpc_rows(images: dict[str, tuple[list[bytes], str]], profile: str, repeats: int
              ) -> dict[str, dict[str, float]]:
    import grpc

    from services.common.grpc_server import CHANNEL_OPTIONS
    from services.common.pb import imageprep_pb2, imageprep_pb2_grpc
    from tests.support.processes import ServiceProcess

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        address = f"unix://{tmp}/imageprep.sock"
        flags = ["serve", "imageprep", "--listen", address, "--memory-cache-bytes",
                 str(2 << 30), "--workers", "2"]
        with ServiceProcess.start(flags, Path(tmp) / "imageprep.log") as proc:
            proc.wait_grpc_serving(address)
            with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
                stub = imageprep_pb2_grpc.ImagePrepStub(channel)
                for fmt, (variants, media_type) in images.items():
                    fresh = iter(variants)
                    identities: list[bytes] = []

                    def prepare(fresh=fresh, media_type=media_type,
                                identities=identities) -> None:
                        source = imageprep_pb2.ImageSource(data=next(fresh),
                                                           media_type=media_type)
                        reply = stub.Prepare(imageprep_pb2.PrepareRequest(
                            profile=profile, images=[source]))
                        identities.append(reply.images[0].identity)

                    cold = median_ms(prepare, repeats)
                    fetch = imageprep_pb2.FetchPixelsRequest(identities=identities[-1:])
                    fetched = median_ms(
                        lambda fetch=fetch: sum(len(c.data) for c in stub.FetchPixels(fetch)),
                        repeats)
                    results[fmt] = {"grpc Prepare cold": cold, "grpc FetchPixels": fetched,
                                    "grpc Prepare + FetchPixels": cold + fetched}
                    if "pixel_dtype" in imageprep_pb2.FetchPixelsRequest.DESCRIPTOR.fields_by_name:
                        halved = imageprep_pb2.FetchPixelsRequest(identities=identities[-1:],
                                                                  pixel_dtype="bfloat16")
                        results[fmt]["grpc FetchPixels bfloat16"] = median_ms(
                            lambda halved=halved: sum(len(c.data)
                                                      for c in stub.FetchPixels(halved)),
                            repeats)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="samples per median")
    parser.add_argument("--no-grpc", action="store_true", help="skip the service path")
    parser.add_argument("--profiles", default=",".join(BUILTIN_PROFILES))
    args = parser.parse_args()

    rgb = photo(WIDTH, HEIGHT)
    for profile in args.profiles.split(","):
        table: dict[str, dict[str, float]] = {}
        for fmt, media_type in FORMATS:
            table[fmt] = stage_rows(encode(rgb, fmt), media_type, profile, args.repeats)
        if not args.no_grpc:
            # A distinct picture per Prepare call, so that no call is a retention hit.
            variants = {fmt: ([encode(np.roll(rgb, seed, axis=1), fmt)
                               for seed in range(args.repeats + 1)], media_type)
                        for fmt, media_type in FORMATS}
            for fmt, rows in grpc_rows(variants, profile, args.repeats).items():
                table[fmt].update(rows)
        print(f"\n{profile}, {WIDTH}x{HEIGHT}: median ms of {args.repeats}")
        print(f"{'stage':<28}" + "".join(f"{fmt:>10}" for fmt in table))
        names = list(dict.fromkeys(name for rows in table.values() for name in rows))
        for name in names:
            cells = "".join(f"{table[fmt][name]:>10.2f}" if name in table[fmt] else f"{'-':>10}"
                            for fmt in table)
            print(f"{name:<28}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
