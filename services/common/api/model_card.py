"""A served model as ListModels describes it (proto ModelCard)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelCard:
    id: str                                   # first served name, else the checkpoint id
    aliases: tuple[str, ...] = ()             # every name it answers to (id included)
    root: str = ""                            # checkpoint identifier
    max_model_len: int = 0                    # effective context (the engine's limit)
    tools: bool = False                       # capabilities
    vision: bool = False
    reasoning: bool = False
    created: int = 0                          # unix seconds the core was prepared
    owned_by: str = "helios"
    architecture: str = ""
    family: str = ""                          # qwen3, llama ...
    num_parameters: int = 0
    dtype: str = ""
    size_bytes: int = 0                       # weight bytes on disk
    digest: str = ""                          # hex model identity
    chat_template: str = ""
    max_num_seqs: int = 0                     # the engine's request slots (0: unknown)
    max_waiting: int = 0                      # its waiting queue (requests)
    # vision models: the core manifest's per-request image limits (0: none of its own)
    max_images: int = 0
    max_image_bytes: int = 0
    max_image_pixels: int = 0

    def answers_to(self, name: str) -> bool:
        return name == self.id or name == self.root or name in self.aliases
