"""GGUF tensor names -> Hugging Face parameter names, per architecture.

    hf_tensor_name("llama", "blk.3.attn_q.weight")   # "model.layers.3.self_attn.q_proj.weight"

llama.cpp names tensors `{part}.{weight|bias}` at the top level and `blk.{i}.{part}.{...}` per
layer. The layer parts map the same for every supported architecture except the norms around
the feed-forward block: Llama and Qwen have one (`ffn_norm`, HF's post_attention_layernorm),
Gemma 3 has four (attention output, before and after the feed-forward). Tensors llama.cpp adds
that are not parameters (`rope_freqs`: config, read by rope.py) map to None.
"""

from __future__ import annotations

import re

from services.common.errors import UnsupportedError

TOP_LEVEL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

LAYER_PARTS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

GEMMA3_LAYER_PARTS = {
    **LAYER_PARTS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}

NOT_PARAMETERS = frozenset({"rope_freqs.weight"})

_LAYER = re.compile(r"^blk\.(?P<index>\d+)\.(?P<part>[a-z0-9_]+)\.(?P<kind>weight|bias)$")
_TOP = re.compile(r"^(?P<part>[a-z0-9_]+)\.(?P<kind>weight|bias)$")


def layer_parts(architecture: str) -> dict[str, str]:
    return GEMMA3_LAYER_PARTS if architecture == "gemma3" else LAYER_PARTS


def hf_tensor_name(architecture: str, name: str, *, source: str = "") -> str | None:
    """The Hugging Face name of one GGUF tensor (None: not a parameter). An unknown name is an
    UnsupportedError naming the tensor and the file (`source`)."""
    if name in NOT_PARAMETERS:
        return None
    layer = _LAYER.match(name)
    if layer:
        part = layer_parts(architecture).get(layer["part"])
        if part is not None:
            return f"model.layers.{int(layer['index'])}.{part}.{layer['kind']}"
    else:
        top = _TOP.match(name)
        if top and top["part"] in TOP_LEVEL:
            return f"{TOP_LEVEL[top['part']]}.{top['kind']}"
    where = f"{source}: " if source else ""
    raise UnsupportedError(f"{where}tensor {name!r} has no Hugging Face counterpart in a "
                           f"{architecture} model (not supported)", param=name)
