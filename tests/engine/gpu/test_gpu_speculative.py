"""Speculative verification on a CUDA device (the tiny Qwen3 checkpoint, float32): the
GraphRunner's verification graphs (per batch capacity and width, in the two-frame overlap)
against eager verification on the same device, against the CPU's TorchRunner, and against
non-speculative decoding: the same tokens for greedy and seeded sampling with every filter
and penalty, with exact and wrong drafts, under a grammar, and through the next turn's
resume from a verified terminal state.

float32 on the GPU gives the CPU's tokens exactly (tests/engine/gpu/test_gpu_runner.py says
why logprobs are compared within 1e-2)."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.core import open_model
from services.engine.scheduler.requests import FinishReason, StopRules
from tests.engine.gpu.test_gpu_eagle3 import check_round_graphs
from tests.engine.grammar.byte_tokenizer import write_byte_tokenizer
from tests.engine.grammar.conftest import constrained, schema_spec
from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint
from tests.engine.runner.conftest import greedy_request, make_engine
from tests.engine.runner.test_speculative import SCHEMA, Continuations, StopAt, _drive, _requests

pytestmark = pytest.mark.gpu

SPECULATIVE = dict(speculative_method="ngram", num_speculative_tokens=4)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    directory = build_checkpoint(SPECS["qwen3-qknorm-sharded"],
                                 tmp_path_factory.mktemp("qwen3-spec-gpu"))
    write_byte_tokenizer(directory, VOCAB_SIZE)
    return open_model(directory)


def _engine(source, device: str, proposer=None, **overrides):
    values = dict(page_size=4, max_num_seqs=8, kv_cache_bytes=32 << 20, prefill_chunk_size=64,
                  max_num_batched_tokens=96, device=device, dtype="float32")
    values.update(overrides)
    if proposer is not None:
        values.update(SPECULATIVE)
    engine = make_engine(source, **values)
    if proposer is not None:
        state = engine.scheduler.state
        state.config = dataclasses.replace(state.config, proposer=proposer)
    return engine


def _proposer(plain, wrong_every: int):
    expected = {r.prompt_token_ids: plain[r.request_id][0] for r in _requests()}
    del expected[_requests()[3].prompt_token_ids]          # one request gets no drafts
    return Continuations(expected, wrong_every=wrong_every)


def _same(a, b, tolerance: float = 1e-2) -> None:
    assert a.keys() == b.keys()
    for rid in a:
        assert a[rid][0] == b[rid][0], rid
        assert a[rid][2] is b[rid][2], rid
        assert len(a[rid][1]) == len(b[rid][1])
        assert all(abs(x - y) < tolerance for x, y in zip(a[rid][1], b[rid][1], strict=True))


@pytest.mark.parametrize("wrong_every", [0, 3])
def test_verification_graphs_equal_eager_cpu_and_plain_decoding(source, wrong_every):
    cpu_plain = _drive(_engine(source, "cpu", runner="torch"), _requests())
    gpu_plain = _drive(_engine(source, "cuda", overlap="on"), _requests())
    _same(gpu_plain, cpu_plain)
    results = {}
    for name, device, overrides in (("graphs", "cuda", dict(overlap="off")),
                                    ("graphs+overlap", "cuda", dict(overlap="on")),
                                    ("eager", "cuda", dict(overlap="on",
                                                           cuda_graph_max_batch=-1)),
                                    ("cpu", "cpu", dict(runner="torch"))):
        engine = _engine(source, device, _proposer(cpu_plain, wrong_every), **overrides)
        results[name] = _drive(engine, _requests())
        counters = engine.scheduler.state.counters
        assert counters.launches_by_kind["verify"] > 0, name
        if name.startswith("graphs"):
            assert engine.runner.verify_graph_steps > 0, name
        _same(results[name], cpu_plain)


def test_verification_graphs_under_a_grammar(source):
    prompt = list(range(3, 14))
    spec = schema_spec(SCHEMA)

    def requests():
        return [constrained("j", prompt, spec, 150, temperature=0.0),
                constrained("k", prompt[:7], spec, 150, seed=3, temperature=0.8),
                greedy_request("free", prompt[2:], 20)]

    eager = dict(structured_outputs="eager")
    reference = _drive(_engine(source, "cpu", runner="torch", **eager), requests(),
                       _engine(source, "cpu", runner="torch", **eager).grammars)
    expected = {r.prompt_token_ids: reference[r.request_id][0] for r in requests()}
    for overlap in ("off", "on"):
        engine = _engine(source, "cuda", Continuations(expected, wrong_every=3),
                         overlap=overlap, **eager)
        out = _drive(engine, requests(), engine.grammars)
        assert {k: v[0] for k, v in out.items()} == {k: v[0] for k, v in reference.items()}
        assert engine.runner.verify_graph_steps > 0
        assert out["j"][2] is FinishReason.STOP


def test_the_next_turn_after_a_verified_stop_on_the_gpu(source):
    prompt = [(7 * i + 3) % VOCAB_SIZE for i in range(30)]
    reference = _drive(_engine(source, "cpu", runner="torch"),
                       [greedy_request("r", prompt, 40)])["r"][0]
    stop = next(i for i in range(8, 30) if reference[i] not in reference[:i])
    request = dataclasses.replace(greedy_request("a", prompt, 40), stop=StopRules(
        max_tokens=40, stop_token_ids=frozenset({reference[stop]})))
    engine = _engine(source, "cuda", StopAt(prompt, reference, stop), overlap="on")
    assert _drive(engine, [request])["a"][0] == reference[:stop + 1]
    follow = prompt + reference[:stop]
    admitted = engine.scheduler.admit(greedy_request("b", follow, 6))
    assert admitted.usage.cached_tokens == len(follow)
    fresh = _drive(_engine(source, "cpu", runner="torch"), [greedy_request("b", follow, 6)])
    from tests.engine.fakes import run_like_the_loop
    assert run_like_the_loop(engine.scheduler, engine.runner)["b"][0] == fresh["b"][0]


def _draft_on_device(source, tmp_path, device: str, overlap: str) -> None:
    """A draft model (the target itself, then a perturbed copy) on `device` through the
    GraphRunner (verification graphs, `overlap`): the CPU's plain tokens; the target as its
    own draft has every greedy draft accepted, drafting in its round graphs."""
    from tests.engine.runner.test_speculative_draft import perturbed_copy

    perturbed = perturbed_copy(source.root, tmp_path / "draft")
    cpu_plain = _drive(_engine(source, "cpu", runner="torch"), _requests())
    greedy = [r for r in _requests() if r.sampling.temperature == 0.0]
    for draft, requests in ((source.root, greedy), (perturbed, _requests())):
        engine = _engine(source, device, runner="graph", overlap=overlap,
                         speculative_method="draft", speculative_model=str(draft),
                         num_speculative_tokens=4)
        out = _drive(engine, requests)
        _same(out, {r.request_id: cpu_plain[r.request_id] for r in requests})
        counters = engine.scheduler.state.counters
        assert counters.spec_drafter_steps > 0 and counters.spec_accepted_tokens > 0
        assert engine.runner.verify_graph_steps > 0 or device == "cpu"
        if draft == source.root:
            assert counters.spec_accepted_tokens == counters.spec_draft_tokens
        check_round_graphs(engine, device)


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_draft_model_with_verification_graphs(source, tmp_path, overlap):
    _draft_on_device(source, tmp_path, "cuda", overlap)


def test_exact_drafts_keep_verifying_with_the_cost_model(source):
    """With the cost model on (CUDA) and drafts that are always right, every round after
    the first verifies: a verification graph captured on its first step must not pose as
    that shape's cost (the capture inside the step's timing events made the batch switch-off
    strip every later round), and the measured graphs keep it worth verifying."""
    prompt = _requests()[0].prompt_token_ids
    request = greedy_request("long", prompt, 80)
    cpu = _drive(_engine(source, "cpu", runner="torch"), [request])
    engine = _engine(source, "cuda", Continuations({prompt: cpu["long"][0]}), overlap="on")
    assert engine.scheduler.state.config.cost_model
    out = _drive(engine, [greedy_request("long", prompt, 80)])
    assert out["long"][0] == cpu["long"][0]
    counters = engine.scheduler.state.counters
    assert counters.speculation_off == 0
    assert counters.spec_accepted_tokens >= 60, counters.spec_accepted_tokens


def test_greedy_verification_graphs_are_captured_at_start_up(source):
    """Every greedy verification width is captured at start-up at the small capacities (the
    widest above), so greedy speculation captures nothing while serving."""
    from services.engine.runner.decode_graphs import EXACT_WIDTHS_UP_TO
    from services.engine.runner.slot_state import SamplingMode

    plain = _drive(_engine(source, "cpu", runner="torch"), _requests()[:2])
    expected = {r.prompt_token_ids: plain[r.request_id][0] for r in _requests()[:2]}
    engine = _engine(source, "cuda", Continuations(expected, wrong_every=3), overlap="on")
    graphs = engine.runner.graphs
    width = 1 + SPECULATIVE["num_speculative_tokens"]
    for capacity in graphs.capacities:
        widths = range(2, width + 1) if capacity <= EXACT_WIDTHS_UP_TO else (width,)
        for w in widths:
            assert (capacity, w, SamplingMode.GREEDY, False, False) in graphs.graphs, (capacity, w)
    captured, seconds = len(graphs.graphs), graphs.capture_seconds
    greedy = [greedy_request(r.request_id, r.prompt_token_ids, 12) for r in _requests()[:2]]
    out = _drive(engine, greedy)
    assert engine.runner.verify_graph_steps > 0
    assert (len(graphs.graphs), graphs.capture_seconds) == (captured, seconds)
    assert {k: v[0] for k, v in out.items()} == {
        k: v[0] for k, v in _drive(_engine(source, "cpu", runner="torch"), greedy).items()}
