"""transformers' own GGUF loading of the pinned real files, the reference the GGUF tests and
the real-model end-to-end tests compare with; each object is built once per session (loading
the Gemma file takes transformers about a minute on two cores).

    reference = TransformersGGUF(paths)        # paths: model name -> .gguf path
    reference.config("gemma3"); reference.tokenizer("smollm2"); reference.model("smollm2")
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


class TransformersGGUF:
    def __init__(self, paths: Callable[[str], Path]) -> None:
        self._paths = paths
        self._cache: dict[tuple[str, str], Any] = {}

    def _load(self, kind: str, name: str, loader: Callable[[Path], Any]) -> Any:
        key = (kind, name)
        if key not in self._cache:
            self._cache[key] = loader(self._paths(name))
        return self._cache[key]

    def config(self, name: str) -> Any:
        from transformers import AutoConfig

        return self._load("config", name, lambda p: AutoConfig.from_pretrained(
            p.parent, gguf_file=p.name))

    def tokenizer(self, name: str) -> Any:
        from transformers import AutoTokenizer

        return self._load("tokenizer", name, lambda p: AutoTokenizer.from_pretrained(
            p.parent, gguf_file=p.name))

    def model(self, name: str) -> Any:
        """The causal LM in float32, eval mode."""
        import torch
        from transformers import AutoModelForCausalLM

        return self._load("model", name, lambda p: AutoModelForCausalLM.from_pretrained(
            p.parent, gguf_file=p.name, dtype=torch.float32).eval())
