"""Incremental detokenization and stop strings, property-based over the pinned tokenizers."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.frontend.stop import StopMatcher
from tests.frontend.conftest import ASSET_NAMES, frontend_assets

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
# Arbitrary Unicode: every category, surrogates excluded (not encodable as UTF-8).
UNICODE_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)


def stream(tokenizer, ids, *, skip_special_tokens=True) -> tuple[str, list[str]]:
    detok = tokenizer.detokenizer(skip_special_tokens=skip_special_tokens)
    pieces = [detok.push(token_id) for token_id in ids]
    pieces.append(detok.flush())
    return "".join(pieces), pieces


@pytest.mark.parametrize("asset", ASSET_NAMES)
@SETTINGS
@given(text=UNICODE_TEXT)
def test_streaming_unicode_text_equals_full_decode(asset, text):
    tokenizer = frontend_assets(asset).tokenizer
    ids = tokenizer.encode(text)
    streamed, pieces = stream(tokenizer, ids)
    assert streamed == tokenizer.decode(ids)
    # No piece before the end carries a replacement character the full decode does not have.
    if "\ufffd" not in tokenizer.decode(ids):
        assert not any("\ufffd" in piece for piece in pieces)


@pytest.mark.parametrize("asset", ASSET_NAMES)
@SETTINGS
@given(data=st.data())
def test_streaming_arbitrary_ids_equals_full_decode(asset, data):
    """Models can emit any id sequence: broken UTF-8, byte-fallback runs, special tokens."""
    tokenizer = frontend_assets(asset).tokenizer
    special = sorted(tokenizer.added_tokens)
    byte_tokens = [i for i in (tokenizer.token_to_id(f"<0x{b:02X}>") for b in range(256))
                   if i is not None]
    pool = st.one_of(st.integers(0, tokenizer.vocab_size - 1), st.sampled_from(special),
                     *([st.sampled_from(byte_tokens)] if byte_tokens else []))
    ids = data.draw(st.lists(pool, max_size=25))
    for skip in (True, False):
        streamed, _ = stream(tokenizer, ids, skip_special_tokens=skip)
        assert streamed == tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("asset", ASSET_NAMES)
def test_multibyte_characters_split_over_tokens_wait_for_completion(asset):
    tokenizer = frontend_assets(asset).tokenizer
    text = "😀👩‍👩‍👧𝄞 漢字"
    ids = tokenizer.encode(text)
    streamed, pieces = stream(tokenizer, ids)
    assert streamed == text
    assert all("\ufffd" not in piece for piece in pieces)
    # A truncated character is flushed as U+FFFD at the end, as the full decode does.
    for cut in range(1, len(ids)):
        streamed, _ = stream(tokenizer, ids[:cut])
        assert streamed == tokenizer.decode(ids[:cut])


def test_skip_special_tokens(qwen3):
    tokenizer = qwen3.tokenizer
    ids = tokenizer.encode("<|im_start|>assistant\n<think>hi</think><|im_end|>")
    assert stream(tokenizer, ids)[0] == "assistant\n<think>hi</think>"  # <think> is not special
    assert stream(tokenizer, ids, skip_special_tokens=False)[0] == (
        "<|im_start|>assistant\n<think>hi</think><|im_end|>")


# ---------------------------------------------------------------------------------------------
# Stop strings


def run_stop(chunks, stops, include=False):
    matcher = StopMatcher(stops, include_in_output=include)
    out = []
    for chunk in chunks:
        result = matcher.push(chunk)
        out.append(result.text)
        if result.stop is not None:
            return "".join(out), result.stop
    out.append(matcher.flush())
    return "".join(out), None


def splits(text: str):
    """Every way to cut `text` into two or three chunks."""
    yield [text]
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
        for j in range(i, len(text) + 1):
            yield [text[:i], text[i:j], text[j:]]


def test_stop_strings_caught_across_every_chunk_boundary():
    text = "Hello wor|ld END of story"
    for chunks in splits(text):
        assert run_stop(chunks, ["END", "ld E"]) == ("Hello wor|", "ld E")
        assert run_stop(chunks, ["END"], include=True) == ("Hello wor|ld END", "END")
        assert run_stop(chunks, ["nope", "story!"]) == (text, None)


def test_earliest_match_wins_and_partial_prefixes_are_released():
    assert run_stop(["abc", "d"], ["cd", "bcd"]) == ("a", "bcd")
    assert run_stop(["a<", "/x"], ["</s>"]) == ("a</x", None)
    matcher = StopMatcher(["</s>"])
    assert matcher.push("x </").text == "x "
    assert matcher.held == "</"
    assert matcher.push("t").text == "</t"


@pytest.mark.parametrize("asset", ASSET_NAMES)
def test_stop_strings_split_at_every_token_boundary(asset):
    """The ids are built so that a token boundary falls at each position inside the stop
    string; decoded token by token, the stop is caught and no text past it is emitted."""
    tokenizer = frontend_assets(asset).tokenizer
    prefix, suffix = "Answer 😀 détails ", " and more after"
    for stop in ("STOP", "\n\nUser:", "🛑 halt", "ß»"):
        for cut in range(len(stop) + 1):
            ids = tokenizer.encode(prefix + stop[:cut]) + tokenizer.encode(stop[cut:] + suffix)
            assert stop in tokenizer.decode(ids)
            detok, matcher = tokenizer.detokenizer(), StopMatcher(["never", stop])
            emitted, matched = "", None
            for token_id in ids:
                result = matcher.push(detok.push(token_id))
                emitted += result.text
                assert stop not in emitted
                if result.stop:
                    matched = result.stop
                    break
            assert matched == stop
            assert emitted == prefix


@SETTINGS
@given(text=UNICODE_TEXT, stop=st.text(min_size=1, max_size=5), cut=st.data())
def test_stop_matcher_is_chunking_invariant(text, stop, cut):
    full = text + stop + text
    expected_text = full[:full.index(stop)]
    points = sorted(cut.draw(st.lists(st.integers(0, len(full)), max_size=6)))
    chunks = [full[a:b] for a, b in zip([0, *points], [*points, len(full)], strict=True)]
    assert run_stop(chunks, [stop]) == (expected_text, stop)


def _trained_tokenizer(decoder, pre_tokenizer):
    """A small BPE tokenizer with a decoder outside the two exactly modelled families."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, trainers

    from services.frontend.tokenizer import Tokenizer

    rust = RustTokenizer(models.BPE(unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizer
    rust.decoder = decoder
    corpus = ["hello world this is a test", "naïve café ünïcode", "the quick brown fox"] * 20
    rust.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300,
                                                         special_tokens=["[UNK]", "<s>"]))
    return Tokenizer(rust.to_str(), {})


@pytest.mark.parametrize("kind", ["metaspace", "wordpiece", "bpe"])
def test_generic_decoders_stream_like_a_full_decode(kind):
    from tokenizers import decoders, pre_tokenizers

    decoder, pre = {
        "metaspace": (decoders.Metaspace(), pre_tokenizers.Metaspace()),
        "wordpiece": (decoders.WordPiece(), pre_tokenizers.Whitespace()),
        "bpe": (decoders.BPEDecoder(), pre_tokenizers.Whitespace()),
    }[kind]
    tokenizer = _trained_tokenizer(decoder, pre)
    assert tokenizer.token_bytes.model.kind == "generic"
    rng = random.Random(kind)
    words = ["hello", "world", "this", "is", "a", "test", "naïve", "café", "ünïcode", "the", "quick", "brown", "fox"]
    for _ in range(200):
        if rng.random() < 0.5:
            ids = tokenizer.encode(" ".join(rng.choice(words) for _ in range(rng.randint(1, 8))))
        else:
            ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 10))]
        for skip in (True, False):
            assert stream(tokenizer, ids, skip_special_tokens=skip)[0] == tokenizer.decode(
                ids, skip_special_tokens=skip)
