"""Direct CUDA driver calls through cuda-python (`cuda.bindings.driver`), imported lazily: the
CPU machines have the package but no driver.

Where each one is used, and why:
- `GraphLauncher.launch`: `cuGraphLaunch` on the graph's executable ("raw replay"). torch's
  `CUDAGraph.replay()` first runs its RNG bookkeeping for every generator registered at capture
  (the default CUDA generator always is): two `fill_` kernels writing the generator's seed and
  offset, then the launch. Our graphs draw no torch random numbers (sampling noise is a
  counter-based hash of seed and position: services/engine/sampling/random_stream.py), so that
  prologue is dead work on the model stream before every decode step; the reference design's
  raw replay skips it for the same reason.
- Polling a completion: measured on the H200 (bench_decode.py, 2026-11-29), torch's
  `Event.query()` took 0.30 us and `cuEventQuery` through cuda-python 0.77 us (its Python
  wrapper objects cost more than torch's C++ path), so completions are polled through torch;
  `driver_event_done` stays for that comparison.
Without the bindings (or a driver) both fall back to torch.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


@functools.cache
def _driver() -> Any | None:
    try:
        from cuda.bindings import driver
    except Exception:                  # not installed, or no libcuda on this machine
        log.info("cuda-python unavailable; graphs replay and events poll through torch")
        return None
    return driver


def driver_available() -> bool:
    return _driver() is not None


def event_done(event: torch.cuda.Event) -> bool:
    """True once every piece of work recorded before `event` has finished (no sync)."""
    return bool(event.query())


def driver_event_done(event: torch.cuda.Event) -> bool:
    """The same through cuEventQuery (kept for the measurement above)."""
    driver = _driver()
    if driver is None:
        return bool(event.query())
    (result,) = driver.cuEventQuery(driver.CUevent(event.cuda_event))
    if result == driver.CUresult.CUDA_SUCCESS:
        return True
    if result == driver.CUresult.CUDA_ERROR_NOT_READY:
        return False
    raise RuntimeError(f"cuEventQuery failed: {result}")


class GraphLauncher:
    """Replays a captured graph on a stream with `cuGraphLaunch` (handles resolved once)."""

    def __init__(self, graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> None:
        self.graph = graph
        driver = _driver()
        raw = getattr(graph, "raw_cuda_graph_exec", None)
        self._launch: Any = None
        if driver is not None and raw is not None:
            try:
                self._exec = driver.CUgraphExec(raw())
                self._stream = driver.CUstream(stream.cuda_stream)
                self._launch = driver.cuGraphLaunch
                self._ok = driver.CUresult.CUDA_SUCCESS
            except Exception:          # an older torch without the raw handle
                log.info("raw graph launch unavailable; replaying through torch")
                self._launch = None

    @property
    def is_raw(self) -> bool:
        return self._launch is not None

    def launch(self) -> None:
        if self._launch is None:
            self.graph.replay()
            return
        (result,) = self._launch(self._exec, self._stream)
        if result != self._ok:
            raise RuntimeError(f"cuGraphLaunch failed: {result}")
