"""A GGUF file's tensors as the Hugging Face checkpoint of the same model: float32, HF names,
HF shapes, and the values transformers' GGUF loader produces.

    for name, tensor in iter_hf_tensors("model.gguf"):   # ("model.layers.0.self_attn.q_proj.weight",
        ...                                              #  float32 [out, in])

Each tensor is dequantized with the gguf package (F32 / F16 / BF16 and every block format it
implements: Q4_0 ... Q8_0, the K-quants, the IQ formats), then llama.cpp's conversion is undone:
- llama (`permutes_qk`): its converter reordered the rows of q_proj / k_proj (weight and bias)
  within each head from HF's half-split rotary layout into interleaved pairs; they are put back;
- gemma3 (`norm_offset`): every RMSNorm weight was stored as 1 + w; w is restored.
`check_tensors` validates names and types without reading data (prepare time);
`count_parameters` sums the table.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from services.common.errors import UnsupportedError, ValidationError
from services.common.gguf.architectures import GGUFArchitecture, architecture_of
from services.common.gguf.config import hf_config
from services.common.gguf.names import hf_tensor_name
from services.common.gguf.reader import GGUFFile, TensorInfo, open_gguf

DIRECT_TYPES = ("F32", "F16", "BF16")


@functools.cache
def can_dequantize(type_name: str) -> bool:
    """Whether the installed gguf package turns this ggml type into floats (probed once with a
    zero block: the package raises NotImplementedError for the types it lacks)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    if type_name in DIRECT_TYPES:
        return True
    try:
        qtype = GGMLQuantizationType[type_name]
        _, type_size = GGML_QUANT_SIZES[qtype]
        dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except (KeyError, NotImplementedError, ValueError, TypeError):
        return False
    return True


def _parameter_tensors(gguf_file: GGUFFile) -> Iterator[tuple[TensorInfo, str]]:
    arch = architecture_of(gguf_file)
    for info in gguf_file.tensors:
        name = hf_tensor_name(arch.name, info.name, source=str(gguf_file.path))
        if name is not None:
            yield info, name


def check_tensors(gguf_file: GGUFFile) -> None:
    """Every tensor maps to an HF parameter and has a type this package can dequantize."""
    seen: dict[str, str] = {}
    for info, name in _parameter_tensors(gguf_file):
        if not can_dequantize(info.type_name):
            raise UnsupportedError(
                f"{gguf_file.path}: tensor {info.name} has type {info.type_name}, which the "
                "gguf package cannot dequantize (not supported)", param=info.name)
        if name in seen:
            raise ValidationError(f"{gguf_file.path}: tensors {seen[name]} and {info.name} "
                                  f"both map to {name}", param=info.name)
        seen[name] = info.name
    if "model.embed_tokens.weight" not in seen:
        raise ValidationError(f"{gguf_file.path}: no token_embd.weight tensor",
                              param="token_embd.weight")


def count_parameters(gguf_file: GGUFFile) -> int:
    """Parameters of the model from the tensor table (no data is read)."""
    return sum(info.num_elements for info, _ in _parameter_tensors(gguf_file))


def unpermute_rotary_rows(values: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: within each head it stored rows (0, d/2, 1, d/2+1 ...)
    in place of HF's (0, 1 ... d/2-1, d/2 ...). `values`: [num_heads * head_dim, ...]."""
    rows = values.shape[0]
    half = rows // num_heads // 2
    pairs = values.reshape(num_heads, half, 2, *values.shape[1:])
    return pairs.swapaxes(1, 2).reshape(values.shape)


def _undo_conversion(arch: GGUFArchitecture, config: dict, gguf_name: str,
                     values: np.ndarray) -> np.ndarray:
    if arch.permutes_qk:
        if ".attn_q." in gguf_name:
            values = unpermute_rotary_rows(values, config["num_attention_heads"])
        elif ".attn_k." in gguf_name:
            values = unpermute_rotary_rows(values, config["num_key_value_heads"])
    if arch.norm_offset and gguf_name.endswith("norm.weight"):
        values = values - np.float32(arch.norm_offset)
    return values


def _dequantize(tensor: object, info: TensorInfo, source: Path) -> np.ndarray:
    from gguf.quants import dequantize

    if not can_dequantize(info.type_name):
        raise UnsupportedError(
            f"{source}: tensor {info.name} has type {info.type_name}, which the gguf package "
            "cannot dequantize (not supported)", param=info.name)
    values = dequantize(tensor.data, tensor.tensor_type)  # type: ignore[attr-defined]
    return np.asarray(values, dtype=np.float32).reshape(info.shape)


def iter_hf_tensors(path: Path | str | GGUFFile) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 tensor in the HF shape) for every parameter of the file,
    in file order, one at a time. A tied lm_head (no output.weight) is not yielded."""
    gguf_file = path if isinstance(path, GGUFFile) else open_gguf(path)
    arch = architecture_of(gguf_file)
    config = hf_config(gguf_file)
    check_tensors(gguf_file)
    raw = {tensor.name: tensor for tensor in gguf_file.reader_tensors()}
    for info, name in _parameter_tensors(gguf_file):
        values = _dequantize(raw[info.name], info, gguf_file.path)
        values = _undo_conversion(arch, config, info.name, values)
        if not (values.flags.writeable and values.flags.c_contiguous):
            values = np.array(values, dtype=np.float32, copy=True)   # F32 data: a file view
        yield name, torch.from_numpy(values)
