"""A byte-level tokenizer.json for the tiny test checkpoints (320-token vocabulary): one token
per byte (ids 0..255, GPT-2's byte alphabet) and special tokens above (id 256 is EOS), so
grammars compile for checkpoints that carry no real tokenizer, without any download."""

from __future__ import annotations

from pathlib import Path

EOS_ID = 256


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table (what ByteLevel pre-tokenization emits)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_byte_tokenizer(directory: Path, vocab_size: int) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in enumerate(byte_alphabet())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(f"<|s{i}|>", special=True)
                                  for i in range(vocab_size - 256)])
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    return path
