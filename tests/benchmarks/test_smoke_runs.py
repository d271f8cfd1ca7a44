"""The GPU benchmarks' own CPU smoke modes, run as the device calls run them (a subprocess per
script, the arguments of benchmarks/gpu/pending_benches.txt's lines where the CPU can take
them, at the scripts' tiny shapes): a renamed import or a broken flag fails here, not in the first seconds of a lent GPU
(RESULTS.md 2026-12-06, eighth session: a sweep that imported a renamed function cost its
section of a device call)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_script(args: list[str], out: Path) -> str:
    done = subprocess.run([sys.executable, *args, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_decode_attention_over_fp8_pages_smoke(tmp_path):
    """bench_kernels.py's decode, sweep and mixed-step sections over e4m3 pages (attn_kv_sweep,
    attn_mixed_fp8)."""
    stdout = run_script(["benchmarks/bench_kernels.py", "--smoke", "--sections",
                         "decode,sweep,mixed_sweep", "--kv-dtype", "fp8"], tmp_path)
    report = json.loads((tmp_path / "bench_kernels.json").read_text())
    assert report["kv_dtype"] == "fp8"
    assert {row["variant"] for row in report["decode_sweep"]} == {"default", "splits*2",
                                                                   "n128s3", "p3", "p3r128"}
    assert [row["prefetch"] for row in report["decode_sweep"] if row["variant"] == "p3"] == [True]
    assert all("error" not in row for row in report["decode_sweep"]), stdout
    mixed = {row["variant"]: row for row in report["mixed_sweep"]}
    assert set(mixed) == {"default", "p3", "p3r128"}
    assert (mixed["default"]["prefetch"], mixed["p3"]["prefetch"]) == (False, True)
    assert all("error" not in row for row in mixed.values()), stdout
    # the smoke pages hold randn values: e4m3 keeps them within a few percent of bf16's
    assert report["decode"][0]["rel_err_vs_sdpa"] < 5e-2


def test_fused_moe_smoke(tmp_path):
    """bench_fused_moe.py at its tiny shapes (moe_t1, moe_decode_sweep's flags): both paths
    forced, the routing given, and the decode tile sweep; its best tiles are real plans."""
    run_script(["benchmarks/bench_fused_moe.py", "--smoke", "--shapes", "tiny-oai",
                "--sweep-shapes", "tiny-oai", "--tokens", "1", "--sweep-tokens", "",
                "--decode-sweep-tokens", "1"], tmp_path)
    shape = json.loads((tmp_path / "fused_moe.json").read_text())["shapes"]["tiny-oai"]
    level = shape["levels"][0]
    assert {"decode_us", "decode_given_us", "sorted_us"} <= set(level)
    sweep = shape["decode_sweeps"]["1"]
    assert sweep["default"] == [[8, 128, 4], [8, 256, 4]] and sweep["best_us"] > 0
    assert {row["part"] for row in sweep["rows"]} == {"gate_up", "down"}


@pytest.mark.parametrize("args", [
    ["--sections", "step"],                                             # the default shapes
    ["--shapes", "qwen3-8b", "--sections", "step,step-fp8", "--kv-fp8", "--batch", "2"],
])
def test_decode_step_smoke(args, tmp_path):
    """bench_decode_step.py's step sections (quant_fp8_steps, step_fp8_b256's flags): each
    of the two step results printed and written (on the CPU the variants' argmax is not
    compared: only a GPU run records it)."""
    stdout = run_script(["benchmarks/bench_decode_step.py", "--smoke", *args], tmp_path)
    same = [line for line in stdout.splitlines() if "same argmax in every variant" in line]
    assert len(same) == 2 and all(
        line.endswith("True") for line in same), stdout
    assert json.loads((tmp_path / "decode_step.json").read_text())["steps"]


def test_sm90_attention_report(tmp_path):
    """sm90_report.py attention (no GPU: Triton + ptxas for sm_90): the decode tile without
    the page prefetch keeps one K/V tile in flight a program at any stages, with it at 3
    stages two; the occupancy arithmetic on known cases."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sm90_report import programs_per_sm

    assert programs_per_sm(116, 38912, 4) == 4     # registers bind: 120 x 128 threads
    assert programs_per_sm(124, 71680, 4) == 3     # shared memory binds
    assert programs_per_sm(110, 38912, 8) == 2     # 8 warps of 112
    assert programs_per_sm(32, 0, 4) == 16         # warps bind
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # compiled, not run
    done = subprocess.run([sys.executable, "benchmarks/sm90_report.py", "attention"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {tuple(r[:6]): r[6:] for r in (line.split() for line in done.stdout.splitlines()[1:])
            if r}   # (pages, prefetch, stages, block_n, warps, cap) -> regs, spills, ..., N x K KB
    for pages in ("bf16", "fp8"):
        assert rows[pages, "False", "2", "64", "4", "-"][-4] == "1"
        assert rows[pages, "False", "3", "64", "4", "-"][-4] == "1"
        assert rows[pages, "True", "3", "64", "4", "-"][-4] == "2"
    # FP8 pages, prefetching, capped at 128 registers: no spill, 4 programs an SM (3 uncapped)
    regs, spills, *_, programs = rows["fp8", "True", "3", "64", "4", "128"][:-4]
    assert (regs, spills, programs) == ("128", "0", "4")
    assert rows["fp8", "True", "3", "64", "4", "-"][-5] == "3"
