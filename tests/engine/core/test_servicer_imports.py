"""The engine servicer starts without the model stack: only the core process imports torch
(issue 19: the servicer's torch import ran before the core's, serially, on every start)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CODE = """
import pickle, sys
import services.engine.server
from services.engine.core.messages import CoreInfo, Ready
ready = pickle.loads(pickle.dumps(Ready(CoreInfo("cpu", "float32", 16, 8, 2, 4096, 4, 512,
                                                 1 << 20, 151936), "session")))
assert ready.info.vocab_size == 151936
print(sorted(m for m in ("torch", "triton", "safetensors", "llguidance") if m in sys.modules))
"""


def test_the_servicer_imports_and_reads_ready_without_torch():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_sampling_package_still_exports_its_tensor_side():
    from services.engine import sampling
    from services.engine.sampling.sampler import Sampler

    assert sampling.Sampler is Sampler
    assert {"Sampler", "SamplingBatch", "SamplingRow", "SamplerOutput"} <= set(dir(sampling)) \
        | set(sampling.__all__)
