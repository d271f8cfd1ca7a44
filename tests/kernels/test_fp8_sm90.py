"""The FP8 kernels as the H200 compiler makes them (Triton + ptxas for sm_90, no GPU needed:
tests/kernels/sm90_compile.py): every launch at Qwen3-8B shapes without spills, the GEMMs on
e4m3 tensor cores, the one-row kernels reading e4m3 words into PTX's pair conversion, and
the tensor-core skinny variants. Their numerics: test_fp8.py (CPU) and test_fp8_gpu.py."""

from __future__ import annotations

import pytest

SM90_CODE = """
import dataclasses, json, torch
from services.common.quantization import Fp8Scheme
from services.engine.kernels.fp8_gemm import block_mm, triton_mm
from services.engine.kernels.fp8_layers import fp8_linear, fp8_norm_linear
from services.engine.kernels.fp8_quant import norm_quantize_fp8, quantize_fp8
from services.engine.model.fp8 import Fp8Weight
from tests.kernels.sm90_compile import capture_launches, compile_launch, report
E4 = torch.float8_e4m3fn
H, I, QKV = 4096, 12288, 6144          # Qwen3-8B
def weight(n, k, block):
    scheme = Fp8Scheme("fp8", "block", "group") if block else Fp8Scheme("online", "channel", "token")
    scale = torch.ones((n // 128, k // 128) if block else (n,))
    return Fp8Weight(torch.zeros(n, k, dtype=E4), scale, scheme)
x1, x256 = torch.zeros(1, H, dtype=torch.bfloat16), torch.zeros(256, H, dtype=torch.bfloat16)
act1 = torch.zeros(1, I, dtype=torch.bfloat16)
g = torch.ones(H, dtype=torch.bfloat16)
names = []
with capture_launches() as calls:
    for block in (False, True):
        tag = "block" if block else "channel"
        fp8_norm_linear(x1, x1, g, 1e-6, weight(QKV, H, block)); names.append(f"skinny qkv {tag}")
        fp8_norm_linear(x1, x1, g, 1e-6, weight(2 * I, H, block), None, "silu"); names.append(f"skinny gate_up silu {tag}")
        fp8_linear(act1, weight(H, I, block)); names.append(f"skinny down {tag}")
    a = torch.zeros(256, H, dtype=E4)
    # M = 256: 96 output tiles for 132 SMs, unsplit (the partials would move as many bytes as
    # the weight); M = 48: 48 tiles, K split 3 ways, then the ordered sum
    triton_mm(a, torch.ones(256, 1), weight(QKV, H, False).qweight, torch.ones(QKV), None, torch.bfloat16, blockwise=False); names += ["gemm rowwise M=256"]
    triton_mm(a[:48], torch.ones(48, 1), weight(QKV, H, False).qweight, torch.ones(QKV), None, torch.bfloat16, blockwise=False); names += ["gemm rowwise M=48", "split-k sum"]
    block_mm(a, torch.ones(256, H // 128), weight(QKV, H, True).qweight, torch.ones(QKV // 128, H // 128), None, torch.bfloat16); names += ["gemm block M=256"]
    block_mm(a[:48], torch.ones(48, H // 128), weight(QKV, H, True).qweight, torch.ones(QKV // 128, H // 128), None, torch.bfloat16); names += ["gemm block M=48", "split-k sum"]
    quantize_fp8(x256, "token"); names.append("quant token")
    quantize_fp8(x256, "group"); names.append("quant group")
    quantize_fp8(torch.zeros(256, I, dtype=torch.bfloat16), "token"); names.append("quant token down")
    norm_quantize_fp8(x256, x256, g, 1e-6, "token"); names.append("norm quant token")
    norm_quantize_fp8(x256, x256, g, 1e-6, "group"); names.append("norm quant group")
rows = []
for name, launch in zip(names, calls, strict=True):
    if "PDL" in launch.fn.arg_names:
        launch = dataclasses.replace(launch, kwargs={**launch.kwargs, "PDL": True})
    if "E4M3_PTX" in launch.kwargs:   # as launched on CUDA: e4m3 words (fp8_unpack.py)
        launch = dataclasses.replace(launch, kwargs={**launch.kwargs, "E4M3_PTX": True})
    compiled = compile_launch(launch)
    r = report(name, compiled)
    ptx = compiled.asm["ptx"]
    fp8_wgmma = any("wgmma.mma_async" in line and ".e4m3.e4m3" in line for line in ptx.splitlines())
    rows.append([name, r.registers, r.local_loads, fp8_wgmma, "griddepcontrol.wait" in ptx,
                 "cvt.rn.f16x2.e4m3x2" in ptx, r.global_loads])
print(json.dumps(rows))
"""


def test_fp8_kernels_compile_for_sm90_without_spills():
    """Every FP8 launch at Qwen3-8B shapes compiled for the H200 (Triton + ptxas, no GPU):
    no spills; the GEMMs on tensor cores (FP8 wgmma); the skinny kernels with PDL's wait,
    reading e4m3 words 16 bytes a load into the PTX pair conversion (fp8_unpack.py)."""
    from tests.kernels.test_package import compiled_json

    rows = compiled_json(SM90_CODE)
    assert len(rows) == 17
    for name, registers, local_loads, fp8_wgmma, waits, pair_cvt, loads in rows:
        assert local_loads == 0 and registers <= 255, f"{name}: spills ({registers} regs)"
        if name.startswith("gemm"):   # Hopper's e4m3 wgmma (QGMMA in the SASS)
            assert fp8_wgmma, f"{name}: no e4m3 wgmma in the PTX"
        if name.startswith("skinny"):
            assert waits, f"{name}: no griddepcontrol.wait"
            # the weights as words, vector loads (16 bytes, or 8 where a thread's share of a
            # 8 x 128 block-scaled step is 8), into the pair conversion
            assert pair_cvt and (".128" in loads or ".64" in loads), f"{name}: {loads}"
            # 72-128 (the cast, before fp8_unpack.py: 94-168)
            assert registers <= 128, f"{name}: {registers} registers"


@pytest.mark.parametrize(("mode", "kernel"), [("TENSOR_CORES", "_skinny_rows_kernel"),
                                              ("W8A8", "_w8a8_rows_kernel")])
def test_tensor_core_skinny_kernels_compile_for_sm90(mode, kernel):
    """HELIOS_FP8_SKINNY=tensor-cores and =w8a8 at Qwen3-8B's batch-1 shapes (per-channel and
    block scales; the norm, SiLU and plain projections): no spills, the tiles on tensor
    cores; w8a8's as e4m3 x e4m3 wgmma (no conversion of the weights)."""
    from tests.kernels.test_package import compiled_json

    code = (
        "import json, torch\n"
        "from services.common.quantization import Fp8Scheme\n"
        "from services.engine.kernels import fp8_layers\n"
        "from services.engine.model.fp8 import Fp8Weight\n"
        "from tests.kernels.sm90_compile import capture_launches, compile_launch, report\n"
        f"fp8_layers.{mode} = True\n"
        "H, I, QKV = 4096, 12288, 6144\n"
        "def weight(n, k, block):\n"
        "    scheme = Fp8Scheme('fp8', 'block', 'group') if block else Fp8Scheme('online', 'channel', 'token')\n"
        "    scale = torch.ones((n // 128, k // 128) if block else (n,))\n"
        "    return Fp8Weight(torch.zeros(n, k, dtype=torch.float8_e4m3fn), scale, scheme)\n"
        "x1, act1 = torch.zeros(1, H, dtype=torch.bfloat16), torch.zeros(1, I, dtype=torch.bfloat16)\n"
        "g = torch.ones(H, dtype=torch.bfloat16)\n"
        "with capture_launches() as calls:\n"
        "    for block in (False, True):\n"
        "        fp8_layers.fp8_norm_linear(x1, x1, g, 1e-6, weight(QKV, H, block))\n"
        "        fp8_layers.fp8_norm_linear(x1, x1, g, 1e-6, weight(2 * I, H, block), None, 'silu')\n"
        "        fp8_layers.fp8_linear(act1, weight(H, I, block))\n"
        "rows = []\n"
        "for launch in calls:\n"
        "    compiled = compile_launch(launch)\n"
        "    r = report(launch.fn.fn.__name__, compiled)\n"
        "    fp8 = any('wgmma.mma_async' in line and '.e4m3.e4m3' in line\n"
        "              for line in compiled.asm['ptx'].splitlines())\n"
        "    rows.append([launch.fn.fn.__name__, r.registers, r.local_loads, r.mma, fp8])\n"
        "print(json.dumps(rows))\n"
    )
    rows = compiled_json(code)
    assert len(rows) == 6
    for name, registers, local_loads, mma, fp8_wgmma in rows:
        assert name == kernel
        assert local_loads == 0 and registers <= 255, f"spills ({registers} registers)"
        if mode == "W8A8":   # e4m3 x e4m3 wgmma (QGMMA in the SASS, which `mma` leaves out)
            assert fp8_wgmma, "no e4m3 wgmma in the PTX"
        else:                # the converted tiles: bf16 HGMMA
            assert mma and not fp8_wgmma, "no tensor-core MMA in the SASS"
