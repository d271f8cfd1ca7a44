"""A GGUF file's metadata -> the Hugging Face `config.json` of the same model.

    config = hf_config(open_gguf("model.gguf"))   # {"architectures": ["LlamaForCausalLM"], ...}

llama.cpp keeps the hyperparameters under `{arch}.*` keys (embedding_length, block_count,
attention.head_count ...); this maps them onto the names transformers' config classes use, for
the architectures of `architectures.py`. What a GGUF does not store is filled the way llama.cpp
itself fills it (Gemma 3: every sixth layer attends fully, local rope base 10000), so the
engine and transformers read the same model. The tests check the result field by field against
transformers' own conversion (`AutoConfig.from_pretrained(dir, gguf_file=...)`).
"""

from __future__ import annotations

from typing import Any

from services.common.errors import UnsupportedError, ValidationError
from services.common.gguf.architectures import GGUFArchitecture, architecture_of
from services.common.gguf.reader import GGUFFile
from services.common.gguf.rope import rope_scaling

GEMMA3_SLIDING_PATTERN = 6          # llama.cpp and transformers: layers 6, 12 ... are global
GEMMA3_LOCAL_ROPE_THETA = 10000.0   # rope base of the sliding-window layers
GEMMA3_27B_LAYERS = 62              # llama.cpp scales 27B queries by hidden/heads, not head_dim


def _required(gguf_file: GGUFFile, suffix: str) -> Any:
    value = gguf_file.arch_value(suffix)
    if value is None:
        raise ValidationError(
            f"{gguf_file.path}: metadata {gguf_file.architecture}.{suffix} is missing",
            param=f"{gguf_file.architecture}.{suffix}")
    return value


def _single(gguf_file: GGUFFile, suffix: str, value: Any) -> int:
    """A per-layer array must be uniform (one value for every layer) to fit config.json."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise UnsupportedError(
                f"{gguf_file.path}: {gguf_file.architecture}.{suffix} differs between layers "
                f"({sorted(set(value))}); per-layer shapes are not supported", param=suffix)
        value = value[0]
    return int(value)


def vocab_size(gguf_file: GGUFFile) -> int:
    """Rows of the embedding (what the weights need), else the stated or listed vocabulary."""
    for tensor in gguf_file.tensors:
        if tensor.name == "token_embd.weight":
            return tensor.shape[0]
    stated = gguf_file.arch_value("vocab_size")
    if stated is not None:
        return int(stated)
    tokens = gguf_file.value("tokenizer.ggml.tokens")
    if not tokens:
        raise ValidationError(f"{gguf_file.path}: no vocabulary size (no token_embd.weight, "
                              "vocab_size or tokenizer.ggml.tokens)", param="vocab_size")
    return len(tokens)


def _head_dim(gguf_file: GGUFFile, hidden: int, heads: int) -> int:
    key_length = gguf_file.arch_value("attention.key_length")
    value_length = gguf_file.arch_value("attention.value_length")
    if key_length is not None and value_length is not None and key_length != value_length:
        raise UnsupportedError(
            f"{gguf_file.path}: key length {key_length} differs from value length "
            f"{value_length}; unsupported", param="attention.value_length")
    if key_length is not None:
        return int(key_length)
    rotary = gguf_file.arch_value("rope.dimension_count")
    if rotary is not None and gguf_file.architecture == "llama":
        return int(rotary)     # llama.cpp writes the head size here for llama
    return hidden // heads


def _token_id(gguf_file: GGUFFile, name: str) -> int | None:
    value = gguf_file.value(f"tokenizer.ggml.{name}")
    return None if value is None else int(value)


def _gemma3_fields(gguf_file: GGUFFile, config: dict[str, Any]) -> dict[str, Any]:
    layers = config["num_hidden_layers"]
    scalar = config["head_dim"]
    if layers == GEMMA3_27B_LAYERS:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    window = gguf_file.arch_value("attention.sliding_window")
    attn_cap = gguf_file.arch_value("attn_logit_softcapping")
    final_cap = gguf_file.arch_value("final_logit_softcapping")
    return {
        "sliding_window": None if window is None else int(window),
        "layer_types": ["full_attention" if (i + 1) % GEMMA3_SLIDING_PATTERN == 0
                        else "sliding_attention" for i in range(layers)],
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_THETA,
        "query_pre_attn_scalar": scalar,
        "attn_logit_softcapping": None if attn_cap is None else float(attn_cap),
        "final_logit_softcapping": None if final_cap is None else float(final_cap),
    }


def _has_tensor_suffix(gguf_file: GGUFFile, suffix: str) -> bool:
    return any(name.endswith(suffix) for name in gguf_file.tensor_names)


def hf_config(gguf_file: GGUFFile) -> dict[str, Any]:
    """config.json for the file's model (UnsupportedError for another architecture)."""
    arch: GGUFArchitecture = architecture_of(gguf_file)
    hidden = int(_required(gguf_file, "embedding_length"))
    heads = _single(gguf_file, "attention.head_count", _required(gguf_file,
                                                                 "attention.head_count"))
    kv_heads_raw = gguf_file.arch_value("attention.head_count_kv", heads)
    kv_heads = _single(gguf_file, "attention.head_count_kv", kv_heads_raw)
    head_dim = _head_dim(gguf_file, hidden, heads)
    theta = float(gguf_file.arch_value("rope.freq_base", arch.default_rope_theta))
    config: dict[str, Any] = {
        "architectures": [arch.hf_architecture],
        "model_type": arch.model_type,
        "vocab_size": vocab_size(gguf_file),
        "hidden_size": hidden,
        "intermediate_size": _single(gguf_file, "feed_forward_length",
                                     _required(gguf_file, "feed_forward_length")),
        "num_hidden_layers": int(_required(gguf_file, "block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(_required(gguf_file, "attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(_required(gguf_file, "context_length")),
        "rope_theta": theta,
        "rope_scaling": rope_scaling(gguf_file, head_dim, theta),
        "tie_word_embeddings": "output.weight" not in gguf_file.tensor_names,
        arch.activation_key: arch.activation,
        "torch_dtype": "float32",     # iter_hf_tensors yields float32
    }
    if arch.name in ("llama", "qwen3"):
        config["attention_bias"] = _has_tensor_suffix(gguf_file, ".attn_q.bias")
    if arch.name == "llama":
        config["mlp_bias"] = _has_tensor_suffix(gguf_file, ".ffn_up.bias")
    for key, name in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                      ("pad_token_id", "padding_token_id")):
        token_id = _token_id(gguf_file, name)
        if token_id is not None:
            config[key] = token_id
    if arch.name == "gemma3":
        config["attention_bias"] = False
        config.update(_gemma3_fields(gguf_file, config))
    return config
