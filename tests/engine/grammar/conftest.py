"""Grammar fixtures: the demo core's real Qwen3 vocabulary, one compiler per session (loading
the vocabulary takes about a second), and constrained requests."""

from __future__ import annotations

import dataclasses
import json

import pytest

from services.common.core import open_model
from services.engine.grammar import GrammarCompiler, GrammarKind, GrammarSpec, GrammarVocabulary
from services.engine.sampling import SamplingParams
from services.engine.scheduler.requests import EngineRequest, StopRules

DEMO_VOCAB = 151936
EOS = (151645, 151643)

# Schemas whose every instance is short: a random-weight model samples uniformly among the
# tokens a grammar allows, so unbounded strings or numbers could run past any token budget.
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "member": {"type": "boolean"}},
    "required": ["name", "age", "member"], "additionalProperties": False}
NESTED = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 1, "maximum": 999},
    "owner": {"type": "object", "properties": {
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                 "minItems": 1, "maxItems": 3}},
        "required": ["role", "tags"], "additionalProperties": False}},
    "required": ["id", "owner"], "additionalProperties": False}
SCORES = {"type": "object", "properties": {
    "scores": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
               "minItems": 2, "maxItems": 4},
    "ratio": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25},
    "flag": {"type": ["boolean", "null"]}},
    "required": ["scores", "ratio", "flag"], "additionalProperties": False}
SCHEMAS = {"person": PERSON, "nested": NESTED, "scores": SCORES}


@pytest.fixture(scope="session")
def demo_source(demo_core):
    return open_model(demo_core, verify=())


@pytest.fixture(scope="session")
def grammars(demo_source) -> GrammarCompiler:
    return GrammarCompiler(GrammarVocabulary(demo_source.path("tokenizer.json"), DEMO_VOCAB,
                                             EOS))


@pytest.fixture(scope="session")
def tokenizer(demo_source):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(demo_source.path("tokenizer.json")))


def schema_spec(schema, *, lenient: bool = False) -> GrammarSpec:
    return GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema), lenient)


def constrained(request_id: str, prompt, spec: GrammarSpec | None, max_tokens: int, *,
                seed: int = 0, temperature: float = 1.0, n: int = 1,
                ignore_eos: bool = False) -> EngineRequest:
    params = SamplingParams.create(temperature=temperature, max_tokens=max_tokens, seed=seed,
                                   ignore_eos=ignore_eos)
    return EngineRequest(request_id=request_id, prompt_token_ids=tuple(prompt),
                         sampling=params,
                         stop=StopRules(max_tokens=max_tokens, ignore_eos=ignore_eos),
                         seed=seed, n=n, grammar=spec)


def unconstrained(request: EngineRequest) -> EngineRequest:
    return dataclasses.replace(request, grammar=None)
