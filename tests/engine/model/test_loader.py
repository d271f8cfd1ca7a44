"""Config parsing and weight loading: supported layouts, refusals with typed errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.common.core import open_model, prepare_core
from services.common.errors import ManifestError, UnsupportedError, ValidationError
from services.engine.model import ModelConfig, load_model
from tests.engine.model.checkpoints import write_tokenizer

LLAMA_31 = {  # the shape of a real Llama 3.1 config.json (old rope layout), tiny sizes
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 8,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 300,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_parses_legacy_rope_layout() -> None:
    config = ModelConfig.from_dict(LLAMA_31)
    assert config.head_dim == 8 and config.q_size == 64 and config.kv_size == 16
    assert config.rope.rope_type == "llama3" and config.rope.theta == 500000.0
    assert config.rope.original_max_position_embeddings == 8192
    assert config.max_context == 131072 and not config.qk_norm and not config.qkv_bias
    linear = ModelConfig.from_dict({**LLAMA_31, "rope_scaling": {"type": "linear", "factor": 2}})
    assert (linear.rope.rope_type, linear.rope.factor) == ("linear", 2.0)
    assert linear.max_context == 2 * 131072
    yarn = ModelConfig.from_dict({**LLAMA_31, "max_position_embeddings": 40960, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})
    assert yarn.max_context == 131072
    dynamic = ModelConfig.from_dict({**LLAMA_31, "max_position_embeddings": 4096,
                                     "rope_scaling": {"type": "dynamic", "factor": 2.0}})
    assert dynamic.max_context == 8192


def test_architecture_traits() -> None:
    qwen2 = ModelConfig.from_dict({**LLAMA_31, "architectures": ["Qwen2ForCausalLM"],
                                   "model_type": "qwen2", "rope_scaling": None})
    assert qwen2.qkv_bias and not qwen2.o_bias
    qwen3 = ModelConfig.from_dict({**LLAMA_31, "architectures": ["Qwen3ForCausalLM"],
                                   "model_type": "qwen3", "head_dim": 32, "rope_scaling": None})
    assert qwen3.qk_norm and qwen3.head_dim == 32 and qwen3.q_size == 256
    llama_bias = ModelConfig.from_dict({**LLAMA_31, "attention_bias": True, "mlp_bias": True})
    assert llama_bias.qkv_bias and llama_bias.o_bias and llama_bias.mlp_bias


def test_sliding_windows_per_layer() -> None:
    """Sliding layers attend to their window at any length: the context is not capped."""
    mistral = ModelConfig.from_dict({**LLAMA_31, "architectures": ["MistralForCausalLM"],
                                     "model_type": "mistral", "sliding_window": 4096,
                                     "rope_scaling": None, "max_position_embeddings": 32768})
    assert [layer.sliding_window for layer in mistral.layers] == [4096, 4096]
    assert mistral.sliding_window == 4096 and mistral.max_context == 32768
    qwen2 = ModelConfig.from_dict({**LLAMA_31, "architectures": ["Qwen2ForCausalLM"],
                                   "model_type": "qwen2", "sliding_window": 4096,
                                   "use_sliding_window": False, "rope_scaling": None})
    assert qwen2.sliding_window == 0 and qwen2.max_context == 131072
    qwen2_sliding = ModelConfig.from_dict({
        **LLAMA_31, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "sliding_window": 64, "use_sliding_window": True, "max_window_layers": 1,
        "rope_scaling": None})
    assert [layer.kind for layer in qwen2_sliding.layers] == ["full", "sliding"]
    stated = ModelConfig.from_dict({
        **LLAMA_31, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "sliding_window": 32, "layer_types": ["sliding_attention", "full_attention"],
        "rope_scaling": None})
    assert [layer.sliding_window for layer in stated.layers] == [32, 0]
    with pytest.raises(ValidationError, match="layer_types"):
        ModelConfig.from_dict({**LLAMA_31, "architectures": ["Qwen3ForCausalLM"],
                               "layer_types": ["full_attention"], "rope_scaling": None})
    with pytest.raises(UnsupportedError, match="chunked_attention"):
        ModelConfig.from_dict({**LLAMA_31, "architectures": ["Qwen3ForCausalLM"],
                               "layer_types": ["chunked_attention", "full_attention"],
                               "rope_scaling": None})


@pytest.mark.parametrize("architecture", ["GPT2LMHeadModel", "Phi3ForCausalLM",
                                          "DeepseekV3ForCausalLM"])
def test_unsupported_architecture_is_named(architecture: str) -> None:
    with pytest.raises(UnsupportedError, match=architecture) as info:
        ModelConfig.from_dict({**LLAMA_31, "architectures": [architecture]})
    for supported in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM"):
        assert supported in str(info.value)   # and the supported ones are listed


@pytest.mark.parametrize(("change", "error"), [
    ({"hidden_act": "gelu"}, UnsupportedError),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, UnsupportedError),
    ({"partial_rotary_factor": 0.5}, UnsupportedError),
    ({"num_key_value_heads": 3}, ValidationError),
    ({"architectures": []}, UnsupportedError),
    ({"hidden_size": "big"}, ValidationError),
    ({"rope_scaling": {"rope_type": "linear"}}, ValidationError),
])
def test_bad_configs_are_refused(change: dict, error: type) -> None:
    with pytest.raises(error):
        ModelConfig.from_dict({**LLAMA_31, **change})


def _copy(checkpoint_dirs: dict[str, Path], name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(checkpoint_dirs[name], target)
    return target


def test_unsupported_architecture_refused_at_load(checkpoint_dirs, tmp_path) -> None:
    path = _copy(checkpoint_dirs, "llama", tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["Phi3ForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedError, match="Phi3ForCausalLM"):
        load_model(open_model(path))


@pytest.mark.parametrize(("edit", "message"), [
    ("drop", "lacks tensor 'model.layers.1.mlp.up_proj.weight'"),
    ("extra", "unexpected tensor 'model.layers.0.self_attn.rotary.extra'"),
    ("reshape", "has shape"),
])
def test_weights_that_do_not_match_the_config(checkpoint_dirs, tmp_path, edit, message):
    path = _copy(checkpoint_dirs, "llama", tmp_path)
    tensors = load_file(path / "model.safetensors")
    if edit == "drop":
        del tensors["model.layers.1.mlp.up_proj.weight"]
    elif edit == "extra":
        tensors["model.layers.0.self_attn.rotary.extra"] = torch.zeros(3)
    else:
        tensors["model.norm.weight"] = torch.zeros(7)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ManifestError, match=message.replace("(", r"\(")):
        load_model(open_model(path))


def test_missing_shard_is_named(checkpoint_dirs, tmp_path) -> None:
    path = _copy(checkpoint_dirs, "qwen3-qknorm-sharded", tmp_path)
    shard = sorted(path.glob("model-0000*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(ManifestError, match=shard.name):
        load_model(open_model(path))


def test_tied_checkpoint_shares_the_embedding(engine_models) -> None:
    tied = engine_models["qwen2-bias-yarn"]
    assert tied.lm_head is None and tied.lm_head_weight is tied.model.embed_tokens.weight
    untied = engine_models["llama"]
    assert untied.lm_head is not None and untied.lm_head_weight is untied.lm_head.weight


def test_tied_checkpoint_that_also_saved_lm_head(checkpoint_dirs, tmp_path) -> None:
    path = _copy(checkpoint_dirs, "qwen2-bias-yarn", tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    model = load_model(open_model(path))
    assert torch.equal(model.lm_head_weight, tensors["model.embed_tokens.weight"])


def test_loads_from_a_prepared_core(checkpoint_dirs, tmp_path, engine_models) -> None:
    core = tmp_path / "core"
    prepare_core(checkpoint_dirs["qwen3-qknorm-sharded"], core, model_id="tiny-qwen3")
    model = load_model(open_model(core))
    reference = engine_models["qwen3-qknorm-sharded"]
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


def test_demo_core_loads(demo_core) -> None:
    model = load_model(open_model(demo_core))
    assert model.config.architecture == "Qwen3ForCausalLM" and model.config.qk_norm
    assert model.model.embed_tokens.weight.dtype == torch.float32   # bf16 checkpoint, float32 on the CPU


def test_checkpoint_helper_writes_a_model_directory(tmp_path) -> None:
    write_tokenizer(tmp_path)
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["type"] == "WordLevel"
