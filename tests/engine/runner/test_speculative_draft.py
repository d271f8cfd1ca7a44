"""The draft-model proposer (`speculative_method draft`, runner/drafter.py) in a real engine,
CPU float32, on the tiny Qwen3 checkpoint with a byte-level tokenizer: with the target itself
as the draft (every greedy draft accepted) and with a perturbed copy (drafts accepted and
rejected), greedy and seeded output equal the non-speculative output token for token, alone,
concurrent, under preemption, on the TorchRunner and the GraphRunner (eager, with and without
overlap); the drafter's KV holds only the tokens a choice kept (rejected drafts rolled back);
drafter forwards are counted; a draft model with another vocabulary is refused at start-up."""

from __future__ import annotations

import shutil

import pytest
import torch

from services.common.core import open_model
from services.common.errors import ValidationError
from services.engine.core.telemetry import SpeculativeLoad
from services.engine.runner.drafter import DraftModelProposer
from services.engine.runner.round_graphs import CATCH_UP_ROWS
from services.engine.scheduler.plan import SlotHandle
from tests.engine.fakes import run_like_the_loop
from tests.engine.grammar.byte_tokenizer import write_byte_tokenizer
from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint, write_tokenizer
from tests.engine.runner.conftest import greedy_request, make_engine
from tests.engine.runner.test_speculative import KINDS, _drive, _prompt

VALUES = dict(page_size=4, max_num_seqs=6, kv_cache_bytes=8 << 20, prefill_chunk_size=64,
              max_num_batched_tokens=80)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    directory = build_checkpoint(SPECS["qwen3-qknorm-sharded"],
                                 tmp_path_factory.mktemp("draft-target"))
    write_byte_tokenizer(directory, VOCAB_SIZE)
    return directory


@pytest.fixture(scope="module")
def source(target_dir):
    return open_model(target_dir)


def perturbed_copy(model_dir, directory):
    """`model_dir`'s weights with noise in `directory`: a draft that agrees often, not
    always (about a third of its drafts accepted on the tiny Qwen3 checkpoint)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, directory)
    generator = torch.Generator().manual_seed(3)
    for path in sorted(directory.glob("*.safetensors")):
        tensors = load_file(path)
        for name, value in tensors.items():
            tensors[name] = value + 0.1 * value.std() * torch.randn(value.shape,
                                                                     generator=generator)
        save_file(tensors, path, metadata={"format": "pt"})
    return directory


@pytest.fixture(scope="module")
def perturbed_dir(target_dir, tmp_path_factory):
    return perturbed_copy(target_dir, tmp_path_factory.mktemp("draft-perturbed") / "model")


def _draft_engine(source, draft_dir, kind="torch", k=4, **overrides):
    return make_engine(source, **{**VALUES, **KINDS[kind], "speculative_method": "draft",
                                  "speculative_model": str(draft_dir),
                                  "num_speculative_tokens": k, **overrides})


def _requests():
    prompts = [_prompt(37, 1), _prompt(12, 2), _prompt(70, 3), _prompt(9, 4)]
    return [greedy_request("g0", prompts[0], 14, logprobs=True, top_logprobs=3),
            greedy_request("g1", prompts[1], 19, logprobs=True),
            greedy_request("g2", prompts[2], 16),
            greedy_request("s3", prompts[3], 13, temperature=1.1, seed=5, top_p=0.9,
                           repetition_penalty=1.5, logprobs=True)]


@pytest.fixture(scope="module")
def plain(source):
    return _drive(make_engine(source, **VALUES), _requests())


def _same(spec, plain):
    for rid, (tokens, logprobs, reason) in plain.items():
        assert spec[rid][0] == tokens, rid
        assert spec[rid][2] is reason, rid
        assert max((abs(a - b) for a, b in zip(spec[rid][1], logprobs, strict=True)),
                   default=0.0) < 1e-4, rid


def _greedy_acceptance(engine) -> float:
    counters = engine.scheduler.state.counters
    assert counters.spec_draft_tokens > 0
    return counters.spec_accepted_tokens / counters.spec_draft_tokens


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_target_as_its_own_draft(source, target_dir, plain, kind):
    """Greedy drafts of the target itself: the plain output, every greedy draft accepted
    (a rollback that kept rejected or stale draft KV would propose other tokens)."""
    engine = _draft_engine(source, target_dir, kind)
    greedy = [r for r in _requests() if r.sampling.temperature == 0.0]
    spec = _drive(engine, greedy)
    _same(spec, {r.request_id: plain[r.request_id] for r in greedy})
    assert _greedy_acceptance(engine) == 1.0
    load = SpeculativeLoad.of(engine.scheduler)
    assert load is not None and load.method == "draft" and load.drafter_steps > 0
    assert load.num_accepted_tokens == load.num_draft_tokens > 0


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_perturbed_draft_concurrent(source, perturbed_dir, plain, kind):
    """Greedy (with logprobs) and seeded sampling at once, drafts often rejected:
    the plain tokens, logprobs and finish reasons."""
    engine = _draft_engine(source, perturbed_dir, kind)
    spec = _drive(engine, _requests())
    _same(spec, plain)
    counters = engine.scheduler.state.counters
    assert 0 < counters.spec_accepted_tokens < counters.spec_draft_tokens
    assert counters.spec_drafter_steps > 0 and counters.launches_by_kind["verify"] > 0


def test_choices_of_one_request(source, perturbed_dir):
    """n = 3 seeded choices share the prompt, each with its own draft KV: the plain
    choices."""
    request = greedy_request("n3", _prompt(25, 9), 15, temperature=0.9, seed=2, n=3)
    plain = make_engine(source, **VALUES)
    plain.scheduler.admit(request)
    reference = run_like_the_loop(plain.scheduler, plain.runner)
    engine = _draft_engine(source, perturbed_dir)
    engine.scheduler.admit(request)
    assert run_like_the_loop(engine.scheduler, engine.runner) == reference
    assert len(reference["n3"]) == 3
    assert engine.scheduler.state.counters.spec_accepted_tokens > 0


def test_preemption_keeps_the_output(source, perturbed_dir):
    """A pool too small for every choice at once: preempted choices come back (a new slot
    generation: the drafter starts over) with the plain tokens."""
    prompts = [_prompt(40, 20 + i) for i in range(5)]
    requests = [greedy_request(f"p{i}", p, 24) for i, p in enumerate(prompts)]
    reference = _drive(make_engine(source, **{**VALUES, "kv_cache_bytes": 300 << 10}),
                       requests)
    # the same pages: each costs the target's and the draft's bytes
    engine = _draft_engine(source, perturbed_dir, kv_cache_bytes=600 << 10)
    spec = _drive(engine, requests)
    assert spec == reference
    counters = engine.scheduler.state.counters
    assert counters.preemptions > 0 and counters.spec_accepted_tokens > 0


def test_rejected_drafts_are_rolled_back(source, perturbed_dir):
    """After a round whose drafts were partly rejected the drafter holds only the tokens the
    choice kept, and proposes what a fresh drafter proposes for the same tokens."""
    engine = _draft_engine(source, perturbed_dir, k=4)
    drafter = engine.scheduler.state.config.proposer
    assert isinstance(drafter, DraftModelProposer)
    tokens = _prompt(30, 7)
    handle = SlotHandle(0, 1)
    drafts, forwards = drafter.propose_for(handle, tokens, 4)
    assert len(drafts) == 4 and forwards == 4       # the prompt in one chunk, then 3
    assert drafter.tokens_held(0) == (*tokens, *drafts[:3])
    kept = [*tokens, drafts[0], (drafts[1] + 1) % VOCAB_SIZE]   # draft 1 rejected
    again, forwards = drafter.propose_for(handle, kept, 4)
    assert forwards == 4                             # caught up on the correction alone
    fresh = _draft_engine(source, perturbed_dir, k=4).scheduler.state.config.proposer
    assert isinstance(fresh, DraftModelProposer)
    assert again == fresh.propose_for(handle, kept, 4)[0]
    assert drafter.tokens_held(0) == (*kept, *again[:3])
    # a new generation of the slot starts over; its pages came back first
    pages = drafter.free_pages
    drafter.propose_for(SlotHandle(0, 2), tokens[:5], 1)
    assert drafter.tokens_held(0) == tuple(tokens[:5]) and drafter.free_pages > pages


def test_graph_rounds_draft_what_eager_rounds_draft(source, perturbed_dir):
    """A round through the round graphs (runner/round_graphs.py; on the CPU the graph body
    runs eagerly on the padded buffers) drafts what the forward-by-forward eager round drafts
    for the same tokens and holds the same rows: a whole catch-up of every length up to the
    largest row capacity, and past it (65 and 72 rows: one eager chunk first, then the graph;
    150 rows: two chunks of the 80-token budget, then the graph), then a round after a partly
    rejected one, at fewer drafts than k."""
    graphed = _draft_engine(source, perturbed_dir, k=4).scheduler.state.config.proposer
    eager = _draft_engine(source, perturbed_dir, k=4).scheduler.state.config.proposer
    assert isinstance(graphed, DraftModelProposer) and isinstance(eager, DraftModelProposer)
    eager.graphs.fits = lambda *_: False                      # type: ignore[method-assign]
    assert graphed.graphs.row_capacities[-1] == CATCH_UP_ROWS == 64
    prompt = _prompt(150, 11)
    lengths = (1, 2, 3, 7, 16, 31, 33, 40, 63, 64, 65, 72, 150)
    for generation, length in enumerate(lengths, start=1):
        handle, tokens = SlotHandle(0, generation), prompt[:length]
        rounds = graphed.graphs.rounds
        drafts, forwards = graphed.propose_for(handle, tokens, 4)
        assert drafts == eager.propose_for(handle, tokens, 4)[0], length
        assert graphed.graphs.rounds == rounds + 1
        # eager chunks before the graph's 64 rows, then the graph's catch-up and 3 chained
        assert forwards == 4 + (length > 64) + (length > 64 + 80)
        assert graphed.tokens_held(0) == eager.tokens_held(0) == (*tokens, *drafts[:3])
        kept = [*tokens, drafts[0], (drafts[1] + 1) % VOCAB_SIZE]      # draft 1 rejected
        again, forwards = graphed.propose_for(handle, kept, 2)
        assert again == eager.propose_for(handle, kept, 2)[0] and forwards == 2
        assert graphed.tokens_held(0) == eager.tokens_held(0) == (*kept, again[0])
    # each round's kind counted (bench_speculative_draft's diagnostics): a round with eager
    # chunks before its graph counts as eager
    assert graphed.pages.round_counts == {"graph": 23, "eager": 3}
    assert eager.pages.round_counts == {"graph": 0, "eager": 26}
    assert all(seconds > 0 for seconds in graphed.pages.round_seconds.values())


def test_seeded_sampling_draws_the_plain_tokens(source, perturbed_dir):
    """Seed for seed, sampled requests draw the tokens they draw without speculation (the
    drafts are a deterministic function of the tokens: no proposal distribution to correct)."""
    requests = [greedy_request(f"s{seed}", _prompt(11, 40), 12, temperature=1.3, seed=seed,
                               top_k=40) for seed in range(24)]
    plain = _drive(make_engine(source, **VALUES), requests)
    engine = _draft_engine(source, perturbed_dir)
    assert _drive(engine, requests) == plain
    assert engine.scheduler.state.counters.spec_accepted_tokens > 0


def test_another_vocabulary_is_refused(source, tmp_path):
    """A draft with the same number of tokens but another tokenizer (word-level t0..t319)
    and one with fewer tokens: start-up fails naming speculative_model."""
    other = build_checkpoint(SPECS["llama"], tmp_path / "word-level")
    write_tokenizer(other)
    with pytest.raises(ValidationError, match="another vocabulary") as info:
        _draft_engine(source, other)
    assert info.value.param == "speculative_model"
    smaller = build_checkpoint(SPECS["llama"], tmp_path / "smaller")
    write_byte_tokenizer(smaller, VOCAB_SIZE - 8)
    with pytest.raises(ValidationError, match="312 tokens vs 320"):
        _draft_engine(source, smaller)


def test_grammar_and_stops_with_a_draft_model(source, perturbed_dir):
    """JSON-schema outputs (greedy and seeded), a stop id and min_tokens inside verified
    runs, max_tokens cutting the drafts: the plain engine's tokens and finish reasons."""
    import dataclasses

    from services.engine.scheduler.requests import FinishReason, StopRules
    from tests.engine.grammar.conftest import constrained, schema_spec
    from tests.engine.runner.test_speculative import SCHEMA

    prompt = _prompt(21, 8, 256)
    probe = _drive(make_engine(source, **VALUES), [greedy_request("p", prompt, 20)])["p"][0]
    stop_id = probe[9]
    base = greedy_request("stop", prompt, 20)
    spec = schema_spec(SCHEMA)
    requests = [
        dataclasses.replace(base, stop=StopRules(max_tokens=20,
                                                 stop_token_ids=frozenset({stop_id}))),
        dataclasses.replace(base, request_id="late", stop=StopRules(
            max_tokens=20, min_tokens=probe.index(stop_id) + 1,
            stop_token_ids=frozenset({stop_id}))),
        greedy_request("short", prompt, 7),
        constrained("j", prompt[:11], spec, 150, temperature=0.0),
        constrained("k", prompt[:7], spec, 150, seed=3, temperature=0.8)]
    plain = make_engine(source, **VALUES, structured_outputs="eager")
    reference = _drive(plain, requests, plain.grammars)
    assert reference["stop"][2] is FinishReason.STOP and reference["j"][2] is FinishReason.STOP
    for draft in (source.root, perturbed_dir):
        engine = _draft_engine(source, draft, structured_outputs="eager")
        assert _drive(engine, requests, engine.grammars) == reference
        assert engine.scheduler.state.counters.spec_accepted_tokens > 0


def test_a_multimodal_draft_is_refused(source, tmp_path):
    """A vision-language draft (mRoPE positions: its forwards need [3, T] rows) sharing the
    target's tokenizer is refused at start-up, naming speculative_model."""
    from tests.engine.model.vision.checkpoints import SPECS as VISION_SPECS
    from tests.engine.model.vision.checkpoints import build_checkpoint as build_vision

    draft = build_vision(VISION_SPECS["qwen2_5_vl"], tmp_path / "vl")
    write_byte_tokenizer(draft, VOCAB_SIZE)
    with pytest.raises(ValidationError, match="multimodal") as info:
        _draft_engine(source, draft)
    assert info.value.param == "speculative_model"
