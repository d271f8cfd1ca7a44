"""FP8 checkpoints for the loader tests: a dense tiny checkpoint rewritten in each supported
FP8 layout (Hugging Face `fp8` block-wise, compressed-tensors per channel and per tensor with
static activations), with the expected dequantized weights computed here in float64, apart
from the engine's own quantization code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tests.engine.model.checkpoints import CheckpointSpec, build_checkpoint

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
E4M3 = torch.float8_e4m3fn
# every projection's rows are a multiple of 128 (whole 128x128 blocks per q/k/v, gate/up shard)
SPEC = CheckpointSpec("llama-fp8", "LlamaConfig", {
    "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 4, "tie_word_embeddings": False})
STATIC_INPUT_SCALE = 0.02

FORMATS: dict[str, dict[str, Any]] = {
    "hf-block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                 "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]},
    "ct-channel": {"quant_method": "compressed-tensors", "format": "float-quantized",
                   "ignore": ["lm_head"], "config_groups": {"group_0": {
                       "targets": ["Linear"],
                       "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                   "symmetric": True, "dynamic": False},
                       "input_activations": {"num_bits": 8, "type": "float",
                                             "strategy": "token", "symmetric": True,
                                             "dynamic": True}}}},
    "ct-tensor-static": {"quant_method": "compressed-tensors", "format": "float-quantized",
                         "ignore": ["lm_head"], "config_groups": {"group_0": {
                             "targets": ["Linear"],
                             "weights": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                         "symmetric": True, "dynamic": False},
                             "input_activations": {"num_bits": 8, "type": "float",
                                                   "strategy": "tensor", "symmetric": True,
                                                   "dynamic": False}}}},
}


def _quantize(w: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3 weight, stored scale, dequantized weight float64) for one projection."""
    w64 = w.double()
    n, k = w64.shape
    if layout == "hf-block":
        tiles = w64.view(n // 128, 128, -1, 128) if k % 128 == 0 else None
        assert tiles is not None, "test shapes are whole blocks"
        scale = (tiles.abs().amax(dim=(1, 3)) / 448.0).float()               # [nb, kb]
        full = scale.double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    elif layout == "ct-channel":
        scale = (w64.abs().amax(dim=1, keepdim=True) / 448.0).float()        # [N, 1]
        full = scale.double().expand(n, k)
    else:
        scale = (w64.abs().amax() / 448.0).float().reshape(1)                # [1]
        full = scale.double().expand(n, k)
    q = (w64 / full).clamp(-448, 448).to(E4M3)
    return q, scale, q.double() * full


def write_fp8_checkpoint(directory: Path, layout: str) -> tuple[Path, dict[str, torch.Tensor]]:
    """The tiny checkpoint in `layout`; returns it and each projection's float64 dequantized
    weight by checkpoint name."""
    build_checkpoint(SPEC, directory)
    weights = directory / "model.safetensors"
    tensors = load_file(str(weights))
    expected: dict[str, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJECTIONS:
            q, scale, dq = _quantize(tensor, layout)
            out[name] = q
            out[module + (".weight_scale_inv" if layout == "hf-block" else ".weight_scale")] = \
                scale
            if layout == "ct-tensor-static":
                out[module + ".input_scale"] = torch.tensor([STATIC_INPUT_SCALE])
            expected[name] = dq
        else:
            out[name] = tensor
    save_file(out, str(weights))
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = FORMATS[layout]
    (directory / "config.json").write_text(json.dumps(config))
    return directory, expected
