"""Real model shapes for speed benchmarks, written out (random weights are fine for speed).

    python benchmarks/model_shapes.py qwen3-8b --out /tmp/qwen3-8b   # config + tokenizer, no weights
    python benchmarks/model_shapes.py qwen3-8b --out /tmp/qwen3-8b --core /tmp/qwen3-8b-core

The directory holds config.json, generation_config.json and the real tokenizer files; the
engine serves it with `--load-format dummy` (weights drawn on the device), and the HF baseline
builds the same architecture from the config. `--core` also prepares a core without weights,
which every service opens (`helios run CORE` with the engine's load_format set to dummy).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common import assets

QWEN3_COMMON = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_scaling": None,
    "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
    "sliding_window": None, "initializer_range": 0.02, "use_cache": True,
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
    "max_position_embeddings": 40960,
}

SHAPES: dict[str, dict] = {
    "qwen3-0.6b": {**QWEN3_COMMON, "hidden_size": 1024, "intermediate_size": 3072,
                   "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "max_window_layers": 28,
                   "tie_word_embeddings": True},
    "qwen3-8b": {**QWEN3_COMMON, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "head_dim": 128, "max_window_layers": 36, "tie_word_embeddings": False},
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "max_position_embeddings": 131072, "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
        "torch_dtype": "bfloat16", "initializer_range": 0.02, "use_cache": True,
    },
}
TOKENIZERS = {"qwen3-0.6b": "qwen3", "qwen3-8b": "qwen3", "llama-3.1-8b": "llama3_1"}


def parameter_count(config: dict) -> int:
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    if config.get("model_type") == "qwen3":
        per_layer += 2 * config["head_dim"]
    embed = config["vocab_size"] * h
    return layers * per_layer + embed * (1 if config.get("tie_word_embeddings") else 2) + h


def weight_bytes(config: dict, itemsize: int = 2) -> int:
    return parameter_count(config) * itemsize


def kv_bytes_per_token(config: dict, itemsize: int = 2) -> int:
    return (2 * config["num_hidden_layers"] * config["num_key_value_heads"] *
            config["head_dim"] * itemsize)


def write_core(model_dir: Path, out: Path) -> Path:
    """A prepared core of a weightless model directory (hard links, no weight files)."""
    from services.common.core import prepare_core

    prepare_core(model_dir, out, allow_missing_weights=True)
    return out


def write_shape(name: str, out: Path) -> Path:
    config = SHAPES[name]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    eos = config["eos_token_id"]
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eos if isinstance(eos, list) else [eos]}, indent=2) + "\n")
    source = assets.fetch(TOKENIZERS[name])
    for file_name in assets.ASSET_FILES:
        shutil.copyfile(source / file_name, out / file_name)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--core", type=Path, help="also prepare a core (no weights) here")
    args = parser.parse_args()
    path = write_shape(args.shape, args.out)
    if args.core:
        write_core(path, args.core)
    params = parameter_count(SHAPES[args.shape])
    print(f"{args.shape}: {params / 1e9:.2f} B parameters, {params * 2 / 1e9:.2f} GB bf16 -> {path}")
