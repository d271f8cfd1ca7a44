"""The kernel compile workers on the GPU (kernels/precompile.py, issue 19's cold start): with
an empty Triton cache, an engine built with the pool compiles nothing itself, neither kernels
nor their C launchers (every variant its start-up meets was discovered and compiled by the
workers), and serves the same greedy tokens
as one built without it. A second start (a new process, another empty Triton cache, the same
$HELIOS_CACHE_DIR) compiles the remembered variant list without a discovery run, and again
compiles nothing itself. Each start runs in a subprocess: its own caches, and no kernel
already compiled in this process's memory (which would hide the compilations)."""

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
from services.engine.kernels.compile_pool import CompilePool
from services.engine.config import EngineConfig
from services.common.core import open_model
from services.engine.runner.graph_runner import GraphRunner
from tests.engine.gpu.test_gpu_compiles import CONFIG, _prompt
from tests.engine.model.checkpoints import write_tokenizer
from tests.engine.runner.conftest import greedy_request, serve

pool = CompilePool.start(4)            # forked before this process touches CUDA
import torch
from tests.kernels.compilations import count_compilations

root = Path(sys.argv[2])
(root / "config.json").write_text(json.dumps(CONFIG))
write_tokenizer(root)
source = open_model(root, allow_missing_weights=True)
config = EngineConfig(model=str(root), device="cuda", dtype="bfloat16", load_format="dummy",
                      page_size=16, max_num_seqs=16, prefill_chunk_size=256,
                      max_num_batched_tokens=512, kv_cache_bytes=1 << 29)
reports = []
precompile = GraphRunner.precompile
GraphRunner.precompile = lambda self, p, **kw: reports.append(precompile(self, p, **kw)) \
    or reports[-1]
compiled = count_compilations()
import triton.runtime.build as build
launchers = []                     # C launchers built in this process (cache misses)
real_build = build._build
def counting_build(name, *args, **kwargs):
    launchers.append(name)
    return real_build(name, *args, **kwargs)
build._build = counting_build

def tokens(engine):
    requests = [greedy_request(f"r{n}", _prompt(n, n), 8) for n in (1, 17, 300, 700)]
    return serve(engine, requests)[0]

discoveries = []
start_up = GraphRunner._start_up
def counting_start_up(self, discover):
    discoveries.append(discover)
    return start_up(self, discover)
GraphRunner._start_up = counting_start_up

engine = build_engine(config, source, None, pool)
built_compiled = list(compiled)
built_launchers = list(launchers)
report = reports[0]
result = {"variants": report.variants, "failed": report.failed, "seconds": report.seconds,
          "compile_seconds": report.compile_seconds, "compiled_while_building": built_compiled,
          "launchers_built_while_building": built_launchers,
          "launchers_missed": report.launchers_missed,
          "discovery_runs": discoveries.count(True)}
if sys.argv[1] == "compare":
    with_pool = tokens(engine)
    del engine
    torch.cuda.empty_cache()
    result["same_tokens"] = with_pool == tokens(build_engine(config, source))
print(json.dumps(result))
"""


def _start(tmp_path: Path, kernel_cache: str, mode: str) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / kernel_cache),
               HELIOS_CACHE_DIR=str(tmp_path / "helios"),
               PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    env.pop("TRITON_INTERPRET", None)
    (tmp_path / "model").mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(tmp_path / "model")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(mode, result)
    return result


def test_an_engine_built_with_the_pool_compiles_nothing_itself(tmp_path):
    first = _start(tmp_path, "triton-first", "compare")
    assert first["failed"] == 0 and first["variants"] >= 10, first
    assert first["discovery_runs"] == 1, first
    assert first["compiled_while_building"] == [], first
    assert first["launchers_missed"] == 0, first
    assert first["launchers_built_while_building"] == [], first
    assert first["same_tokens"], first
    # a fresh machine's Triton cache, the remembered list: no discovery, nothing compiled
    # by the engine core itself
    second = _start(tmp_path, "triton-second", "restart")
    assert second["discovery_runs"] == 0, second
    assert second["failed"] == 0 and second["variants"] >= first["variants"], second
    assert second["compiled_while_building"] == [], second
    assert second["launchers_built_while_building"] == [], second
