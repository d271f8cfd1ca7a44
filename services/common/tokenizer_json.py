"""The `added_tokens` of a tokenizer.json without parsing the whole file.

A manifest needs only the added tokens (`<think>` marks a reasoning model; an EOS named by
tokenizer_config.json is found among them), yet a full `json.loads` of a 150k-token vocabulary
takes about 0.36 s, and every service that opens a model directory paid it on top of its own
tokenizer's parse. The `tokenizers` library writes `added_tokens` before `normalizer`, ..., and
the large `model`, so walking the top-level object key by key and decoding each value with the
standard decoder stops after a few small values. Where `added_tokens` comes later (or is
absent), the walk decodes every value: no worse than the full parse, and the same result.
"""

from __future__ import annotations

import json
from typing import Any

_DECODER = json.JSONDecoder()
_SPACE = " \t\n\r"


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in _SPACE:
        index += 1
    return index


def _expect(text: str, index: int, char: str) -> int:
    if index >= len(text) or text[index] != char:
        raise json.JSONDecodeError(f"Expecting '{char}'", text, index)
    return index + 1


def read_added_tokens(text: str) -> list[Any]:
    """The top-level `added_tokens` list of tokenizer.json `text` ([] when absent or not a
    list, as `data.get("added_tokens") or []` reads it); a malformed prefix, or a top level
    that is not an object, raises json.JSONDecodeError like json.loads. A repeated key keeps
    its first value (json.loads keeps the last; the library never writes one twice)."""
    index = _expect(text, _skip_space(text, 0), "{")
    index = _skip_space(text, index)
    if index < len(text) and text[index] == "}":
        return []
    while True:
        key, index = _DECODER.raw_decode(text, _skip_space(text, index))
        if not isinstance(key, str):
            raise json.JSONDecodeError("Expecting property name", text, index)
        index = _expect(text, _skip_space(text, index), ":")
        value, index = _DECODER.raw_decode(text, _skip_space(text, index))
        if key == "added_tokens":
            return value if isinstance(value, list) else []
        index = _skip_space(text, index)
        if index < len(text) and text[index] == "}":
            return []
        index = _expect(text, index, ",")
