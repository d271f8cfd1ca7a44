"""Tiny random-weight Hugging Face checkpoints of every supported architecture, for parity tests.

Each spec builds a transformers config, a model from it, and perturbs every weight with a seeded
generator: norms and biases are moved away from their defaults (so a norm or bias the engine
forgets changes the tokens) and the projections are scaled up so the logits are well separated
(greedy ties would make exact-match comparisons flaky). `save_pretrained` writes
config.json + safetensors (sharded when asked); a tiny word-level tokenizer.json makes the
directory a valid Helios model directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

VOCAB_SIZE = 320

_BASE: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


@dataclass(frozen=True)
class CheckpointSpec:
    name: str
    config_class: str                  # transformers config class name
    overrides: dict[str, Any] = field(default_factory=dict)
    max_shard_size: str | None = None  # e.g. "40KB" for a sharded checkpoint
    seed: int = 0
    outer: dict[str, Any] | None = None   # a multimodal config: the text config goes inside

    def config(self) -> Any:
        import transformers

        values = {**_BASE, **self.overrides}
        if self.outer is not None:
            return getattr(transformers, self.config_class)(text_config=values, **self.outer)
        return getattr(transformers, self.config_class)(**values)


# Gemma 3: three layers (sliding, full, sliding) with a 5-token window, so every parity
# prompt runs past the window; each kind with its own rope (the full one linearly scaled),
# a query scalar unlike head_dim, and soft-capped logits.
_GEMMA3 = {
    "num_hidden_layers": 3, "head_dim": 16, "sliding_window": 5,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "query_pre_attn_scalar": 24, "final_logit_softcapping": 30.0,
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}},
}
# gpt-oss: sliding (a 5-token window, so every parity prompt runs past it) then full
# attention, attention sinks, YaRN without truncation, 4 experts top-2 with biases, and a
# SwiGLU clamp low enough that the random activations hit it on both sides.
_GPT_OSS = {
    "head_dim": 16, "sliding_window": 5, "max_position_embeddings": 128,
    "num_local_experts": 4, "num_experts_per_tok": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "swiglu_limit": 0.6, "swiglu_alpha": 1.5, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 8.0, "beta_slow": 1.0,
                        "truncate": False, "original_max_position_embeddings": 32,
                        "rope_theta": 150000.0},
}
# Qwen3-MoE: 8 experts, top 3 renormalized, layer 1 dense (mlp_only_layers) between two
# sparse ones; a second spec with the raw top-k probabilities and every other layer sparse.
_QWEN3_MOE = {
    "num_hidden_layers": 3, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 3,
    "moe_intermediate_size": 32, "norm_topk_prob": True, "mlp_only_layers": [1],
    "tie_word_embeddings": False}
_SIGLIP_TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                "num_attention_heads": 2, "image_size": 28, "patch_size": 14}


SPECS: dict[str, CheckpointSpec] = {spec.name: spec for spec in (
    CheckpointSpec("llama", "LlamaConfig", {"tie_word_embeddings": False}),
    CheckpointSpec("llama3-rope-tied-bias", "LlamaConfig", {
        "tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True,
        "num_key_value_heads": 1,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    CheckpointSpec("llama-linear-rope", "LlamaConfig", {
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "head_dim": 32}),
    CheckpointSpec("llama-dynamic-rope", "LlamaConfig", {
        "max_position_embeddings": 24, "rope_theta": 500.0,
        "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}),
    CheckpointSpec("qwen2-bias-yarn", "Qwen2Config", {
        "tie_word_embeddings": True, "max_position_embeddings": 128,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 32}}),
    CheckpointSpec("qwen3-qknorm-sharded", "Qwen3Config", {
        "head_dim": 32, "tie_word_embeddings": False, "rope_theta": 1000000.0},
        max_shard_size="60KB"),
    CheckpointSpec("mistral", "MistralConfig", {
        "num_key_value_heads": 4, "head_dim": 16, "sliding_window": None}),
    CheckpointSpec("mistral-sliding", "MistralConfig", {"sliding_window": 6}),
    CheckpointSpec("qwen2-sliding", "Qwen2Config", {
        "use_sliding_window": True, "sliding_window": 7, "max_window_layers": 1}),
    CheckpointSpec("gemma3", "Gemma3TextConfig", _GEMMA3),
    CheckpointSpec("gpt-oss", "GptOssConfig", _GPT_OSS),
    CheckpointSpec("qwen3-moe", "Qwen3MoeConfig", _QWEN3_MOE),
    CheckpointSpec("qwen3-moe-step2", "Qwen3MoeConfig", {
        **_QWEN3_MOE, "num_hidden_layers": 2, "norm_topk_prob": False, "mlp_only_layers": [],
        "decoder_sparse_step": 2, "num_experts": 6, "num_experts_per_tok": 2}),
    CheckpointSpec("mixtral", "MixtralConfig", {"num_local_experts": 4,
                                                "num_experts_per_tok": 2, "sliding_window": 6}),
    CheckpointSpec("gemma3-vlm-text", "Gemma3Config", _GEMMA3,
                   outer={"vision_config": _SIGLIP_TINY, "mm_tokens_per_image": 4}),
)}


def _perturb(model: Any, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.3 * noise)
            elif "embed_tokens" in name or "lm_head" in name:
                param.copy_(noise)
            else:  # projections: std ~ 1/sqrt(fan_in) keeps activations O(1)
                param.copy_(noise / param.shape[-1] ** 0.5)


def write_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB_SIZE)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))


def build_checkpoint(spec: CheckpointSpec, directory: Path) -> Path:
    """Write the spec's checkpoint into `directory` and return it."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(spec.seed)
    model = transformers.AutoModelForCausalLM.from_config(spec.config(), dtype=torch.float32)
    _perturb(model, spec.seed)
    kwargs = {"max_shard_size": spec.max_shard_size} if spec.max_shard_size else {}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    write_tokenizer(directory)
    return directory


def load_reference(directory: Path) -> Any:
    """The transformers model for a written checkpoint, float32, eval mode."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return model.eval()
