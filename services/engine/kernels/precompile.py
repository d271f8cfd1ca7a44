"""Compile the start-up's Triton kernel variants in parallel worker processes.

    pool = CompilePool.start(workers=12)        # forked early, before CUDA is initialised
    with discover_variants() as found:           # launches skipped, each new variant recorded
        ...the start-up's forwards...
    pool.compile(found, target)                  # compiled in parallel into Triton's cache
    ...the start-up's forwards again: each variant loads from the cache...

Why: Triton compiles a variant (a kernel at one set of constexprs and argument
specialisations) the first time a launch meets it, one after another, each 0.5-2 s of
MLIR, LLVM and ptxas. A fresh machine's start-up meets dozens (the eager warm-up's shapes, every
graph's capture run): 48 s of the 8B cold start on the H200 was compiling. Threads do not
help much (the compiler holds the GIL in its passes: 1.5x on two cores), processes do.

How: `discover_variants` installs Triton's `jit_cache_hook`, which runs before every
compilation the JIT would do, records the variant (the kernel and Triton's own
`specialization_data`, as `JITFunction.preload` takes it) and returns True, so the launch is
skipped: the forwards run with every uncompiled kernel a no-op, their results garbage (they
are start-up forwards whose results are dropped anyway). The pool's workers, forked from the
engine core before it touched CUDA (so they start at once, with every module imported),
rebuild each variant as `preload` does and compile it for the device's target with
`triton.compile`, which writes Triton's on-disk cache; they never touch the GPU. The second
run of the forwards finds every variant there (tens of milliseconds each). A variant the
discovery missed, or one a worker failed on, compiles in the second run as before: the pool
changes only when compilation happens, never what runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

log = logging.getLogger(__name__)

MAX_WORKERS = 16


@dataclass(frozen=True, slots=True)
class Variant:
    """One kernel variant: where its JITFunction lives and Triton's specialisation data."""

    module: str
    attribute: str
    specialization: str     # JSON (triton.runtime.jit.serialize_specialization_data)


@dataclass(slots=True)
class Discovered:
    variants: dict[tuple[str, str, str], Variant] = field(default_factory=dict)
    unnamed: int = 0        # variants of kernels no module attribute holds (compiled later)


def _attribute_of(jit_function: Any) -> tuple[str, str] | None:
    """(module, attribute) under which the JITFunction object itself is importable."""
    module = sys.modules.get(jit_function.module)
    if module is None:
        return None
    for name, value in vars(module).items():
        if value is jit_function:
            return jit_function.module, name
    return None


@contextlib.contextmanager
def discover_variants() -> Iterator[Discovered]:
    """Within the block, a launch that would compile a kernel variant records it and is
    skipped (no launch, nothing compiled)."""
    from triton import knobs

    found = Discovered()
    names: dict[int, tuple[str, str] | None] = {}

    def record(**hook: Any) -> bool:        # Triton's JITHook keywords: fn, compile, ...
        jit_function = hook["fn"].jit_function
        if id(jit_function) not in names:
            names[id(jit_function)] = _attribute_of(jit_function)
        where = names[id(jit_function)]
        if where is None:
            found.unnamed += 1
            return True
        spec = hook["compile"]["specialization_data"]
        found.variants.setdefault((*where, spec), Variant(*where, spec))
        return True

    previous = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = record
    try:
        yield found
    finally:
        knobs.runtime.jit_cache_hook = previous


def compile_variant(variant: Variant, backend_name: str, arch: int, warp_size: int) -> float:
    """Compile one variant for the target into Triton's cache (a worker's job); seconds."""
    started = time.perf_counter()
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    fn = getattr(importlib.import_module(variant.module), variant.attribute)
    data = json.loads(variant.specialization)
    constexprs = {
        tuple(key): tl.dtype(value) if tl.dtype.is_dtype(value) else
        tl.constexpr(value["constexpr"]) if isinstance(value, dict) and "constexpr" in value
        else value
        for key, value in zip(data["constant_keys"], data["constant_vals"], strict=True)}
    attrs = {tuple(key): value for key, value in zip(data["attrs_keys"], data["attrs_vals"],
                                                     strict=True)}
    signature = {key: tuple(value) if isinstance(value, list) else value
                 for key, value in data["signature"].items()}
    target = GPUTarget(backend_name, arch, warp_size)
    options = make_backend(target).parse_options(
        {key: tuple(value) if isinstance(value, list) else value
         for key, value in data["options"].items()})
    source = ASTSource(fn, signature, constexprs, attrs)
    triton.compile(source, target=target, options=options.__dict__)
    return time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class CompileReport:
    variants: int
    failed: int
    seconds: float              # wall time of the parallel compilation
    compile_seconds: float      # the workers' summed time (what one process would have taken)


def _serve(jobs: Connection, results: Connection) -> NoReturn:
    """A worker's loop: compile each variant sent until the pipe closes, then exit."""
    with contextlib.suppress(Exception):      # die with the engine core (Linux)
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG
    code = 0
    try:
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
    """Forked worker processes that compile kernel variants (os.fork: the engine core is a
    daemonic multiprocessing process, which multiprocessing's pools refuse to fork from).
    Start it before CUDA is initialised; the workers never touch the GPU."""

    def __init__(self, workers: list[_Worker]) -> None:
        self._workers = workers

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
                _serve(Connection(job_read, writable=False), Connection(result_write,
                                                                        readable=False))
            os.close(job_read)
            os.close(result_write)
            started.append(_Worker(pid, Connection(job_write, readable=False),
                                   Connection(result_read, writable=False)))
        return cls(started)

    def compile(self, found: Discovered, target: Any) -> CompileReport:
        """Compile every discovered variant for `target` (a triton GPUTarget), one job per
        idle worker at a time; blocks until all are done."""
        if not self._workers:
            raise RuntimeError("the compile pool is closed")
        started = time.perf_counter()
        pending = list(found.variants.values())
        busy: dict[Connection, tuple[_Worker, Variant]] = {}
        failed, total = 0, 0.0

        def give(worker: _Worker) -> None:
            variant = pending.pop()
            worker.jobs.send((variant, target.backend, target.arch, target.warp_size))
            busy[worker.results] = (worker, variant)

        for worker in self._workers:
            if pending:
                give(worker)
        while busy:
            for ready in wait(list(busy)):
                assert isinstance(ready, Connection)
                worker, variant = busy.pop(ready)
                try:
                    ok, value = ready.recv()
                except EOFError:                       # the worker died: the capture compiles
                    ok, value = False, "the worker exited"
                    self._workers.remove(worker)
                if ok:
                    total += value
                else:   # compiled again, in the engine core, where the launch meets it
                    failed += 1
                    log.warning("kernel variant of %s.%s did not compile in a worker: %s",
                                variant.module, variant.attribute, value)
                if pending and worker in self._workers:
                    give(worker)
            if not self._workers and pending:
                failed += len(pending)
                pending.clear()
        return CompileReport(len(found.variants), failed, time.perf_counter() - started, total)

    def close(self) -> None:
        """Close the job pipes (each worker exits at EOF) and reap the workers."""
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.jobs.close()
            worker.results.close()
        for worker in workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(worker.pid, 0)


def default_workers() -> int:
    """One worker per core but one (the engine core's own), at most MAX_WORKERS."""
    return max(0, min(MAX_WORKERS, (os.cpu_count() or 1) - 1))
