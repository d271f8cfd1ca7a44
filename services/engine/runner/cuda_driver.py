"""Direct CUDA driver calls through cuda-python (`cuda.bindings.driver`), imported lazily: the
CPU machines have the package but no driver.

`event_done(event)` polls a completion without synchronising. torch's `Event.query()` does the
same through a device guard, its stream bookkeeping and an error check that raises; the engine
loop polls the oldest frame's event after every step and on every idle turn, so the direct
`cuEventQuery` is used (torch's `cuda_event` handle is the driver's `CUevent`: the runtime and
driver event handles are the same object). `benchmarks/bench_decode.py` times both calls.
Without the bindings (or a driver) the torch call is used.
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
        log.info("cuda-python unavailable; polling events through torch")
        return None
    return driver


def driver_available() -> bool:
    return _driver() is not None


def event_done(event: torch.cuda.Event) -> bool:
    """True once every piece of work recorded before `event` has finished (no sync)."""
    driver = _driver()
    if driver is None:
        return bool(event.query())
    (result,) = driver.cuEventQuery(driver.CUevent(event.cuda_event))
    if result == driver.CUresult.CUDA_SUCCESS:
        return True
    if result == driver.CUresult.CUDA_ERROR_NOT_READY:
        return False
    raise RuntimeError(f"cuEventQuery failed: {result}")
