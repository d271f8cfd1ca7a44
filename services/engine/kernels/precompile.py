"""The start-up's Triton kernel variants: found without compiling, compiled elsewhere.

    with discover_variants(lambda v: pool.submit(v, target)) as found:
        ...the start-up's forwards...          # launches skipped, each new variant recorded
    pool.finish()                              # kernels/compile_pool.py: compiled in parallel
    with record_compiled() as met:
        ...the start-up's forwards again...    # each variant loads from Triton's cache
    remember(path, met.variants.values())      # the next start submits these at once

Why: Triton compiles a variant (a kernel at one set of constexprs and argument
specialisations) the first time a launch meets it, one after another, each 0.5-2 s of
MLIR, LLVM and ptxas. A fresh machine's start-up meets dozens (the eager warm-up's shapes, every
graph's capture run): 48 s of the 8B cold start on the H200 was compiling. Threads do not
help much (the compiler holds the GIL in its passes: 1.5x on two cores), processes do.

How: `discover_variants` installs Triton's `jit_cache_hook`, which runs before every
compilation the JIT would do, records the variant (the kernel and Triton's own
`specialization_data`, as `JITFunction.preload` takes it) and returns True, so the launch is
skipped: the forwards run with every uncompiled kernel a no-op, their results garbage (they
are start-up forwards whose results are dropped anyway). `compile_variant`, a compile
worker's job, rebuilds a variant as `preload` does and compiles it for the device's target
with `triton.compile`, which writes Triton's on-disk cache, then builds its C launcher there
too (Triton compiles one per kernel signature with the system C compiler at a kernel's first
launch); it never touches the GPU. The second run of the forwards finds every variant there
(tens of milliseconds each). A variant the discovery missed, or one a worker failed on,
compiles in the second run as before: this changes only when compilation happens, never what
runs. `remembered_path` / `load_remembered` / `remember` keep the list of variants a start-up
met under `$HELIOS_CACHE_DIR/kernels/`.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.assets import cache_root

log = logging.getLogger(__name__)


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

    src, metadata = kernel.src, kernel.metadata
    constants = {((src.fn.arg_names.index(key),) if isinstance(key, str) else key): value
                 for key, value in getattr(src, "constants", {}).items()}
    code = nvidia.make_launcher(constants, dict(src.signature.items()),
                                getattr(metadata, "tensordesc_meta", None))
    return _module_source(LAUNCHER_NAME, code)


def _module_source(name: str, code: str) -> tuple[str, Any, str]:
    """A C module's source, the Triton cache holding its build and the file name there:
    `compile_module_from_src`'s digest of the source and the platform."""
    from triton.runtime.build import platform_key
    from triton.runtime.cache import get_cache_manager

    digest = hashlib.sha256((code + platform_key()).encode("utf-8")).hexdigest()
    return code, get_cache_manager(digest), f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"


def launcher_cached(kernel: Any) -> bool:
    """Whether the kernel's launcher is in Triton's cache (its first launch loads it)."""
    _, cache, file_name = _launcher_source(kernel)
    return cache.get_file(file_name) is not None


def build_launcher(kernel: Any) -> None:
    """Build the kernel's C launcher into Triton's cache unless it is there: on a fresh cache
    each new signature's launcher is a C compilation, which the capture would otherwise do at
    each kernel's first launch, one after another (the first start's extra seconds of
    "capture CUDA graphs" on the H100 and H200)."""
    _build_into_cache(LAUNCHER_NAME, *_launcher_source(kernel))


def _build_into_cache(name: str, code: str, cache: Any, file_name: str) -> None:
    """Compile C module `name` from `code` with the system C compiler, as Triton's CUDA
    backend does for its launchers and driver utilities, and put it in `cache` under
    `file_name` unless it is there already."""
    from triton.backends.nvidia import driver as nvidia
    from triton.runtime.build import _build

    if cache.get_file(file_name) is not None:
        return
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"{name}.c")
        Path(path).write_text(code)
        built = _build(name, path, directory, nvidia.library_dirs(), nvidia.include_dirs,
                       nvidia.libraries, [])
        cache.put(Path(built).read_bytes(), file_name, binary=True)


def build_driver_utils() -> float:
    """Build Triton's CUDA driver utilities (the `cuda_utils` C module, which Triton compiles
    with the system C compiler the first time anything touches its driver, on a fresh cache)
    into Triton's cache unless it is there, without loading it: a compile worker's first job,
    so that the engine core finds it built. Returns the seconds it took."""
    from triton.backends.nvidia import driver as nvidia

    started = time.perf_counter()
    code = (Path(nvidia.dirname) / "driver.c").read_text()
    _build_into_cache("cuda_utils", *_module_source("cuda_utils", code))
    return time.perf_counter() - started


def current_target() -> Any:
    """The Triton target of the current CUDA device (a GPUTarget), as Triton's CUDA driver
    derives it, but from torch: touching Triton's driver would build its `cuda_utils` module
    here, which a compile worker may still be building (`build_driver_utils`)."""
    import torch
    from triton.backends.compiler import GPUTarget

    major, minor = torch.cuda.get_device_capability()
    return GPUTarget("cuda", major * 10 + minor, 32)
