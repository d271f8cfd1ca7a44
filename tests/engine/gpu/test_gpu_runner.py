"""The GraphRunner on a CUDA device: decode graphs, two-frame overlap and device-side sampling
against the CPU reference path, on tiny checkpoints.

Tolerances: float32 on the GPU gives the CPU's tokens exactly (the attention kernel's float32
dot runs in TF32, so logprobs agree within 1e-2, not bitwise); bf16 on the GPU is checked
teacher-forced against a float32 CPU forward over the same tokens: every chosen token's
logprob within 0.25 nats of the reference's, and each chosen token within 0.25 nats of the
reference's best (a bf16 greedy run may take a different near-tie, never a bad token). The
tiny checkpoints scale their projections up (well-separated logits of magnitude ~10-30), so
bf16's 2^-8 relative rounding shows as ~0.1 nats; a wrong token or garbage is several nats.
"""

from __future__ import annotations

import random

import pytest
import torch

from services.common.core import open_model
from services.engine.runner.cuda_driver import driver_available, driver_event_done, event_done
from services.engine.runner.graph_runner import GraphRunner
from services.engine.runner.slot_state import SamplingMode
from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint
from tests.engine.runner.conftest import greedy_request, make_engine, serve

pytestmark = pytest.mark.gpu

SHAPES = [(5, 1, 12), (40, 2, 20), (3, 3, 9), (70, 4, 16), (17, 5, 24), (1, 6, 5)]


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_SIZE) for _ in range(length)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(SPECS["qwen3-qknorm-sharded"], tmp_path_factory.mktemp("qwen3"))


def _engine(checkpoint, device: str, dtype: str, **overrides):
    values = dict(page_size=4, max_num_seqs=8, kv_cache_bytes=32 << 20, prefill_chunk_size=64,
                  max_num_batched_tokens=96, device=device, dtype=dtype)
    values.update(overrides)
    return make_engine(open_model(checkpoint), **values)


def _requests(logprobs: bool = True):
    return [greedy_request(f"r{i}", _prompt(n, s), m, logprobs=logprobs, top_logprobs=5)
            for i, (n, s, m) in enumerate(SHAPES)]


def _run(engine, requests):
    tokens, logprobs, _ = serve(engine, requests)
    return tokens, logprobs


# architectures beyond the Llama family's full attention: Gemma 3 (sliding + full layers with
# their own ropes, sandwich norms, gelu_tanh, soft-capped logits), Mistral and Qwen2 windows
OTHER_ARCHITECTURES = ("gemma3", "mistral-sliding", "qwen2-sliding")


@pytest.fixture(scope="module", params=OTHER_ARCHITECTURES)
def other_checkpoint(request, tmp_path_factory):
    return build_checkpoint(SPECS[request.param], tmp_path_factory.mktemp(request.param))


def test_float32_graphs_and_overlap_match_the_cpu_path(checkpoint):
    _check_float32_matches_the_cpu(checkpoint)


def test_other_architectures_in_float32_match_the_cpu_path(other_checkpoint):
    _check_float32_matches_the_cpu(other_checkpoint)


def test_other_architectures_in_bf16_against_a_float32_reference(other_checkpoint):
    _check_bf16_against_float32(other_checkpoint)


def _check_float32_matches_the_cpu(checkpoint):
    want, want_lp = _run(_engine(checkpoint, "cpu", "float32", runner="torch"), _requests())
    engine = _engine(checkpoint, "cuda", "float32")
    assert isinstance(engine.runner, GraphRunner) and engine.runner.window == 2
    got, got_lp = _run(engine, _requests())
    assert got == want
    for rid in want:
        for a, b in zip(got_lp[rid], want_lp[rid], strict=True):
            assert abs(a.logprob - b.logprob) < 1e-2
    assert engine.runner.graph_steps > 10 and engine.runner.prefill_graph_steps > 0
    shapes = engine.scheduler.state.costs.shapes
    # CUDA-event timing; a shape seen only in a step that captured its graph is untimed
    decode = [s for (kind, _), s in shapes.items() if kind == "decode"]
    timed = [s for s in decode if s.recent]
    assert timed and all(0 < s.estimate_s() < 1.0 for s in timed)
    assert all(s.untimed > 0 for s in decode if not s.recent)


def test_graph_replay_equals_eager_execution_on_the_gpu(checkpoint):
    eager = _engine(checkpoint, "cuda", "float32", cuda_graph_max_batch=-1, overlap="off")
    assert eager.runner.graphs.capacities == ()
    want, _ = _run(eager, _requests(logprobs=False))
    graphs = _engine(checkpoint, "cuda", "float32")
    got, _ = _run(graphs, _requests(logprobs=False))
    assert got == want and graphs.runner.graph_steps > 10


def test_prefill_graphs_equal_eager_prefill_on_the_gpu(checkpoint):
    """Greedy output with prefill and mixed steps replayed in their graphs equals the same
    steps run eagerly (`cuda_graph_prefill` off), float32 and bf16; the greedy prefill graphs
    are captured at start-up, so serving captures none."""
    for dtype in ("float32", "bfloat16"):
        eager = _engine(checkpoint, "cuda", dtype, cuda_graph_prefill="off")
        assert eager.runner.graphs.prefill_rows == ()
        want, _ = _run(eager, _requests(logprobs=False))
        assert eager.runner.prefill_graph_steps == 0
        graphed = _engine(checkpoint, "cuda", dtype)
        graphs = graphed.runner.graphs
        assert graphs.prefill_rows == (16, 32, 64, 128)
        assert set(graphs.prefill) == {(rows, SamplingMode.GREEDY, False, False)
                                       for rows in graphs.prefill_rows}
        got, _ = _run(graphed, _requests(logprobs=False))
        assert got == want, dtype
        kinds = graphed.scheduler.state.counters.launches_by_kind
        assert graphed.runner.prefill_graph_steps == kinds["prefill"] + kinds["mixed"] > 0
        assert len(graphs.prefill) == len(graphs.prefill_rows)   # none captured serving


def test_seeded_sampling_on_the_gpu_is_reproducible(checkpoint):
    def requests():
        return [greedy_request(f"s{i}", _prompt(20 + i, 30 + i), 16, seed=i, temperature=0.9,
                               top_k=30, top_p=0.9, presence_penalty=0.5,
                               logit_bias={7: 2.0}) for i in range(4)]
    first, _ = _run(_engine(checkpoint, "cuda", "float32"), requests())
    again, _ = _run(_engine(checkpoint, "cuda", "float32"), requests())
    assert first == again and len({tuple(v) for v in first.values()}) == 4


def test_bf16_logprobs_against_a_float32_reference(checkpoint):
    _check_bf16_against_float32(checkpoint)


def _transformers_scores(checkpoint):
    """(prompt, tokens) -> [(logprob of each token, best logprob there)]: transformers'
    float32 forward over prompt + tokens."""
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32).eval()

    def score(prompt, tokens):
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + tokens])).logits[0].float()
        ref = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)      # predicts tokens
        return [(ref[j, t].item(), ref[j].max().item()) for j, t in enumerate(tokens)]
    return score


def _engine_scores(checkpoint):
    """The same from the CPU path in float32 (prompt scoring over prompt + tokens): for an
    architecture whose transformers code differs between versions, the reference that CI's
    parity tests tie to the transformers CI installs."""
    import dataclasses

    from tests.engine.fakes import run_step

    engine = _engine(checkpoint, "cpu", "float32", runner="torch")

    def score(prompt, tokens):
        request = dataclasses.replace(greedy_request("score", prompt + tokens, 0),
                                      prompt_logprobs=1)
        engine.scheduler.admit(request)
        entries = []
        while engine.scheduler.has_work:
            for update in run_step(engine.scheduler, engine.runner)[1]:
                for delta in update.deltas:
                    entries.extend(delta.prompt_logprobs)
        scored = {e.position: (e.logprob, e.top[0].logprob) for e in entries}
        return [scored[len(prompt) + j] for j in range(len(tokens))]
    return score


def _check_bf16_against_float32(checkpoint, reference=_transformers_scores):
    engine = _engine(checkpoint, "cuda", "bfloat16")
    got, got_lp = _run(engine, _requests())
    score = reference(checkpoint)
    for i, (n, s, _) in enumerate(SHAPES):
        prompt = _prompt(n, s)
        tokens = got[f"r{i}"]
        scores = score(prompt, tokens)
        for j, (token, lp) in enumerate(zip(tokens, got_lp[f"r{i}"], strict=True)):
            want, best = scores[j]
            assert lp.token_id == token
            assert abs(lp.logprob - want) < 0.25, (i, j)
            assert best - want < 0.25, (i, j)


def test_cuda_event_polling_through_the_driver():
    x = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    event = torch.cuda.Event()
    for _ in range(20):
        x = x @ x / 64
    event.record()
    while not driver_event_done(event):
        pass
    assert event.query() and event_done(event)
    assert driver_available()          # cuda-python is installed where the engine runs


def test_decode_graphs_replay_raw(checkpoint):
    engine = _engine(checkpoint, "cuda", "float32")
    graphs = engine.runner.graphs.graphs
    assert graphs and all(launcher.is_raw for launcher in graphs.values())
