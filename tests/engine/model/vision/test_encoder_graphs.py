"""vision/encoder_graphs.py off CUDA, and the tower's plan/run split it replays: on the CPU
every pass runs eagerly (the GPU half, capture and replay against the eager pass, is
tests/engine/gpu/test_gpu_vision.py), and `vision_graphs` is validated."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.config import EngineConfig
from services.engine.model.vision.inputs import VisionInput
from services.engine.vision.encoder_graphs import EncoderGraphs
from tests.engine.model.vision.checkpoints import SPECS, prepared_image


def _images(model, profile: str, *shapes: tuple[int, int, int]) -> list[VisionInput]:
    merge = model.vl_config.vision.spatial_merge_size
    prepared = [prepared_image(profile, h, w, seed) for h, w, seed in shapes]
    return [VisionInput.from_tensors(p.identity, p.tensors, merge) for p in prepared]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_passes_off_cuda_run_eagerly_and_equal_the_tower(vl_engine_models, name) -> None:
    model = vl_engine_models[name]
    encoder = EncoderGraphs(model.visual, max_layouts=4)
    assert not encoder.enabled
    for _ in range(3):                  # one layout, met three times: still eager here
        batch = _images(model, SPECS[name].profile, (140, 140, 1), (300, 180, 2))
        got, want = encoder(batch), model.visual(batch)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g.features, w.features)
            assert len(g.deepstack) == len(w.deepstack)
            for a, b in zip(g.deepstack, w.deepstack, strict=True):
                assert torch.equal(a, b)
    assert (encoder.eager_passes, encoder.captures, encoder.replays) == (3, 0, 0)
    assert encoder([]) == []


@pytest.mark.parametrize("name", sorted(SPECS))
def test_run_returns_features_in_image_order(vl_engine_models, name) -> None:
    """One packed pass of two images equals each image encoded alone: `run`'s merged rows
    come back in image order (Qwen2.5-VL's windows reordered), cut per image."""
    model = vl_engine_models[name]
    profile = SPECS[name].profile
    both = model.visual(_images(model, profile, (140, 140, 3), (300, 180, 4)))
    alone = [model.visual(_images(model, profile, shape))[0]
             for shape in ((140, 140, 3), (300, 180, 4))]
    for packed, single in zip(both, alone, strict=True):
        torch.testing.assert_close(packed.features, single.features, rtol=1e-5, atol=1e-5)


def test_vision_graphs_is_validated() -> None:
    assert EngineConfig(model="core").vision_graphs == 4
    with pytest.raises(ValidationError, match="vision_graphs must be 0 or more"):
        EngineConfig(model="core", vision_graphs=-1)
