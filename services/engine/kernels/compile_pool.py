"""Worker processes that compile kernel variants (kernels/precompile.py's `compile_variant`).

    pool = CompilePool.start(workers=12)     # forked early, before CUDA is initialised
    pool.submit(variant, target)             # returns at once; an idle worker takes it
    report = pool.finish()                   # waits for every submitted variant
    pool.close()

The workers are plain forks of the engine core (a daemonic multiprocessing process, from which
multiprocessing's own pools refuse to start children), each with a job pipe and a result pipe.
Forked before the core touches CUDA, they start at once with every module imported, and never
touch the GPU. While variants wait for a worker, a pump thread hands each to the next worker
that finishes, so the caller goes on (loading the weights, discovering more variants).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

from services.common.processes import die_with_parent
from services.engine.kernels.precompile import Variant, build_driver_utils, compile_variant

log = logging.getLogger(__name__)

MAX_WORKERS = 16
PUMP_POLL_S = 0.005     # the pump thread's longest wait for a result while holding the lock
DRIVER_UTILS_WAIT_S = 60.0   # a C compile of ~1 s; past this the engine core goes on


@dataclass(frozen=True, slots=True)
class CompileReport:
    variants: int
    failed: int
    seconds: float              # wall time of the parallel compilation
    compile_seconds: float      # the workers' summed time (what one process would have taken)
    launchers_missed: int = 0   # variants whose C launcher a worker could not build


def _serve(jobs: Connection, results: Connection, driver_utils: bool) -> NoReturn:
    """A worker's loop: compile each variant sent until the pipe closes, then exit. The first
    worker (`driver_utils`) starts by building Triton's driver utilities and reporting it."""
    die_with_parent()                         # with the engine core
    code = 0
    try:
        if driver_utils:
            try:
                results.send((True, (build_driver_utils(), "")))
            except Exception as exc:
                results.send((False, f"{type(exc).__name__}: {exc}"))
        while True:
            try:
                variant, backend, arch, warp_size = jobs.recv()
            except EOFError:
                break
            try:
                results.send((True, compile_variant(variant, backend, arch, warp_size)))
            except Exception as exc:
                results.send((False, f"{type(exc).__name__}: {exc}"))
    except BaseException:
        code = 1
    finally:
        os._exit(code)       # never back into the engine core's code


@dataclass(slots=True)
class _Worker:
    pid: int
    jobs: Connection
    results: Connection


class CompilePool:
    """Forked worker processes that compile kernel variants (module docstring). `submit`
    hands a variant over without waiting (an idle worker takes it, or it queues); `finish`
    waits for every submitted one."""

    def __init__(self, workers: list[_Worker]) -> None:
        self._workers = workers
        self._idle = list(workers[1:])
        self._queue: deque[tuple[Variant, tuple[str, int, int]]] = deque()
        # the first worker builds Triton's driver utilities first (the job None)
        self._busy: dict[Connection, tuple[_Worker, Variant | None]] = \
            {workers[0].results: (workers[0], None)} if workers else {}
        self._submitted = 0
        self._failed = 0
        self._compile_seconds = 0.0
        self._launchers_missed = 0
        self._started: float | None = None
        self._lock = threading.Lock()       # the pump thread and the caller share the pipes
        self._pump: threading.Thread | None = None

    @property
    def workers(self) -> int:
        return len(self._workers)

    @classmethod
    def start(cls, workers: int) -> CompilePool | None:
        """Fork `workers` processes now (None where fork is unavailable or workers < 1)."""
        if workers < 1 or not hasattr(os, "fork"):
            return None
        started: list[_Worker] = []
        for _ in range(workers):
            job_read, job_write = os.pipe()
            result_read, result_write = os.pipe()
            pid = os.fork()
            if pid == 0:                                   # the worker
                os.close(job_write)
                os.close(result_read)
                for other in started:
                    other.jobs.close()
                    other.results.close()
                _serve(Connection(job_read, writable=False),
                       Connection(result_write, readable=False), driver_utils=not started)
            os.close(job_read)
            os.close(result_write)
            started.append(_Worker(pid, Connection(job_write, readable=False),
                                   Connection(result_read, writable=False)))
        return cls(started)

    def submit(self, variant: Variant, target: Any) -> None:
        """Compile `variant` for `target` (a triton GPUTarget) in a worker; returns at once.
        While variants wait for a worker, a pump thread hands each to the next worker that
        finishes (the caller goes on: loading the weights, discovering more)."""
        with self._lock:
            if not self._workers:
                raise RuntimeError("the compile pool is closed")
            if self._started is None:
                self._started = time.perf_counter()
            self._submitted += 1
            self._queue.append((variant, (target.backend, target.arch, target.warp_size)))
            self._collect(timeout=0.0)
            self._dispatch()
            if self._queue and self._pump is None:
                self._pump = threading.Thread(target=self._pump_queue, name="kernel-compile",
                                              daemon=True)
                self._pump.start()

    def compile(self, variants: Iterable[Variant], target: Any) -> CompileReport:
        """Compile every variant for `target`; blocks until all are done."""
        for variant in variants:
            self.submit(variant, target)
        return self.finish()

    def wait_for_driver_utils(self, timeout: float = DRIVER_UTILS_WAIT_S) -> bool:
        """Until the first worker has built Triton's driver utilities (or died), at most
        `timeout` seconds: call it before anything in this process touches Triton's driver,
        which would build them here too (precompile.build_driver_utils). False if the wait
        ran out (the driver then builds them here, as without the pool)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while any(job is None for _, job in self._busy.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("Triton's driver utilities took over %.0f s to build in a "
                                "worker; the engine core goes on without them", timeout)
                    return False
                self._collect(timeout=left)
                self._dispatch()
        return True

    def finish(self) -> CompileReport:
        """Wait for every submitted variant; the report covers them since the last finish."""
        while True:
            with self._lock:
                pump = self._pump
                if pump is None:
                    while self._busy or (self._queue and self._workers):
                        self._collect(timeout=None)
                        self._dispatch()
                    self._failed += len(self._queue)  # every worker died: the capture compiles
                    self._queue.clear()
                    seconds = 0.0 if self._started is None else \
                        time.perf_counter() - self._started
                    report = CompileReport(self._submitted, self._failed, seconds,
                                           self._compile_seconds, self._launchers_missed)
                    self._submitted, self._failed, self._launchers_missed = 0, 0, 0
                    self._compile_seconds, self._started = 0.0, None
                    return report
            pump.join()

    def _pump_queue(self) -> None:
        """Until no variant waits for a worker: collect results, hand out the next ones."""
        while True:
            with self._lock:
                if not self._queue or not self._workers:
                    self._pump = None
                    return
                self._collect(timeout=PUMP_POLL_S)
                self._dispatch()

    def _dispatch(self) -> None:
        while self._queue and self._idle:
            worker = self._idle.pop()
            variant, target = self._queue.popleft()
            worker.jobs.send((variant, *target))
            self._busy[worker.results] = (worker, variant)

    def _collect(self, timeout: float | None) -> None:
        if not self._busy:
            return
        for ready in wait(list(self._busy), timeout):
            assert isinstance(ready, Connection)
            worker, variant = self._busy.pop(ready)
            try:
                ok, value = ready.recv()
            except EOFError:                           # the worker died: the capture compiles
                ok, value = False, "the worker exited"
                self._workers.remove(worker)
            else:
                self._idle.append(worker)
            if variant is None:                        # the driver utilities
                if not ok:
                    log.warning("Triton's driver utilities were not built in a worker (the "
                                "engine core builds them): %s", value)
                continue
            if ok:
                seconds, missed = value
                self._compile_seconds += seconds
                if missed:
                    self._launchers_missed += 1
                    if self._launchers_missed == 1:
                        log.warning("a kernel launcher was not built in a worker (its first "
                                    "launch builds it): %s", missed)
            else:      # compiled again, in the engine core, where the launch meets it
                self._failed += 1
                log.warning("kernel variant of %s.%s did not compile in a worker: %s",
                            variant.module, variant.attribute, value)

    def close(self) -> None:
        """Close the job pipes (each worker exits at EOF) and reap the workers."""
        with self._lock:
            self._queue.clear()                 # the pump thread ends at its next look
            workers, self._workers, self._idle = self._workers, [], []
            self._busy.clear()
        for worker in workers:
            worker.jobs.close()
            worker.results.close()
        for worker in workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(worker.pid, 0)


def default_workers() -> int:
    """One worker per core but one (the engine core's own), at most MAX_WORKERS."""
    return max(0, min(MAX_WORKERS, (os.cpu_count() or 1) - 1))
