"""Where the Qwen2.5-VL-7B vision encoder's time goes on one 1024x768 image, and whether a
CUDA graph of its blocks would pay (issue 14: the encoder is ~22-40 ms of an image chat's
first token on an H100, against ~8 ms of GEMM work at the tensor cores' dense bf16 rate).

    python benchmarks/profile_vision_encoder.py --out benchmarks/out/gpu     # CUDA only

Builds the tower as benchmarks/vision_encoder.py does (random bf16 weights, the image through
imageprep's pipeline: 3,996 patches) and reports, for each encoder attention backend:
- `forward_ms`: the whole forward, eager (the engine's path), median of 10 synchronised runs;
- `blocks_ms`: the 32 blocks alone (`run_blocks` over the plan and embedded patches, laid
  out beforehand), eager;
- `forward_graph_ms`: the whole forward through the engine's encoder graphs
  (vision/encoder_graphs.py: the pass captured once for this layout, then replayed; the
  replayed features must be the eager pass's bits, `graph_equal`);
- `kernels`: the blocks' kernels in one eager pass (torch.profiler): their count, the sum of
  their device time against the pass's wall time (the rest is the GPU waiting for the host),
  and the ten largest by total time.
Writes profile_vision_encoder.json under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_vision import CONFIG
from benchmarks.vision_encoder import _inputs, _tower


def _median_ms(run: Any, repeats: int = 10) -> float:
    times = []
    for index in range(repeats + 3):
        torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        torch.cuda.synchronize()
        if index >= 3:
            times.append(1e3 * (time.perf_counter() - started))
    return statistics.median(times)


def kernel_profile(run: Any) -> dict:
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        run()
        torch.cuda.synchronize()
        wall_ms = 1e3 * (time.perf_counter() - started)
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time_total / 1e3
            counts[event.name] += 1
    busy = sum(totals.values())
    top = sorted(totals, key=totals.__getitem__, reverse=True)[:10]
    return {"count": sum(counts.values()), "device_ms": busy, "wall_ms": wall_ms,
            "top": [{"name": name[:100], "ms": totals[name], "calls": counts[name]}
                    for name in top]}


def profile_backend(tower: Any, images: list[Any], backend: str) -> dict:
    from services.engine.vision.encoder_graphs import EncoderGraphs

    tower.attention_backend = backend
    report: dict[str, Any] = {"forward_ms": _median_ms(lambda: tower(images))}
    plan = tower.plan(images)
    pixels, positions = tower.pass_inputs(images)[:2]
    x = tower.patch_embed(pixels)[plan.patch_order]
    rotary = tower.rotary(positions)[plan.patch_order]
    report["blocks_ms"] = _median_ms(lambda: tower.run_blocks(x, rotary, plan))
    report["kernels"] = kernel_profile(lambda: tower.run_blocks(x, rotary, plan))
    eager = tower(images)
    try:   # the engine's encoder graphs (vision/encoder_graphs.py): the whole pass replayed
        encoder = EncoderGraphs(tower, max_layouts=1)
        encoder(images)
        replayed = encoder(images)                      # captured, then replayed
        report["graph_equal"] = all(
            torch.equal(a.features, b.features) for a, b in zip(replayed, eager, strict=True))
        report["forward_graph_ms"] = _median_ms(lambda: encoder(images))
        report["graph_replays"] = encoder.replays
    except Exception as exc:   # a layout that cannot be captured is a finding
        report["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_vision_encoder needs CUDA")
        return 1
    tower = _tower(CONFIG, "cuda", torch.bfloat16)
    images = _inputs(tower)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                              "patches": images[0].num_patches}
    for backend in ("sdpa", "triton"):
        report[backend] = profile_backend(tower, images, backend)
        row = report[backend]
        kernels = row["kernels"]
        print(f"{backend}: forward {row['forward_ms']:.2f} ms, blocks eager "
              f"{row['blocks_ms']:.2f} ms, forward from an encoder graph "
              f"{row.get('forward_graph_ms', float('nan')):.2f} ms (equal bits: "
              f"{row.get('graph_equal')}) {row.get('graph_error', '')}")
        print(f"  {kernels['count']} kernels, {kernels['device_ms']:.2f} ms of device time in "
              f"a {kernels['wall_ms']:.2f} ms pass (profiled)")
        for top in kernels["top"]:
            print(f"  {top['ms']:8.2f} ms {top['calls']:5d}x  {top['name']}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_vision_encoder.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
