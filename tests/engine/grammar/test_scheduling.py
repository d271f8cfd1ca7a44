"""Constrained choices in the scheduler and the engine-core loop (fake runner, real grammars):
bitmasks on exactly the sampling rows of constrained choices, never planned behind their own
in-flight step under overlap, a matcher that cannot continue ends the choice with an error,
and admission waits for the grammar to compile without stopping the loop."""

from __future__ import annotations

import json
import threading

import pytest

from services.common.errors import CancelledError, GrammarError, UnsupportedError
from services.engine.core.messages import Abort, Submit
from services.engine.grammar import GrammarCompiler, GrammarKind, GrammarSpec
from services.engine.scheduler.requests import FinishReason
from tests.engine.core.test_loop import Harness
from tests.engine.fakes import run_step, run_step_two_frames, run_until_idle
from tests.engine.grammar.conftest import DEMO_VOCAB, EOS, SCHEMAS, schema_spec
from tests.engine.scheduler.conftest import make_engine, request


def _engine(grammars, **config):
    return make_engine(grammars=grammars, vocab_size=DEMO_VOCAB, eos=frozenset(EOS), **config)


def _constrained(request_id: str, prompt, spec: GrammarSpec, max_tokens: int = 200, **kw):
    import dataclasses

    return dataclasses.replace(request(request_id, prompt, max_tokens, ignore_eos=False, **kw),
                               grammar=spec)


PROMPT = list(range(1000, 1030))


def test_bitmasks_ride_on_the_sampling_rows_of_constrained_choices(grammars, tokenizer):
    scheduler, runner = _engine(grammars)
    spec = schema_spec(SCHEMAS["person"])
    compiled = grammars.compile(spec)
    scheduler.admit(_constrained("g", PROMPT, spec, n=2), grammar=compiled)
    scheduler.admit(request("free", PROMPT[:9], 6))
    out = run_until_idle(scheduler, runner)
    for step in runner.steps:
        for seq in step.seqs:
            if seq.allowed_tokens is not None:
                assert seq.sample and seq.allowed_tokens.shape == ((DEMO_VOCAB + 31) // 32,)
    rows = [s for step in runner.steps for s in step.seqs if s.allowed_tokens is not None]
    assert len(rows) == sum(len(t) for t in out["g"].values())   # every constrained sample
    for choice in out["g"].values():
        json.loads(tokenizer.decode(choice))                    # the fake obeyed the masks


def test_a_constrained_choice_never_follows_its_in_flight_step(grammars):
    scheduler, runner = _engine(grammars, overlap=True)
    spec = GrammarSpec(GrammarKind.REGEX, "[a-z]{40}")
    scheduler.admit(_constrained("g", PROMPT, spec), grammar=grammars.compile(spec))
    scheduler.admit(request("free", PROMPT[:7], 40))
    runner.window = 2
    for _ in range(10_000):
        run_step_two_frames(scheduler, runner)
        if not scheduler.has_work:
            break
    rows = [(s.allowed_tokens is not None, s.feeds_pending)
            for step in runner.steps for s in step.seqs if s.sample]
    assert (False, True) in rows          # the free request did overlap its steps
    assert (True, True) not in rows       # the constrained one never did
    assert sum(1 for c, _ in rows if c) >= 5      # 40 letters, a few per token
    assert scheduler.state.counters.requests_completed == 2


def test_a_matcher_that_cannot_continue_ends_its_choice_with_an_error(grammars):
    scheduler, runner = _engine(grammars)
    spec = GrammarSpec(GrammarKind.REGEX, "[0-9]{30}")
    scheduler.admit(_constrained("g", PROMPT, spec), grammar=grammars.compile(spec))
    scheduler.admit(request("free", PROMPT[:7], 5))
    runner.ignore_grammar = True          # a sampler that ignores the bitmask
    errors = []
    for _ in range(100):
        _, updates = run_step(scheduler, runner)
        errors += [d for u in updates for d in u.deltas if d.finish_reason is FinishReason.ERROR]
        if not scheduler.has_work:
            break
    (failed,) = errors
    assert failed.request_id == "g" and "no longer matches its grammar" in failed.error
    assert scheduler.state.counters.requests_failed == 1
    assert scheduler.state.counters.requests_completed == 1     # the neighbour finished


def test_admission_requires_the_compiled_grammar(grammars):
    scheduler, _ = _engine(grammars)
    spec = GrammarSpec(GrammarKind.REGEX, "x")
    with pytest.raises(Exception, match="admitted compiled"):
        scheduler.admit(_constrained("g", PROMPT, spec))
    with pytest.raises(Exception, match="admitted compiled"):
        scheduler.admit(request("free", PROMPT, 3), grammar=grammars.compile(spec))


@pytest.fixture
def harness(grammars):
    created: list[Harness] = []

    def make(**kwargs) -> Harness:
        created.append(Harness(grammars=grammars, vocab_size=DEMO_VOCAB, **kwargs))
        return created[-1]
    yield make
    for h in created:
        h.stop()


def test_the_core_admits_once_the_grammar_compiled(harness, tokenizer):
    h = harness()
    spec = GrammarSpec(GrammarKind.REGEX, "[a-c]{7}")       # new: compiles in the background
    assert h.core.grammars.lookup(spec) is None
    admitted = h.call(Submit(_constrained("g", PROMPT, spec)))
    assert admitted.request_id == "g"
    h.pump(lambda: h.finished("g"))
    text = tokenizer.decode([t for u in h.updates for d in u.deltas for t in d.token_ids])
    assert len(text) == 7 and set(text) <= set("abc")
    # cached now: the next one is admitted at once
    assert h.core.grammars.lookup(spec) is not None
    assert h.call(Submit(_constrained("g2", PROMPT, spec))).request_id == "g2"


def test_the_core_answers_grammar_errors_and_aborts_while_compiling(grammars, demo_source):
    gate = threading.Event()

    class Held(GrammarCompiler):
        def _compile(self, spec):
            gate.wait(30)
            return super()._compile(spec)

    held = Held(grammars.vocabulary)
    h = Harness(grammars=held, vocab_size=DEMO_VOCAB)
    try:
        call_id = h.send(Submit(_constrained("slow", PROMPT,
                                             GrammarSpec(GrammarKind.REGEX, "[a-z]{3}"))))
        # the loop goes on while the grammar compiles: other calls are answered
        assert h.call(Submit(request("free", PROMPT[:5], 3))).request_id == "free"
        h.pump(lambda: h.finished("free"))
        assert call_id not in h.replies
        assert h.call(Abort(("slow",))) == 1
        h.pump(lambda: call_id in h.replies)
        with pytest.raises(CancelledError):
            raise h.replies[call_id].error.error()
        gate.set()
        with pytest.raises(GrammarError, match="objekt"):
            h.call(Submit(_constrained("bad", PROMPT, schema_spec({"type": "objekt"}))))
        assert h.scheduler.num_active == 0
    finally:
        gate.set()
        h.stop()


def test_a_core_without_grammars_refuses_them():
    h = Harness()
    try:
        with pytest.raises(UnsupportedError, match="structured outputs are off"):
            h.call(Submit(_constrained("g", [1, 2, 3], GrammarSpec(GrammarKind.REGEX, "a"))))
    finally:
        h.stop()
