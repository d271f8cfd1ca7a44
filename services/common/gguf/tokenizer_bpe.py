"""Byte-level BPE (`tokenizer.ggml.model = gpt2`) -> a `tokenizers` Tokenizer.

The vocabulary is written in GPT-2's byte alphabet (every byte shown as a printable character,
the space as "Ġ"), the merges come from the file, and `tokenizer.ggml.pre` names how text is
split before BPE; `PRE_TOKENIZERS` holds the splits llama.cpp uses for the models Helios reads:

- `default` / `gpt2`: GPT-2's split (contractions, letters, digits, other, spaces);
- `smollm` (also starcoder and refact vocabularies): every digit alone, then GPT-2's split;
- `qwen2`: Qwen2/Qwen3's split (single digits, case-insensitive contractions, newline runs);
- `llama-bpe` / `llama3`: Llama 3's split (digits in groups of up to three), and whole-word
  lookup before merges (`ignore_merges`), as llama.cpp and Llama 3's tokenizer.json do.

Special and user-defined tokens are added by `tokenizer.py`, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from services.common.errors import UnsupportedError, ValidationError
from services.common.gguf.vocab import GGUFVocab

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte: printable Latin-1 bytes stand for themselves,
    the rest (controls, space, DEL, NBSP, soft hyphen) take code points from U+0100 upward."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1),
                 *range(0xAE, 0xFF + 1)]
    spelling = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in spelling:
            spelling[byte] = chr(256 + extra)
            extra += 1
    return spelling


BYTE_SPELLING = byte_alphabet()
BYTE_CHARS = frozenset(BYTE_SPELLING.values())


@dataclass(frozen=True, slots=True)
class Split:
    """How one `tokenizer.ggml.pre` splits text before BPE."""

    pre_tokenizer: Callable[[], pre_tokenizers.PreTokenizer]
    ignore_merges: bool = False


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _regex(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    return build


PRE_TOKENIZERS: dict[str, Split] = {
    "default": Split(_gpt2),
    "gpt2": Split(_gpt2),
    "gpt-2": Split(_gpt2),
    "smollm": Split(_digits_then_gpt2),
    "starcoder": Split(_digits_then_gpt2),
    "refact": Split(_digits_then_gpt2),
    "qwen2": Split(_regex(QWEN2_SPLIT)),
    "deepseek-r1-qwen": Split(_regex(QWEN2_SPLIT)),
    "llama-bpe": Split(_regex(LLAMA3_SPLIT), ignore_merges=True),
    "llama3": Split(_regex(LLAMA3_SPLIT), ignore_merges=True),
    "llama-v3": Split(_regex(LLAMA3_SPLIT), ignore_merges=True),
}


def spell_byte_level(token: str) -> str:
    """A token as the BPE vocabulary writes it: unchanged when already in the byte alphabet,
    else its UTF-8 bytes spelled in it (llama.cpp keeps some added tokens as raw text)."""
    if set(token) <= BYTE_CHARS:
        return token
    return "".join(BYTE_SPELLING[b] for b in token.encode("utf-8"))


def _merges(vocab: GGUFVocab) -> list[tuple[str, str]]:
    pairs = []
    for rank, merge in enumerate(vocab.merges or ()):
        left, _, right = merge.partition(" ")
        if not left or not right:
            raise ValidationError(f"{vocab.source}: BPE merge #{rank} {merge!r} is not "
                                  "'left right'", param="tokenizer.ggml.merges")
        pairs.append((left, right))
    return pairs


def byte_level_tokenizer(vocab: GGUFVocab) -> tuple[Tokenizer, list[str]]:
    """The byte-level BPE tokenizer and each id's spelling in its vocabulary."""
    split = PRE_TOKENIZERS.get(vocab.pre)
    if split is None:
        raise UnsupportedError(
            f"{vocab.source}: BPE pre-tokenizer {vocab.pre!r} (tokenizer.ggml.pre) is not "
            f"supported (supported: {', '.join(sorted(PRE_TOKENIZERS))})",
            param="tokenizer.ggml.pre")
    spelled = [spell_byte_level(token) for token in vocab.tokens]
    table = {text: token_id for token_id, text in enumerate(spelled)}
    model = models.BPE(vocab=table, merges=_merges(vocab), dropout=None, fuse_unk=False,
                       byte_fallback=False, ignore_merges=split.ignore_merges)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = split.pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, spelled
