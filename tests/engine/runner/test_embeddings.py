"""Embeddings through the scheduler and both runners vs transformers' hidden states (float32).

An embedding request is a prompt-only scoring request whose result is the pooled final
(normed) hidden state, L2-normalized. The demo decoder checkpoint pools the last token; a
random checkpoint in the Qwen3-Embedding layout (saved as `Qwen3Model`, no lm_head, with
sentence-transformers' modules.json and 1_Pooling/config.json) pools the last token, or the
mean when its pooling config says so; chunked prefill and a warm prefix cache included.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch

from services.common.core import open_model, prepare_core
from services.common.errors import ValidationError
from services.engine.scheduler.requests import FinishReason
from tests.engine.fakes import run_step
from tests.engine.runner.conftest import greedy_request, make_engine
from tests.support.embedding_checkpoint import build_embedding_checkpoint

TOL = 1e-4


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(151_000) for _ in range(length)]


def _embed(engine, request_id: str, prompt: list[int]):
    request = dataclasses.replace(greedy_request(request_id, prompt, 0), embed=True)
    engine.scheduler.admit(request)
    embedding, finish, usage = (), None, None
    while engine.scheduler.has_work:
        _, updates = run_step(engine.scheduler, engine.runner)
        for update in updates:
            if update.request_id == request_id:
                usage = update.usage
                for delta in update.deltas:
                    embedding = delta.embedding or embedding
                    finish = delta.finish_reason or finish
                    assert not delta.token_ids
    assert finish is FinishReason.LENGTH and usage.completion_tokens == 0
    return torch.tensor(embedding)


def _close(got: torch.Tensor, hidden: torch.Tensor, mode: str) -> None:
    pooled = hidden[-1] if mode == "last" else hidden.mean(dim=0)
    want = torch.nn.functional.normalize(pooled.float(), dim=0)
    assert got.shape == want.shape
    assert abs(got.norm().item() - 1.0) < 1e-5
    assert torch.allclose(got, want, atol=TOL), (got - want).abs().max()


@torch.no_grad()
def _hidden(model, prompt: list[int]) -> torch.Tensor:
    return model(torch.tensor([prompt])).last_hidden_state[0]


@pytest.mark.parametrize("runner", ["torch", "graph"])
def test_decoder_checkpoint_pools_the_last_token(demo_source, hf_demo, runner):
    engine = make_engine(demo_source, runner=runner, prefill_chunk_size=64,
                         max_num_batched_tokens=64, page_size=16)
    prompt = _prompt(150, 4)
    _close(_embed(engine, "e", prompt), _hidden(hf_demo.model, prompt), "last")
    # a warm prefix cache (a generation of the same prompt) is not reused
    engine.scheduler.admit(greedy_request("g", prompt, 2))
    while engine.scheduler.has_work:
        run_step(engine.scheduler, engine.runner)
    _close(_embed(engine, "again", prompt), _hidden(hf_demo.model, prompt), "last")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, demo_model_dir):
    root = tmp_path_factory.mktemp("qwen3-embedding")
    return {mode: build_embedding_checkpoint(root, demo_model_dir, mode=mode)
            for mode in ("last", "mean")}


@pytest.mark.parametrize("mode", ["last", "mean"])
def test_qwen3_embedding_layout(checkpoints, mode):
    model_dir, model = checkpoints[mode]
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == \
        ["Qwen3Model"]
    assert "lm_head.weight" not in model.state_dict()
    core = model_dir.parent / f"core-{mode}"
    prepare_core(model_dir, core, model_id=f"qwen3-embedding-{mode}")
    engine = make_engine(open_model(core, verify=()), prefill_chunk_size=64,
                         max_num_batched_tokens=64)
    assert engine.scheduler.state.config.pooling == mode
    for length, seed in ((1, 1), (40, 2), (130, 3)):
        prompt = _prompt(length, seed)
        _close(_embed(engine, f"{mode}-{length}", prompt), _hidden(model, prompt), mode)


def test_embedding_requests_are_prompt_only(demo_source):
    engine = make_engine(demo_source)
    request = dataclasses.replace(greedy_request("x", _prompt(5, 1), 3), embed=True)
    with pytest.raises(ValidationError, match="embedding"):
        engine.scheduler.admit(request)
