"""What the H200 compiler makes of the fused-MoE GEMM launches at the gpt-oss-20b shape, bf16
against MXFP4 expert matrices (kept: `mxfp4_experts: keep`), on any machine (no GPU: Triton's
compiler and ptxas for sm_90, tests/kernels/sm90_compile.py): registers, spilled loads, shared
memory, tensor-core instructions and global-load widths, at T = 1, 64 and 2048 tokens.

    python benchmarks/sm90_moe_report.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXPERTS, TOP_K, HIDDEN, INTER = 32, 4, 2880, 2880      # gpt-oss-20b


def main() -> int:
    import torch

    from services.engine.kernels.fused_moe import fused_experts
    from services.engine.model.mxfp4 import Mxfp4Weight
    from tests.kernels.sm90_compile import capture_launches, compile_launch, report

    def weight(fmt: str, rows: int, k: int):
        if fmt == "bf16":
            return torch.zeros(EXPERTS, rows, k, dtype=torch.bfloat16)
        return Mxfp4Weight(torch.zeros(EXPERTS, rows, k // 2, dtype=torch.uint8),
                           torch.zeros(EXPERTS, rows, k // 32, dtype=torch.uint8),
                           torch.bfloat16)

    print("T     format  kernel           regs  spills  shared  MMA            global loads")
    for tokens in (1, 64, 2048):
        x = torch.zeros(tokens, HIDDEN, dtype=torch.bfloat16)
        for fmt in ("bf16", "mxfp4"):
            with capture_launches() as launches:
                fused_experts(x, weight(fmt, 2 * INTER, HIDDEN), weight(fmt, HIDDEN, INTER),
                              torch.zeros(tokens, TOP_K),
                              torch.zeros(tokens, TOP_K, dtype=torch.int32),
                              gate_up_bias=torch.zeros(EXPERTS, 2 * INTER, dtype=torch.bfloat16),
                              down_bias=torch.zeros(EXPERTS, HIDDEN, dtype=torch.bfloat16),
                              activation="swiglu_oai")
            for launch in launches:
                name = launch.fn.fn.__name__
                if name not in ("_gate_up_kernel", "_down_kernel"):
                    continue
                r = report(f"T={tokens}", compile_launch(launch))
                print(f"{tokens:<6}{fmt:<8}{name:<17}{r.registers:>4}{r.local_loads:>8}"
                      f"{r.shared_bytes:>8}  {r.mma!s:<15}{r.global_loads}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
