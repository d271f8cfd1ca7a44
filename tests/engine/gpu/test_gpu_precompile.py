"""The kernel compile workers on the GPU (kernels/precompile.py, issue 19's cold start): with
an empty Triton cache, an engine built with the pool compiles nothing itself (every variant its
start-up meets was discovered and compiled by the workers), and serves the same greedy tokens
as one built without it. Run in a subprocess: its own cache directory, and no kernel already
compiled in this process's memory (which would hide the compilations)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import json, sys, tempfile
from pathlib import Path
from services.engine.core.build import build_engine
from services.engine.kernels.precompile import CompilePool
from services.engine.config import EngineConfig
from services.common.core import open_model
from services.engine.runner.graph_runner import GraphRunner
from tests.engine.gpu.test_gpu_compiles import CONFIG, _prompt
from tests.engine.model.checkpoints import write_tokenizer
from tests.engine.runner.conftest import greedy_request, serve

pool = CompilePool.start(4)            # forked before this process touches CUDA
import torch
import triton.compiler.compiler as compiler

root = Path(tempfile.mkdtemp())
(root / "config.json").write_text(json.dumps(CONFIG))
write_tokenizer(root)
source = open_model(root, allow_missing_weights=True)
config = EngineConfig(model=str(root), device="cuda", dtype="bfloat16", load_format="dummy",
                      page_size=16, max_num_seqs=16, prefill_chunk_size=256,
                      max_num_batched_tokens=512, kv_cache_bytes=1 << 29)
reports = []
precompile = GraphRunner.precompile
GraphRunner.precompile = lambda self, p: reports.append(precompile(self, p)) or reports[-1]
compiled = []
make_ir = compiler.ASTSource.make_ir
def counting(self, *args, **kwargs):
    compiled.append(self.fn.__name__)
    return make_ir(self, *args, **kwargs)
compiler.ASTSource.make_ir = counting

def tokens(engine):
    requests = [greedy_request(f"r{n}", _prompt(n, n), 8) for n in (1, 17, 300, 700)]
    return serve(engine, requests)[0]

engine = build_engine(config, source, None, pool)
built_compiled = list(compiled)
with_pool = tokens(engine)
del engine
torch.cuda.empty_cache()
without_pool = tokens(build_engine(config, source))
report = reports[0]
print(json.dumps({"variants": report.variants, "failed": report.failed,
                  "seconds": report.seconds, "compile_seconds": report.compile_seconds,
                  "compiled_while_building": built_compiled,
                  "same_tokens": with_pool == without_pool}))
"""


def test_an_engine_built_with_the_pool_compiles_nothing_itself(tmp_path):
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"),
               PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(result)
    assert result["failed"] == 0 and result["variants"] >= 10, result
    assert result["compiled_while_building"] == [], result
    assert result["same_tokens"], result
