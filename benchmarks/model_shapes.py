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
# Mixture-of-experts shapes (random bf16 weights: gpt-oss's MXFP4 experts are served as bf16)
SHAPES["qwen3-30b-a3b"] = {
    **QWEN3_COMMON, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "max_window_layers": 48,
    "tie_word_embeddings": False}
SHAPES["gpt-oss-20b"] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088,
    "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "attention_bias": True,
    "hidden_act": "silu", "swiglu_limit": 7.0, "rms_norm_eps": 1e-05, "rope_theta": 150000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": False, "original_max_position_embeddings": 4096},
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "bos_token_id": 199998,
    "eos_token_id": [200002, 199999], "pad_token_id": 199999, "torch_dtype": "bfloat16",
    "initializer_range": 0.02, "use_cache": True}

# 117 B parameters: 234 GB in bf16, more than one GPU holds; with its experts kept MXFP4
# (bench_moe.py --mxfp4-experts keep) ~65 GB
SHAPES["gpt-oss-120b"] = {**SHAPES["gpt-oss-20b"], "num_hidden_layers": 36,
                          "num_local_experts": 128,
                          "layer_types": ["sliding_attention", "full_attention"] * 18}

TOKENIZERS = {"qwen3-0.6b": "qwen3", "qwen3-8b": "qwen3", "llama-3.1-8b": "llama3_1",
              "qwen3-30b-a3b": "qwen3",
              # o200k_harmony when the assets pin it; the Qwen3 tokenizer times the same
              "gpt-oss-20b": "gptoss" if "gptoss" in assets.PINNED else "qwen3",
              "gpt-oss-120b": "gptoss" if "gptoss" in assets.PINNED else "qwen3"}


def experts_of(config: dict) -> tuple[int, int, int, int]:
    """(experts, experts per token, expert intermediate size, sparse layers); 0s if dense."""
    experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    if not experts:
        return 0, 0, 0, 0
    inter = int(config.get("moe_intermediate_size") or config["intermediate_size"])
    step = int(config.get("decoder_sparse_step") or 1)
    dense = set(config.get("mlp_only_layers") or ())
    sparse = sum(1 for i in range(config["num_hidden_layers"])
                 if i not in dense and (i + 1) % step == 0)
    return experts, int(config["num_experts_per_tok"]), inter, sparse


def expert_parameters(config: dict) -> int:
    """One expert's gate/up/down weights (and gpt-oss's biases)."""
    _, _, inter, _ = experts_of(config)
    h = config["hidden_size"]
    bias = 3 * inter + h if config.get("model_type") == "gpt_oss" else 0
    return 3 * h * inter + bias


def parameter_count(config: dict, active_experts: float | None = None) -> int:
    """All parameters; with `active_experts`, the weights one decode step reads: attention,
    norms, routers, `active_experts` experts per sparse layer, the lm_head (the embedding
    reads only its rows, so it is not counted)."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    attention = h * q + 2 * h * kv + q * h + 2 * h
    if config.get("model_type") in ("qwen3", "qwen3_moe"):
        attention += 2 * config["head_dim"]
    if config.get("attention_bias") and config.get("model_type") == "gpt_oss":
        attention += q + 2 * kv + h + config["num_attention_heads"]   # biases + sinks
    experts, _, _, sparse = experts_of(config)
    router = (h + (1 if config.get("model_type") == "gpt_oss" else 0)) * experts
    per_expert = expert_parameters(config)
    moe = sparse * (router + (experts if active_experts is None else active_experts)
                    * per_expert)
    dense_mlp = (layers - sparse) * 3 * h * i
    embed = config["vocab_size"] * h
    if active_experts is not None:
        return int(layers * attention + moe + dense_mlp + embed + h)
    return int(layers * attention + moe + dense_mlp
               + embed * (1 if config.get("tie_word_embeddings") else 2) + h)


def expected_active_experts(config: dict, batch: int, shares: list[float] | None = None
                            ) -> float:
    """Distinct experts a step of `batch` tokens reads per sparse layer: sum over experts of
    1 - (1 - p_e)^batch, with p_e the chance that one token picks expert e (k / E when the
    routing is uniform; `shares` = each expert's fraction of the routed tokens otherwise)."""
    experts, top_k, _, _ = experts_of(config)
    if not experts:
        return 0.0
    picks = [top_k * s for s in shares] if shares else [top_k / experts] * experts
    return sum(1.0 - (1.0 - min(1.0, p)) ** batch for p in picks)


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
    if experts_of(SHAPES[args.shape])[0]:
        active = parameter_count(SHAPES[args.shape], expected_active_experts(SHAPES[args.shape], 1))
        print(f"  batch-1 decode reads {active / 1e9:.2f} B parameters")
