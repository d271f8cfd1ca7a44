"""Speculative decoding on a real model, CPU float32: whatever the drafts, the output is
the non-speculative output, token for token, on the TorchRunner and the GraphRunner (eager
on the CPU: its verification "graphs" run on the same packed and padded views as on the GPU),
with and without two-frame overlap: greedy (with logprobs), seeded sampling with every
filter and penalty, stop ids and max_tokens inside verified runs, grammars (drafts the
grammar rejects are never verified), and the next turn's full prefix hit on the terminal
state of a verified conversation (the hidden state of the last accepted row). The model is
the tiny Qwen3 checkpoint with a byte-level tokenizer (grammars compile for it)."""

from __future__ import annotations

import dataclasses
import json
import random

import jsonschema
import pytest

from services.common.core import open_model
from services.engine.scheduler.requests import FinishReason, StopRules
from tests.engine.fakes import run_like_the_loop
from tests.engine.grammar.byte_tokenizer import write_byte_tokenizer
from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint
from tests.engine.runner.conftest import greedy_request, make_engine

KINDS = {"torch": dict(runner="torch"), "graph": dict(runner="graph", overlap="off"),
         "overlap": dict(runner="graph", overlap="on")}
SPECULATIVE = dict(speculative_method="ngram", num_speculative_tokens=4)
SCHEMA = {"type": "object", "properties": {          # compact: one token per byte
    "word": {"type": "string", "maxLength": 8},
    "count": {"type": "integer", "minimum": 0, "maximum": 99},
    "kind": {"enum": ["a", "b", "c"]},
    "items": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}},
    "required": ["word", "count", "kind", "items"], "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False}}


def _prompt(length: int, seed: int, vocab: int = VOCAB_SIZE) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    directory = build_checkpoint(SPECS["qwen3-qknorm-sharded"],
                                 tmp_path_factory.mktemp("qwen3-speculative"))
    write_byte_tokenizer(directory, VOCAB_SIZE)
    return open_model(directory)


def _plain(source, **overrides):
    values = dict(page_size=4, max_num_seqs=6, kv_cache_bytes=8 << 20, prefill_chunk_size=64,
                  max_num_batched_tokens=80)
    values.update(overrides)
    return make_engine(source, **values)


class Continuations:
    """Proposes each prompt's known continuation, every `wrong_every`-th draft changed by
    `corrupt` (0: all exact); records what it proposed."""

    def __init__(self, expected, k: int = 4, wrong_every: int = 0, corrupt=None) -> None:
        self.expected = {tuple(p): list(o) for p, o in expected.items()}
        self.num_tokens = k
        self.source = "copy"
        self.wrong_every = wrong_every
        self.corrupt = corrupt or (lambda t: (t + 7) % VOCAB_SIZE)
        self.count = 0
        self.proposed: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def propose(self, tokens, limit):
        for prompt, output in self.expected.items():
            if tuple(tokens[:len(prompt)]) == prompt:
                done = len(tokens) - len(prompt)
                drafts = list(output[done:done + min(limit, self.num_tokens)])
                for i in range(len(drafts)):
                    self.count += 1
                    if self.wrong_every and self.count % self.wrong_every == 0:
                        drafts[i] = self.corrupt(drafts[i])
                self.proposed.append((tuple(tokens), tuple(drafts)))
                return tuple(drafts)
        return ()


def _engine(source, kind: str, proposer=None, **overrides):
    engine = _plain(source, **{**KINDS[kind], **SPECULATIVE, **overrides})
    state = engine.scheduler.state
    state.config = dataclasses.replace(state.config, proposer=proposer)
    return engine


def _drive(engine, requests, grammars=None):
    """Drive like the engine loop; request id -> (tokens, logprobs, finish reason)."""
    scheduler, runner = engine.scheduler, engine.runner
    for request in requests:
        compiled = grammars.compile(request.grammar) if request.grammar else None
        scheduler.admit(request, grammar=compiled)
    out: dict[str, tuple[list[int], list[float], FinishReason | None]] = {}

    def take(updates):
        for update in updates:
            for d in update.deltas:
                assert not d.error, d.error
                tokens, lps, reason = out.get(update.request_id, ([], [], None))
                out[update.request_id] = (tokens + list(d.token_ids),
                                          lps + [lp.logprob for lp in d.logprobs],
                                          d.finish_reason or reason)

    while scheduler.has_work:
        submitted = False
        if runner.outstanding < runner.window:
            plan = scheduler.plan()
            if plan is not None:
                runner.submit(scheduler.commit(plan, scheduler.state.resources.fences.next_fence))
                submitted = True
        if runner.outstanding and (runner.outstanding >= runner.window or not submitted):
            take(scheduler.complete(runner.wait()))
    return out


def _requests():
    prompts = [_prompt(37, 1), _prompt(12, 2), _prompt(70, 3), _prompt(9, 4)]
    return [greedy_request("g0", prompts[0], 14, logprobs=True, top_logprobs=3),
            greedy_request("g1", prompts[1], 11, logprobs=True),
            greedy_request("s2", prompts[2], 16, temperature=1.5, top_p=0.95, top_k=50,
                           seed=11, repetition_penalty=1.8, presence_penalty=2.0,
                           frequency_penalty=2.0, logprobs=True),
            greedy_request("s3", prompts[3], 13, temperature=1.1, seed=5)]


@pytest.fixture(scope="module")
def plain(source):
    return _drive(_plain(source), _requests())


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("wrong_every", [0, 3])
def test_verified_output_equals_plain_decoding(source, plain, kind, wrong_every):
    expected = {r.prompt_token_ids: plain[r.request_id][0] for r in _requests()}
    del expected[_requests()[3].prompt_token_ids]           # s3 gets no proposals
    proposer = Continuations(expected, wrong_every=wrong_every)
    engine = _engine(source, kind, proposer)
    spec = _drive(engine, _requests())
    for rid, (tokens, logprobs, reason) in plain.items():
        assert spec[rid][0] == tokens, rid
        assert spec[rid][2] is reason
        assert len(spec[rid][1]) == len(logprobs)
        assert max((abs(a - b) for a, b in zip(spec[rid][1], logprobs, strict=True)),
                   default=0.0) < 1e-4, rid
    counters = engine.scheduler.state.counters
    assert counters.launches_by_kind["verify"] > 0 and counters.spec_draft_tokens > 0
    if wrong_every == 0:
        assert counters.spec_accepted_tokens == counters.spec_draft_tokens
    else:
        assert 0 < counters.spec_accepted_tokens < counters.spec_draft_tokens
    if kind != "torch":        # verification graphs (eager on the CPU) served them
        assert engine.runner.verify_graph_steps > 0


@pytest.mark.parametrize("kind", ["torch", "graph"])
def test_stops_and_limits_inside_verified_runs(source, kind):
    """A stop id and min_tokens inside runs of exact drafts, max_tokens cutting the drafts:
    the plain engine's tokens and finish reasons."""
    prompt = _prompt(21, 8)
    probe = _drive(_plain(source), [greedy_request("p", prompt, 20)])["p"][0]
    stop_id = probe[9]
    first = probe.index(stop_id)

    def requests():
        base = greedy_request("stop", prompt, 20)
        return [dataclasses.replace(base, stop=StopRules(max_tokens=20, stop_token_ids=
                                                         frozenset({stop_id}))),
                dataclasses.replace(base, request_id="late", stop=StopRules(
                    max_tokens=20, min_tokens=first + 1, stop_token_ids=frozenset({stop_id}))),
                greedy_request("short", prompt, 7)]

    reference = _drive(_plain(source), requests())
    assert reference["stop"][2] is FinishReason.STOP and len(reference["stop"][0]) == first + 1
    assert reference["short"][2] is FinishReason.LENGTH and len(reference["short"][0]) == 7
    engine = _engine(source, kind, Continuations({tuple(prompt): probe}))
    assert _drive(engine, requests()) == reference
    assert engine.scheduler.state.counters.spec_accepted_tokens > 0


class StopAt(Continuations):
    """Exact drafts of `reference`, except the one at output index `stop`, which the target
    replaces with the stop id there (the correction ends the choice with drafts after it)."""

    def __init__(self, prompt, reference, stop: int) -> None:
        super().__init__({tuple(prompt): reference})
        self.corrupt_at = stop

    def propose(self, tokens, limit):
        done = len(tokens) - len(next(iter(self.expected)))
        drafts = list(super().propose(tokens, limit))
        if 0 <= self.corrupt_at - done < len(drafts):
            drafts[self.corrupt_at - done] = (drafts[self.corrupt_at - done] + 1) % VOCAB_SIZE
        return tuple(drafts)


@pytest.mark.parametrize("kind", ["torch", "graph"])
def test_the_next_turn_resumes_from_the_last_accepted_row(source, kind):
    """A choice that stops on a correction token with rejected drafts after it keeps, as its
    terminal checkpoint, the hidden state of its last accepted row (not of the last fed,
    rejected, draft row): a follow-up whose prompt is exactly that state (a full hit,
    sampling resumed from the snapshot) continues with the plain engine's tokens."""
    prompt = _prompt(30, 9)
    reference = _drive(_plain(source), [greedy_request("r", prompt, 40)])["r"][0]
    stops = [i for i in range(6, 30) if reference[i] not in reference[:i]][:4]
    assert len(stops) >= 3
    for stop in stops:
        request = dataclasses.replace(greedy_request("a", prompt, 40), stop=StopRules(
            max_tokens=40, stop_token_ids=frozenset({reference[stop]})))
        engine = _engine(source, kind, StopAt(prompt, reference, stop))
        assert _drive(engine, [request])["a"] == (reference[:stop + 1], [], FinishReason.STOP)
        follow = prompt + reference[:stop]
        fresh = _drive(_plain(source), [greedy_request("b", follow, 6)])["b"][0]
        admitted = engine.scheduler.admit(greedy_request("b", follow, 6))
        assert admitted.usage.cached_tokens == len(follow)          # the terminal state
        outputs = run_like_the_loop(engine.scheduler, engine.runner)
        assert outputs["b"][0] == fresh and fresh[0] == reference[stop], stop


def _spy(runner) -> list:
    """Record every verification row group the runner is given: (output_index, drafts)."""
    seen: list[tuple[int, tuple[int, ...]]] = []
    submit = runner.submit

    def spying(step):
        seen.extend((s.output_index, s.draft_token_ids) for s in step.seqs
                    if s.draft_token_ids)
        return submit(step)

    runner.submit = spying
    return seen


@pytest.mark.parametrize("kind", ["torch", "graph"])
def test_drafts_under_a_grammar(source, kind):
    """JSON schema outputs (greedy and seeded sampling): proposals of the plain continuation
    with every third draft changed. Only the prefix the grammar accepts is verified, each
    verification row is sampled under its own mask, and the documents are the plain
    engine's (valid under the schema)."""
    from tests.engine.grammar.conftest import constrained, schema_spec

    engine_plain = _plain(source, structured_outputs="eager")
    prompt = _prompt(11, 10, 256)
    spec = schema_spec(SCHEMA)
    requests = [constrained("j", prompt, spec, 150, temperature=0.0),
                constrained("k", prompt[:7], spec, 150, seed=3, temperature=0.8)]
    reference = _drive(engine_plain, requests, engine_plain.grammars)
    expected = {r.prompt_token_ids: reference[r.request_id][0] for r in requests}
    proposer = Continuations(expected, wrong_every=3)
    engine = _engine(source, kind, proposer, structured_outputs="eager")
    verified = _spy(engine.runner)
    assert _drive(engine, requests, engine.grammars) == reference
    for rid in ("j", "k"):
        assert reference[rid][2] is FinishReason.STOP
        text = bytes(t for t in reference[rid][0] if t < 256).decode()
        jsonschema.validate(json.loads(text), SCHEMA)
    assert verified and engine.scheduler.state.counters.spec_accepted_tokens > 0
    compiled = engine.grammars.compile(spec)
    outputs = [reference["j"][0], reference["k"][0]]
    for output_index, drafts in verified:
        # whichever request it was, its drafts continue one of the outputs validly
        ok = False
        for output in outputs:
            matcher = compiled.matcher()
            if all(matcher.accept(t) for t in output[:output_index]):
                ok = ok or matcher.valid_prefix(drafts) == len(drafts)
        assert ok, (output_index, drafts)
    kept = {drafts for _, drafts in verified}
    # some proposals held a draft the grammar rejected: they were cut short (or dropped)
    assert any(drafts not in kept for _, drafts in proposer.proposed)


@pytest.mark.parametrize("kind", ["graph", "overlap"])
@pytest.mark.parametrize("wrong_every", [0, 3])
def test_verifications_in_the_widest_graph_equal_plain_decoding(source, plain, kind,
                                                                 wrong_every, monkeypatch):
    """A verification packed into a wider graph than its rows (what a start-up capture of
    the widest verification graph serves: DecodeGraphs.verify_width_for) gives the plain
    output: sequences narrower than the graph leave padding rows."""
    from services.engine.runner.decode_graphs import DecodeGraphs

    widths = []

    def widest(self, capacity, width, mode, logprobs, grammar):
        widths.append(width)
        return 1 + SPECULATIVE["num_speculative_tokens"]

    monkeypatch.setattr(DecodeGraphs, "verify_width_for", widest)
    expected = {r.prompt_token_ids: plain[r.request_id][0] for r in _requests()}
    engine = _engine(source, kind, Continuations(expected, wrong_every=wrong_every, k=2))
    spec = _drive(engine, _requests())
    assert {rid: v[0] for rid, v in spec.items()} == {rid: v[0] for rid, v in plain.items()}
    for rid, (_, logprobs, _) in plain.items():
        assert max((abs(a - b) for a, b in zip(spec[rid][1], logprobs, strict=True)),
                   default=0.0) < 1e-4, rid
    assert engine.runner.verify_graph_steps > 0 and widths and max(widths) <= 3


def test_the_narrowest_captured_verification_width_serves_a_step():
    from services.engine.runner.decode_graphs import DecodeGraphs
    from services.engine.runner.slot_state import SamplingMode

    graphs = DecodeGraphs.__new__(DecodeGraphs)
    graphs._widths, graphs._widths_tag = {}, None     # the fields __init__ would set
    greedy, sampled = SamplingMode.GREEDY, SamplingMode.RANDOM
    graphs.graphs = {(1, 3, greedy, False, False): None, (1, 5, greedy, False, False): None,
                     (4, 5, greedy, False, False): None, (1, 2, sampled, False, False): None}
    pick = graphs.verify_width_for
    assert pick(1, 2, greedy, False, False) == 3
    assert pick(1, 4, greedy, False, False) == 5
    assert pick(4, 2, greedy, False, False) == 5
    assert pick(2, 2, greedy, False, False) == 2            # none at that capacity: its own
    assert pick(1, 2, sampled, False, False) == 2
    assert pick(1, 3, sampled, False, False) == 3            # narrower ones never serve
    assert pick(1, 2, greedy, True, False) == 2              # logprobs: another graph
    graphs.graphs = None
    assert pick(1, 4, greedy, False, False) == 4             # the CPU: no graphs
