"""Which Triton kernel variants serving compiles after start-up, by specialisation key: the
scenario of tests/engine/gpu/test_gpu_compiles.py (which only counts them), printed.

    python benchmarks/gpu/diag_compile_variants.py      # on a CUDA machine
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def variant_keys() -> dict[str, set[str]]:
    """module.kernel -> the keys of its compiled variants (every device)."""
    from triton.runtime.jit import JITFunction

    import services.engine.kernels as package

    keys: dict[str, set[str]] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, JITFunction) and value.__module__ == module.__name__:
                caches = getattr(value, "device_caches", {})
                keys[f"{info.name}.{name}"] = {str(k) for cache in caches.values()
                                               for k in cache[0]}
    return keys


def main() -> int:
    from services.common.core import open_model
    from tests.engine.gpu.test_gpu_compiles import CONFIG, serving_rounds
    from tests.engine.model.checkpoints import write_tokenizer
    from tests.engine.runner.conftest import make_engine, serve

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        (path / "config.json").write_text(json.dumps(CONFIG))
        write_tokenizer(path)
        engine = make_engine(open_model(path, allow_missing_weights=True), device="cuda",
                             dtype="bfloat16", load_format="dummy", page_size=16,
                             max_num_seqs=32, prefill_chunk_size=512,
                             max_num_batched_tokens=1024, kv_cache_bytes=1 << 30)
        before = variant_keys()
        rounds = serving_rounds()
        for index, requests in enumerate(rounds):
            serve(engine, requests)
            after = variant_keys()
            for name, keys in after.items():
                for key in sorted(keys - before.get(name, set())):
                    print(f"round {index}: new variant of {name}: {key}")
            before = after
        for name, keys in before.items():
            if "attention" in name:
                for key in sorted(keys):
                    print(f"compiled {name}: {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
