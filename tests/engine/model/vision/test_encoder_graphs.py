"""vision/encoder_graphs.py off CUDA, and the tower's plan/run split it replays: on the CPU
every pass runs eagerly; the bookkeeping around a capture (a layout captured the second
time it is met, each pass's tensors copied into the static inputs and its outputs cloned,
least recently used layouts dropped, a failed capture leaving its layout eager) runs here
with a stand-in for the CUDA graph; `vision_graphs` is validated. The real capture and
replay against the eager pass: tests/engine/gpu/test_gpu_vision.py."""

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


class _FakeGraph:
    """A CUDA graph's stand-in: `replay` runs the tower over the captured static inputs into
    the same output tensors, as a replayed graph writes its captured outputs."""

    def __init__(self, tower, statics, plan) -> None:
        self.tower, self.statics, self.plan = tower, statics, plan
        self.outputs = tower.run(statics, plan)

    def replay(self) -> None:
        for out, new in zip(self.outputs, self.tower.run(self.statics, self.plan), strict=True):
            out.copy_(new)


def _graphs_on_the_cpu(monkeypatch, record) -> None:
    monkeypatch.setattr(EncoderGraphs, "enabled", property(lambda self: True))
    monkeypatch.setattr(EncoderGraphs, "_record", record)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_capture_bookkeeping_with_a_stand_in_graph(vl_engine_models, name, monkeypatch) -> None:
    """Each replayed pass gives the tower's features for its own pixels (static inputs
    refreshed, outputs cloned: an earlier pass's features are not overwritten), and with one
    graph kept a second layout's capture drops the first."""
    model = vl_engine_models[name]
    profile = SPECS[name].profile

    def record(self, statics, plan):
        graph = _FakeGraph(self.tower, statics, plan)
        return graph, graph.outputs

    _graphs_on_the_cpu(monkeypatch, record)
    encoder = EncoderGraphs(model.visual, max_layouts=1)
    kept = []
    for seed in (1, 2, 3):
        batch = _images(model, profile, (140, 140, seed))
        got = encoder(batch)
        kept.append((got, model.visual(batch)))
    for got, want in kept:                    # still each pass's own features
        torch.testing.assert_close(got[0].features, want[0].features)
    assert (encoder.eager_passes, encoder.captures, encoder.replays) == (1, 1, 2)
    for seed in (4, 5):
        encoder(_images(model, profile, (300, 180, seed)))
    assert (encoder.captures, encoder.layouts) == (2, 1)
    encoder(_images(model, profile, (140, 140, 6)))     # dropped: met again, eager
    assert encoder.eager_passes == 3


def test_a_failed_capture_leaves_its_layout_eager(vl_engine_models, monkeypatch,
                                                  caplog) -> None:
    model = vl_engine_models["qwen2_5_vl"]
    attempts = []

    def record(self, statics, plan):
        attempts.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    _graphs_on_the_cpu(monkeypatch, record)
    encoder = EncoderGraphs(model.visual, max_layouts=2)
    for seed in (1, 2, 3, 4):
        batch = _images(model, SPECS["qwen2_5_vl"].profile, (140, 140, seed))
        got = encoder(batch)
        torch.testing.assert_close(got[0].features, model.visual(batch)[0].features)
    assert attempts == [1]                    # tried once, on the second meeting
    assert (encoder.eager_passes, encoder.captures, encoder.replays) == (4, 0, 0)
    assert "failed to capture" in caplog.text


def test_vision_graphs_is_validated() -> None:
    assert EngineConfig(model="core").vision_graphs == 4
    with pytest.raises(ValidationError, match="vision_graphs must be 0 or more"):
        EngineConfig(model="core", vision_graphs=-1)
