"""Dummy weights: the model's real shapes filled with random values drawn on its device.

`--load-format dummy` serves a model directory that holds only config.json and the tokenizer
(benchmarks/model_shapes.py writes them for Qwen3-0.6B, Qwen3-8B and Llama-3.1-8B): the speed
of a forward pass does not depend on the values, and nothing is read from disk. Values are a
pure function of the seed (per device type: the CPU and CUDA generators differ), drawn with a
small standard deviation so activations stay finite in bf16 through every layer: matrices and
embeddings N(0, 0.02) (transformers' `initializer_range`), norm weights 1, biases 0. An FP8
projection draws its dense rows the same way and quantizes them with its scheme; kept MXFP4
experts draw random codes under scales of 2 ** -7 (values of about that deviation).
"""

from __future__ import annotations

import logging

import torch

from services.engine.model.causal_lm import CausalLM
from services.engine.model.config import ModelConfig
from services.engine.model.layers.fp8_linear import Fp8Linear
from services.engine.model.mxfp4 import SCALE_BIAS
from services.engine.model.registry import build_model

log = logging.getLogger(__name__)

STD = 0.02
DUMMY_ROWS = 4096   # an FP8 layer's dense rows drawn (then quantized) at a time


@torch.inference_mode()
def init_dummy_weights(model: CausalLM, seed: int = 0, std: float = STD) -> CausalLM:
    """Fill every parameter of `model` in place (in parameter order, one generator)."""
    generator = torch.Generator(device=model.device)
    generator.manual_seed(seed)
    fp8 = {name: module for name, module in model.named_modules()
           if isinstance(module, Fp8Linear)}
    for name, param in model.named_parameters():
        owner = fp8.get(name.rpartition(".")[0])
        if owner is not None:
            if param is owner.weight:   # dense rows drawn, then quantized with the scheme
                for start in range(0, owner.out_features, DUMMY_ROWS):
                    rows = min(DUMMY_ROWS, owner.out_features - start)
                    dense = torch.empty(rows, owner.in_features, device=param.device,
                                        dtype=model.dtype)
                    owner.quantize_into(dense.normal_(0.0, std, generator=generator), start)
            elif param is owner.input_scale:
                param.fill_(std * 4 / 448.0)
            elif name.endswith("bias"):
                param.zero_()
            continue
        if param.dtype == torch.uint8:      # kept MXFP4 experts (expert_weights.py Mxfp4Experts)
            if name.endswith("_scales"):     # 2 ** -7: E2M1 values of ~0.01 (about STD)
                param.fill_(SCALE_BIAS - 7)
            else:                             # any codes
                param.random_(0, 256, generator=generator)
        elif param.dim() >= 2:
            param.normal_(0.0, std, generator=generator)
        elif name.endswith("bias"):
            param.zero_()
        else:                        # norm weights (input, post-attention, q/k, final)
            param.fill_(1.0)         # (Gemma's 1 + w stored: a scale of 1 too)
    return model


def load_dummy_model(config: ModelConfig, device: torch.device | str, dtype: torch.dtype, *,
                     max_positions: int | None = None, seed: int = 0) -> CausalLM:
    """A model of `config`'s shapes on `device` with dummy weights (no checkpoint read)."""
    model = build_model(config, device, dtype, max_positions)
    init_dummy_weights(model, seed)
    log.info("dummy weights for %s (%d layers) on %s as %s, seed %d", config.architecture,
             config.num_hidden_layers, device, dtype, seed)
    return model.eval()
