"""Filling a model from checkpoint tensors through its parameters' own loaders.

    load_weights(model, tensors)   # tensors: (file name, checkpoint name, tensor) triples

Each checkpoint tensor is mapped by the architecture (`model.checkpoint_target`) to a
parameter and a shard, and that parameter's `weight_loader` copies it (converting the dtype,
placing fused shards, adding a stored offset). Strict: every (parameter, shard) is filled
exactly once and no tensor is left unexplained, so a checkpoint that does not match its
config fails at load, naming the tensor and its file, instead of generating nonsense later.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from services.common.errors import ManifestError
from services.engine.model.causal_lm import CausalLM
from services.engine.model.layers.weights import (
    WeightShapeError,
    covered_shards,
    weight_loader,
    weight_shards,
)


def expected_weights(model: CausalLM) -> set[tuple[str, str | None]]:
    """Every (parameter name, shard) a complete checkpoint fills."""
    return {(name, shard) for name, param in model.named_parameters()
            for shard in weight_shards(param)}


@torch.inference_mode()
def load_weights(model: CausalLM, tensors: Iterable[tuple[str, str, torch.Tensor]],
                 source: str = "checkpoint") -> None:
    params = dict(model.named_parameters())
    expected = expected_weights(model)
    filled: set[tuple[str, str | None]] = set()
    architecture = model.config.architecture
    for file_name, name, tensor in tensors:
        target = model.checkpoint_target(name)
        if target is None:
            continue
        param_name, shard = target
        param = params.get(param_name)
        fills = [(param_name, s) for s in covered_shards(param, shard)] if param is not None \
            else []
        if param is None or not fills or any(fill not in expected for fill in fills):
            raise ManifestError(
                f"{file_name}: unexpected tensor {name!r} for {architecture} "
                "(the checkpoint does not match its config.json)", param=name)
        if any(fill in filled for fill in fills):
            raise ManifestError(f"{file_name}: tensor {name!r} appears twice (or overlaps "
                                "another tensor's weights)", param=name)
        try:
            weight_loader(param)(param, tensor, shard)
        except WeightShapeError as exc:
            raise ManifestError(f"{file_name}: tensor {name!r} has shape {exc.got}, the "
                                f"config implies {exc.expected}", param=name) from exc
        filled.update(fills)
    missing = sorted(expected - filled, key=lambda t: (t[0], t[1] or ""))
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        name = model.checkpoint_name(*missing[0])
        raise ManifestError(f"{source}: checkpoint lacks tensor {name!r}{more}", param=name)
