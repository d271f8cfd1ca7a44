"""Constrained decoding with the demo model (random weights: unconstrained it writes gibberish,
so every valid document below is the grammar's doing), on the TorchRunner and on the
GraphRunner (eager on the CPU: the decode "graphs" run their grammar variant on the same padded
views and persistent bitmask rows as on the GPU), with and without two-frame overlap."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from services.engine.grammar import GrammarKind, GrammarSpec
from services.engine.scheduler.requests import FinishReason
from tests.engine.grammar.conftest import EOS, SCHEMAS, constrained, schema_spec, unconstrained
from tests.engine.runner.conftest import greedy_request, make_engine

RUNNERS = {"torch": dict(runner="torch"), "graph": dict(runner="graph", overlap="off"),
           "overlap": dict(runner="graph", overlap="on")}


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return tokenizer.encode("<|im_start|>user\nanswer in JSON<|im_end|>\n"
                            "<|im_start|>assistant\n").ids


def _engine(demo_source, kind: str):
    return make_engine(demo_source, max_num_seqs=6, **RUNNERS[kind])


def _run(engine, requests) -> dict[str, dict[int, tuple[list[int], FinishReason | None]]]:
    """Drive like the engine loop; request -> choice -> (tokens, finish reason)."""
    scheduler, runner = engine.scheduler, engine.runner
    for request in requests:
        compiled = engine.grammars.compile(request.grammar) if request.grammar else None
        scheduler.admit(request, grammar=compiled)
    out: dict[str, dict[int, tuple[list[int], FinishReason | None]]] = {}
    while scheduler.has_work:
        submitted = False
        if runner.outstanding < runner.window:
            plan = scheduler.plan()
            if plan is not None:
                runner.submit(scheduler.commit(plan,
                                               scheduler.state.resources.fences.next_fence))
                submitted = True
        if runner.outstanding and (runner.outstanding >= runner.window or not submitted):
            for update in scheduler.complete(runner.wait()):
                for d in update.deltas:
                    tokens, reason = out.setdefault(update.request_id, {}).get(d.index,
                                                                               ([], None))
                    assert not d.error, d.error
                    out[update.request_id][d.index] = (tokens + list(d.token_ids),
                                                       d.finish_reason or reason)
    return out


def _text(tokenizer, tokens: list[int]) -> str:
    return tokenizer.decode([t for t in tokens if t not in EOS])


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_parse_and_validate(demo_source, tokenizer, prompt, name):
    engine = _engine(demo_source, "torch")
    spec = schema_spec(SCHEMAS[name])
    outputs = _run(engine, [constrained(f"s{seed}", prompt, spec, 200, seed=seed)
                            for seed in range(4)])
    for choices in outputs.values():
        tokens, reason = choices[0]
        assert reason is FinishReason.STOP
        jsonschema.validate(json.loads(_text(tokenizer, tokens)), SCHEMAS[name])
        # the grammar completed: the choice ends there, without spending a step on EOS
        assert tokens[-1] not in EOS


def test_json_object_mode_writes_objects(demo_source, tokenizer, prompt):
    engine = _engine(demo_source, "torch")
    spec = GrammarSpec(GrammarKind.JSON_OBJECT)
    outputs = _run(engine, [constrained(f"o{seed}", prompt, spec, 120, seed=seed)
                            for seed in range(6)])
    finished = 0
    for choices in outputs.values():
        tokens, reason = choices[0]
        text = _text(tokenizer, tokens)
        if reason is FinishReason.STOP:
            assert isinstance(json.loads(text), dict)
            finished += 1
        else:   # out of tokens inside a long string: still a prefix of an object
            assert reason is FinishReason.LENGTH and text.startswith("{")
    assert finished >= 4


def test_regex_and_lark_grammars(demo_source, tokenizer, prompt):
    engine = _engine(demo_source, "torch")
    regex = GrammarSpec(GrammarKind.REGEX, r"[0-9]{3}-[a-z]{2,4}")
    lark = GrammarSpec(GrammarKind.LARK, 'start: "yes" | "no" | "maybe " NUM\nNUM: /[1-9]/')
    outputs = _run(engine, [constrained(f"r{s}", prompt, regex, 40, seed=s) for s in range(3)]
                   + [constrained(f"l{s}", prompt, lark, 40, seed=s) for s in range(3)])
    for rid, choices in outputs.items():
        tokens, reason = choices[0]
        text = _text(tokenizer, tokens)
        assert reason is FinishReason.STOP
        if rid.startswith("r"):
            assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", text), text
        else:
            assert re.fullmatch(r"yes|no|maybe [1-9]", text), text


def test_n_choices_each_follow_the_grammar_with_their_own_matcher(demo_source, tokenizer,
                                                                    prompt):
    engine = _engine(demo_source, "torch")
    schema = SCHEMAS["person"]
    outputs = _run(engine, [constrained("n", prompt, schema_spec(schema), 200, seed=5, n=3)])
    texts = [_text(tokenizer, outputs["n"][i][0]) for i in range(3)]
    for text in texts:
        jsonschema.validate(json.loads(text), schema)
    assert len(set(texts)) == 3


def test_every_runner_gives_the_same_tokens_and_seeds_reproduce(demo_source, prompt):
    """Seeded sampling under grammars (several at once, n > 1, beside unconstrained requests)
    is reproducible, and identical on the TorchRunner and the GraphRunner with and without
    overlap: the bitmask path of the decode "graphs" included."""
    def requests():
        return [constrained("a", prompt, schema_spec(SCHEMAS["nested"]), 120, seed=11),
                constrained("b", prompt, schema_spec(SCHEMAS["scores"]), 120, seed=12, n=2),
                constrained("c", prompt, GrammarSpec(GrammarKind.REGEX, "[a-z ]{5,30}"), 60,
                            seed=13, temperature=0.7),
                greedy_request("free", prompt[:5], 30, seed=1, temperature=0.9),
                greedy_request("greedy", prompt, 25)]
    results = {kind: _run(_engine(demo_source, kind), requests()) for kind in RUNNERS}
    assert results["torch"] == results["graph"] == results["overlap"]
    again = _run(_engine(demo_source, "overlap"), requests())
    assert again == results["overlap"]
    other = _run(_engine(demo_source, "torch"),
                 [constrained("a", prompt, schema_spec(SCHEMAS["nested"]), 120, seed=99)])
    assert other["a"] != results["torch"]["a"]


def test_a_slot_left_by_a_grammar_is_free_for_its_next_occupant(demo_source, prompt):
    """Two slots: a short constrained choice leaves slot 0 to an unconstrained request while
    another constrained choice keeps every step a grammar step (decode "graphs" with bitmask
    rows): the newcomer reads an all-ones row, so its tokens are those it makes alone."""
    solo = _run(_engine(demo_source, "graph"), [greedy_request("f", prompt[3:], 20)])
    engine = make_engine(demo_source, max_num_seqs=2, runner="graph", overlap="off")
    spec = GrammarSpec(GrammarKind.REGEX, "[a-z]{6}")
    long = GrammarSpec(GrammarKind.REGEX, "[a-z ]{60}")
    out = _run(engine, [constrained("a", prompt, spec, 10, seed=1),
                        constrained("b", prompt, long, 80, seed=2),
                        greedy_request("f", prompt[3:], 20)])
    assert out["f"] == solo["f"]
    assert engine.runner.graph_steps > 10
    assert engine.scheduler.state.counters.requests_completed == 3


@pytest.mark.parametrize("kind", sorted(RUNNERS))
def test_unconstrained_neighbours_are_unchanged_by_a_grammar_request(demo_source, prompt, kind):
    free = [greedy_request(f"f{i}", prompt[i:], 24) for i in range(3)]
    alone = _run(_engine(demo_source, kind), free)
    spec = schema_spec(SCHEMAS["nested"])
    mixed = _run(_engine(demo_source, kind),
                 [constrained("g", prompt, spec, 60, seed=2), *free,
                  constrained("h", prompt[2:], spec, 60, seed=4, temperature=0.0)])
    assert {k: v for k, v in mixed.items() if k.startswith("f")} == alone
    # and the grammar requests themselves ran constrained
    assert mixed["g"][0][0] != _run(_engine(demo_source, kind),
                                    [unconstrained(constrained("g", prompt, spec, 60,
                                                               seed=2))])["g"][0][0]
