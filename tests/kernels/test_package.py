"""The package contract: the exported names, lazy triton, and every kernel compiling for the
H200 (sm_90) with no spills, checked on any machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPS = ("rms_norm", "fused_add_rms_norm", "apply_rotary", "silu_and_mul", "gelu_tanh_and_mul",
       "write_kv", "paged_attention", "qkv_prologue", "linear", "norm_linear", "fp8_linear",
       "fp8_norm_linear")


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True,
        timeout=240, check=False,
    )


def compiled_json(code: str) -> Any:
    """Run `code` with kernels compiled, not interpreted (launches recorded, nothing runs) and
    return the JSON its last line printed; skip where triton is not installed."""
    done = _python(code)
    if "No module named 'triton'" in done.stderr:
        pytest.skip("triton is not installed")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_names_follow_availability() -> None:
    """Without CUDA (and without the interpreter) the names are absent, so the model falls back
    to its torch ops, and importing the package imports no triton; with them, all are there."""
    code = (
        "import json, os, sys, torch\n"
        "from services.engine import kernels\n"
        "if os.environ.get('TRITON_INTERPRET'):\n"
        "    import services.engine.kernels.norm, services.engine.kernels.attention, services.engine.kernels.skinny_linear, services.engine.kernels.fp8_layers  # submodules first\n"
        f"names = {list(OPS)!r}\n"
        "print(json.dumps({'cuda': torch.cuda.is_available(), 'triton_loaded': 'triton' in sys.modules,"
        " 'present': [n for n in names if callable(getattr(kernels, n, None))]}))\n"
    )
    plain = json.loads(_python(code).stdout)
    assert not plain["triton_loaded"] or plain["cuda"]
    assert plain["present"] == (list(OPS) if plain["cuda"] else [])
    interpreted = json.loads(_python(code, TRITON_INTERPRET="1").stdout)
    assert interpreted["present"] == list(OPS)  # functions, not same-named submodules


def test_signatures_match_the_model_ops_spec() -> None:
    import inspect

    from services.engine.kernels import (
        activation,
        attention,
        fp8_layers,
        kv_write,
        norm,
        prologue,
        rotary,
        skinny_linear,
    )

    expected = {
        norm.rms_norm: ["x", "weight", "eps"],
        norm.fused_add_rms_norm: ["x", "residual", "weight", "eps"],
        rotary.apply_rotary: ["q", "k", "positions", "cos_sin_cache", "is_neox"],
        activation.silu_and_mul: ["x"],
        activation.gelu_tanh_and_mul: ["x"],
        kv_write.write_kv: ["k", "v", "k_cache", "v_cache", "slot_mapping"],
        attention.paged_attention: ["q", "k_cache", "v_cache", "meta", "scale", "sliding_window"],
        prologue.qkv_prologue: ["qkv", "q_norm", "k_norm", "eps", "positions", "cos_sin_cache",
                                    "is_neox", "k_cache", "v_cache", "slot_mapping", "num_q_heads",
                                    "num_kv_heads"],
        skinny_linear.linear: ["x", "weight", "bias"],
        skinny_linear.norm_linear: ["x", "residual", "norm_weight", "eps", "weight", "bias",
                                    "activation"],
        fp8_layers.fp8_linear: ["x", "weight", "bias"],
        fp8_layers.fp8_norm_linear: ["x", "residual", "norm_weight", "eps", "weight", "bias",
                                     "activation"],
    }
    for fn, names in expected.items():
        positional = [
            p.name for p in inspect.signature(fn).parameters.values()
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        ]
        assert positional == names, fn.__name__


@pytest.mark.gpu
def test_the_model_dispatches_every_op_to_a_kernel() -> None:
    from services.engine.model import ops

    ops.kernel_ops.cache_clear()
    assert sorted(ops.kernel_ops()) == sorted(OPS)


def test_every_kernel_compiles_for_sm90_without_spills() -> None:
    code = (
        "import json\n"
        "from tests.kernels.sm90_compile import compile_launch, qwen3_8b_launches, report\n"
        "rows = [report(n, compile_launch(l)) for n, l in qwen3_8b_launches()]\n"
        "print(json.dumps([[r.name, r.registers, r.stack_bytes, r.local_loads, r.mma] for r in rows]))\n"
    )
    rows = compiled_json(code)
    assert len(rows) == 25
    for name, registers, stack, local_loads, mma in rows:
        assert local_loads == 0 and registers <= 255, f"{name}: spills ({registers} regs, stack {stack})"
        if (name.startswith("attention") and "reduce" not in name) or name.endswith("M=5"):
            assert mma, f"{name}: no tensor-core MMA in the SASS"
    for prefill in (r for r in rows if r[0].startswith("attention prefill")):
        assert "HGMMA" in prefill[4], f"{prefill[0]} should use Hopper's wgmma"


def test_pdl_kernels_compile_for_sm90_with_the_wait() -> None:
    """Every kernel of the decode chain has a PDL variant (griddepcontrol before the first read
    of an earlier kernel's output); it must compile for sm_90 without spills, with the wait in
    the PTX (the launch contract of kernels/pdl.py)."""
    code = (
        "import dataclasses, json\n"
        "from tests.kernels.sm90_compile import compile_launch, qwen3_8b_launches, report\n"
        "rows = []\n"
        "for name, launch in qwen3_8b_launches():\n"
        "    if 'PDL' not in launch.fn.arg_names:\n"
        "        continue\n"
        "    pdl = dataclasses.replace(launch, kwargs={**launch.kwargs, 'PDL': True})\n"
        "    compiled = compile_launch(pdl)\n"
        "    r = report(name, compiled)\n"
        "    ptx = compiled.asm['ptx']\n"
    "    trigger = ptx.find('griddepcontrol.launch_dependents')\n"
    "    rows.append([name, r.registers, r.local_loads, 'griddepcontrol.wait' in ptx,\n"
    "                 trigger > ptx.rfind('mma') if trigger >= 0 else None])\n"
        "print(json.dumps(rows))\n"
    )
    rows = compiled_json(code)
    names = {row[0] for row in rows}
    assert {"fused_add_rms_norm H=4096", "qkv_prologue qk-norm", "attention decode split",
            "attention split reduce", "attention decode split sliding", "norm_linear qkv M=1", "norm_linear gate_up silu M=1",
            "norm_linear gate_up gelu_tanh M=1",
            "linear down M=1", "linear lm_head fp32 M=1", "norm_linear qkv M=5",
            "norm_linear gate_up silu M=5", "linear down M=5", "linear lm_head fp32 M=5"} <= names
    for name, registers, local_loads, waits, trigger_after_mma in rows:
        assert local_loads == 0 and registers <= 255, f"{name}: spills ({registers} regs)"
        assert waits, f"{name}: no griddepcontrol.wait in the PTX"
        assert trigger_after_mma is not None, f"{name}: never lets the next kernel launch"
        if name.endswith("M=5"):
            # the rows kernel lets the next kernel launch only after its sums (kernels/pdl.py:
            # launched early, the next kernel's programs crowded this one's shared memory)
            assert trigger_after_mma, f"{name}: launch_dependents before the last MMA"
