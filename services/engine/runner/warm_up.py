"""Start-up forwards of the eager step shapes, so no kernel compiles while serving.

    warm_up_eager(model, kv, max_tokens=4096, max_seqs=256, max_model_len=32768)

Decode graphs compile the decode kernels when they are captured; prefill and mixed steps run
eagerly, and each Triton kernel compiles a variant the first time it meets a new constexpr
(the attention kernel's query tile and split flag, its split reduction's width, a tier of
tiles) — on the H200 a first prefill stalled serving for 2.4 s and a first mixed step for
3.4 s. These forwards meet those variants at start-up: one prompt chunk of several lengths,
chunks continuing long prompts (split attention), and mixed batches of decodes beside a
chunk, each within the step budget, the slots and the KV pool. They write KV pages nobody
owns yet (nothing is cached before the engine serves) and their results are dropped.
`tests/engine/gpu/test_gpu_compiles.py` serves varied steps after start-up and checks that no
kernel compiled a new variant.
"""

from __future__ import annotations

import logging
import time

import torch

from services.engine.model.attention import KVCache, build_metadata
from services.engine.model.causal_lm import CausalLM, ForwardBatch

log = logging.getLogger(__name__)

CHUNKS = (1, 2, 3, 16, 63, 64, 65, 128, 192, 512, 1024, 2048, 4096, 8192)  # prompt chunks
CONTEXTS = (1024, 4096, 16384, 65536)    # KV lengths a continuing chunk or decode attends to
MIXED = (2, 4, 8, 16, 32, 64, 128, 256)  # sequences of a mixed step


def eager_shapes(max_tokens: int, max_seqs: int, max_model_len: int, pages: int,
                 page_size: int) -> list[tuple[list[int], list[int]]]:
    """(query lengths, KV lengths) per sequence of each warm-up forward that fits the step
    budget, the slots, the context and `pages` KV pages."""
    shapes: list[tuple[list[int], list[int]]] = []
    for q in CHUNKS:
        if q <= max_tokens:
            shapes.append(([q], [q]))                     # a new prompt's chunk
    for context in (*CONTEXTS, max_model_len):
        if context > max_model_len:
            continue
        for q in (1, 64, min(512, max_tokens)):           # a chunk (or decode) late in a prompt
            shapes.append(([q], [context]))
    # short steps (a prompt's tail alone or beside decodes) have the fewest programs and so
    # split the KV range the most: over contexts of 2^n and 1.5 x 2^n positions they meet
    # each power-of-two tier of the reduction's split count (its BLOCK_S), and the split
    # attention, at counts that are multiples of 16 and counts that are not
    context = 256
    while context <= max_model_len:
        for length in (context, min(max_model_len, context * 3 // 2)):
            shapes.append(([2], [length]))
            shapes.append(([1, 1, 1, 2], [length] * 4))
        context *= 2
    for seqs in MIXED:
        if seqs > max_seqs or seqs > max_tokens:
            continue
        for context in (64, 2048):
            chunk = min(64, max_tokens - (seqs - 1))
            if chunk >= 1 and context <= max_model_len:
                shapes.append(([1] * (seqs - 1) + [chunk], [context] * (seqs - 1) + [chunk]))
                shapes.append(([1] * seqs, [context] * seqs))     # decodes past the graphs
    fits = []
    for q_lens, kv_lens in dict.fromkeys((tuple(q), tuple(k)) for q, k in shapes):
        if sum(-(-k // page_size) for k in kv_lens) <= pages:
            fits.append((list(q_lens), list(kv_lens)))
    return fits


@torch.inference_mode()
def warm_up_eager(model: CausalLM, kv: KVCache, *, max_tokens: int, max_seqs: int,
                  max_model_len: int) -> int:
    """Run the eager shapes' forwards (and the logits of each sequence's last row) on the
    model's device; returns how many ran. A no-op off CUDA (nothing compiles there)."""
    device = model.device
    if device.type != "cuda":
        return 0
    started = time.perf_counter()
    shapes = eager_shapes(max_tokens, max_seqs, max_model_len, kv.num_pages - 1, kv.page_size)
    for q_lens, kv_lens in shapes:
        tables, next_page = [], 0
        for length in kv_lens:
            count = -(-length // kv.page_size)
            tables.append(list(range(next_page, next_page + count)))
            next_page += count
        meta = build_metadata(q_lens, kv_lens, tables, kv.page_size, device)
        positions = torch.cat([torch.arange(k - q, k, device=device)
                               for q, k in zip(q_lens, kv_lens, strict=True)])
        if model.position_rows == 3:
            positions = positions.expand(3, -1).contiguous()
        ids = torch.zeros(positions.shape[-1], dtype=torch.int64, device=device)
        hidden = model(ForwardBatch(ids, positions, meta), kv).hidden
        last = torch.cumsum(torch.tensor(q_lens, device=device), 0) - 1
        model.compute_logits(hidden[last])
    torch.cuda.synchronize(device)
    log.info("eager step shapes warmed up", extra={"fields": {
        "forwards": len(shapes), "seconds": round(time.perf_counter() - started, 2)}})
    return len(shapes)
