"""GGUF metadata -> config.json: the real files against transformers' own GGUF conversion, and
synthetic files for what they do not exercise (qwen2/qwen3, Gemma 3 rules, rope scaling)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.common.errors import UnsupportedError, ValidationError
from services.common.gguf.config import hf_config
from services.common.gguf.reader import open_gguf
from tests.common.conftest import REAL_MODELS
from tests.support.gguf_files import TinySpec, write_tiny_gguf

# What the engine's config parsing reads (services/engine/model/config.py, gemma3.py).
ENGINE_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                 "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                 "bos_token_id", "eos_token_id", "pad_token_id", "attention_bias")
GEMMA3_FIELDS = ("sliding_window", "layer_types", "query_pre_attn_scalar",
                 "attn_logit_softcapping", "final_logit_softcapping", "hidden_activation")
# transformers' result carries the file's name and path; ours names the class and dtype.
PROVENANCE = {"_name_or_path", "_model_name_or_path", "architectures", "dtype", "unk_token_id"}


@pytest.mark.parametrize("name", REAL_MODELS)
def test_config_matches_transformers_field_by_field(name, real_ggufs, transformers_gguf):
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    ours = hf_config(real_ggufs.file(name))
    theirs = transformers_gguf.config(name)
    fields = ENGINE_FIELDS + (GEMMA3_FIELDS if name == "gemma3" else ("hidden_act",))
    for key in fields:
        assert ours[key] == getattr(theirs, key), key
    assert ours["architectures"] == [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[theirs.model_type]]
    # Read back by transformers, our config.json is the same config in every field (rope
    # included: rope_theta / rope_local_base_freq become the same rope_parameters).
    parsed = AutoConfig.for_model(**ours).to_dict()
    expected = theirs.to_dict()
    differing = {key for key in (set(parsed) | set(expected)) - PROVENANCE
                 if parsed.get(key) != expected.get(key)}
    assert not differing, {key: (parsed.get(key), expected.get(key)) for key in differing}
    assert parsed["rope_parameters"] == expected["rope_parameters"]


def test_real_files_state_their_shapes(real_ggufs):
    smol = hf_config(real_ggufs.file("smollm2"))
    assert (smol["architectures"], smol["hidden_size"], smol["num_hidden_layers"],
            smol["num_key_value_heads"], smol["rope_theta"]) == (["LlamaForCausalLM"], 576, 30,
                                                                 3, 100000.0)
    gemma = hf_config(real_ggufs.file("gemma3"))
    assert gemma["model_type"] == "gemma3_text" and gemma["sliding_window"] == 512
    assert [i for i, t in enumerate(gemma["layer_types"]) if t == "full_attention"] == [5, 11, 17]
    assert gemma["rope_local_base_freq"] == 10000.0 and gemma["rope_theta"] == 1_000_000.0
    assert gemma["query_pre_attn_scalar"] == 256 and gemma["rope_scaling"] is None


def _config(directory, **spec_fields):
    directory.mkdir(exist_ok=True)
    path = directory / "model.gguf"
    write_tiny_gguf(path, TinySpec(**spec_fields))
    return hf_config(open_gguf(path))


def test_qwen3_head_dim_comes_from_the_key_length(tmp_path):
    config = _config(tmp_path, arch="qwen3", hidden=16, heads=4, head_dim=8, pre="qwen2")
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert config["head_dim"] == 8 != 16 // 4
    assert config["attention_bias"] is False and config["hidden_act"] == "silu"


def test_qwen2_and_untied_embeddings(tmp_path):
    config = _config(tmp_path, arch="qwen2", qkv_bias=True, tie_embeddings=False, pre="qwen2")
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["tie_word_embeddings"] is False


def test_gemma3_layer_pattern_softcaps_and_27b_query_scale(tmp_path):
    config = _config(tmp_path, arch="gemma3", num_layers=12, tokenizer="llama", metadata={
        "gemma3.attention.sliding_window": 1024, "gemma3.final_logit_softcapping": 30.0})
    assert [i for i, t in enumerate(config["layer_types"]) if t == "full_attention"] == [5, 11]
    assert config["sliding_window"] == 1024
    assert config["final_logit_softcapping"] == 30.0 and config["attn_logit_softcapping"] is None
    assert config["query_pre_attn_scalar"] == 4   # the key length
    # llama.cpp scales Gemma 3 27B (62 layers) queries by hidden / heads instead.
    big = _config(tmp_path / "27b", arch="gemma3", num_layers=62, hidden=32, heads=4,
                  head_dim=4, tokenizer="llama")
    assert big["query_pre_attn_scalar"] == 32 // 4 and big["head_dim"] == 4


@pytest.mark.parametrize(("metadata", "expected"), [
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 8.0},
     {"rope_type": "linear", "factor": 8.0}),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
      "llama.rope.scaling.original_context_length": 4096,
      "llama.rope.scaling.yarn_beta_fast": 16.0},
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
      "beta_fast": 16.0}),
    ({"llama.rope.scaling.type": "none"}, None),
])
def test_stated_rope_scaling(tmp_path, metadata, expected):
    assert _config(tmp_path, metadata=metadata)["rope_scaling"] == expected


def _llama3_divisors(head_dim: int, theta: float, factor: float) -> np.ndarray:
    """transformers' own Llama 3 rotary frequencies, as the divisors llama.cpp stores."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    def inv_freq(scaling):
        config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                             rope_theta=theta, rope_scaling=scaling,
                             max_position_embeddings=131072)
        return LlamaRotaryEmbedding(config).inv_freq.to(torch.float64).numpy()

    scaled = inv_freq({"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    return (inv_freq(None) / scaled).astype(np.float32)


def test_llama3_rope_freqs_tensor_becomes_llama3_scaling(tmp_path):
    divisors = _llama3_divisors(64, 500000.0, 32.0)
    config = _config(tmp_path, head_dim=64, metadata={"llama.rope.freq_base": 500000.0},
                     extra_tensors={"rope_freqs.weight": divisors})
    assert config["rope_scaling"] == {"rope_type": "llama3", "factor": pytest.approx(32.0),
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}


def test_other_rope_freqs_are_refused(tmp_path):
    with pytest.raises(UnsupportedError, match="rope_freqs.weight"):
        _config(tmp_path, head_dim=64, extra_tensors={
            "rope_freqs.weight": np.linspace(1, 3, 32).astype(np.float32)})


def test_unknown_rope_scaling_type_is_refused(tmp_path):
    with pytest.raises(UnsupportedError, match="rope scaling type 'longrope'"):
        _config(tmp_path, metadata={"llama.rope.scaling.type": "longrope",
                                    "llama.rope.scaling.factor": 2.0})


def test_unsupported_architecture_names_it_and_the_supported(tmp_path):
    with pytest.raises(UnsupportedError) as info:
        _config(tmp_path, arch="phi3")
    assert "'phi3'" in str(info.value)
    assert "llama, qwen2, qwen3, gemma3" in str(info.value)


def test_missing_hyperparameter_is_named(tmp_path):
    with pytest.raises(ValidationError, match="llama.embedding_length is missing"):
        _config(tmp_path, drop_metadata=("llama.embedding_length",))
