"""Bounded tokenization (services/frontend/bounded_encode.py) on every pinned tokenizer.

Chunked encoding must equal encoding the whole text (ids and character spans), the character
bound must never claim more tokens than the text has, and a text past the limit must be
refused after tokenizing only about the limit's worth of it.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.frontend import bounded_encode
from services.frontend.bounded_encode import PromptTooLong
from tests.frontend.conftest import ASSET_NAMES, frontend_assets

# Pieces that exercise the pre-tokenizers: words, single and repeated spaces, newlines, tabs,
# digits, punctuation, contractions, CJK, combining marks, NBSP / ideographic spaces, special
# tokens written as text, and Gemma's one token that crosses a space ("> </").
PIECES = ["word", "Hello", " ", "  ", "   ", "\n", "\n\n", "\t", "123", "4567", ".", ",", "!",
          "'s", "'ll", "日本語", "é", "e\u0301", "\u00a0", "\u3000", "<|im_start|>", "<bos>",
          "> </", "><", "-", "==", "ünï", "🙂", "x", "\r\n", "a b", "Ġ", "▁"]


@pytest.fixture(params=ASSET_NAMES)
def tokenizer(request):
    return frontend_assets(request.param).tokenizer


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few dozen characters, so short texts are cut many times."""
    monkeypatch.setattr(bounded_encode, "MIN_CHUNK_CHARS", 24)
    monkeypatch.setattr(bounded_encode, "MAX_CHUNK_CHARS", 24)


def test_every_pinned_tokenizer_can_be_cut(tokenizer):
    bounds = tokenizer.bounds
    assert bounds.chunkable
    assert bounds.chars_per_token is not None and bounds.max_token_chars >= 16


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=120))
def test_chunked_equals_whole(tokenizer, small_chunks, pieces):
    text = "".join(pieces)
    whole = tokenizer.encode_with_offsets(text)
    chunked = tokenizer.encode_bounded(text, None)
    assert chunked.ids == whole.ids
    if text and len(text) > 24:
        assert chunked.spans.offsets == whole.offsets
        for k in range(len(whole.ids)):
            assert chunked.spans.token_to_chars(k) == whole.spans.token_to_chars(k)
        for p in range(len(text)):
            assert chunked.spans.char_to_token(p) == whole.spans.char_to_token(p)
    with_specials = tokenizer.encode_bounded(text, None, add_special_tokens=True)
    assert with_specials.ids == tokenizer.encode(text, add_special_tokens=True)
    assert tokenizer.count_tokens(text) == len(whole.ids)
    assert tokenizer.count_tokens(text, add_special_tokens=True) == len(with_specials.ids)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=200),
       st.integers(min_value=0, max_value=80))
def test_refusal_counts_are_lower_bounds(tokenizer, small_chunks, pieces, limit):
    text = "".join(pieces)
    true_count = len(tokenizer.encode(text))
    assert tokenizer.bounds.lower_bound(len(text)) <= true_count
    try:
        encoding = tokenizer.encode_bounded(text, limit)
    except PromptTooLong as exc:
        assert limit < exc.at_least <= true_count
    else:
        assert encoding.ids == tokenizer.encode(text)


@pytest.mark.parametrize("text", [
    " " * 100_000,                      # the longest tokens are whitespace runs
    "\n" * 100_000,
    "=" * 100_000,
    "ĠĠĠĠ" * 20_000,
])
def test_character_bound_is_safe_on_long_runs(tokenizer, text):
    assert tokenizer.bounds.lower_bound(len(text)) <= len(tokenizer.encode(text))


def test_far_beyond_the_context_is_refused_without_tokenizing_it(tokenizer):
    """30 MiB: refused by the character bound at once; 1 MiB under a large limit: by the
    chunked count, after about the limit's worth of text."""
    huge = "word " * (30 * 1024 * 1024 // 5)
    started = time.perf_counter()
    with pytest.raises(PromptTooLong) as info:
        tokenizer.encode_bounded(huge, 4095)
    assert time.perf_counter() - started < 0.5
    assert info.value.at_least > 4095
    assert info.value.at_least <= len(huge) // tokenizer.bounds.chars_per_token + 1
    text = "word " * 200_000                # 1 MB; ~200k tokens; past the character bound
    limit = len(text) // tokenizer.bounds.chars_per_token + 10
    with pytest.raises(PromptTooLong) as info:
        tokenizer.encode_bounded(text, limit)
    # Stopped after the first chunk that crossed the limit (16 x limit characters at most).
    assert limit < info.value.at_least <= limit + bounded_encode.chunk_chars(limit)


def test_no_cut_in_a_text_without_spaces_is_whole(tokenizer, small_chunks):
    text = "abc" * 100
    assert tokenizer.encode_bounded(text, None).ids == tokenizer.encode(text)
