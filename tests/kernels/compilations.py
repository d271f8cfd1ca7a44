"""Counting the Triton compilations a process really does (not cache loads)."""

from __future__ import annotations


def count_compilations() -> list[str]:
    """From now on, the name of every kernel Triton compiles from source is appended to the
    returned list: `ASTSource.make_ir` runs only on a cache miss (a variant found in Triton's
    cache, in memory or on disk, is loaded without it)."""
    import triton.compiler.compiler as compiler

    compiled: list[str] = []
    make_ir = compiler.ASTSource.make_ir

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        compiled.append(self.fn.__name__)
        return make_ir(self, *args, **kwargs)

    compiler.ASTSource.make_ir = counting  # type: ignore[method-assign]
    return compiled
