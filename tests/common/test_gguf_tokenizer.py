"""GGUF tokenizer metadata -> tokenizer.json: identical ids and decoding to transformers' own
GGUF conversion (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) on both real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers

from services.common.errors import UnsupportedError
from services.common.gguf.reader import open_gguf
from services.common.gguf.tokenizer import hf_tokenizer
from services.frontend.chat.template import ChatTemplate
from services.frontend.tokenizer import Tokenizer as HeliosTokenizer
from services.frontend.tokenizer import special_tokens_map
from tests.common.conftest import REAL_MODELS
from tests.support.gguf_files import TinySpec, write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]

CORPUS = [
    "Hello world", "Hello, world! How are you today?", " leading space", "trailing space ",
    "don't I'll we're THEY'VE o'clock", "The quick brown fox jumps over the lazy dog.",
    # digits
    "0 1 12 123 1234 12345 3.14159 1e-9 -42 $1,000,000.00 2024-06-01 10:30",
    # unicode, CJK, emoji, accents, right-to-left, combining marks
    "你好，世界！我爱自然语言处理。", "こんにちは世界、カタカナとひらがな", "안녕하세요 세계",
    "Ünïcödé façade naïve café résumé Straße", "مرحبا بالعالم", "שלום עולם", "Привет, мир!",
    "emoji 🙂👍🏽🇫🇷👨‍👩‍👧‍👦 ✅", "e\u0301 a\u0308 \u00a0nbsp \u200bzero width \u2028sep",
    "math ∑∫√∞ ≠ ≤ ≥ → ⇒ λx.x", "\x00\x01\x7f control bytes",
    # code
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    '{"key": [1, 2, {"nested": null}], "s": "a\\"b"}',
    "for (int i = 0; i < n; ++i) { sum += a[i]; }", "SELECT * FROM t WHERE x <> 'y';",
    "<html><body><div class=\"x\">text</div></body></html>",
    # whitespace runs
    "a  b   c    d     e", "\n", "\n\n", "x\n\n\n\ny", "\t\tindented\ttabs", "  \n  \n \t \n",
    " " * 33, "end" + " " * 40 + "end", "\r\n windows \r\n", "",
    # special tokens written in the text
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>x",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos><pad><unk>", "<unused0>[multimodal]<start_of_image>", "<think>hmm</think>",
]
CORPUS += [" " * n + "x" for n in range(1, 20)] + ["y" + "\n" * n for n in range(1, 12)]
CORPUS += [REPO.joinpath("README.md").read_text()[:6000],
           REPO.joinpath("services/common/core.py").read_text()[:6000]]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name three primes."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Translate 'cat' to 日本語 🐱"}],
    [{"role": "user", "content": "Write code:\n\n```python\nprint(1)\n```\n  indented"}],
]


@pytest.fixture(scope="module")
def tokenizer_pairs(real_ggufs, transformers_gguf):
    """name -> (our tokenizers.Tokenizer, our TokenizerFiles, transformers' tokenizer)."""
    cache = {}

    def get(name):
        if name not in cache:
            files = hf_tokenizer(real_ggufs.file(name))
            cache[name] = (tokenizers.Tokenizer.from_str(files.tokenizer_json), files,
                           transformers_gguf.tokenizer(name))
        return cache[name]
    return get


@pytest.mark.parametrize("name", REAL_MODELS)
def test_ids_and_decoding_match_transformers(name, tokenizer_pairs):
    ours, _, theirs = tokenizer_pairs(name)
    assert ours.get_vocab_size(with_added_tokens=True) == len(theirs)
    mismatches = []
    for text in CORPUS:
        for add_special in (True, False):
            mine = ours.encode(text, add_special_tokens=add_special).ids
            expected = theirs.encode(text, add_special_tokens=add_special)
            if mine != expected:
                mismatches.append((text[:60], add_special, mine[:12], expected[:12]))
        ids = theirs.encode(text, add_special_tokens=True)
        for skip in (False, True):
            if ours.decode(ids, skip_special_tokens=skip) != theirs.decode(
                    ids, skip_special_tokens=skip):
                mismatches.append((text[:60], "decode", skip))
    assert not mismatches, mismatches[:5]


@pytest.mark.parametrize("name", REAL_MODELS)
def test_special_tokens_match_transformers(name, tokenizer_pairs):
    ours, files, theirs = tokenizer_pairs(name)
    added = {i: t for i, t in ours.get_added_tokens_decoder().items()}
    assert {i for i, t in added.items() if t.special} == set(theirs.all_special_ids) | {
        i for i, t in theirs.added_tokens_decoder.items() if t.special}
    assert {i: t.content for i, t in added.items()} == {
        i: t.content for i, t in theirs.added_tokens_decoder.items()}
    config = files.tokenizer_config
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert config[key] == getattr(theirs, key), key
    assert config["add_bos_token"] == theirs.add_bos_token


def test_smollm2_chat_template_renders_and_tokenizes_like_transformers(tokenizer_pairs):
    ours, files, theirs = tokenizer_pairs("smollm2")
    config = files.tokenizer_config
    assert config["chat_template"] == theirs.chat_template
    template = ChatTemplate(config["chat_template"])
    for conversation in CONVERSATIONS:
        expected = theirs.apply_chat_template(conversation, tokenize=False,
                                              add_generation_prompt=True)
        rendered = template.render([dict(m) for m in conversation], tools=None, documents=None,
                                   add_generation_prompt=True, continue_final_message=False,
                                   kwargs=special_tokens_map(config)).prompt
        assert rendered == expected
        assert ours.encode(rendered, add_special_tokens=False).ids == theirs.encode(
            expected, add_special_tokens=False)
    assert files.stop_token_ids[0] == theirs.eos_token_id == 2   # <|im_end|>


def test_gemma3_base_has_no_template_and_adds_bos(tokenizer_pairs):
    ours, files, theirs = tokenizer_pairs("gemma3")
    assert "chat_template" not in files.tokenizer_config and theirs.chat_template is None
    assert ours.encode("Hi").ids[0] == 2 == theirs.bos_token_id
    # eos (<eos>) first, then <end_of_turn>, as Gemma's generation_config lists them.
    assert files.stop_token_ids == (1, 106)


@pytest.mark.parametrize(("name", "kind"), [("smollm2", "bytelevel"), ("gemma3", "sentencepiece")])
def test_frontend_streams_exactly(name, kind, tokenizer_pairs):
    """The frontend's detokenizer models our decoder exactly (not the windowed fallback)."""
    ours, files, _ = tokenizer_pairs(name)
    helios = HeliosTokenizer(files.tokenizer_json, files.tokenizer_config)
    assert helios.token_bytes.model.kind == kind
    text = "Streaming 🙂 naïve 你好\n  code()"
    ids = helios.encode(text)
    pieces = b"".join(helios.token_piece(i)[1] for i in ids)
    assert pieces.decode("utf-8") == ours.decode(ids, skip_special_tokens=False)


def test_tiny_sentencepiece_with_space_prefix_matches_transformers(tmp_path):
    from transformers import AutoTokenizer

    path = tmp_path / "spm.gguf"
    write_tiny_gguf(path, TinySpec(tokenizer="llama"))
    files = hf_tokenizer(open_gguf(path))
    ours = tokenizers.Tokenizer.from_str(files.tokenizer_json)
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in ("hello world", "the  world stand", " the", "zzz ünï 🙂", "a\nb", ""):
        assert ours.encode(text).ids == theirs.encode(text), text
        ids = theirs.encode(text)
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(
            ids, skip_special_tokens=True), text
    assert ours.encode("world").ids == [1, ours.token_to_id("\u2581world")]   # BOS, "▁world"


def test_tiny_bpe_keeps_control_and_user_tokens_whole(tmp_path):
    path = tmp_path / "bpe.gguf"
    write_tiny_gguf(path, TinySpec(pre="qwen2"))
    files = hf_tokenizer(open_gguf(path))
    ours = tokenizers.Tokenizer.from_str(files.tokenizer_json)
    tokens = json.loads(files.tokenizer_json)["added_tokens"]
    kinds = {t["content"]: t["special"] for t in tokens}
    assert kinds == {"<|endoftext|>": True, "<|im_start|>": True, "<|im_end|>": True,
                     "<think>": False}
    ids = ours.encode("<think> the world<|im_end|>").ids
    assert ids[0] == ours.token_to_id("<think>") and ids[-1] == ours.token_to_id("<|im_end|>")
    assert ours.token_to_id("Ġworld") in ids


def test_unknown_pre_tokenizer_and_model_are_refused(tmp_path):
    path = tmp_path / "pre.gguf"
    write_tiny_gguf(path, TinySpec(pre="chameleon"))
    with pytest.raises(UnsupportedError, match="pre-tokenizer 'chameleon'.*smollm"):
        hf_tokenizer(open_gguf(path))
    other = tmp_path / "rwkv.gguf"
    write_tiny_gguf(other, TinySpec(metadata={"tokenizer.ggml.model": "rwkv"}))
    with pytest.raises(UnsupportedError, match="tokenizer model 'rwkv'"):
        hf_tokenizer(open_gguf(other))
