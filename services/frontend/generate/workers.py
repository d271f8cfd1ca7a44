"""PreparationPool: a bounded pool of CPU workers for request preparation.

Rendering and tokenizing a large prompt takes milliseconds to tens of milliseconds of CPU; on
the event loop that would stall every token stream the frontend is relaying. Preparation runs
on `frontend_workers` threads instead (two by default, as the reference design's admission
says): jinja rendering holds the GIL only in short slices (the interpreter switches threads every
5 ms) and tokenization (`encode_batch`) releases it, so streaming keeps flowing during a burst
(benchmarks/bench_frontend.py measures the event-loop lag). Requests beyond the worker count wait
in arrival order; a request cancelled while waiting never starts.

Large jobs (prompts of megabytes: rendering copies them under the GIL) run on at most
`workers - 1` workers at once, so a burst of them never holds every worker and small requests
are prepared without waiting behind them (with one worker they share it, in order).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class PreparationPool:
    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError("a preparation pool needs at least one worker")
        self.workers = workers
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="frontend-prepare")
        self.num_waiting = 0     # requests queued for a worker
        self.num_running = 0     # requests being prepared
        self.large_slots = max(1, workers - 1)
        self._large: asyncio.Semaphore | None = None   # made on the loop that first needs it

    def _run(self, fn: Callable[..., T], *args: object) -> T:
        self.num_waiting -= 1
        self.num_running += 1
        try:
            return fn(*args)
        finally:
            self.num_running -= 1

    async def run(self, fn: Callable[..., T], *args: object, large: bool = False) -> T:
        """Run `fn(*args)` on a worker; cancelling the caller drops a request still queued.
        A `large` job first waits for one of the `large_slots`."""
        if large:
            if self._large is None:
                self._large = asyncio.Semaphore(self.large_slots)
            async with self._large:
                return await self.run(fn, *args)
        self.num_waiting += 1
        future = self._executor.submit(self._run, fn, *args)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancel():
                self.num_waiting -= 1
            raise

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
