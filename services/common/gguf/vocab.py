"""The `tokenizer.*` metadata of a GGUF file as one typed object.

llama.cpp stores the tokenizer as parallel arrays (token texts, SentencePiece scores, token
types), the BPE merges as "left right" strings, the special token ids, a few flags (add BOS,
add a space prefix) and the chat template. `read_vocab` reads them once and checks that the
arrays agree; the tokenizer builders (`tokenizer_bpe.py`, `tokenizer_spm.py`) work from it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from services.common.errors import UnsupportedError, ValidationError
from services.common.gguf.reader import GGUFFile

TOKENIZER_MODELS = ("gpt2", "llama")   # byte-level BPE, SentencePiece


class TokenType(enum.IntEnum):
    """llama.cpp's token attributes (gguf `TokenType`)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3          # special: <|im_start|>, <bos> ...
    USER_DEFINED = 4     # added but not special: matched whole in the text
    UNUSED = 5
    BYTE = 6             # SentencePiece byte fallback: <0x0A>


@dataclass(frozen=True)
class GGUFVocab:
    """Everything `tokenizer.ggml.*` / `tokenizer.chat_template` state, ids indexing `tokens`."""

    source: str                           # the file, for error messages
    model: str                            # gpt2 (byte-level BPE) or llama (SentencePiece)
    pre: str                              # pre-tokenizer name: smollm, qwen2, llama-bpe ...
    tokens: tuple[str, ...]               # token text by id
    token_types: tuple[int, ...]          # TokenType by id
    scores: tuple[float, ...] | None      # SentencePiece scores by id
    merges: tuple[str, ...] | None        # BPE merges, "left right", best first
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    eot_id: int | None                    # end of turn (chat models), when stated
    eom_id: int | None                    # end of message (tool calls), when stated
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]

    def ids_of_type(self, kind: TokenType) -> list[int]:
        return [i for i, t in enumerate(self.token_types) if t == kind]


def _optional_id(gguf_file: GGUFFile, key: str, count: int) -> int | None:
    value = gguf_file.value(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    token_id = int(value)
    if not 0 <= token_id < count:
        raise ValidationError(f"{gguf_file.path}: tokenizer.ggml.{key} = {token_id} is outside "
                              f"the vocabulary of {count} tokens", param=f"tokenizer.ggml.{key}")
    return token_id


def read_vocab(gguf_file: GGUFFile) -> GGUFVocab:
    """The tokenizer metadata (UnsupportedError for a tokenizer model other than gpt2/llama)."""
    source = str(gguf_file.path)
    model = gguf_file.value("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        raise UnsupportedError(
            f"{source}: tokenizer model {model!r} (tokenizer.ggml.model) is not supported "
            f"(supported: {', '.join(TOKENIZER_MODELS)})", param="tokenizer.ggml.model")
    tokens = gguf_file.value("tokenizer.ggml.tokens")
    if not tokens:
        raise ValidationError(f"{source}: tokenizer.ggml.tokens is missing or empty",
                              param="tokenizer.ggml.tokens")
    count = len(tokens)
    types = gguf_file.array("tokenizer.ggml.token_type", np.int32)
    token_types = (tuple(int(t) for t in types) if types is not None
                   else (TokenType.NORMAL,) * count)
    scores_array = gguf_file.array("tokenizer.ggml.scores", np.float32)
    scores = None if scores_array is None else tuple(float(s) for s in scores_array)
    for key, values in (("token_type", token_types), ("scores", scores)):
        if values is not None and len(values) != count:
            raise ValidationError(f"{source}: tokenizer.ggml.{key} has {len(values)} entries "
                                  f"for {count} tokens", param=f"tokenizer.ggml.{key}")
    merges = gguf_file.value("tokenizer.ggml.merges")
    if model == "gpt2" and not merges:
        raise ValidationError(f"{source}: a gpt2 (BPE) tokenizer without tokenizer.ggml.merges",
                              param="tokenizer.ggml.merges")
    if model == "llama" and scores is None:
        raise ValidationError(f"{source}: a SentencePiece tokenizer without "
                              "tokenizer.ggml.scores", param="tokenizer.ggml.scores")
    add_bos = gguf_file.value("tokenizer.ggml.add_bos_token")
    add_prefix = gguf_file.value("tokenizer.ggml.add_space_prefix")
    template = gguf_file.value("tokenizer.chat_template")
    return GGUFVocab(
        source=source, model=model, pre=str(gguf_file.value("tokenizer.ggml.pre", "default")),
        tokens=tuple(tokens), token_types=token_types, scores=scores,
        merges=tuple(merges) if merges else None,
        bos_id=_optional_id(gguf_file, "bos_token_id", count),
        eos_id=_optional_id(gguf_file, "eos_token_id", count),
        unk_id=_optional_id(gguf_file, "unknown_token_id", count),
        pad_id=_optional_id(gguf_file, "padding_token_id", count),
        eot_id=_optional_id(gguf_file, "eot_token_id", count),
        eom_id=_optional_id(gguf_file, "eom_token_id", count),
        # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise.
        add_bos=bool(add_bos) if add_bos is not None else model == "llama",
        add_eos=bool(gguf_file.value("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(add_prefix) if add_prefix is not None else model == "llama",
        chat_template=template if isinstance(template, str) and template else None,
    )
