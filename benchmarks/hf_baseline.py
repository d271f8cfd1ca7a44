"""The baseline every GPU benchmark reports against: HF transformers with random weights.

    model, device = random_hf_model(model_dir)

A model directory from benchmarks/model_shapes.py (config.json only): the architecture's
transformers class built from the config, bf16 on CUDA (float32 on the CPU), weights left
at transformers' random init, eval mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def random_hf_model(model_dir: Path | str) -> tuple[Any, str]:
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = transformers.AutoConfig.from_pretrained(model_dir)
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        except TypeError:                                   # transformers < 5
            model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    return model.eval(), device
