"""Reading a checkpoint's tensors: safetensors files (one, or the shards an index lists) or a
GGUF file (dequantized to float32 by services.common.gguf, with Hugging Face names).

    for file_name, name, tensor in checkpoint_tensors(source): ...

Tensors come one at a time, on the CPU, in the checkpoint's dtype (GGUF: float32); the
parameters' loaders convert them on copy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from services.common.core import ROLE_WEIGHTS, ModelSource
from services.common.errors import ManifestError

INDEX_FILE = "model.safetensors.index.json"


def weight_files(source: ModelSource) -> list[Path]:
    """The files holding the weights: the index's shards, else every weight file."""
    index_path = source.path(INDEX_FILE)
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text()).get("weight_map") or {}
        names = sorted(set(weight_map.values()))
        if not names:
            raise ManifestError(f"{index_path}: empty weight_map", param=INDEX_FILE)
    else:
        names = sorted(f.path for f in source.files_with_role(ROLE_WEIGHTS))
    if not names:
        raise ManifestError(f"{source.root}: no weights (safetensors or GGUF)", param="weights")
    paths = [source.path(name) for name in names]
    for path in paths:
        if not path.is_file():
            raise ManifestError(f"{source.root}: weight shard {path.name} is missing",
                                param=path.name)
    return paths


def checkpoint_tensors(source: ModelSource) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(file name, Hugging Face tensor name, tensor) for every tensor of the checkpoint."""
    for path in weight_files(source):
        if path.suffix == ".gguf":
            from services.common.gguf.tensors import iter_hf_tensors

            for name, tensor in iter_hf_tensors(path):
                yield path.name, name, tensor
            continue
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield path.name, name, handle.get_tensor(name)
