"""Cold start: `helios run` on a real-size checkpoint from local disk to the first token.

    python benchmarks/bench_cold_start.py --dir /tmp/helios-cold/qwen3-8b \
        --out benchmarks/out/cold_start.json

Writes the Qwen3-8B shape as safetensors shards of random bf16 weights with the real
tokenizer (`--dir`, kept for later runs: `--reuse`), then starts `helios run DIR` (all four
services) and sends one 128-token completion as soon as it serves. Reported: the time to
"Helios is serving", to the first streamed token, and every start-up phase the services
logged (services/common/startup.py): the launcher's summary line and the engine's phases.
Whether the weights were in the page cache (just written: yes, unless `--drop-caches`, which
needs root) is stated with the result. The target (issue 19): the first token within 20 s.

Triton's kernel cache: `--fresh-kernel-cache` gives each run an empty TRITON_CACHE_DIR and a
Helios cache without remembered file digests or kernel variant lists, as on a fresh machine
(else the machine's caches, warm from any earlier run, hide the hashing and compiling);
`--restart` starts again on the first run's cache; `--compare-serial` adds a run, on an empty
cache of its own, with `kernel_compile_workers: 0` (each variant compiled in the engine core
when first launched, as before the compile workers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.model_shapes import SHAPES, write_shape

SHARD_BYTES = 4 << 30
PHASE = re.compile(r"(\w+): ([a-zA-Z][\w ,+-]*?) (\d+\.\d+) s\b")


def qwen3_tensors(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv, dim = (config["num_attention_heads"], config["num_key_value_heads"],
                      config["head_dim"])
    names = [("model.embed_tokens.weight", (config["vocab_size"], hidden))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names += [(p + "self_attn.q_proj.weight", (heads * dim, hidden)),
                  (p + "self_attn.k_proj.weight", (kv * dim, hidden)),
                  (p + "self_attn.v_proj.weight", (kv * dim, hidden)),
                  (p + "self_attn.o_proj.weight", (hidden, heads * dim)),
                  (p + "self_attn.q_norm.weight", (dim,)), (p + "self_attn.k_norm.weight", (dim,)),
                  (p + "mlp.gate_proj.weight", (inter, hidden)),
                  (p + "mlp.up_proj.weight", (inter, hidden)),
                  (p + "mlp.down_proj.weight", (hidden, inter)),
                  (p + "input_layernorm.weight", (hidden,)),
                  (p + "post_attention_layernorm.weight", (hidden,))]
    names.append(("model.norm.weight", (hidden,)))
    if not config.get("tie_word_embeddings"):
        names.append(("lm_head.weight", (config["vocab_size"], hidden)))
    return names


def write_checkpoint(directory: Path, shape: str) -> float:
    """Config, tokenizer and safetensors shards of random bf16 weights; returns GB written."""
    import torch
    from safetensors.torch import save_file

    write_shape(shape, directory)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(0)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, dims in qwen3_tensors(SHAPES[shape]):
        if name.endswith("norm.weight"):
            tensor = torch.ones(dims, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(dims, device=device, generator=generator) * 0.02).to(
                torch.bfloat16).cpu()
        nbytes = tensor.numel() * 2
        if size and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    index: dict[str, str] = {}
    total = 0
    for number, tensors in enumerate(shards, 1):
        file_name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(directory / file_name), metadata={"format": "pt"})
        for name, tensor in tensors.items():
            index[name] = file_name
            total += tensor.numel() * 2
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": index}, indent=1) + "\n")
    os.sync()
    return total / 1e9


def first_token(url: str, prompt_len: int) -> float:
    import httpx

    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    body = {"model": model, "prompt": [1000 + i for i in range(prompt_len)],
            "max_tokens": 4, "stream": True, "temperature": 0.0}
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - start
    raise SystemExit("no token streamed")


def fresh_helios_cache(directory: Path) -> Path:
    """A Helios cache without remembered file digests or kernel variant lists (a fresh
    machine's), sharing the pinned tokenizer assets of the real one; kept for a restart."""
    from services.common.assets import cache_root

    helios = directory / "helios"
    if not helios.exists():
        helios.mkdir(parents=True)
        for entry in cache_root().iterdir() if cache_root().is_dir() else ():
            if entry.name not in ("digests.json", "kernels"):
                (helios / entry.name).symlink_to(entry)
    return helios


def start_once(args: argparse.Namespace, env: dict[str, str], settings: dict[str, object]
               ) -> dict:
    """`helios run DIR` until it serves, one streamed completion, then stop: the times and
    the phases the services logged."""
    from tests.support.processes import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "helios.yaml"
        config.write_text("engine:\n  max_model_len: 4096\n" + "".join(
            f"  {key}: {value}\n" for key, value in settings.items()))
        log_path = Path(tmp) / "run.log"
        with log_path.open("wb") as log:
            started = time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli.main", "run", str(args.dir), "--port",
                 str(port), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT,
                env=env)
            try:
                deadline = started + args.timeout
                while "Helios is serving" not in log_path.read_text(errors="replace"):
                    if proc.poll() is not None or time.perf_counter() > deadline:
                        print(log_path.read_text(errors="replace")[-4000:])
                        raise SystemExit("helios run did not start")
                    time.sleep(0.05)
                serving_s = time.perf_counter() - started
                ttft = first_token(f"http://127.0.0.1:{port}", args.prompt_len)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
        output = log_path.read_text(errors="replace")
    summary = next((line.split("start-up: ", 1)[1] for line in output.splitlines()
                    if "start-up: " in line), "")
    phases = [(service, phase, float(seconds)) for service, phase, seconds in
              PHASE.findall(output) if service in ("engine", "frontend", "imageprep", "gateway")]
    compiled = next((line for line in output.splitlines() if "kernel variants in" in line), "")
    return {"settings": settings, "serving_s": serving_s, "first_token_s": serving_s + ttft,
            "first_ttft_s": ttft, "phases": phases, "summary": summary,
            "compile_pool": compiled[compiled.find("compiled "):] if compiled else ""}


def report(args: argparse.Namespace, result: dict, cached: bool) -> None:
    print(f"\n{args.shape} from {args.dir}, {result['run']} (page cache: "
          f"{'warm' if cached else 'dropped'}; kernel cache: "
          f"{'as the run left it' if args.fresh_kernel_cache else 'the machine default'})")
    print(f"helios run -> serving: {result['serving_s']:.1f} s; -> first token: "
          f"{result['first_token_s']:.1f} s (TTFT of the first request "
          f"{result['first_ttft_s'] * 1e3:.0f} ms)")
    for service, phase, seconds in result["phases"]:
        print(f"  {service:<10} {phase:<36} {seconds:7.2f} s")
    if result["compile_pool"]:
        print(f"  {result['compile_pool']}")
    print(f"launcher: {result['summary']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/helios-cold/qwen3-8b"))
    parser.add_argument("--shape", default="qwen3-8b", choices=["qwen3-8b", "qwen3-0.6b"])
    parser.add_argument("--reuse", action="store_true", help="keep an existing --dir")
    parser.add_argument("--drop-caches", action="store_true",
                        help="drop the page cache before starting (root only)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--fresh-kernel-cache", action="store_true",
                        help="each run starts with an empty Triton cache (TRITON_CACHE_DIR) "
                             "and a Helios cache without file digests or kernel variant "
                             "lists, as on a fresh machine; --restart reuses the first run's")
    parser.add_argument("--restart", action="store_true",
                        help="start a second time after the first (its caches warm)")
    parser.add_argument("--compare-serial", action="store_true",
                        help="one more run with kernel_compile_workers 0 (the engine core "
                             "compiles each variant itself, one at a time): the same run's "
                             "before of the compile workers")
    args = parser.parse_args()
    written_gb = None
    if not (args.reuse and (args.dir / "model.safetensors.index.json").is_file()):
        started = time.perf_counter()
        written_gb = write_checkpoint(args.dir, args.shape)
        print(f"wrote {written_gb:.1f} GB of safetensors in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
    cached = True
    if args.drop_caches:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            cached = False
        except OSError as exc:
            print(f"could not drop the page cache ({exc}): the weights are cached", flush=True)
    runs = [("first start", "cache", {})]
    if args.restart:
        runs.append(("restart (kernel cache warm)", "cache", {}))
    if args.compare_serial:
        runs.append(("first start, kernels compiled one at a time", "serial-cache",
                     {"kernel_compile_workers": 0}))
    results = []
    with tempfile.TemporaryDirectory() as kernel_caches:
        for label, cache, settings in runs:
            env = dict(os.environ)
            if args.fresh_kernel_cache:     # each run's caches start empty; a restart reuses them
                env["TRITON_CACHE_DIR"] = str(Path(kernel_caches) / cache / "triton")
                env["HELIOS_CACHE_DIR"] = str(fresh_helios_cache(Path(kernel_caches) / cache))
            result = start_once(args, env, settings)
            result["run"] = label
            results.append(result)
            report(args, result, cached)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "shape": args.shape, "written_gb": written_gb, "page_cache_warm": cached,
            "fresh_kernel_cache": args.fresh_kernel_cache, "runs": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
