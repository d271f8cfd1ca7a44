"""Running the kernels through Triton's CPU interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import inspect

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
