"""The tokenizer's vocabulary inside the model's logits.

Checkpoints often pad the embedding / LM head past the tokenizer (Qwen3: 151,936 rows for
151,669 tokens; the padding keeps matrix shapes friendly). Those rows are trained for nothing
(or random, in the demo model) and decode to no text, so no sampler may pick them: the
engine reads the tokenizer's size from the core's `tokenizer.json` at load and every
sampler (`Sampler`, the graph runner's `sample_rows`) sets the logits of ids at or past it to
-inf before any sampling transform, and lists top alternatives among the tokenizer's ids only.
The logprobs reported stay the model's own (log_softmax over every column, as transformers
computes them). The slice is static (a host int), so decode CUDA graphs capture it.

That same size (`token_vocab_size`) is the vocabulary every validation message names (prompt
ids, `logit_bias`, `stop_token_ids`), the size the frontend's tokenizer reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def tokenizer_vocab_size(tokenizer_json: Path) -> int:
    """Ids the tokenizer defines: one past the largest id of its model vocabulary and its
    added tokens (what `tokenizers`' get_vocab_size(with_added_tokens=True) gives)."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = (data.get("model") or {}).get("vocab")
    size = 0
    if isinstance(vocab, dict):           # BPE, WordPiece, WordLevel: token -> id
        size = max(vocab.values(), default=-1) + 1
    elif isinstance(vocab, list):         # Unigram: [piece, score] by id
        size = len(vocab)
    added = [int(t["id"]) for t in data.get("added_tokens") or () if "id" in t]
    return max(size, max(added, default=-1) + 1)


def token_vocab_size(tokenizer_json: Path | None, model_vocab: int) -> int:
    """The ids a request may name and the sampler may emit: the tokenizer's, capped by the
    model's logits (the model's own size when there is no tokenizer file)."""
    if tokenizer_json is None or not tokenizer_json.is_file():
        return model_vocab
    size = tokenizer_vocab_size(tokenizer_json)
    return min(size, model_vocab) if size > 0 else model_vocab


def mask_beyond_vocab_(logits: torch.Tensor, token_vocab: int) -> torch.Tensor:
    """Logits [N, V] with the ids >= token_vocab set to -inf, in place (a static slice)."""
    if token_vocab < logits.shape[-1]:
        logits[:, token_vocab:] = float("-inf")
    return logits
