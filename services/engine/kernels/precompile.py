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
`triton.compile`, which writes Triton's on-disk cache, then build its C launcher there too
(Triton compiles one per kernel signature with the system C compiler at a kernel's first
launch); they never touch the GPU. The second
run of the forwards finds every variant there (tens of milliseconds each). A variant the
discovery missed, or one a worker failed on, compiles in the second run as before: the pool
changes only when compilation happens, never what runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import json
import logging
import os
import signal
import sys
import sysconfig
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, NoReturn

from services.common.assets import cache_root

log = logging.getLogger(__name__)

MAX_WORKERS = 16
PUMP_POLL_S = 0.005     # the pump thread's longest wait for a result while holding the lock


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


class _Recorder:
    """Turns Triton's JIT hook calls into Variants (module attributes looked up once)."""

    def __init__(self, found: Discovered, on_new: Callable[[Variant], None] | None) -> None:
        self.found = found
        self.on_new = on_new
        self._names: dict[int, tuple[str, str] | None] = {}

    def __call__(self, **hook: Any) -> bool:    # Triton's JITHook keywords: fn, compile, ...
        jit_function = hook["fn"].jit_function
        if id(jit_function) not in self._names:
            self._names[id(jit_function)] = _attribute_of(jit_function)
        where = self._names[id(jit_function)]
        if where is None:
            self.found.unnamed += 1
            return True
        spec = hook["compile"]["specialization_data"]
        key = (*where, spec)
        if key not in self.found.variants:
            variant = self.found.variants[key] = Variant(*where, spec)
            if self.on_new is not None:
                self.on_new(variant)
        return True


@contextlib.contextmanager
def discover_variants(on_new: Callable[[Variant], None] | None = None
                      ) -> Iterator[Discovered]:
    """Within the block, a launch that would compile a kernel variant records it (and hands it
    to `on_new`: a pool's `submit`, so compiling starts while the discovery goes on) and is
    skipped (no launch, nothing compiled)."""
    from triton import knobs

    found = Discovered()
    previous = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = _Recorder(found, on_new)
    try:
        yield found
    finally:
        knobs.runtime.jit_cache_hook = previous


@contextlib.contextmanager
def record_compiled() -> Iterator[Discovered]:
    """Within the block, every variant the JIT compiles (or loads from Triton's cache) is
    recorded; the launches run as usual."""
    from triton import knobs

    found = Discovered()
    recorder = _Recorder(found, None)
    previous = knobs.runtime.jit_post_compile_hook

    def record(**hook: Any) -> None:
        recorder(**hook)
        if previous is not None:
            previous(**hook)

    knobs.runtime.jit_post_compile_hook = record
    try:
        yield found
    finally:
        knobs.runtime.jit_post_compile_hook = previous


def remembered_path(parts: dict[str, Any]) -> Path:
    """Where the variant list of a start-up described by `parts` (the engine's settings, the
    model's config, the device and library versions) is kept: `$HELIOS_CACHE_DIR/kernels/`,
    named by a digest of `parts` and of this package's kernel sources (a changed kernel
    makes a new list)."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.read_bytes())
    return cache_root() / "kernels" / f"{digest.hexdigest()[:32]}.json"


def load_remembered(path: Path) -> list[Variant]:
    """The variants a previous start-up met (empty when none was kept or it is unreadable)."""
    try:
        rows = json.loads(path.read_text())
        return [Variant(row["module"], row["attribute"], row["specialization"]) for row in rows]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def remember(path: Path, variants: Iterable[Variant]) -> None:
    """Keep the variant list (replaced atomically; a failure to write is only logged)."""
    rows = [{"module": v.module, "attribute": v.attribute, "specialization": v.specialization}
            for v in variants]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(rows))
        os.replace(temporary, path)
    except OSError as exc:
        log.warning("could not keep the kernel variant list at %s: %s", path, exc)


def compile_variant(variant: Variant, backend_name: str, arch: int, warp_size: int
                    ) -> tuple[float, str]:
    """Compile one variant for the target into Triton's cache, and its C launcher (a
    worker's job): the seconds it took, and why the launcher was not built ("" if it was)."""
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
    kernel = triton.compile(source, target=target, options=options.__dict__)
    try:
        build_launcher(kernel)
        missed = ""
    except Exception as exc:    # the first launch builds it, as without the pool
        missed = f"{type(exc).__name__}: {exc}"
    return time.perf_counter() - started, missed


LAUNCHER_NAME = "__triton_launcher"


def _launcher_source(kernel: Any) -> tuple[str, Any, str]:
    """The C source of a compiled kernel's launcher, the Triton cache holding its build and
    the file name there: what the CUDA backend's `CudaLauncher` derives at the kernel's first
    launch (Triton 3.6: one launcher per signature and constants, built with the system C
    compiler and cached by a digest of its source)."""
    from triton.backends.nvidia import driver as nvidia
    from triton.runtime.build import platform_key
    from triton.runtime.cache import get_cache_manager

    src, metadata = kernel.src, kernel.metadata
    constants = {((src.fn.arg_names.index(key),) if isinstance(key, str) else key): value
                 for key, value in getattr(src, "constants", {}).items()}
    code = nvidia.make_launcher(constants, dict(src.signature.items()),
                                getattr(metadata, "tensordesc_meta", None))
    digest = hashlib.sha256((code + platform_key()).encode("utf-8")).hexdigest()
    file_name = f"{LAUNCHER_NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"
    return code, get_cache_manager(digest), file_name


def launcher_cached(kernel: Any) -> bool:
    """Whether the kernel's launcher is in Triton's cache (its first launch loads it)."""
    _, cache, file_name = _launcher_source(kernel)
    return cache.get_file(file_name) is not None


def build_launcher(kernel: Any) -> None:
    """Build the kernel's C launcher into Triton's cache unless it is there: on a fresh cache
    each new signature's launcher is a C compilation, which the capture would otherwise do at
    each kernel's first launch, one after another (the first start's extra seconds of
    "capture CUDA graphs" on the H100 and H200)."""
    from triton.backends.nvidia import driver as nvidia
    from triton.runtime.build import _build

    code, cache, file_name = _launcher_source(kernel)
    if cache.get_file(file_name) is not None:
        return
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"{LAUNCHER_NAME}.c")
        Path(path).write_text(code)
        built = _build(LAUNCHER_NAME, path, directory, nvidia.library_dirs(),
                       nvidia.include_dirs, nvidia.libraries, [])
        cache.put(Path(built).read_bytes(), file_name, binary=True)


@dataclass(frozen=True, slots=True)
class CompileReport:
    variants: int
    failed: int
    seconds: float              # wall time of the parallel compilation
    compile_seconds: float      # the workers' summed time (what one process would have taken)
    launchers_missed: int = 0   # variants whose C launcher a worker could not build


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
    Start it before CUDA is initialised; the workers never touch the GPU. `submit` hands a
    variant over without waiting (an idle worker takes it, or it queues); `finish` waits for
    every submitted one."""

    def __init__(self, workers: list[_Worker]) -> None:
        self._workers = workers
        self._idle = list(workers)
        self._queue: deque[tuple[Variant, tuple[str, int, int]]] = deque()
        self._busy: dict[Connection, tuple[_Worker, Variant]] = {}
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
                _serve(Connection(job_read, writable=False), Connection(result_write,
                                                                        readable=False))
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


def current_target() -> Any:
    """The Triton target of the current CUDA device (a GPUTarget)."""
    from triton.runtime import driver

    return driver.active.get_current_target()


def default_workers() -> int:
    """One worker per core but one (the engine core's own), at most MAX_WORKERS."""
    return max(0, min(MAX_WORKERS, (os.cpu_count() or 1) - 1))
