"""Where compiled e4m3 rounding departs from torch's cast (a GPU diagnostic for the FP8 kernels).

    python benchmarks/gpu/diag_fp8_rounding.py

Runs kernels/fp8_quant.round_e4m3 alone on every e4m3 value, every midpoint and their float32
neighbours, and prints, for the first mismatches: the input, round_e4m3's float32 result, the
result after the kernel's cast to float8e4nv, and torch's cast. Also a plain in-kernel cast
(no round_e4m3) for comparison.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.engine.kernels.fp8_quant import round_e4m3

E4M3 = torch.float8_e4m3fn


@triton.jit
def _probe(x_ptr, rounded_ptr, cast_ptr, plain_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    r = round_e4m3(x)
    tl.store(rounded_ptr + offs, r, mask=mask)
    tl.store(cast_ptr + offs, r.to(tl.float8e4nv), mask=mask)
    tl.store(plain_ptr + offs, tl.clamp(x, -448.0, 448.0).to(tl.float8e4nv), mask=mask)


def main() -> None:
    codes = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
    values = codes[torch.isfinite(codes)].unique()
    mids = (values[1:] + values[:-1]) / 2
    x = torch.cat([values, mids, mids.nextafter(torch.tensor(1e9)),
                   mids.nextafter(torch.tensor(-1e9)), torch.tensor([500.0, -1e6, 1e-8])])
    n = len(x)
    xd = x.cuda()
    rounded = torch.empty(n, device="cuda")
    cast = torch.empty(n, dtype=E4M3, device="cuda")
    plain = torch.empty(n, dtype=E4M3, device="cuda")
    _probe[(triton.cdiv(n, 256),)](xd, rounded, cast, plain, n, BLOCK=256)
    want = x.clamp(-448, 448).to(E4M3)
    for name, got in (("round_e4m3 then cast", cast.cpu()), ("plain cast", plain.cpu())):
        bad = (got.view(torch.uint8) != want.view(torch.uint8)).nonzero().flatten()
        print(f"{name}: {len(bad)} of {n} differ from torch's cast")
        for i in bad[:12].tolist():
            print(f"  x={x[i].item()!r} rounded={rounded[i].item()!r} "
                  f"got={got[i].float().item()!r} want={want[i].float().item()!r}")
    off = (rounded.cpu() != want.float()).nonzero().flatten()
    print(f"round_e4m3's float32 result != torch's cast value: {len(off)}")
    for i in off[:12].tolist():
        print(f"  x={x[i].item()!r} rounded={rounded[i].item()!r} want={want[i].float().item()!r}")


if __name__ == "__main__":
    main()
