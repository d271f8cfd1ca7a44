"""Compile kernel launches for the H200 (sm_90) on any machine, no GPU needed, and report
what the compiler made of them: registers, spills, shared memory, load widths, MMA kind.

The real wrappers run with CPU tensors while `capture_launches()` stands in for Triton's
launcher; each captured launch is specialised the way the JIT would (16-byte-aligned pointers
and ints divisible by 16 get the divisibility hint, ints equal to 1 become constants) and
compiled ahead of time with Triton's own compiler and ptxas. `python -m tests.kernels.sm90_compile`
prints the table for Qwen3-8B shapes.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import triton
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, native_specialize_impl

H200 = GPUTarget("cuda", 90, 32)
OPTION_NAMES = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclass(frozen=True, slots=True)
class Launch:
    fn: JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grid: Any


@dataclass(frozen=True, slots=True)
class Report:
    name: str
    registers: int
    stack_bytes: int
    shared_bytes: int
    local_loads: int  # LDL in the SASS: spilled values read back
    global_loads: dict[str, int]  # LDG (and async-copy LDGSTS) by width
    mma: dict[str, int]  # HMMA (mma.sync) / HGMMA (wgmma) instructions
    # each `async_wait` of the TTGIR: how many async copies it leaves in flight (all 0 with
    # copies in the kernel: nothing is double-buffered, each copy waited for as issued)
    async_waits: tuple[int, ...] = ()


@contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Within the block, kernel launches are recorded instead of run."""
    calls: list[Launch] = []
    original = JITFunction.run

    def record(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        calls.append(Launch(self, args, kwargs, grid))

    JITFunction.run = record  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        JITFunction.run = original  # type: ignore[method-assign]


def compile_launch(launch: Launch, target: GPUTarget = H200) -> Any:
    fn = launch.fn
    params = list(inspect.signature(fn.fn).parameters.values())
    options = {k: v for k, v in launch.kwargs.items() if k in OPTION_NAMES}
    bound = dict(zip([p.name for p in params], launch.args, strict=False))
    bound.update({k: v for k, v in launch.kwargs.items() if k not in OPTION_NAMES})
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for index, param in enumerate(params):
        value = bound.get(param.name, param.default)   # a parameter not passed: its default
        if param.annotation is not inspect.Parameter.empty and "constexpr" in str(param.annotation):
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
            continue
        kind, spec = native_specialize_impl(BaseBackend, value, False, True, True)
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[param.name] = spec
        elif spec == "D":
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, constexprs, attrs)
    return triton.compile(source, target=target, options=options)


def compile_key(launch: Launch) -> tuple[Any, ...]:
    """What Triton's JIT compiles a separate binary for: the constexprs, each other argument's
    type and specialisation (== 1, divisible by 16; not for `do_not_specialize` ones) and the
    compile options. Launches with equal keys share one compilation."""
    fn = launch.fn
    params = list(inspect.signature(fn.fn).parameters.values())
    bound = dict(zip([p.name for p in params], launch.args, strict=False))
    bound.update({k: v for k, v in launch.kwargs.items() if k not in (*OPTION_NAMES, "launch_pdl")})
    unspecialised = {fn.arg_names[i] if isinstance(i, int) else i
                     for i in (getattr(fn, "do_not_specialize", None) or ())}
    parts: list[Any] = []
    for param in params:
        value = bound.get(param.name, param.default)
        if param.annotation is not inspect.Parameter.empty and "constexpr" in str(param.annotation):
            parts.append((param.name, value))
        elif param.name in unspecialised:
            parts.append((param.name, type(value).__name__))
        else:
            kind, spec = native_specialize_impl(BaseBackend, value, False, True, True)
            parts.append((param.name, kind, spec if kind == "constexpr" or spec == "D" else ""))
    options = tuple(sorted((k, v) for k, v in launch.kwargs.items() if k in OPTION_NAMES))
    return (fn.fn.__name__, tuple(parts), options)


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _cuobjdump(compiled: Any, option: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run(
            [_tool("cuobjdump"), option, f.name], capture_output=True, text=True, check=True
        ).stdout


def sass(compiled: Any) -> str:
    """The SASS of a compiled launch (cuobjdump --dump-sass)."""
    return _cuobjdump(compiled, "--dump-sass")


def report(name: str, compiled: Any) -> Report:
    usage = _cuobjdump(compiled, "--dump-resource-usage")
    sass_text = sass(compiled)
    registers = int(re.search(r"REG:(\d+)", usage).group(1))  # type: ignore[union-attr]
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))  # type: ignore[union-attr]
    loads: dict[str, int] = {}
    for match in re.finditer(r"\b(LDG|LDGSTS)\.E(\.\w+)*", sass_text):
        width = next((w for w in (".128", ".64") if w in match.group(0)), ".32")
        key = ("async" if match.group(1) == "LDGSTS" else "") + width
        loads[key] = loads.get(key, 0) + 1
    return Report(
        name=name,
        registers=registers,
        stack_bytes=stack,
        shared_bytes=int(compiled.metadata.shared),
        local_loads=len(re.findall(r"\bLDL\b", sass_text)),
        global_loads=loads,
        mma={op: n for op in ("HMMA", "HGMMA") if (n := len(re.findall(rf"\b{op}\b", sass_text)))},
        async_waits=tuple(int(n) for n in re.findall(r"async_wait .*\{num = (\d+)",
                                                      compiled.asm["ttgir"])),
    )


def qwen3_8b_launches() -> list[tuple[str, Launch]]:
    """The kernels' launches at Qwen3-8B shapes (32 q heads, 8 kv heads, D=128, hidden 4096)."""
    from tests.kernels.shapes import qwen3_8b_calls

    with capture_launches() as calls:
        names = qwen3_8b_calls()
    return list(zip(names, calls, strict=True))


def qwen3_8b_decode_attention(batch: int, ctx: int, kv_dtype: Any = None,
                              max_seq_len: int = 2304) -> Launch:
    """The attention kernel's launch in a Qwen3-8B decode step (32 q / 8 kv heads, D = 128,
    pages of 16) of `batch` sequences at `ctx` positions, over bf16 or `kv_dtype` pages,
    planned for the H200's 132 multiprocessors (a batch-1 step's split reduction left out)."""
    from types import SimpleNamespace

    import torch

    from services.engine.kernels import attention

    pages = batch * -(-ctx // 16)
    q = torch.zeros(batch, 32, 128, dtype=torch.bfloat16)
    cache = torch.zeros(pages, 16, 8, 128, dtype=kv_dtype or torch.bfloat16)
    meta = SimpleNamespace(query_start_loc=torch.arange(batch + 1, dtype=torch.int32),
                           seq_lens=torch.full((batch,), ctx, dtype=torch.int32),
                           page_table=torch.arange(pages, dtype=torch.int32).view(batch, -1),
                           max_query_len=1, max_seq_len=max_seq_len)
    sm_count = attention.sm_count
    attention.sm_count = lambda device: 132      # type: ignore[assignment]
    try:
        with capture_launches() as calls:
            attention.paged_attention(q, cache, cache, meta, 0.088)
    finally:
        attention.sm_count = sm_count            # type: ignore[assignment]
    return calls[0]


def attention_variant(launch: Launch, prefetch: bool, stages: int, cap: int = 0,
                      **constants: Any) -> Launch:
    """`launch` (a paged-attention launch) with the page prefetch on or off, `stages` stages,
    Triton's `maxnreg` = `cap` (0: none, whatever the plan had set), PDL on, and any other
    constants replaced: the variants the sm_90 reports and tests compare."""
    import dataclasses

    kwargs = {k: v for k, v in launch.kwargs.items() if k != "maxnreg"}
    kwargs.update(PREFETCH_PAGES=prefetch, num_stages=stages, PDL=True, **constants)
    if cap:
        kwargs["maxnreg"] = cap
    return dataclasses.replace(launch, kwargs=kwargs)


def gpt_oss_moe_launches(fmt: str, tokens: int) -> list[Launch]:
    """The fused-MoE GEMM launches (gate/up, down) at gpt-oss-20b's shape for `tokens` tokens,
    the expert matrices bf16 or "mxfp4" (kept packed: model/mxfp4.py's Mxfp4Weight)."""
    import torch

    from services.engine.kernels.fused_moe import fused_experts
    from services.engine.model.mxfp4 import Mxfp4Weight

    experts, top_k, hidden, inter = 32, 4, 2880, 2880

    def weight(rows: int, k: int) -> Any:
        if fmt == "bf16":
            return torch.zeros(experts, rows, k, dtype=torch.bfloat16)
        return Mxfp4Weight(torch.zeros(experts, rows, k // 2, dtype=torch.uint8),
                           torch.zeros(experts, rows, k // 32, dtype=torch.uint8),
                           torch.bfloat16)

    x = torch.zeros(tokens, hidden, dtype=torch.bfloat16)
    with capture_launches() as launches:
        fused_experts(x, weight(2 * inter, hidden), weight(hidden, inter),
                      torch.zeros(tokens, top_k), torch.zeros(tokens, top_k, dtype=torch.int32),
                      gate_up_bias=torch.zeros(experts, 2 * inter, dtype=torch.bfloat16),
                      down_bias=torch.zeros(experts, hidden, dtype=torch.bfloat16),
                      activation="swiglu_oai")
    return [launch for launch in launches
            if launch.fn.fn.__name__ in ("_gate_up_kernel", "_down_kernel")]


def main() -> None:
    print(f"{'launch':34} {'regs':>5} {'stack':>6} {'smem':>7} {'LDL':>4}  {'global loads':28} "
          f"{'mma':18} async waits")
    for name, launch in qwen3_8b_launches():
        r = report(name, compile_launch(launch))
        loads = " ".join(f"{w.replace('.', '')}b:{n}" for w, n in sorted(r.global_loads.items()))
        mma = " ".join(f"{k}:{v}" for k, v in r.mma.items())
        waits = ",".join(map(str, r.async_waits))
        print(f"{name:34} {r.registers:5} {r.stack_bytes:6} {r.shared_bytes:7} {r.local_loads:4}  "
              f"{loads:28} {mma:18} {waits}")


if __name__ == "__main__":
    main()
