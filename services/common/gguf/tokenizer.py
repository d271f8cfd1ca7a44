"""A GGUF file's tokenizer metadata -> `tokenizer.json`, `tokenizer_config.json` and the ids
that end a generation.

    files = hf_tokenizer(open_gguf("model.gguf"))
    files.tokenizer_json      # str: a `tokenizers` serialization (Tokenizer.from_str)
    files.tokenizer_config    # dict: chat_template, bos/eos/unk/pad tokens, add_bos_token
    files.stop_token_ids      # eos, end-of-turn / end-of-message ids

The model is built by `tokenizer_bpe.py` (gpt2) or `tokenizer_spm.py` (llama); here the
control tokens become special added tokens and the user-defined ones plain added tokens (both
matched whole in the text, never normalized), and BOS / EOS are added to each encoding when the
file says so. The tests compare ids and decoding with transformers' own GGUF conversion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Tokenizer, processors

from services.common.gguf.architectures import architecture_of
from services.common.gguf.reader import GGUFFile
from services.common.gguf.tokenizer_bpe import byte_level_tokenizer
from services.common.gguf.tokenizer_spm import sentencepiece_tokenizer
from services.common.gguf.vocab import GGUFVocab, TokenType, read_vocab

# Control tokens that end a turn in the chat formats of the supported families; llama.cpp
# stops on them too (its end-of-generation set), beside the stated eos / eot / eom ids.
END_OF_TURN_TOKENS = frozenset({
    "<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>",
    "<|end_of_text|>", "<|end|>",
})


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer_json: str                 # tokenizer.json text
    tokenizer_config: dict[str, Any]    # tokenizer_config.json content
    stop_token_ids: tuple[int, ...]     # generation_config.json eos_token_id


def _add_tokens(tokenizer: Tokenizer, vocab: GGUFVocab, spelled: list[str]) -> None:
    """Control tokens as special, user-defined ones as plain added tokens. A token the
    vocabulary spells differently from the file (a respelled whitespace run, a raw-text token
    in a byte-level vocabulary) stays an ordinary vocabulary entry."""
    named = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id} - {None}
    special, plain = [], []
    for token_id, (text, kind) in enumerate(zip(vocab.tokens, vocab.token_types, strict=True)):
        if spelled[token_id] != text:
            continue
        if kind == TokenType.CONTROL or token_id in named:
            special.append(AddedToken(text, special=True, normalized=False))
        elif kind == TokenType.USER_DEFINED:
            plain.append(AddedToken(text, special=False, normalized=False))
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(plain)


def _post_processor(vocab: GGUFVocab) -> processors.PostProcessor | None:
    """BOS before / EOS after each sequence, when the file asks for them."""
    bos = vocab.token(vocab.bos_id) if vocab.add_bos else None
    eos = vocab.token(vocab.eos_id) if vocab.add_eos else None
    if bos is None and eos is None:
        return None
    first = [f"{bos}:0"] if bos else []
    last = [f"{eos}:0"] if eos else []
    second_first = [f"{bos}:1"] if bos else []
    second_last = [f"{eos}:1"] if eos else []
    specials = [(token, token_id) for token, token_id in
                ((bos, vocab.bos_id), (eos, vocab.eos_id)) if token is not None]
    return processors.TemplateProcessing(
        single=[*first, "$A:0", *last],
        pair=[*first, "$A:0", *last, *second_first, "$B:1", *second_last],
        special_tokens=specials)


def stop_token_ids(vocab: GGUFVocab) -> tuple[int, ...]:
    """eos, then eot / eom, then the end-of-turn control tokens of the vocabulary."""
    ids = [i for i in (vocab.eos_id, vocab.eot_id, vocab.eom_id) if i is not None]
    ids += [i for i, (text, kind) in enumerate(zip(vocab.tokens, vocab.token_types, strict=True))
            if kind == TokenType.CONTROL and text in END_OF_TURN_TOKENS]
    return tuple(dict.fromkeys(ids))


def tokenizer_config(vocab: GGUFVocab, max_length: int | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": vocab.add_bos,
        "add_eos_token": vocab.add_eos,
        "clean_up_tokenization_spaces": False,
    }
    for name, token_id in (("bos_token", vocab.bos_id), ("eos_token", vocab.eos_id),
                           ("unk_token", vocab.unk_id), ("pad_token", vocab.pad_id)):
        if token_id is not None:
            config[name] = vocab.tokens[token_id]
    if max_length:
        config["model_max_length"] = max_length
    if vocab.chat_template:
        config["chat_template"] = vocab.chat_template
    return config


def build_tokenizer(vocab: GGUFVocab, architecture: str) -> Tokenizer:
    if vocab.model == "gpt2":
        tokenizer, spelled = byte_level_tokenizer(vocab)
    else:
        tokenizer, spelled = sentencepiece_tokenizer(vocab, architecture)
    _add_tokens(tokenizer, vocab, spelled)
    post = _post_processor(vocab)
    if post is not None:
        tokenizer.post_processor = post
    return tokenizer


def hf_tokenizer(gguf_file: GGUFFile) -> TokenizerFiles:
    """tokenizer.json, tokenizer_config.json and the stop ids of the file's model."""
    arch = architecture_of(gguf_file)
    vocab = read_vocab(gguf_file)
    tokenizer = build_tokenizer(vocab, arch.name)
    context = gguf_file.arch_value("context_length")
    return TokenizerFiles(
        tokenizer_json=tokenizer.to_str(),
        tokenizer_config=tokenizer_config(vocab, int(context) if context else None),
        stop_token_ids=stop_token_ids(vocab))
