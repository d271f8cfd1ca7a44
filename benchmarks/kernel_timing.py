"""What the kernel benchmarks share: the Qwen3-8B attention and MLP shapes, the CUDA-graph
timer (each measured call captured in a graph, replayed, the median replay), the profiler's
kernel table, input sets sized past the L2, and the plain-text table the reports print.

bench_kernels.py, bench_decode_step.py and bench_verify_attention.py time through these.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

COPY_LIMIT = 4.27e12  # bytes/s, device-to-device copy on an H200 (PERFORMANCE.md)
HQ, HK, D, PAGE = 32, 8, 128, 16  # Qwen3-8B attention
HIDDEN, INTER = 4096, 12288
L2_BYTES = 60 * 2**20
BF16 = torch.bfloat16


def capture_graph(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    """`fn` captured in a CUDA graph, after two runs on a side stream (kernels compile there),
    with PDL where the engine's graphs use it (kernels/pdl.py `graph_launches`)."""
    from services.engine.kernels.pdl import graph_launches

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with graph_launches():
        with torch.cuda.stream(stream):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_seconds(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Median seconds of one replay, timed with CUDA events."""
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def kernel_table(run: Callable[[], Any], per: float = 1.0) -> tuple[int, list[dict]]:
    """CUDA kernels of one `run()` under torch.profiler (graph replays included), by total
    time: (kernels per `per`, rows of kernel name, launches per `per`, us per `per`, median
    us each), `per` being what `run` did (replays, steps) so the rows read per unit."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return kernel_rows(prof, per)


def kernel_rows(prof: Any, per: float = 1.0) -> tuple[int, list[dict]]:
    """kernel_table's grouping of a finished torch.profiler session's CUDA kernels."""
    by_name: dict[str, list[float]] = {}
    count = 0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = event.name
        if name.startswith(("Memcpy", "Memset")) or "cudaGraph" in name:
            continue
        count += 1
        by_name.setdefault(name, []).append(event.device_time)
    rows = [{"kernel": name[:90], "per_step": len(t) / per, "us_per_step": sum(t) / per,
             "median_us": statistics.median(t)} for name, t in by_name.items()]
    rows.sort(key=lambda r: -r["us_per_step"])
    return round(count / per), rows


class Timer:
    """Median seconds per call of `fn` (which makes `calls` calls): CUDA graph replays timed
    with events on the GPU; wall clock around one run elsewhere (smoke runs only)."""

    def __init__(self, device: torch.device, replays: int) -> None:
        self.device = device
        self.replays = replays

    def __call__(self, fn: Callable[[], Any], calls: int = 1) -> float:
        if self.device.type != "cuda":
            fn()
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) / calls
        graph = capture_graph(fn)
        seconds = replay_seconds(graph, self.replays)
        del graph
        return seconds / calls


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def num_sets(bytes_per_set: int, cap: int = 32) -> int:
    """Input sets to rotate so that one graph replay reads about 3x the L2."""
    return max(1, min(cap, math.ceil(3 * L2_BYTES / bytes_per_set)))


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("-|-".join("-" * w for w in widths))
    lines += [" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def measure_copy(device: torch.device, timer: Timer) -> float:
    """Device-to-device copy of 2 GiB, bytes read + written; the first timing warms the clocks."""
    a = torch.randn(2**29, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    timer(lambda: b.copy_(a))
    t = timer(lambda: b.copy_(a))
    return 2 * a.numel() * a.element_size() / t
