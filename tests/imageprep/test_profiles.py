"""Profile settings: built-in defaults, checkpoint overrides through a prepared core."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from services.common import assets
from services.common.core import prepare_core
from services.common.errors import UnsupportedError, ValidationError
from services.imageprep.model_profile import ProfileResolver
from services.imageprep.profiles import BUILTIN_PROFILES, settings_from_checkpoint


def test_builtin_profiles_match_the_published_configs():
    qwen3, qwen25 = BUILTIN_PROFILES["qwen3_vl"], BUILTIN_PROFILES["qwen2_5_vl"]
    assert (qwen3.patch_size, qwen3.merge_size, qwen3.temporal_patch_size) == (16, 2, 2)
    assert qwen3.image_mean == qwen3.image_std == (0.5, 0.5, 0.5)
    assert (qwen3.min_pixels, qwen3.max_pixels, qwen3.position_table_side) == (65536, 16777216, 48)
    assert qwen3.patch_dim == 1536 and qwen3.factor == 32
    assert (qwen25.patch_size, qwen25.min_pixels, qwen25.max_pixels) == (14, 3136, 12845056)
    assert qwen25.position_table_side == 0 and qwen25.patch_dim == 1176


def test_fingerprint_changes_with_every_setting():
    base = BUILTIN_PROFILES["qwen3_vl"]
    variants = [base.with_pixel_bounds(1024, None), base.with_pixel_bounds(None, 1 << 20),
                settings_from_checkpoint("qwen3_vl", {"image_mean": [0.5, 0.5, 0.4]}),
                settings_from_checkpoint("qwen3_vl", {}, {"vision_config": {
                    "num_position_embeddings": 1024}})]
    prints = {base.fingerprint(), *(v.fingerprint() for v in variants)}
    assert len(prints) == 5


@pytest.mark.parametrize("pre, error, text", [
    ({"resample": 2}, UnsupportedError, "bicubic"),
    ({"do_normalize": False}, UnsupportedError, "do_normalize"),
    ({"image_std": [0.5, 0, 0.5]}, ValidationError, "non-zero"),
    ({"image_mean": [0.5, 0.5]}, ValidationError, "3 numbers"),
    ({"min_pixels": 10, "max_pixels": 5}, ValidationError, "must be >= min_pixels"),
])
def test_bad_checkpoint_settings(pre, error, text):
    with pytest.raises(error, match=text):
        settings_from_checkpoint("qwen3_vl", pre)


@pytest.fixture(scope="module")
def vision_core(tmp_path_factory):
    model = tmp_path_factory.mktemp("qwen3vl-tiny")
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "text_config": {"vocab_size": 151936, "max_position_embeddings": 4096},
        "vision_config": {"num_position_embeddings": 1024, "patch_size": 16}}))
    (model / "preprocessor_config.json").write_text(json.dumps({
        "size": {"shortest_edge": 4096, "longest_edge": 1048576}, "patch_size": 16,
        "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "resample": 3,
        "image_processor_type": "Qwen2VLImageProcessorFast"}))
    save_file({"w": torch.zeros(2, 2)}, str(model / "model.safetensors"))
    shutil.copy(assets.fetch("qwen3") / "tokenizer.json", model / "tokenizer.json")
    core = tmp_path_factory.mktemp("core") / "core"
    prepare_core(model, core)
    return core


def test_resolver_takes_the_core_profile_and_preprocessor_config(vision_core):
    resolver = ProfileResolver.from_model(str(vision_core))
    assert resolver.default_profile == "qwen3_vl"
    settings = resolver.resolve("", None, None)
    assert (settings.min_pixels, settings.max_pixels) == (4096, 1048576)
    assert settings.position_table_side == 32
    assert resolver.resolve("qwen3_vl", None, None) == settings
    assert resolver.resolve("qwen2_5_vl", None, None) == BUILTIN_PROFILES["qwen2_5_vl"]
    assert resolver.resolve("", None, 65536).max_pixels == 65536


def test_resolver_without_a_model_needs_a_profile():
    with pytest.raises(ValidationError, match="profile is required"):
        ProfileResolver.from_model("").resolve("", None, None)
