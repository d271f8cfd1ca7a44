"""The demo checkpoint is deterministic from its seed and loads in transformers."""

from __future__ import annotations

import hashlib

import pytest

from services.cli.demo_model import DEMO_CONFIG, build_demo_model


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = build_demo_model(tmp_path / "a", seed=7)
    b = build_demo_model(tmp_path / "b", seed=7)
    c = build_demo_model(tmp_path / "c", seed=8)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def test_demo_loads_in_transformers_and_generates(demo_model_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(demo_model_dir)
    assert model.config.num_hidden_layers == DEMO_CONFIG["num_hidden_layers"]
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}],
                                        add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4
