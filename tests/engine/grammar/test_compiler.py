"""GrammarCompiler: specs -> grammars against the real Qwen3 vocabulary; library messages as
GrammarErrors; the cache; matchers; the bitmask fill and its application to logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import GrammarError, UnsupportedError, ValidationError
from services.engine.grammar import (
    GrammarCompiler,
    GrammarKind,
    GrammarSpec,
    GrammarVocabulary,
    fill_bitmasks,
)
from services.engine.sampling.filters import apply_token_bitmask
from tests.engine.grammar.conftest import DEMO_VOCAB, EOS, PERSON, schema_spec


def allowed_ids(mask) -> set[int]:
    bits = np.unpackbits(np.asarray(mask, dtype=np.int32).view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


@pytest.mark.parametrize(("spec", "message"), [
    (schema_spec({"type": "objekt"}), "objekt"),
    (GrammarSpec(GrammarKind.JSON_SCHEMA, "{not json"), "not valid JSON"),
    (GrammarSpec(GrammarKind.JSON_SCHEMA, "[1, 2]"), "object or a boolean"),
    (schema_spec({"type": "string", "format": "no-such-format"}), "no-such-format"),
    (schema_spec({"type": "integer", "minimum": 5, "maximum": 1}), "Unsatisfiable"),
    (GrammarSpec(GrammarKind.REGEX, "[a-"), "unclosed character class"),
    (GrammarSpec(GrammarKind.LARK, "start: foo"), "unknown name"),
])
def test_invalid_grammars_are_grammar_errors_with_the_library_message(grammars, spec, message):
    with pytest.raises(GrammarError, match=message) as caught:
        grammars.compile(spec)
    assert caught.value.param == "grammar" and caught.value.message
    # the failure is cached: the same error again, without compiling again
    failed = grammars.num_failed
    with pytest.raises(GrammarError):
        grammars.compile(spec)
    assert grammars.num_failed == failed


def test_lenient_ignores_unsupported_keywords(grammars):
    schema = {"type": "string", "format": "no-such-format", "maxLength": 3}
    compiled = grammars.compile(schema_spec(schema, lenient=True))
    assert compiled.matcher().error == ""


def test_spec_validation():
    with pytest.raises(ValidationError, match="needs its text"):
        GrammarSpec(GrammarKind.REGEX, "  ")
    with pytest.raises(ValidationError, match="takes no text"):
        GrammarSpec(GrammarKind.JSON_OBJECT, "{}")
    with pytest.raises(ValidationError, match="larger than"):
        GrammarSpec(GrammarKind.LARK, "x" * (2 << 20))


def test_compilations_are_cached_by_spec_and_started_once(grammars):
    spec = schema_spec({"type": "array", "items": {"type": "integer"}, "maxItems": 2})
    first, second = grammars.start(spec), grammars.start(spec)
    compiled = first.result(timeout=30)
    assert second.result(timeout=30) is compiled
    assert grammars.lookup(spec) is compiled and grammars.compile(spec) is compiled
    assert grammars.lookup(schema_spec({"type": "null"})) is None


def test_the_cache_keeps_the_most_recently_used(demo_source):
    compiler = GrammarCompiler(GrammarVocabulary(demo_source.path("tokenizer.json"),
                                                 DEMO_VOCAB, EOS), cache_size=2)
    specs = [GrammarSpec(GrammarKind.REGEX, f"a{{{k}}}") for k in range(1, 4)]
    compiler.compile(specs[0])
    compiler.compile(specs[1])
    compiler.lookup(specs[0])                       # touched: specs[1] is now the oldest
    compiler.compile(specs[2])
    assert compiler.lookup(specs[0]) is not None and compiler.lookup(specs[1]) is None


def test_a_model_without_tokenizer_json_has_no_grammars(tmp_path):
    compiler = GrammarCompiler(GrammarVocabulary(tmp_path / "tokenizer.json", 100, ()))
    with pytest.raises(UnsupportedError, match="tokenizer.json"):
        compiler.compile(GrammarSpec(GrammarKind.JSON_OBJECT))


def test_matcher_walks_a_document_and_masks_allow_eos_only_at_the_end(grammars, tokenizer):
    compiled = grammars.compile(schema_spec(PERSON))
    matcher = compiled.matcher()
    document = '{"name": "Ann", "age": 41, "member": true}'
    ids = tokenizer.encode(document).ids
    for token in ids[:-1]:
        mask = fill_bitmasks([matcher], grammars.words, grammars.executor)[0]
        assert token in allowed_ids(mask) and not set(EOS) & allowed_ids(mask)
        assert matcher.accept(token)
    assert matcher.accept(ids[-1]) and matcher.is_stopped and matcher.is_accepting
    assert allowed_ids(fill_bitmasks([matcher], grammars.words, grammars.executor)[0]) \
        <= set(EOS)
    # each choice has its own matcher: a fresh one starts at the beginning
    fresh = compiled.matcher()
    assert not fresh.is_stopped
    assert not fresh.accept(tokenizer.encode("[").ids[0])
    assert "doesn't satisfy the grammar" in fresh.error


def test_bitmask_rows_match_the_library_per_matcher(grammars, tokenizer):
    compiled = grammars.compile(GrammarSpec(GrammarKind.JSON_OBJECT))
    matchers = [compiled.matcher() for _ in range(3)]
    for token in tokenizer.encode('{"a":').ids:
        matchers[1].accept(token)
    masks = fill_bitmasks(matchers, grammars.words, grammars.executor)
    assert masks.shape == (3, (DEMO_VOCAB + 31) // 32) and masks.dtype == np.int32
    for row, matcher in zip(masks, matchers, strict=True):
        assert row.tobytes() == matcher.raw.compute_bitmask()[:row.nbytes]
    assert (masks[0] == masks[2]).all() and (masks[0] != masks[1]).any()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 130), st.integers(0, 2**32 - 1))
def test_apply_token_bitmask_equals_a_plain_loop(rows, vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (rows, words), dtype=torch.int32,
                            generator=generator)
    got = apply_token_bitmask(logits, bitmask)
    for r in range(rows):
        for t in range(vocab):
            bit = (int(bitmask[r, t // 32]) >> (t % 32)) & 1
            want = logits[r, t].item() if bit else float("-inf")
            assert got[r, t].item() == want


def test_json_object_mode_accepts_only_objects(grammars, tokenizer):
    compiled = grammars.compile(GrammarSpec(GrammarKind.JSON_OBJECT))
    for text, ok in (('{"k": [1, {"x": null}]}', True), ('[1]', False), ('"s"', False)):
        matcher = compiled.matcher()
        accepted = all(matcher.accept(t) for t in tokenizer.encode(text).ids)
        assert accepted == ok and (matcher.is_accepting if ok else True)
    assert json.loads('{"k": [1, {"x": null}]}')


def test_json_whitespace_is_bounded_unless_the_schema_says_otherwise(grammars, tokenizer):
    def accepts(schema, text):
        matcher = grammars.compile(schema_spec(schema)).matcher()
        return all(matcher.accept(t) for t in tokenizer.encode(text).ids) and \
            matcher.is_accepting

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts(schema, '{"a": 1}') and accepts(schema, '{\n  "a": 1\n}')
    assert not accepts(schema, '{' + " " * 17 + '"a": 1}')       # 16 at most per gap
    compact = {**schema, "x-guidance": {"whitespace_flexible": False}}
    assert accepts(compact, '{"a":1}') and not accepts(compact, '{"a": 1}')


def test_an_unreadable_tokenizer_makes_grammars_unsupported_not_fatal(tmp_path):
    """A tokenizer.json llguidance cannot read (here: no decoder) must not take the engine
    down: an auto/CUDA start logs and serves, and grammar requests get UnsupportedError (the
    same one every time, without reloading)."""
    from services.common.core import open_model
    from services.engine.config import EngineConfig
    from services.engine.core.build import build_grammars
    from tests.engine.model.checkpoints import SPECS, build_checkpoint

    directory = build_checkpoint(SPECS["qwen3-qknorm-sharded"], tmp_path / "ckpt")
    source = open_model(directory)
    config = EngineConfig(model=str(directory), structured_outputs="auto")
    compiler = build_grammars(config, source, 320, torch.device("cuda"))  # auto loads on CUDA
    assert compiler is not None
    with pytest.raises(UnsupportedError, match="cannot be read") as first:
        compiler.compile(schema_spec({"type": "object"}))
    with pytest.raises(UnsupportedError) as second:
        compiler.compile(GrammarSpec(GrammarKind.REGEX, "[a-z]+"))
    assert second.value is first.value or second.value.message == first.value.message
    eager = EngineConfig(model=str(directory), structured_outputs="eager")
    with pytest.raises(UnsupportedError):
        build_grammars(eager, source, 320, torch.device("cpu"))


def test_a_start_after_the_job_finished_returns_the_cached_result(grammars):
    """The race the test above could lose under load: the first job finished (and left the
    running table) before the second start; the second must not compile again."""
    spec = schema_spec({"type": "array", "items": {"type": "boolean"}, "maxItems": 3})
    compiled = grammars.start(spec).result(timeout=30)
    before = grammars.num_compiled
    again = grammars.start(spec)
    assert again.done() and again.result() is compiled and grammars.num_compiled == before
    bad = schema_spec({"type": "objekt"})
    with pytest.raises(GrammarError):
        grammars.start(bad).result(timeout=30)
    failed = grammars.num_failed
    with pytest.raises(GrammarError):
        grammars.start(bad).result(timeout=1)
    assert grammars.num_failed == failed
