"""The fused element-wise kernels (norms, rotary, SiLU-and-mul, the KV write) at Qwen3-8B's
sizes against the model's plain-torch references, eager and under torch.compile: GB/s of the
bytes each op must move. `bench_kernels.py --sections ops` runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.kernel_timing import BF16, HIDDEN, HK, HQ, INTER, PAGE, D, Timer


def bench_ops(device: torch.device, timer: Timer, token_counts: list[int], compile_: bool) -> list[dict]:
    from services.engine.kernels import activation, kv_write, norm, rotary
    from services.engine.model import ops

    rows = []
    compiled: dict[str, Callable[..., Any]] = {}
    references = {
        "rms_norm": ops.reference_rms_norm,
        "fused_add_rms_norm": ops.reference_fused_add_rms_norm,
        "qk_norm": ops.reference_rms_norm,
        "apply_rotary": ops.reference_apply_rotary,
        "silu_and_mul": ops.reference_silu_and_mul,
        "write_kv": ops.reference_write_kv,
    }
    tritons = {
        "rms_norm": norm.rms_norm,
        "fused_add_rms_norm": norm.fused_add_rms_norm,
        "qk_norm": norm.rms_norm,
        "apply_rotary": rotary.apply_rotary,
        "silu_and_mul": activation.silu_and_mul,
        "write_kv": kv_write.write_kv,
    }
    for name, ref in references.items():
        compiled[name] = torch.compile(ref, dynamic=True) if compile_ else ref
    inner = 10  # calls per graph: launch gaps amortised, inputs L2-resident as between layers
    for tokens in token_counts:
        x = torch.randn(tokens, HIDDEN, device=device, dtype=BF16)
        res = torch.randn(tokens, HIDDEN, device=device, dtype=BF16)
        w = torch.randn(HIDDEN, device=device, dtype=BF16)
        qkv = torch.randn(tokens, (HQ + 2 * HK) * D, device=device, dtype=BF16)
        q = qkv[:, : HQ * D].view(tokens, HQ, D)
        k = qkv[:, HQ * D : (HQ + HK) * D].view(tokens, HK, D)
        v = qkv[:, (HQ + HK) * D :].view(tokens, HK, D)
        wd = torch.randn(D, device=device, dtype=BF16)
        positions = torch.randint(0, 32768, (tokens,), device=device)
        cache = torch.randn(32768, D, device=device, dtype=torch.float32)
        gate_up = torch.randn(tokens, 2 * INTER, device=device, dtype=BF16)
        pages = -(-tokens // PAGE) + 1
        k_cache = torch.randn(pages, PAGE, HK, D, device=device, dtype=BF16)
        v_cache = torch.randn(pages, PAGE, HK, D, device=device, dtype=BF16)
        slots = torch.randperm(pages * PAGE, device=device)[:tokens]
        e = 2  # bf16 bytes
        cases: dict[str, tuple[tuple[Any, ...], int]] = {
            "rms_norm": ((x, w, 1e-6), 2 * tokens * HIDDEN * e),
            "fused_add_rms_norm": ((x, res, w, 1e-6), 4 * tokens * HIDDEN * e),
            "qk_norm": ((q, wd, 1e-6), 2 * tokens * HQ * D * e),
            "apply_rotary": ((q, k, positions, cache), 2 * tokens * (HQ + HK) * D * e + tokens * D * 4),
            "silu_and_mul": ((gate_up,), 3 * tokens * INTER * e),
            "write_kv": ((k, v, k_cache, v_cache, slots), 4 * tokens * HK * D * e),
        }
        for name, (args, nbytes) in cases.items():
            row: dict[str, Any] = dict(op=name, tokens=tokens, bytes=nbytes)
            for label, fn in (("triton", tritons[name]), ("eager", references[name]),
                              ("compile", compiled[name] if compile_ else None)):
                if fn is None:
                    continue
                try:
                    t = timer(lambda fn=fn, args=args: [fn(*args) for _ in range(inner)], inner)
                    row[f"{label}_us"] = t * 1e6
                    row[f"{label}_gb_s"] = nbytes / t / 1e9
                except Exception as exc:  # report, keep the other numbers
                    row[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
    return rows
