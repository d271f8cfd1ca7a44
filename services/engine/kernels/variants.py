"""How many variants of each Triton kernel this process has compiled (its per-device caches).

    before = compiled_variants()          # {"attention_kernel._paged_attention_kernel": 3, ...}
    ... serve ...
    new_variants(before)                  # {name: (before, after)} of kernels that compiled more

A kernel compiles a variant per distinct set of constexprs and specialisations it is launched
with; the engine compiles every variant a step can meet at start-up (model/moe.py's expert
warm-up, runner/warm_up.py, the decode graphs' capture), so serving compiles none. The GPU
tests check that with these counts.
"""

from __future__ import annotations

import importlib
import pkgutil


def compiled_variants() -> dict[str, int]:
    """module.kernel -> compiled variants, for every Triton kernel in this package."""
    from triton.runtime.jit import JITFunction

    import services.engine.kernels as package

    counts: dict[str, int] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, JITFunction) and value.__module__ == module.__name__:
                caches = getattr(value, "device_caches", {})
                counts[f"{info.name}.{name}"] = sum(len(cache[0]) for cache in caches.values())
    return counts


def new_variants(before: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Kernels that compiled variants since `before` was taken: name -> (before, now)."""
    now = compiled_variants()
    return {name: (before.get(name, 0), count) for name, count in now.items()
            if count > before.get(name, 0)}
