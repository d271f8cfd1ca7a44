"""load_model: a Hugging Face checkpoint (config.json + safetensors) -> CausalLM on a device.

Reads one `*.safetensors` file or the shards a `model.safetensors.index.json` lists, routes
each tensor by its Hugging Face name into the (fused) parameter slice it belongs to, converts
dtype on copy, and insists that every parameter is filled exactly once and that no tensor is
left unexplained: a checkpoint that does not match its config fails loudly at load, naming the
tensor, instead of generating nonsense later.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open

from services.common.core import ROLE_WEIGHTS, ModelSource
from services.common.errors import ManifestError
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config import ModelConfig

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints saved


def default_dtype(device: torch.device | str) -> torch.dtype:
    """float32 on the CPU (exact tests), bfloat16 on accelerators."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def weight_files(source: ModelSource) -> list[Path]:
    """The safetensors files holding the weights: the index's shards, else every weight file."""
    index_path = source.path(INDEX_FILE)
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text()).get("weight_map") or {}
        names = sorted(set(weight_map.values()))
        if not names:
            raise ManifestError(f"{index_path}: empty weight_map", param=INDEX_FILE)
    else:
        names = sorted(f.path for f in source.files_with_role(ROLE_WEIGHTS))
    if not names:
        raise ManifestError(f"{source.root}: no safetensors weights", param="weights")
    paths = [source.path(name) for name in names]
    for path in paths:
        if not path.is_file():
            raise ManifestError(f"{source.root}: weight shard {path.name} is missing",
                                param=path.name)
    return paths


def weight_targets(model: CausalLM) -> dict[str, torch.Tensor]:
    """Hugging Face tensor name -> the parameter (slice) it fills."""
    config = model.config
    q, kv, inter = config.q_size, config.kv_size, config.intermediate_size
    targets: dict[str, torch.Tensor] = {"model.embed_tokens.weight": model.embed,
                                        "model.norm.weight": model.norm}
    if model.lm_head is not None:
        targets["lm_head.weight"] = model.lm_head
    for i, layer in enumerate(model.decoder_layers()):
        prefix = f"model.layers.{i}."
        attn, mlp = layer.attn, layer.mlp
        fused = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
        for name, (start, end) in fused.items():
            targets[f"{prefix}self_attn.{name}.weight"] = attn.qkv_weight[start:end]
            if attn.qkv_bias is not None:
                targets[f"{prefix}self_attn.{name}.bias"] = attn.qkv_bias[start:end]
        targets[f"{prefix}self_attn.o_proj.weight"] = attn.o_weight
        if attn.o_bias is not None:
            targets[f"{prefix}self_attn.o_proj.bias"] = attn.o_bias
        if attn.q_norm is not None and attn.k_norm is not None:
            targets[f"{prefix}self_attn.q_norm.weight"] = attn.q_norm
            targets[f"{prefix}self_attn.k_norm.weight"] = attn.k_norm
        for name, (start, end) in {"gate_proj": (0, inter), "up_proj": (inter, 2 * inter)}.items():
            targets[f"{prefix}mlp.{name}.weight"] = mlp.gate_up_weight[start:end]
            if mlp.gate_up_bias is not None:
                targets[f"{prefix}mlp.{name}.bias"] = mlp.gate_up_bias[start:end]
        targets[f"{prefix}mlp.down_proj.weight"] = mlp.down_weight
        if mlp.down_bias is not None:
            targets[f"{prefix}mlp.down_proj.bias"] = mlp.down_bias
        targets[f"{prefix}input_layernorm.weight"] = layer.input_norm
        targets[f"{prefix}post_attention_layernorm.weight"] = layer.post_attention_norm
    return targets


def _ignored(name: str, config: ModelConfig) -> bool:
    if name.endswith(_IGNORED_SUFFIXES):
        return True
    return name == "lm_head.weight" and config.tie_word_embeddings  # saved despite the tie


@torch.inference_mode()
def load_model(source: ModelSource, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None, *, max_positions: int | None = None
               ) -> CausalLM:
    """Build the model for `source` on `device` and fill it from the checkpoint.

    dtype defaults to float32 on the CPU and bfloat16 elsewhere; max_positions (the rotary
    table's length, i.e. the longest context) defaults to the config's `max_context`.
    Unsupported architectures raise UnsupportedError; weights that do not match the config
    raise ManifestError naming the tensor.
    """
    config = ModelConfig.from_dict(source.config)
    dtype = dtype or default_dtype(device)
    model = CausalLM(config, device, dtype, max_positions or config.max_context)
    targets = weight_targets(model)
    filled: set[str] = set()
    for path in weight_files(source):
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if _ignored(name, config):
                    continue
                target = targets.get(name)
                if target is None:
                    raise ManifestError(
                        f"{path.name}: unexpected tensor {name!r} for {config.architecture} "
                        "(the checkpoint does not match its config.json)", param=name)
                if name in filled:
                    raise ManifestError(f"{path.name}: tensor {name!r} appears twice",
                                        param=name)
                tensor = handle.get_tensor(name)
                if tuple(tensor.shape) != tuple(target.shape):
                    raise ManifestError(
                        f"{path.name}: tensor {name!r} has shape {tuple(tensor.shape)}, the "
                        f"config implies {tuple(target.shape)}", param=name)
                target.copy_(tensor)
                filled.add(name)
    missing = sorted(set(targets) - filled)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ManifestError(f"{source.root}: checkpoint lacks tensor {missing[0]!r}{more}",
                            param=missing[0])
    log.info("loaded %s (%s, %d layers) on %s as %s", source.manifest.model_id,
             config.architecture, config.num_hidden_layers, device, dtype)
    return model.eval()
