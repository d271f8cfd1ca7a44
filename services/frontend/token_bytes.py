"""What each token id decodes to, as bytes: the decoder of `tokenizer.json`, modelled exactly.

Two decoder families cover the tokenizers Helios serves:

- **byte-level** (GPT-2 style: Qwen, Llama 3, DeepSeek): every character of a token stands for
  one byte through the GPT-2 byte alphabet; a token with a character outside that alphabet
  (added tokens such as `<｜User｜>`) is its own UTF-8 text. The decoded text is the lossy UTF-8
  decoding of all bytes joined.
- **sentencepiece-style** (`Sequence` of `Replace("▁", " ")`, `ByteFallback`, `Fuse`, and an
  optional trailing `Strip`: Gemma, Llama 2, Mistral): tokens are text with `▁` as space, except
  `<0xAB>` byte tokens; a run of consecutive byte tokens is its UTF-8 text when valid, otherwise
  one U+FFFD per byte; `Strip` removes leading characters of the whole text.

`DecoderModel.kind` says which one applies ("bytelevel", "sentencepiece" or "generic" when the
decoder is something else; the detokenizer then falls back to windowed decoding).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def gpt2_byte_alphabet() -> dict[str, int]:
    """The GPT-2 byte-level alphabet: character -> byte (printable bytes map to themselves)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    mapping: dict[str, int] = {chr(b): b for b in printable}
    shift = 0
    for byte in range(256):
        if byte not in printable:
            mapping[chr(256 + shift)] = byte
            shift += 1
    return mapping


_GPT2_BYTES = gpt2_byte_alphabet()


@dataclass(frozen=True, slots=True)
class Replace:
    pattern: str
    content: str


@dataclass(frozen=True, slots=True)
class DecoderModel:
    kind: str                            # bytelevel | sentencepiece | generic
    replacements: tuple[Replace, ...] = ()
    strip_content: str = ""              # Strip after Fuse: character removed from the start
    strip_start: int = 0                 # ... at most this many times

    @classmethod
    def from_json(cls, decoder: dict[str, Any] | None) -> DecoderModel:
        if decoder is None:
            return cls("generic")
        kind = decoder.get("type")
        if kind == "ByteLevel":
            return cls("bytelevel")
        if kind != "Sequence":
            return cls("generic")
        steps = decoder.get("decoders") or []
        types = [step.get("type") for step in steps]
        if types == ["ByteLevel"]:
            return cls("bytelevel")
        replacements: list[Replace] = []
        index = 0
        while index < len(steps) and types[index] == "Replace":
            pattern = steps[index].get("pattern", {})
            if "String" not in pattern:
                return cls("generic")
            replacements.append(Replace(pattern["String"], steps[index].get("content", "")))
            index += 1
        if types[index:index + 2] != ["ByteFallback", "Fuse"]:
            return cls("generic")
        index += 2
        strip_content, strip_start = "", 0
        if index < len(types) and types[index] == "Strip":
            step = steps[index]
            if step.get("stop", 0) != 0:
                return cls("generic")
            strip_content, strip_start = step.get("content", " "), int(step.get("start", 0))
            index += 1
        if index != len(types):
            return cls("generic")
        return cls("sentencepiece", tuple(replacements), strip_content, strip_start)


class TokenBytes:
    """Per-id decoded pieces, computed lazily and cached (vocabularies are 150k-260k ids)."""

    def __init__(self, model: DecoderModel, id_to_token: Any) -> None:
        self.model = model
        self._id_to_token = id_to_token
        self._cache: dict[int, tuple[bytes, bool]] = {}

    def piece(self, token_id: int) -> tuple[bytes, bool]:
        """(bytes, is_byte_token): a sentencepiece byte token is one raw byte of a run."""
        cached = self._cache.get(token_id)
        if cached is not None:
            return cached
        token = self._id_to_token(token_id)
        if token is None:
            result = (b"", False)
        elif self.model.kind == "bytelevel":
            try:
                result = (bytes(_GPT2_BYTES[ch] for ch in token), False)
            except KeyError:
                result = (token.encode("utf-8"), False)
        else:
            match = _BYTE_TOKEN.match(token) if self.model.kind == "sentencepiece" else None
            if match:
                result = (bytes([int(match.group(1), 16)]), True)
            else:
                for rule in self.model.replacements:
                    token = token.replace(rule.pattern, rule.content)
                result = (token.encode("utf-8"), False)
        self._cache[token_id] = result
        return result

    def token_bytes(self, token_id: int) -> bytes:
        return self.piece(token_id)[0]
