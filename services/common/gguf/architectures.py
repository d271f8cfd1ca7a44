"""The GGUF architectures Helios reads and their Hugging Face names.

One `GGUFArchitecture` per `general.architecture` value: the Hugging Face class and model_type
it becomes, its activation, the config.json key that states it, and whether llama.cpp's
converter changed its tensors (the rotary row permutation of llama's q/k projections, Gemma's
RMSNorm weights stored as 1 + w). `architecture_of(gguf_file)` is the one place that refuses
anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import UnsupportedError
from services.common.gguf.reader import GGUFFile


@dataclass(frozen=True, slots=True)
class GGUFArchitecture:
    name: str                   # general.architecture: llama, qwen2, qwen3, gemma3
    hf_architecture: str        # config.json `architectures[0]`
    model_type: str             # config.json `model_type`
    activation_key: str         # hidden_act (Llama, Qwen) / hidden_activation (Gemma)
    activation: str             # silu / gelu_pytorch_tanh
    permutes_qk: bool = False   # llama.cpp reordered q/k rows for its rotary layout
    norm_offset: float = 0.0    # llama.cpp stored every RMSNorm weight as w + offset
    default_rope_theta: float = 10000.0


ARCHITECTURES: dict[str, GGUFArchitecture] = {
    arch.name: arch
    for arch in (
        GGUFArchitecture("llama", "LlamaForCausalLM", "llama", "hidden_act", "silu",
                         permutes_qk=True),
        GGUFArchitecture("qwen2", "Qwen2ForCausalLM", "qwen2", "hidden_act", "silu",
                         default_rope_theta=1_000_000.0),
        GGUFArchitecture("qwen3", "Qwen3ForCausalLM", "qwen3", "hidden_act", "silu",
                         default_rope_theta=1_000_000.0),
        GGUFArchitecture("gemma3", "Gemma3ForCausalLM", "gemma3_text", "hidden_activation",
                         "gelu_pytorch_tanh", norm_offset=1.0,
                         default_rope_theta=1_000_000.0),
    )
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)


def architecture_of(gguf_file: GGUFFile) -> GGUFArchitecture:
    """The file's architecture, or UnsupportedError naming it and the supported ones."""
    name = gguf_file.architecture
    arch = ARCHITECTURES.get(name)
    if arch is None:
        raise UnsupportedError(
            f"{gguf_file.path}: GGUF architecture {name!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})", param="general.architecture")
    return arch
