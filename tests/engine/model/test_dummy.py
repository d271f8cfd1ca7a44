"""--load-format dummy: a model directory with config and tokenizer but no weights serves with
random weights drawn on the device; anything else still refuses such a directory."""

from __future__ import annotations

import shutil

import pytest
import torch

from services.common.core import open_model
from services.common.errors import ManifestError, ValidationError
from services.engine.model import ForwardBatch, ModelConfig, build_metadata, load_dummy_model
from tests.engine.fakes import run_until_idle
from tests.engine.model.checkpoints import SPECS, build_checkpoint
from tests.engine.runner.conftest import greedy_request, make_engine


@pytest.fixture(scope="module")
def weightless(tmp_path_factory):
    full = build_checkpoint(SPECS["qwen3-qknorm-sharded"], tmp_path_factory.mktemp("full"))
    bare = tmp_path_factory.mktemp("bare")
    for path in full.iterdir():
        if not path.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copy(path, bare / path.name)
    return bare


def test_a_directory_without_weights_opens_only_when_allowed(weightless):
    with pytest.raises(ValidationError, match=r"no weights \(\*\.safetensors or one \*\.gguf file\)"):
        open_model(weightless)
    source = open_model(weightless, allow_missing_weights=True)
    assert source.manifest.num_parameters == 0
    assert not [f for f in source.manifest.files if f.role == "weights"]


def test_dummy_weights_are_seeded_and_finite_in_bf16(weightless):
    config = ModelConfig.from_dict(open_model(weightless, allow_missing_weights=True).config)
    first = load_dummy_model(config, "cpu", torch.bfloat16, seed=3)
    again = load_dummy_model(config, "cpu", torch.bfloat16, seed=3)
    other = load_dummy_model(config, "cpu", torch.bfloat16, seed=4)
    for (name, a), b, c in zip(first.named_parameters(), again.parameters(),
                               other.parameters(), strict=True):
        assert torch.equal(a, b), name
        if a.dim() >= 2:
            assert not torch.equal(a, c), name
            assert 0.015 < a.float().std().item() < 0.025, name
        else:
            assert torch.all(a == (0 if name.endswith("bias") else 1)), name
    from services.engine.model import allocate_kv_cache
    kv = allocate_kv_cache(config, 8, 4, "cpu", torch.bfloat16)
    meta = build_metadata([20], [20], [list(range(5))], 4)
    hidden = first(ForwardBatch(torch.arange(20), torch.arange(20), meta), kv).hidden
    assert torch.isfinite(first.compute_logits(hidden)).all()


def test_engine_serves_a_weightless_directory_with_dummy_weights(weightless):
    source = open_model(weightless, allow_missing_weights=True)
    engine = make_engine(source, load_format="dummy", page_size=4)
    engine.scheduler.admit(greedy_request("a", list(range(1, 30)), 6))
    assert len(run_until_idle(engine.scheduler, engine.runner)["a"][0]) == 6
    with pytest.raises(ManifestError, match="no weights \\(safetensors or GGUF\\)"):
        make_engine(source, page_size=4)              # auto: reads the (missing) weights
