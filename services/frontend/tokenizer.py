"""Tokenizer: encode, decode and token facts over Hugging Face's `tokenizers` library.

Loaded from the exact bytes of `tokenizer.json` (the caller checks their fingerprint), with
the named special tokens of `tokenizer_config.json` for chat templates. Encoding goes through
`encode_batch`, which releases the GIL, so preparation threads do not stall the event loop
that streams tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import tokenizers

from services.frontend.bounded_encode import ChunkedSpans, PromptTooLong, TokenBounds, chunk_chars
from services.frontend.detokenizer import IncrementalDetokenizer
from services.frontend.token_bytes import DecoderModel, TokenBytes

COUNT_CHUNK_TOKENS = 1 << 16    # count_tokens encodes ~1 Mi characters at a time

# transformers' named special-token attributes (SPECIAL_TOKENS_ATTRIBUTES).
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                        "cls_token", "mask_token")


@dataclass(frozen=True, slots=True)
class Encoding:
    ids: list[int]
    spans: Any                       # tokenizers.Encoding: char_to_token / token_to_chars

    @property
    def offsets(self) -> list[tuple[int, int]]:
        """Character span of each token in the input text."""
        return list(self.spans.offsets)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens_map(config: dict[str, Any]) -> dict[str, str]:
    """What transformers passes to templates: named special tokens, then extra ones."""
    result: dict[str, str] = {}
    for name in NAMED_SPECIAL_TOKENS:
        text = _token_text(config.get(name))
        if text is not None:
            result[name] = text
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        for name, value in extra.items():
            text = _token_text(value)
            if text is not None:
                result[name] = text
    return result


class Tokenizer:
    def __init__(self, tokenizer_json: str, tokenizer_config: dict[str, Any] | None = None):
        self._tok = tokenizers.Tokenizer.from_str(tokenizer_json)
        added = self._tok.get_added_tokens_decoder()
        self.added_tokens: dict[int, str] = {i: t.content for i, t in added.items()}
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.config = tokenizer_config or {}
        self.special_tokens = special_tokens_map(self.config)
        decoder = self._tok.decoder
        decoder_json = json.loads(decoder.__getstate__()) if decoder is not None else None
        self.token_bytes = TokenBytes(DecoderModel.from_json(decoder_json), self._tok.id_to_token)
        self.bounds = TokenBounds.from_tokenizer(
            tokenizer_json,
            lambda i: self.token_bytes.token_bytes(i).decode("utf-8", errors="replace"))
        self._affixes = self._special_affixes()

    # -- encode -------------------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_with_offsets(self, text: str, *, add_special_tokens: bool = False) -> Encoding:
        encoding = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        return Encoding(encoding.ids, encoding)

    def encode_bounded(self, text: str, limit: int | None, *,
                       add_special_tokens: bool = False) -> Encoding:
        """Encode, or raise PromptTooLong as soon as more than `limit` tokens are certain.

        Refused at once when the character bound proves the text too long; otherwise encoded
        in chunks cut where no token crosses (bounded_encode.py), stopping past the limit.
        The ids (and spans) equal `encode_with_offsets`; with add_special_tokens the chunked
        result carries no spans.
        """
        if limit is not None:
            least = self.bounds.lower_bound(len(text))
            if least > limit:
                raise PromptTooLong(least, limit)
        size = chunk_chars(limit)
        affixes = self._affixes if add_special_tokens else ([], [])
        if len(text) <= size or not self.bounds.chunkable or affixes is None:
            return self.encode_with_offsets(text, add_special_tokens=add_special_tokens)
        prefix, suffix = affixes
        ids: list[int] = list(prefix)
        spans = ChunkedSpans()
        for start, end in self._chunks(text, size):
            encoding = self._tok.encode_batch([text[start:end]], add_special_tokens=False)[0]
            spans.add(start, len(ids), encoding)
            ids.extend(encoding.ids)
            if limit is not None and len(ids) + len(suffix) > limit:
                raise PromptTooLong(len(ids) + len(suffix), limit)
        ids.extend(suffix)
        return Encoding(ids, None if add_special_tokens else spans)

    def count_tokens(self, text: str, *, add_special_tokens: bool = False) -> int:
        """len(encode(text)), with memory bounded by one chunk (nothing is kept)."""
        size = chunk_chars(COUNT_CHUNK_TOKENS)
        affixes = self._affixes if add_special_tokens else ([], [])
        if len(text) <= size or not self.bounds.chunkable or affixes is None:
            return len(self.encode(text, add_special_tokens=add_special_tokens))
        return len(affixes[0]) + len(affixes[1]) + sum(
            len(self._tok.encode_batch([text[start:end]], add_special_tokens=False)[0].ids)
            for start, end in self._chunks(text, size))

    def _chunks(self, text: str, size: int) -> Iterator[tuple[int, int]]:
        """Consecutive (start, end) spans of about `size` characters, cut where no token
        crosses (a span is longer where no cut is found in time)."""
        start = 0
        while start < len(text):
            end = len(text)
            if end - start > size:
                end = self.bounds.find_cut(text, start + size, start) or self._next_cut(
                    text, start + size)
            yield start, end
            start = end

    def _next_cut(self, text: str, after: int) -> int:
        """The first cut after `after`, else the end of the text."""
        i = text.find(" ", after)
        while i != -1:
            if self.bounds.is_cut(text, i):
                return i
            i = text.find(" ", i + 1)
        return len(text)

    def _special_affixes(self) -> tuple[list[int], list[int]] | None:
        """The ids add_special_tokens puts before and after a text (None: not separable)."""
        plain = self._tok.encode_batch(["a"], add_special_tokens=False)[0].ids
        full = self._tok.encode_batch(["a"], add_special_tokens=True)[0].ids
        for at in range(len(full) - len(plain) + 1):
            if full[at:at + len(plain)] == plain:
                return full[:at], full[at + len(plain):]
        return None

    # -- decode -------------------------------------------------------------------------------

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _decode_positional(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self.decode(ids, skip_special_tokens=skip_special_tokens)

    def detokenizer(self, *, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.token_bytes, self.special_ids,
                                      skip_special_tokens=skip_special_tokens,
                                      decode=self._decode_positional)

    # -- token facts --------------------------------------------------------------------------

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return [self._tok.id_to_token(i) or "" for i in ids]

    def token_piece(self, token_id: int) -> tuple[str, bytes]:
        """A token's decoded text (U+FFFD for partial bytes) and its exact bytes."""
        raw = self.token_bytes.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), raw

    def is_valid_id(self, token_id: int) -> bool:
        return 0 <= token_id < self.vocab_size and self._tok.id_to_token(token_id) is not None
