"""The start-up's kernel variants compiled in worker processes (kernels/precompile.py): what the
discovery records is what Triton's JIT then looks up, so a launch after the pool compiled its
variant finds it in Triton's cache and compiles nothing. Checked on any machine for sm_90: a
stand-in driver gives the JIT its target (nothing launches: the discovery skips launches, the
later calls are Triton's `warmup` runs, which compile without launching), in a subprocess
without TRITON_INTERPRET and with a cache directory of its own."""

from __future__ import annotations

from tests.kernels.test_package import compiled_json

# A fresh Triton cache, and a stand-in libcuda where the machine has none: the launchers and
# the driver utilities link against it
FRESH_CACHE = """
import json, os, subprocess, sys, tempfile
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
stub = tempfile.mkdtemp()
with open(os.path.join(stub, "stub.c"), "w") as f:
    f.write("void helios_stand_in(void) {}\\n")
subprocess.run(["cc", "-shared", "-fPIC", "-o", os.path.join(stub, "libcuda.so.1"),
                os.path.join(stub, "stub.c")], check=True)
os.environ.setdefault("TRITON_LIBCUDA_PATH", stub)
"""

SCRIPT = FRESH_CACHE + """
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from tests.kernels.compilations import count_compilations
from services.engine.kernels.compile_pool import CompilePool
from services.engine.kernels.precompile import discover_variants, launcher_cached

pool = CompilePool.start(2)
TARGET = GPUTarget("cuda", 90, 32)

class StandInDriver:
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return TARGET

driver.set_active(StandInDriver())
from services.engine.kernels.attention import AttentionScratch, paged_attention
from services.engine.kernels.activation import silu_and_mul
from services.engine.kernels.norm import rms_norm
from tests.kernels.sm90_compile import capture_launches

def norm(hidden):
    rms_norm(torch.randn(3, hidden, dtype=torch.bfloat16), torch.ones(hidden, dtype=torch.bfloat16),
             1e-6)

class Meta:
    def __init__(self, q_lens, kv_lens):
        self.query_start_loc = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()],
                                            dtype=torch.int32)
        self.seq_lens = torch.tensor(kv_lens, dtype=torch.int32)
        self.page_table = torch.zeros(len(q_lens), 64, dtype=torch.int32)
        self.max_query_len, self.max_seq_len = max(q_lens), max(kv_lens)

def attention(q_lens, kv_lens):
    cache = torch.zeros(64, 16, 2, 64, dtype=torch.bfloat16)
    q = torch.zeros(sum(q_lens), 4, 64, dtype=torch.bfloat16)
    paged_attention(q, cache, cache, Meta(q_lens, kv_lens), 0.125,
                    scratch=AttentionScratch.allocate(sum(q_lens), 4, 64, "cpu"))

def shapes():
    norm(1024)
    norm(2048)
    attention([1], [900])        # decode: the specialised kernel, split, and its reduction
    attention([40], [40])        # prefill: the any-size kernel

with discover_variants(lambda variant: pool.submit(variant, TARGET)) as found:
    shapes()                     # each variant goes to a worker as it is met
import time
deadline = time.monotonic() + 120
while pool._queue and time.monotonic() < deadline:
    time.sleep(0.05)             # more variants than workers: the pump thread hands them out
drained_alone = not pool._queue
report = pool.finish()
names = sorted({v.attribute for v in found.variants.values()})

compiled = count_compilations()

with capture_launches() as launches:
    shapes()
    norm(96)                     # a variant the discovery did not meet
    silu_and_mul(torch.randn(3, 128, dtype=torch.bfloat16))   # a kernel it did not meet
import triton.runtime.build as build
from triton.backends.nvidia.driver import CudaLauncher
built = []
real_build = build._build
def counting_build(name, *args, **kwargs):
    built.append(name)
    return real_build(name, *args, **kwargs)
build._build = counting_build
import types    # nothing here can load a launcher (no libcuda): stand in for the loaded module
build._load_module_from_path = lambda name, path: types.SimpleNamespace(launch=lambda *a: None)
# Triton's driver utilities, as its CUDA driver asks for them: the first worker built them
import triton.backends.nvidia.driver as nvidia
build.compile_module_from_src(src=open(os.path.join(nvidia.dirname, "driver.c")).read(),
                              name="cuda_utils", library_dirs=nvidia.library_dirs(),
                              include_dirs=nvidia.include_dirs, libraries=nvidia.libraries)
launchers = []
for launch in launches:
    kernel = launch.fn.run(*launch.args, grid=launch.grid, warmup=True, **launch.kwargs)
    launchers.append(launcher_cached(kernel))   # what the kernel's first launch would find
    CudaLauncher(kernel.src, kernel.metadata)   # Triton's own first-launch path
pool.close()
print(json.dumps({"variants": report.variants, "failed": report.failed, "names": names,
                  "drained_alone": drained_alone, "launchers_cached": launchers,
                  "launchers_built_after": built,
                  "launchers_missed": report.launchers_missed,
                  "unnamed": found.unnamed, "compiled_after": compiled}))
"""


def test_pool_compiles_what_the_jit_then_finds_in_the_cache() -> None:
    result = compiled_json(SCRIPT)
    assert result["failed"] == 0 and result["unnamed"] == 0, result
    # the norm at two widths, attention decode (split) + its reduction, attention prefill:
    # the two jitted versions of one attention function are told apart by module attribute
    assert result["variants"] >= 5, result
    # with 2 workers, the variants past the first two went out to a worker without the
    # caller's help (the pump thread)
    assert result["drained_alone"], result
    assert {"_rms_norm_kernel", "_paged_attention_kernel", "_paged_attention_any_size_kernel",
            "_reduce_splits_kernel"} <= set(result["names"]), result
    # everything discovered came from the cache; only the undiscovered norm width and the
    # undiscovered kernel compiled
    assert result["compiled_after"] == ["_rms_norm_kernel", "_act_and_mul_kernel"], result
    # the workers built each discovered variant's C launcher where the JIT's own compiled
    # kernel looks for it (a launcher depends on the argument types, not the constexprs: the
    # undiscovered norm width shares one); the undiscovered kernel's is not there
    assert result["launchers_missed"] == 0, result
    assert result["launchers_cached"] == [True] * (len(result["launchers_cached"]) - 1) + [
        False], result
    # Triton's own launcher construction agrees: it built only the undiscovered kernel's, and
    # not its driver utilities (`cuda_utils`, the first worker's first job)
    assert result["launchers_built_after"] == ["__triton_launcher"], result


def test_the_pool_starts_inside_a_daemonic_process() -> None:
    """The engine core is a daemonic multiprocessing process, from which multiprocessing's
    own pools refuse to start workers (the first GPU cold start with them failed so)."""
    script = ("import multiprocessing, sys\n"
              f"SCRIPT = {SCRIPT!r}\n"
              "def run():\n"
              "    exec(SCRIPT, {'__name__': 'daemon'})\n"
              "process = multiprocessing.get_context('fork').Process(target=run, daemon=True)\n"
              "process.start()\n"
              "process.join()\n"
              "sys.exit(process.exitcode)\n")
    result = compiled_json(script)
    assert result["failed"] == 0 and result["launchers_missed"] == 0, result
    assert result["compiled_after"] == ["_rms_norm_kernel", "_act_and_mul_kernel"], result


def test_waiting_for_the_driver_utilities_finds_them_built() -> None:
    """The first worker builds Triton's driver utilities (`cuda_utils`) as it starts;
    `wait_for_driver_utils` returns once they are in Triton's cache, where Triton's driver
    looks for them, so the engine core's first touch of the driver compiles no C."""
    result = compiled_json(FRESH_CACHE + """
import time
from pathlib import Path
import triton.backends.nvidia.driver as nvidia
from services.engine.kernels.compile_pool import CompilePool
from services.engine.kernels.precompile import _module_source

pool = CompilePool.start(1)
_, cache, name = _module_source("cuda_utils", (Path(nvidia.dirname) / "driver.c").read_text())
started = time.perf_counter()
pool.wait_for_driver_utils()
waited = time.perf_counter() - started
after = cache.get_file(name) is not None
report = pool.finish()          # nothing submitted: the utilities are not a variant
pool.close()
print(json.dumps({"after": after, "waited": waited,
                  "variants": report.variants}))
""")
    assert result["after"], result
    assert result["variants"] == 0, result


def test_the_wait_for_the_driver_utilities_is_bounded() -> None:
    """A worker stuck building the driver utilities holds the engine core's start-up up to
    the wait's limit, not forever."""
    result = compiled_json("""
import json, time
from services.engine.kernels import compile_pool
compile_pool.build_driver_utils = lambda: time.sleep(3) or 3.0   # the fork inherits it
pool = compile_pool.CompilePool.start(1)
started = time.perf_counter()
built = pool.wait_for_driver_utils(timeout=0.5)
waited = time.perf_counter() - started
pool.close()                     # reaps the worker once its 3 s are over
print(json.dumps({"built": built, "waited": waited}))
""")
    assert result["built"] is False and 0.5 <= result["waited"] < 2.5, result


def test_a_variant_list_is_remembered_per_start_up(tmp_path, monkeypatch) -> None:
    from services.engine.kernels.precompile import (
        Variant,
        load_remembered,
        remember,
        remembered_path,
    )

    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    parts = {"engine": {"max_num_seqs": 8}, "model": {"hidden_size": 64}, "triton": "3.6.0"}
    path = remembered_path(parts)
    assert path.parent == tmp_path / "kernels"
    assert remembered_path(dict(parts, engine={"max_num_seqs": 16})) != path
    assert load_remembered(path) == []                  # nothing kept yet
    variants = [Variant("services.engine.kernels.norm", "_rms_norm_kernel", '{"key": 1}'),
                Variant("services.engine.kernels.attention_kernel", "_reduce_splits_kernel",
                        '{"key": 2}')]
    remember(path, variants)
    assert load_remembered(path) == variants
    path.write_text("{not json")                         # unreadable: as if none was kept
    assert load_remembered(path) == []
