"""Running the kernels through Triton's CPU interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import importlib
import inspect
import sys

import torch

# tl.dot in the interpreter multiplies bf16's raw bits (it stores bf16 as uint16; Triton 3.6 to
# 3.9), so kernels with a dot run on fp16 operands there.
DOT_DTYPE = torch.float16


def patch_scalar_index() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int with `int(array)`, which
    numpy >= 2.4 refuses for its 1-element arrays (a loop `range(lo, hi)` over loaded values
    fails); Triton 3.9 squeezes first. Do the same on older Tritons."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if "squeeze" in inspect.getsource(original) or getattr(original, "_helios_patched", False):
        return

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched._helios_patched = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


def reload_kernel_modules() -> None:
    """Triton picks interpreted or compiled kernels when a module defines them; redefine any
    kernel module imported before TRITON_INTERPRET was set (kernel definitions first)."""
    prefix = "services.engine.kernels."
    loaded = [name for name in sys.modules if name.startswith(prefix)]
    for name in sorted(loaded, key=lambda n: (not n.endswith("_kernel"), n)):
        importlib.reload(sys.modules[name])
    package = sys.modules.get("services.engine.kernels")
    if package is not None:
        for export in getattr(package, "_EXPORTS", {}):
            package.__dict__.pop(export, None)  # cached by the package's __getattr__


def interpreter_active() -> bool:
    """Whether Triton's own library functions were defined for the interpreter (they are fixed
    when triton.language is first imported)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.zeros, InterpretedFunction)
