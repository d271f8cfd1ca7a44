"""FP8 against bf16 on the same weights: top-1 agreement and KL of the next-token
distributions at every position of a few prompts (teacher-forced, one prefill each).

    stats = compare(directory, device, dtype)   # {"top1": ..., "kl": ..., "positions": ...}

The weights are a random checkpoint (tests/engine/model/checkpoints.py perturbs them so the
logits are well separated), written at a shape whose projections fill whole 128x128 blocks;
the dense model and the online-FP8 model load it on `device`."""

from __future__ import annotations

from pathlib import Path

import torch

from services.common.core import open_model
from services.engine.model import ForwardBatch, allocate_kv_cache, build_metadata, load_model
from tests.engine.model.checkpoints import CheckpointSpec, build_checkpoint

SPEC = CheckpointSpec("llama-fp8-accuracy", "LlamaConfig", {
    "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "tie_word_embeddings": False}, seed=3)
PROMPT_LENGTHS = (48, 17, 96)


def write(directory: Path) -> Path:
    return build_checkpoint(SPEC, directory)


@torch.inference_mode()
def all_logits(model: torch.nn.Module, prompts: list[list[int]], device: torch.device
               ) -> torch.Tensor:
    """float32 logits [sum(len), vocab] of every position, one packed prefill."""
    page_size = 16
    pages, tables = 0, []
    for prompt in prompts:
        count = -(-len(prompt) // page_size)
        tables.append(list(range(pages, pages + count)))
        pages += count
    kv = allocate_kv_cache(model.config, pages, page_size, device, model.dtype)
    meta = build_metadata([len(p) for p in prompts], [len(p) for p in prompts], tables,
                          page_size, device)
    ids = torch.tensor([t for p in prompts for t in p], device=device)
    positions = torch.tensor([i for p in prompts for i in range(len(p))], device=device)
    hidden = model(ForwardBatch(ids, positions, meta), kv).hidden
    return model.compute_logits(hidden).float()


def compare(directory: Path, device: torch.device, dtype: torch.dtype,
            quantization: str = "fp8") -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    vocab = SPEC.config().vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist()
               for n in PROMPT_LENGTHS]
    dense = all_logits(load_model(open_model(directory), device, dtype), prompts, device)
    fp8 = all_logits(load_model(open_model(directory), device, dtype,
                                quantization=quantization), prompts, device)
    log_p, log_q = dense.log_softmax(-1), fp8.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return {"top1": float((dense.argmax(-1) == fp8.argmax(-1)).float().mean()),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "positions": float(dense.shape[0])}
