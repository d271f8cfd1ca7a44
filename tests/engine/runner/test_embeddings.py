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
import shutil

import pytest
import torch

from services.common.core import open_model, prepare_core
from services.common.errors import ValidationError
from services.engine.scheduler.requests import FinishReason
from tests.engine.fakes import run_step
from tests.engine.runner.conftest import greedy_request, make_engine

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
def embedding_checkpoint(tmp_path_factory, demo_model_dir):
    """A random Qwen3 model saved as `Qwen3Model` (no lm_head) with the demo tokenizer."""
    import transformers

    config = json.loads((demo_model_dir / "config.json").read_text())
    config.update(architectures=["Qwen3Model"], tie_word_embeddings=False,
                  num_hidden_layers=2, hidden_size=48, head_dim=16, num_attention_heads=3,
                  num_key_value_heads=1, intermediate_size=96, torch_dtype="float32")
    hf_config = transformers.Qwen3Config(**{k: v for k, v in config.items()
                                            if k not in ("architectures",)})
    torch.manual_seed(11)
    model = transformers.Qwen3Model(hf_config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(1.0, 0.1)      # norms that are not exactly one
    root = tmp_path_factory.mktemp("qwen3-embedding")
    model.save_pretrained(root / "model", safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (demo_model_dir / name).is_file():
            shutil.copyfile(demo_model_dir / name, root / "model" / name)
    return root, model


def _embedding_core(root, mode: str):
    model_dir = root / "model"
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize"}]
    (model_dir / "modules.json").write_text(json.dumps(modules))
    (model_dir / "1_Pooling").mkdir(exist_ok=True)
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 48, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_lasttoken": mode == "last"}))
    core = root / f"core-{mode}"
    if not core.exists():
        prepare_core(model_dir, core, model_id=f"qwen3-embedding-{mode}")
    return open_model(core, verify=())


@pytest.mark.parametrize("mode", ["last", "mean"])
def test_qwen3_embedding_layout(embedding_checkpoint, mode):
    root, model = embedding_checkpoint
    source = _embedding_core(root, mode)
    assert "lm_head.weight" not in model.state_dict()
    engine = make_engine(source, prefill_chunk_size=64, max_num_batched_tokens=64)
    assert engine.scheduler.state.config.pooling == mode
    for length, seed in ((1, 1), (40, 2), (130, 3)):
        prompt = _prompt(length, seed)
        _close(_embed(engine, f"{mode}-{length}", prompt), _hidden(model, prompt), mode)


def test_embedding_requests_are_prompt_only(demo_source):
    engine = make_engine(demo_source)
    request = dataclasses.replace(greedy_request("x", _prompt(5, 1), 3), embed=True)
    with pytest.raises(ValidationError, match="embedding"):
        engine.scheduler.admit(request)
