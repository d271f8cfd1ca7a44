"""Giving freed memory back to the system after large requests.

A prompt of tens of MiB passes through the frontend as several copies (the protobuf message, the
domain string, the template's output). Freed, those blocks stay in glibc's heaps: the mmap
threshold grows to the largest block freed (up to 32 MiB), so later big blocks come from the
heaps, and each preparation thread has its own arena that is trimmed only from its top. Two
30 MiB prompts left hundreds of MB resident that way; and a refused request's traceback forms
reference cycles with its frames (the gRPC abort is raised while handling it), which keep the
prompt alive until the cyclic collector happens to run. `MemoryReleaser` runs `gc.collect()`
and then `malloc_trim(0)` (every arena, free pages returned with madvise) shortly after the
last large request ends (and again one and four seconds later), on a thread (ctypes
releases the GIL); and the frontend fixes the mmap threshold at 1 MiB at start
(`cap_mmap_threshold`), so big blocks are unmapped as soon as they are freed. On a C library without `malloc_trim` /
`mallopt` these do nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

LARGE_REQUEST_BYTES = 1 << 20     # requests at least this big are followed by a trim
# After the last large request: soon (its handler and gRPC have dropped their references by
# then, as a rule), a second later, and once more a few seconds later for what a loaded
# machine released late: in a CI run on two busy cores the frontend still held 175 MiB of
# its 150 ten seconds after two refused 30 MiB prompts, where an idle machine is back at
# ~115 MiB: most likely blocks freed after the one-second trim, which nothing trimmed.
TRIM_DELAYS_S = (0.05, 1.0, 4.0)


M_MMAP_THRESHOLD = -3            # glibc mallopt parameter
MMAP_THRESHOLD_BYTES = 1 << 20    # blocks this big are mapped, and unmapped when freed


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def cap_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at 1 MiB: a freed prompt copy goes back to the system at
    once instead of raising the threshold and staying in a heap (measured: two 30 MiB prompts
    left the frontend at 254 MiB of 207 with trims alone, 115 MiB with the cap as well)."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def _malloc_trim() -> Callable[[], None] | None:
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def release() -> None:
        trim(0)

    return release


class MemoryReleaser:
    """Coalesces trims: one runs after the last of a burst of large requests has ended."""

    def __init__(self, trim: Callable[[], None] | None = None) -> None:
        self._trim = trim if trim is not None else _malloc_trim()
        self._active = 0
        self._task: asyncio.Task[None] | None = None
        self.num_trims = 0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def started(self, size: int) -> bool:
        """A request of `size` bytes began; True if it counts as large."""
        large = size >= LARGE_REQUEST_BYTES and self._trim is not None
        if large:
            self._active += 1
        return large

    def ended(self) -> None:
        """A large request ended: trim once none is left (the task is created on the loop)."""
        self._active -= 1
        if self._active == 0 and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._release())

    def _collect_and_trim(self) -> None:
        assert self._trim is not None
        gc.collect()   # a failed request's traceback cycles hold its frames (and its prompt)
        self._trim()

    async def _release(self) -> None:
        waited = 0.0
        for delay in TRIM_DELAYS_S:
            await asyncio.sleep(delay - waited)
            waited = delay
            if self._active or self._trim is None:
                return  # another large request began: the last one to end trims
            try:
                await asyncio.to_thread(self._collect_and_trim)
                self.num_trims += 1
            except Exception:  # never fail a request over housekeeping
                log.exception("malloc_trim failed")
                return
