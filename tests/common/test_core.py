"""Prepared cores: manifests, fingerprints, tamper detection that names the file."""

from __future__ import annotations

import json
import shutil

import pytest

from services.common.core import (
    MANIFEST_NAME,
    TOKENIZER_ROLES,
    Manifest,
    inspect_model_dir,
    open_model,
    prepare_core,
)
from services.common.errors import ManifestError, ValidationError


@pytest.fixture
def model_dir(tmp_path, demo_model_dir):
    # A private copy (cores hard-link, and tests tamper with files).
    copy = tmp_path / "model"
    shutil.copytree(demo_model_dir, copy)
    return copy


@pytest.fixture
def core(tmp_path, model_dir):
    out = tmp_path / "core"
    prepare_core(model_dir, out, served_names=("demo", "org/demo-model"), context_hint="hint!")
    # Break the hard links so tampering with the core leaves the model dir intact.
    for path in out.iterdir():
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)
    return out


def test_manifest_describes_the_checkpoint(core):
    manifest = open_model(core).manifest
    assert manifest.architecture == "Qwen3ForCausalLM"
    assert manifest.model_type == "qwen3"
    assert manifest.dtype == "bfloat16"
    assert manifest.max_model_len == 4096
    assert manifest.card_id == "demo"
    assert manifest.names() == ("demo", "org/demo-model", "model")
    assert manifest.eos_token_ids == (151645, 151643)
    assert manifest.capabilities.tools and manifest.capabilities.reasoning
    assert not manifest.capabilities.vision
    assert manifest.tokenizer_file == "tokenizer.json"
    assert manifest.chat_template_file == "tokenizer_config.json"
    assert len(manifest.identity_bytes) == 32
    assert manifest.context_hint == "hint!"
    roles = {f.path: f.role for f in manifest.files}
    assert roles["model.safetensors"] == "weights"
    assert roles["tokenizer.json"] == "tokenizer"


def test_manifest_json_round_trip(core):
    manifest = open_model(core).manifest
    assert Manifest.from_json(manifest.to_json()) == manifest


def test_identity_is_stable_and_tracks_the_template(model_dir):
    first = inspect_model_dir(model_dir).identity
    assert inspect_model_dir(model_dir).identity == first
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] += "{# changed #}"
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert inspect_model_dir(model_dir).identity != first


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "config.json",
                                  "model.safetensors"])
def test_tampered_file_is_refused_by_name(core, name):
    path = core / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ManifestError) as info:
        open_model(core)
    assert name in str(info.value)
    assert info.value.param == name


def test_frontend_verification_skips_weights(core):
    weights = core / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    open_model(core, verify=TOKENIZER_ROLES)  # the frontend never reads the weights
    with pytest.raises(ManifestError, match="model.safetensors"):
        open_model(core)


def test_missing_file_is_named(core):
    (core / "tokenizer.json").unlink()
    with pytest.raises(ManifestError, match="tokenizer.json is missing"):
        open_model(core)


def test_malformed_manifest(core):
    (core / MANIFEST_NAME).write_text('{"format": 1}')
    with pytest.raises(ManifestError, match="malformed"):
        open_model(core)


def test_not_a_model(tmp_path):
    with pytest.raises(ValidationError, match="neither a prepared core"):
        open_model(tmp_path)


def test_prepare_refuses_nonempty_out(model_dir, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "x").write_text("x")
    with pytest.raises(ValidationError, match="not empty"):
        prepare_core(model_dir, out)


def test_prepare_requires_weights(model_dir, tmp_path):
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ValidationError, match="safetensors"):
        prepare_core(model_dir, tmp_path / "out")
