"""EAGLE-3 on CUDA (float32): the target's hook writes the head's fused states inside the
GraphRunner's captured decode and verification graphs; served tokens equal the CPU's plain
tokens, and the stored states equal the target's aux layers recomputed eagerly; with a head
that predicts a repeating target every draft is accepted inside the verification graphs."""

from __future__ import annotations

import pytest
import torch

from services.common.core import open_model
from services.engine.model import ForwardBatch, allocate_kv_cache, build_metadata
from services.engine.model.attention import kv_slot
from services.engine.runner.eagle3_drafter import Eagle3Proposer
from tests.engine.grammar.byte_tokenizer import write_byte_tokenizer
from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint
from tests.engine.runner.conftest import greedy_request, make_engine
from tests.engine.runner.test_speculative import _drive, _prompt
from tests.engine.runner.test_speculative_eagle3 import _requests, repeating_pair, write_head

pytestmark = pytest.mark.gpu

VALUES = dict(page_size=4, max_num_seqs=8, kv_cache_bytes=32 << 20, prefill_chunk_size=64,
              max_num_batched_tokens=96, dtype="float32")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    directory = build_checkpoint(SPECS["qwen3-qknorm-sharded"],
                                 tmp_path_factory.mktemp("qwen3-eagle3-gpu"))
    write_byte_tokenizer(directory, VOCAB_SIZE)
    return directory


@pytest.fixture(scope="module")
def repeating(target_dir, tmp_path_factory):
    return repeating_pair(target_dir, tmp_path_factory.mktemp("eagle3-repeat-gpu"))


def eagle3_on_device(target_dir, head_dir, device: str, overlap: str) -> None:
    """Served tokens equal the CPU's plain ones; the store after a few steps equals the
    recomputed fused states (the body of the GPU tests, runnable on any device)."""
    source = open_model(target_dir)
    cpu_plain = _drive(make_engine(source, **VALUES, device="cpu", runner="torch"),
                       _requests())
    spec = dict(VALUES, device=device, runner="graph", overlap=overlap,
                speculative_method="eagle3", speculative_model=str(head_dir),
                num_speculative_tokens=4)
    engine = make_engine(source, **spec)
    out = _drive(engine, _requests())
    for rid, (tokens, _, reason) in cpu_plain.items():
        assert out[rid][0] == tokens and out[rid][2] is reason, rid
    counters = engine.scheduler.state.counters
    assert counters.spec_drafter_steps > 0 and counters.spec_draft_tokens > 0
    assert engine.runner.graph_steps > 0 or device == "cpu"
    check_round_graphs(engine, device)

    engine = make_engine(source, **spec)
    proposer = engine.scheduler.state.config.proposer
    assert isinstance(proposer, Eagle3Proposer)
    scheduler, runner = engine.scheduler, engine.runner
    scheduler.admit(greedy_request("r", _prompt(23, 11), 12))
    for _ in range(6):                 # prefill, then graph decodes and verifications
        plan = scheduler.plan()
        assert plan is not None
        runner.submit(scheduler.commit(plan, scheduler.state.resources.fences.next_fence))
        scheduler.complete(runner.wait())
    seq = next(iter(scheduler.state.running.values()))
    tokens = seq.tokens(0, seq.num_computed)
    target = runner.model
    kv = allocate_kv_cache(target.config, 16, 4, device, torch.float32)
    meta = build_metadata([len(tokens)], [len(tokens)], [list(range(-(-len(tokens) // 4)))],
                          4, device)
    batch = ForwardBatch(torch.tensor(tokens, device=device),
                         torch.arange(len(tokens), device=device), meta)
    with torch.inference_mode():
        expected = proposer.head.fuse(target.forward(batch, kv).aux_hidden)
        rows = proposer.store.rows[[kv_slot(seq.page_ids, p, 4) for p in range(len(tokens))]]
    torch.testing.assert_close(rows, expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_eagle3_with_captured_graphs(target_dir, tmp_path, overlap):
    eagle3_on_device(target_dir, write_head(tmp_path / "head", target_dir), "cuda", overlap)


def accepted_on_device(repeating, device: str, overlap: str) -> None:
    source, head_dir = repeating
    greedy = [r for r in _requests() if r.sampling.temperature == 0.0]
    plain = _drive(make_engine(source, **VALUES, device="cpu", runner="torch"), greedy)
    engine = make_engine(source, **VALUES, device=device, runner="graph", overlap=overlap,
                         speculative_method="eagle3", speculative_model=str(head_dir),
                         num_speculative_tokens=4)
    out = _drive(engine, greedy)
    assert {rid: v[0] for rid, v in out.items()} == {rid: v[0] for rid, v in plain.items()}
    counters = engine.scheduler.state.counters
    assert counters.spec_accepted_tokens == counters.spec_draft_tokens > 20
    assert engine.runner.verify_graph_steps > 0 or device == "cpu"
    check_round_graphs(engine, device)   # every draft accepted: the replays drafted right


def check_round_graphs(engine, device: str) -> None:
    """The drafter's rounds after a choice's first ran in its round graphs
    (runner/round_graphs.py), every (rows, drafts) shape captured at start-up on CUDA."""
    graphs = engine.scheduler.state.config.proposer.graphs
    assert graphs.rounds > 0
    if device != "cpu":
        want = {(rows, drafts) for rows in graphs.row_capacities
                for drafts in range(1, graphs.num_tokens + 1)}
        assert set(graphs.graphs) == want and graphs.capture_seconds > 0


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_eagle3_accepted_drafts_in_verification_graphs(repeating, overlap):
    accepted_on_device(repeating, "cuda", overlap)
