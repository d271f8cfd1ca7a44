"""Imageprep speed: images/s and p50 latency, Helios beside transformers' fast processor.

    PYTHONPATH=. /tmp/tvenv/bin/python benchmarks/bench_imageprep.py      # with the baseline
    .venv/bin/python benchmarks/bench_imageprep.py                        # Helios only

Workloads: 512x512 and 2048x1536 synthetic photos (smooth content plus texture), encoded as
JPEG (quality 90) and PNG, under the qwen3_vl and qwen2_5_vl profiles (Qwen3's 32-pixel factor
leaves both sizes unresized; Qwen2.5's 28 makes both resize).

- helios: `decode_image` + `process_image` in-process (the work one Prepare does per image on
  a worker, cache off), one image at a time.
- transformers: `Image.open` + `Qwen2VLImageProcessor` (the torchvision backend both models use)
  with the same published settings, one image at a time. Needs torchvision, which does not
  import beside the project venv's torch: run in the separate venv (see
  tests/imageprep/generate_fingerprints.py); without it the baseline is skipped.
- grpc (qwen3_vl): a real `helios serve imageprep` process on a unix socket. Prepare cold (no
  retention: every call decodes), Prepare warm (retained: source-key hit), FetchPixels of the
  prepared tensors; and cold Prepare throughput with 4 concurrent clients.

Prints a table last and writes benchmarks/out/bench_imageprep.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.imageprep.decode import DecodeLimits, decode_image  # noqa: E402
from services.imageprep.processor import process_image  # noqa: E402
from services.imageprep.profiles import BUILTIN_PROFILES  # noqa: E402
from services.imageprep.sources import EncodedImage  # noqa: E402

SIZES = ((512, 512), (2048, 1536))
FORMATS = (("jpeg", "image/jpeg"), ("png", "image/png"))
LIMITS = DecodeLimits(max_encoded_bytes=64 << 20, max_decoded_pixels=64 << 20)


def photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients and shapes plus mild noise: compresses like a photo, not like a flat."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    fx, fy = x / width, y / height
    img = np.stack([200 * fx + 30 * np.sin(20 * fy), 180 * fy + 40 * np.cos(15 * fx),
                    120 + 100 * np.sin(8 * fx * fy)], axis=-1)
    img += rng.normal(0, 6, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(rgb: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    if fmt == "jpeg":
        Image.fromarray(rgb).save(buffer, "JPEG", quality=90)
    else:
        Image.fromarray(rgb).save(buffer, "PNG")
    return buffer.getvalue()


def _summary(latencies: list[float]) -> dict:
    return {"p50_ms": statistics.median(latencies) * 1e3,
            "images_per_s": len(latencies) / sum(latencies), "iterations": len(latencies)}


def measure(run: Callable[[], object], iterations: int, warmup: int = 2) -> dict:
    return measure_interleaved([run], iterations, warmup)[0]


def measure_interleaved(runs: list[Callable[[], object]], iterations: int,
                        warmup: int = 2) -> list[dict]:
    """Time several implementations of the same work in alternation, so that load from other
    processes on the machine falls on all of them alike."""
    for _ in range(warmup):
        for run in runs:
            run()
    latencies: list[list[float]] = [[] for _ in runs]
    for _ in range(iterations):
        for run, record in zip(runs, latencies, strict=True):
            t0 = time.perf_counter()
            run()
            record.append(time.perf_counter() - t0)
    return [_summary(record) for record in latencies]


def helios_runner(data: bytes, media_type: str, profile: str) -> Callable[[], object]:
    settings = BUILTIN_PROFILES[profile]
    return lambda: process_image(decode_image(EncodedImage(media_type, data), LIMITS), settings)


@functools.cache
def _processor_class() -> type | None:
    try:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    except Exception as exc:  # torchvision missing or broken beside this torch
        print(f"transformers baseline unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return Qwen2VLImageProcessor


def transformers_runner(data: bytes, profile: str) -> Callable[[], object] | None:
    Qwen2VLImageProcessor = _processor_class()
    if Qwen2VLImageProcessor is None:
        return None
    s = BUILTIN_PROFILES[profile]
    processor = Qwen2VLImageProcessor(
        patch_size=s.patch_size, temporal_patch_size=s.temporal_patch_size,
        merge_size=s.merge_size, image_mean=list(s.image_mean), image_std=list(s.image_std),
        min_pixels=s.min_pixels, max_pixels=s.max_pixels)

    def run() -> object:
        with Image.open(io.BytesIO(data)) as image:
            return processor(images=[image], return_tensors="pt")

    return run


CONCURRENT_VARIANTS = 8


def _service_rows(stub, workloads: dict, iterations: int, retained: bool) -> list[dict]:
    from services.common.pb import imageprep_pb2

    def request_for(data: bytes, media_type: str) -> imageprep_pb2.PrepareRequest:
        return imageprep_pb2.PrepareRequest(
            profile="qwen3_vl", images=[imageprep_pb2.ImageSource(data=data, media_type=media_type)])

    rows = []
    for (size, fmt), (data, media_type) in workloads.items():
        request = request_for(data, media_type)
        common = {"workload": f"{size[0]}x{size[1]} {fmt}", "profile": "qwen3_vl"}

        def prepare(request=request):
            return stub.Prepare(request)

        mode = "warm (retained)" if retained else "cold (no retention)"
        rows.append({"path": f"grpc Prepare {mode}", **common,
                     **measure(prepare, iterations)})
        if retained:
            fetch = imageprep_pb2.FetchPixelsRequest(identities=[prepare().images[0].identity])
            rows.append({"path": "grpc FetchPixels", **common, **measure(
                lambda fetch=fetch: sum(len(c.data) for c in stub.FetchPixels(fetch)),
                iterations)})
            continue
        # Distinct pictures, so that concurrent requests cannot share one preparation.
        variants = [request_for(encode(photo(*size, seed=seed), fmt), media_type)
                    for seed in range(1, CONCURRENT_VARIANTS + 1)]
        count = max(4 * iterations, CONCURRENT_VARIANTS)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(stub.Prepare, variants[:4]))
            started = time.perf_counter()
            list(pool.map(stub.Prepare, (variants[i % len(variants)] for i in range(count))))
            rate = count / (time.perf_counter() - started)
        rows.append({"path": "grpc Prepare cold, 4 clients", **common, "images_per_s": rate,
                     "p50_ms": float("nan"), "iterations": count})
    return rows


def grpc_rows(workloads: dict, iterations: int) -> list[dict]:
    import grpc

    from services.common.grpc_server import CHANNEL_OPTIONS
    from services.common.pb import imageprep_pb2_grpc
    from tests.support.processes import ServiceProcess

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        address = f"unix://{tmp}/imageprep.sock"
        for retained in (False, True):
            flags = ["serve", "imageprep", "--listen", address, "--memory-cache-bytes",
                     str(2 << 30 if retained else 0), "--workers", "2"]
            with ServiceProcess.start(flags, Path(tmp) / "imageprep.log") as proc:
                proc.wait_grpc_serving(address)
                with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
                    stub = imageprep_pb2_grpc.ImagePrepStub(channel)
                    rows += _service_rows(stub, workloads, iterations, retained)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=0, help="per row (0 = by size)")
    parser.add_argument("--no-grpc", action="store_true", help="skip the service rows")
    args = parser.parse_args()

    rows: list[dict] = []
    workloads = {}
    for size in SIZES:
        rgb = photo(*size)
        for fmt, media_type in FORMATS:
            workloads[(size, fmt)] = (encode(rgb, fmt), media_type)
    for (size, fmt), (data, media_type) in workloads.items():
        iterations = args.iterations or (30 if size[0] <= 512 else 8)
        for profile in BUILTIN_PROFILES:
            name = f"{size[0]}x{size[1]} {fmt}"
            runs = {"helios decode+process": helios_runner(data, media_type, profile)}
            baseline = transformers_runner(data, profile)
            if baseline is not None:
                runs["transformers fast processor"] = baseline
            for path, result in zip(runs, measure_interleaved(list(runs.values()), iterations),
                                    strict=True):
                rows.append({"path": path, "workload": name, "profile": profile,
                             "encoded_bytes": len(data), **result})
    if not args.no_grpc:
        rows += grpc_rows(workloads, args.iterations or 8)

    environment = {"python": platform.python_version(), "torch": torch.__version__,
                   "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                   "machine": platform.machine(), "processor": platform.processor(),
                   "load_average_1m": round(os.getloadavg()[0], 2)}
    try:
        import transformers
        environment["transformers"] = transformers.__version__
    except ImportError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True, check=False).stdout.strip()
    out = REPO / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_imageprep.json").write_text(json.dumps(
        {"commit": commit, "environment": environment, "rows": rows}, indent=1))

    print(f"\nimageprep (commit {commit}, torch {environment['torch']}, "
          f"{environment['torch_threads']} threads, {environment['cpus']} CPUs, load "
          f"{environment['load_average_1m']})")
    print(f"{'path':<32} {'workload':<15} {'profile':<11} {'p50 ms':>9} {'img/s':>8}")
    for row in rows:
        print(f"{row['path']:<32} {row['workload']:<15} {row['profile']:<11} "
              f"{row['p50_ms']:>9.1f} {row['images_per_s']:>8.2f}")
    by_key = {(r["path"], r["workload"], r["profile"]): r for r in rows}
    ratios = [(w, p, by_key[("transformers fast processor", w, p)]["p50_ms"] / r["p50_ms"])
              for (path, w, p), r in by_key.items()
              if path == "helios decode+process" and ("transformers fast processor", w, p)
              in by_key]
    if ratios:
        print("\ntransformers p50 / helios p50 (higher = helios faster):")
        for workload, profile, ratio in ratios:
            print(f"  {workload:<15} {profile:<11} {ratio:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
