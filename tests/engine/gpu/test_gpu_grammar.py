"""Structured outputs on a CUDA device: grammar rows through the decode CUDA graphs (their
grammar variants read the slots' persistent bitmask rows, uploaded with each step's frame) and
the two-frame overlap, against the CPU path; seeded sampling under grammars reproduces.

The tiny checkpoint gets a byte-level tokenizer (tests/engine/grammar/byte_tokenizer.py), so
grammars compile against its 320-token vocabulary with nothing downloaded. float32 on the GPU
gives the CPU's greedy tokens exactly (as in test_gpu_runner.py)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from services.common.core import open_model
from services.engine.grammar import GrammarKind, GrammarSpec
from services.engine.scheduler.requests import FinishReason
from tests.engine.grammar.byte_tokenizer import EOS_ID, write_byte_tokenizer
from tests.engine.grammar.conftest import constrained, schema_spec
from tests.engine.grammar.test_decoding import _run
from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint
from tests.engine.runner.conftest import greedy_request, make_engine

pytestmark = pytest.mark.gpu

SCHEMA = {"type": "object", "properties": {
    "word": {"type": "string", "maxLength": 8},
    "count": {"type": "integer", "minimum": 0, "maximum": 99},
    "kind": {"enum": ["a", "b", "c"]},
    "items": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}},
    "required": ["word", "count", "kind", "items"], "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False}}     # one token per byte: keep it compact
REGEX = r"[a-f]{4}-[0-9]{2,5}"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = build_checkpoint(SPECS["qwen3-qknorm-sharded"],
                                 tmp_path_factory.mktemp("qwen3-grammar"))
    write_byte_tokenizer(directory, VOCAB_SIZE)
    return directory


def _engine(checkpoint, device: str, **overrides):
    values = dict(page_size=4, max_num_seqs=8, kv_cache_bytes=32 << 20, prefill_chunk_size=64,
                  max_num_batched_tokens=96, device=device, dtype="float32",
                  structured_outputs="eager")
    values.update(overrides)
    return make_engine(open_model(checkpoint), **values)


def _requests(temperature: float):
    prompt = list(range(3, 40))
    schema, regex = schema_spec(SCHEMA), GrammarSpec(GrammarKind.REGEX, REGEX)
    return [constrained("json", prompt, schema, 150, seed=1, temperature=temperature),
            constrained("json-n", prompt[4:], schema, 150, seed=2, temperature=temperature,
                        n=2),
            constrained("regex", prompt[9:], regex, 40, seed=3, temperature=temperature),
            greedy_request("free", prompt[2:], 24),
            greedy_request("free2", prompt[7:], 30, seed=4, temperature=0.8)]


def _text(tokens: list[int]) -> str:
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


def _check_valid(outputs) -> None:
    for request_id, choices in outputs.items():
        for tokens, reason in choices.values():
            if request_id.startswith("json"):
                assert reason is FinishReason.STOP
                jsonschema.validate(json.loads(_text(tokens)), SCHEMA)
            elif request_id == "regex":
                assert reason is FinishReason.STOP and re.fullmatch(REGEX, _text(tokens))
            else:
                continue
            assert EOS_ID not in tokens     # a complete grammar ends the choice itself


def test_grammar_rows_in_cuda_graphs_and_overlap_match_the_cpu(checkpoint):
    cpu = _run(_engine(checkpoint, "cpu", runner="torch"), _requests(0.0))
    engine = _engine(checkpoint, "cuda")
    gpu = _run(engine, _requests(0.0))
    assert gpu == cpu
    _check_valid(gpu)
    runner = engine.runner
    assert runner.window == 2 and runner.graph_steps > 10
    # graph keys: (capacity, width, mode, logprobs, grammar)
    assert any(key[-1] for key in runner.graphs.graphs or {})


def test_seeded_sampling_under_grammars_reproduces_on_the_gpu(checkpoint):
    first = _run(_engine(checkpoint, "cuda"), _requests(1.0))
    _check_valid(first)
    assert _run(_engine(checkpoint, "cuda"), _requests(1.0)) == first
    assert _run(_engine(checkpoint, "cuda", cuda_graph_max_batch=-1), _requests(1.0)) == first
