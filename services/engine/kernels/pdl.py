"""Programmatic dependent launch (PDL): a kernel launched with it may start while the kernel
before it on the stream is still running, and waits (`griddepcontrol.wait`) only where it
first needs that kernel's results.

Why: a batch-1 decode step is a chain of a few hundred short kernels, and on an H200 each hop
from one kernel to the next costs microseconds of launch latency and ramp-up even inside a
CUDA graph (stream capture keeps the launch attribute as a programmatic edge). With PDL the
next kernel's programs are already resident when the previous one drains; the skinny linear
kernels also start streaming their weights (which no earlier kernel writes) before the wait.

PDL is used only inside CUDA graphs (`graph_launches`: the decode, verification and EAGLE-3
round graphs, captured at start-up) and only in steps of at most `skinny_linear.MAX_ROWS`
(16) token rows: there every
projection runs through a skinny kernel, so the whole layer chain waits on griddepcontrol.
Behind a cuBLAS GEMM (which neither triggers nor waits) it bought nothing, and at the
Qwen3-0.6B shape the batch-1 step was 10% slower with PDL on the norm / attention kernels
alone (bench_decode_step.py, RESULTS.md 2026-11-29). The 2-16-row tl.dot kernel waits first
(`wait_only`) and lets the next kernel launch after (`let_next_launch`): its programs hold up
to 200 KiB of shared memory, and a trigger before the wait let every kernel down the chain
launch early, each crowding the kernel still running (the Qwen3-8B batch-4 step: 5.50 ms with
that trigger, 4.93 without PDL, 4.68 with the trigger after the sums; RESULTS.md 2026-12-04,
later session). Triggering right after the wait where the device holds the whole grid (so
only one kernel waits ahead) measured slower still: the oracle a=0.7 k=4 verification rounds
at 2.30x and 2.33x plain decoding on an H100 against 2.46x and 2.48x with the trigger after
the sums, interleaved in one call (RESULTS.md 2026-12-07, eleventh session).

The contract every PDL kernel keeps: before `wait_for_previous_grids` it reads only memory no
kernel of the step writes (weights), and writes nothing; every program executes the wait
(an early `return` comes after it), so the kernel cannot finish before its predecessor has,
which keeps ordering transitive down the chain.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_for_previous_grids(PDL: tl.constexpr):
    """Let the next kernel launch early, then wait until the previous kernel has finished and
    its writes are visible. Nothing without PDL (the interpreter has no griddepcontrol)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def wait_only(PDL: tl.constexpr):
    """The wait of `wait_for_previous_grids` without letting the next kernel launch yet (a
    kernel whose programs hold much shared memory calls `let_next_launch` at its end)."""
    if PDL:
        gdc_wait()


@triton.jit
def let_next_launch(PDL: tl.constexpr):
    """Let the next kernel launch (after this program's main work)."""
    if PDL:
        gdc_launch_dependents()


@functools.cache
def _capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


@functools.cache
def switched_off() -> bool:
    """HELIOS_PDL=0 turns PDL off (read once; `switched_off.cache_clear()` re-reads it)."""
    return os.environ.get("HELIOS_PDL", "1").strip() == "0"


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: CUDA on Hopper or later (sm_90 has the
    launch attribute and griddepcontrol), unless switched off."""
    if device.type != "cuda" or switched_off():
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


_in_graph_launches = False      # inside graph_launches()


@contextlib.contextmanager
def graph_launches() -> Iterator[None]:
    """Kernels launched inside may use PDL: a CUDA graph's capture and the eager run before
    it that compiles the variants the capture meets (capturing cannot compile). Eager steps
    launch outside it, without PDL: a host that launches kernels one by one gains nothing
    from an early launch, and every short eager step shape (a prompt's tail beside decodes,
    over any context) would otherwise be a PDL variant the warm-up has to meet, or compile
    while serving (tests/engine/gpu/test_gpu_compiles.py caught one). It refuses nesting:
    each capture says where its own PDL launches begin and end."""
    global _in_graph_launches
    if _in_graph_launches:
        raise RuntimeError("graph_launches() is already active (it does not nest)")
    _in_graph_launches = True
    try:
        yield
    finally:
        _in_graph_launches = False


def launch_options(device: torch.device, rows: int) -> dict[str, bool]:
    """Launch keywords for a PDL-capable kernel (its PDL constexpr, and the launch attribute
    when on) in a step of `rows` token rows: `kernel[grid](..., **launch_options(d, rows))`.
    On only inside `graph_launches()`."""
    from services.engine.kernels.skinny_linear import MAX_ROWS

    enabled = _in_graph_launches and rows <= MAX_ROWS and pdl_enabled(device)
    return {"PDL": enabled, "launch_pdl": True} if enabled else {"PDL": False}
