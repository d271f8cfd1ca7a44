"""How a checkpoint's embeddings pool its final hidden states (sentence-transformers layout).

    pooling = pooling_config(source)      # Pooling(mode="last" | "mean" | "", normalize)

A checkpoint with `modules.json` names its modules: the `Pooling` module's directory holds
`config.json` with `pooling_mode_lasttoken` / `pooling_mode_mean_tokens` (Qwen3-Embedding:
last token), and a `Normalize` module means L2-normalized vectors. A checkpoint without it (a
decoder such as Qwen3 or Llama) pools the final (normed) hidden state of the last prompt
token, normalized. Modes the engine does not compute (CLS, max, weighted mean) leave `mode`
empty: embedding requests are then refused with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.common.core import ModelSource
from services.common.errors import ValidationError

POOLING_MODULE = "sentence_transformers.models.Pooling"
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True, slots=True)
class Pooling:
    mode: str = "last"            # "last", "mean" or "" (not supported: see `reason`)
    normalize: bool = True
    reason: str = ""


def _read(source: ModelSource, relative: str) -> Any:
    path = source.path(relative)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ValidationError(f"{relative} is not valid JSON: {exc}", param=relative) from exc


def pooling_config(source: ModelSource) -> Pooling:
    modules = _read(source, "modules.json")
    if not isinstance(modules, list):
        return Pooling()
    types = [m.get("type", "") for m in modules if isinstance(m, dict)]
    normalize = NORMALIZE_MODULE in types
    pool_dir = next((m.get("path", "") for m in modules if isinstance(m, dict) and
                     m.get("type") == POOLING_MODULE), None)
    config = _read(source, f"{pool_dir}/config.json") if pool_dir else None
    if not isinstance(config, dict):
        return Pooling("last", normalize)
    if config.get("pooling_mode_lasttoken"):
        return Pooling("last", normalize)
    if config.get("pooling_mode_mean_tokens"):
        return Pooling("mean", normalize)
    modes = sorted(k.removeprefix("pooling_mode_") for k, v in config.items()
                   if k.startswith("pooling_mode_") and v)
    return Pooling("", normalize, f"the checkpoint pools by {', '.join(modes) or 'nothing'}; "
                                  "the engine serves last-token and mean pooling")
