"""Qwen3-MoE and Mixtral: config parsing (sparse/dense layer mix), both expert checkpoint
layouts through the real loader, and the loader's refusals. Greedy parity with transformers
runs in test_parity.py (the "qwen3-moe", "qwen3-moe-step2" and "mixtral" specs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.common.core import open_model
from services.common.errors import ManifestError, UnsupportedError
from services.engine.model import load_model, parse_model_config


@pytest.fixture(scope="module")
def moe_dirs(checkpoint_dirs: dict[str, Path]) -> dict[str, Path]:
    return checkpoint_dirs     # the session's tiny checkpoints (conftest.py)


def rewrite(source: Path, target: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """A copy of a checkpoint directory with other tensors."""
    target.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(source / name, target / name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(target / "model.safetensors"))
    return target


def fuse_experts(tensors: dict[str, torch.Tensor], names: tuple[str, str, str], block: str
                 ) -> dict[str, torch.Tensor]:
    """Per-expert tensors -> transformers 5's fused `experts.gate_up_proj` / `down_proj`."""
    gate, up, down = names
    out = {k: v for k, v in tensors.items() if ".experts." not in k}
    prefixes = sorted({k.split(".experts.")[0] for k in tensors if ".experts." in k})
    for prefix in prefixes:
        count = len({k for k in tensors if k.startswith(f"{prefix}.experts.")}) // 3
        out[f"{prefix}.experts.gate_up_proj"] = torch.stack([torch.cat([
            tensors[f"{prefix}.experts.{e}.{gate}.weight"],
            tensors[f"{prefix}.experts.{e}.{up}.weight"]]) for e in range(count)])
        out[f"{prefix}.experts.down_proj"] = torch.stack([
            tensors[f"{prefix}.experts.{e}.{down}.weight"] for e in range(count)])
    assert any(f".{block}.experts.gate_up_proj" in k for k in out)
    return out


@pytest.mark.parametrize("name,names,block", [
    ("qwen3-moe", ("gate_proj", "up_proj", "down_proj"), "mlp"),
    ("mixtral", ("w1", "w3", "w2"), "block_sparse_moe")])
def test_fused_expert_layout_loads_the_same_weights(moe_dirs, tmp_path, name, names,
                                                    block) -> None:
    per_expert = load_model(open_model(moe_dirs[name]))
    tensors = load_file(str(moe_dirs[name] / "model.safetensors"))
    fused_dir = rewrite(moe_dirs[name], tmp_path / "fused", fuse_experts(tensors, names, block))
    fused = load_model(open_model(fused_dir))
    theirs = dict(fused.named_parameters())
    for param_name, param in per_expert.named_parameters():
        assert torch.equal(param, theirs[param_name]), param_name
    assert per_expert.config.moe is not None
    assert per_expert.config.moe.num_sparse_layers == len(per_expert.moe_blocks()) >= 1

    # both layouts at once for one expert block: refused, naming the tensor
    first = next(k for k in tensors if ".experts.0." in k)
    mixed = fuse_experts(tensors, names, block) | {first: tensors[first]}
    with pytest.raises(ManifestError, match="appears twice"):
        load_model(open_model(rewrite(moe_dirs[name], tmp_path / "mixed", mixed)))


@pytest.mark.parametrize("name,missing", [
    ("qwen3-moe", "model.layers.2.mlp.experts.5.up_proj.weight"),
    ("mixtral", "model.layers.1.block_sparse_moe.experts.3.w3.weight")])
def test_missing_expert_is_named(moe_dirs, tmp_path, name, missing) -> None:
    tensors = load_file(str(moe_dirs[name] / "model.safetensors"))
    del tensors[missing]
    with pytest.raises(ManifestError, match=f"lacks tensor '{missing}'"):
        load_model(open_model(rewrite(moe_dirs[name], tmp_path / "missing", tensors)))


def test_expert_shape_mismatch_is_named(moe_dirs, tmp_path) -> None:
    tensors = load_file(str(moe_dirs["qwen3-moe"] / "model.safetensors"))
    bad = "model.layers.0.mlp.experts.1.down_proj.weight"
    tensors[bad] = tensors[bad][:, :-1]
    with pytest.raises(ManifestError, match=f"{bad}' has shape"):
        load_model(open_model(rewrite(moe_dirs["qwen3-moe"], tmp_path / "bad", tensors)))


def qwen3_moe_config(**overrides) -> dict:
    config = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 32, "hidden_size": 16,
              "intermediate_size": 24, "num_hidden_layers": 6, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 8, "num_experts": 4,
              "num_experts_per_tok": 2, "moe_intermediate_size": 8}
    return config | overrides


def test_sparse_layers_follow_step_and_mlp_only_layers() -> None:
    moe = parse_model_config(qwen3_moe_config()).moe
    assert moe is not None and moe.sparse_layers == (True,) * 6 and not moe.renormalize
    moe = parse_model_config(qwen3_moe_config(decoder_sparse_step=2, mlp_only_layers=[3],
                                              norm_topk_prob=True)).moe
    assert moe is not None and moe.renormalize
    assert moe.sparse_layers == (False, True, False, False, False, True)
    moe = parse_model_config(qwen3_moe_config(num_local_experts=4, num_experts=None)).moe
    assert moe is not None and moe.num_experts == 4
    assert parse_model_config(qwen3_moe_config(num_experts=0)).moe is None
    with pytest.raises(UnsupportedError, match="shared experts"):
        parse_model_config(qwen3_moe_config(shared_expert_intermediate_size=32))
    with pytest.raises(Exception, match="experts per token"):
        parse_model_config(qwen3_moe_config(num_experts_per_tok=5))


def test_mixtral_config() -> None:
    config = json.loads(json.dumps(qwen3_moe_config(
        architectures=["MixtralForCausalLM"], num_local_experts=8, sliding_window=64)))
    parsed = parse_model_config(config)
    assert parsed.moe is not None and parsed.moe.num_experts == 8
    assert parsed.moe.intermediate_size == 24 and parsed.moe.renormalize
    assert all(layer.sliding_window == 64 for layer in parsed.layers)
