"""read_added_tokens: a tokenizer.json's added tokens without a full parse, the same list."""

from __future__ import annotations

import json
import shutil

import pytest

from services.common.assets import fetch
from services.common.core import inspect_model_dir
from services.common.tokenizer_json import read_added_tokens

PINNED = ("qwen3", "llama3_1", "gemma3")


@pytest.mark.parametrize("name", PINNED)
def test_pinned_tokenizers_give_the_full_parse(name):
    text = (fetch(name) / "tokenizer.json").read_text(encoding="utf-8")
    expected = json.loads(text)["added_tokens"]
    assert expected and read_added_tokens(text) == expected


def test_stops_before_the_model():
    # a broken tail after added_tokens is never decoded (a full parse would fail on it)
    text = '{"version": "1.0", "added_tokens": [{"id": 7, "content": "<x>"}], "model": {oops'
    assert read_added_tokens(text) == [{"id": 7, "content": "<x>"}]


@pytest.mark.parametrize("data", [
    {"model": {"vocab": {"a": 0, "added_tokens": 1}}, "added_tokens": [{"id": 2}]},
    {"model": {"vocab": {}}},
    {},
    {"added_tokens": None},
    {"added_tokens": []},
])
def test_any_key_order_matches_json_loads(data):
    text = json.dumps(data, indent=2)
    assert read_added_tokens(text) == (data.get("added_tokens") or [])
    assert read_added_tokens(json.dumps(data, separators=(",", ":"))) == \
        (data.get("added_tokens") or [])


@pytest.mark.parametrize("text", ["", "[]", "{", '{"a" 1}', '{"a": 1 "b": 2}', '{1: 2}'])
def test_malformed_is_a_decode_error(text):
    with pytest.raises(json.JSONDecodeError):
        read_added_tokens(text)


def _model_dir(tmp_path, demo_model_dir, name):
    """A dummy-weight directory with a pinned tokenizer and no EOS in its configs, so the EOS
    id comes from tokenizer_config.json's eos_token among the added tokens."""
    directory = tmp_path / name
    directory.mkdir()
    config = json.loads((demo_model_dir / "config.json").read_text())
    config.pop("eos_token_id", None)
    (directory / "config.json").write_text(json.dumps(config))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(fetch(name) / file, directory / file)
    return directory


def _expected_eos(directory):
    added = json.loads((directory / "tokenizer.json").read_text())["added_tokens"]
    eos = json.loads((directory / "tokenizer_config.json").read_text())["eos_token"]
    eos = eos.get("content") if isinstance(eos, dict) else eos
    return tuple(t["id"] for t in added if t["content"] == eos)


@pytest.mark.parametrize("name", PINNED)
def test_manifest_reads_the_added_tokens(tmp_path, demo_model_dir, name):
    directory = _model_dir(tmp_path, demo_model_dir, name)
    manifest = inspect_model_dir(directory, allow_missing_weights=True)
    assert manifest.eos_token_ids == _expected_eos(directory) != ()


def test_a_changed_tokenizer_is_read_again(tmp_path, demo_model_dir):
    directory = _model_dir(tmp_path, demo_model_dir, "llama3_1")
    before = inspect_model_dir(directory, allow_missing_weights=True)
    assert not before.capabilities.reasoning
    path = directory / "tokenizer.json"
    data = json.loads(path.read_text())
    eos = _expected_eos(directory)[0]
    for token in data["added_tokens"]:
        if token["id"] == eos:
            token["id"] = 5     # the EOS token now has another id
    data["added_tokens"].append({"id": 6, "content": "<think>", "special": True})
    path.write_text(json.dumps(data))
    after = inspect_model_dir(directory, allow_missing_weights=True)
    assert after.capabilities.reasoning and after.eos_token_ids == (5,)
    assert after.identity != before.identity
