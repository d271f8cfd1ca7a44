"""Cores from GGUF files: `helios prepare FILE.gguf`, `open_model("x.gguf")` (a cached core,
prepared once per file identity), `helios run` resolution, and every bad file refused at
prepare time with an error naming what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from services.cli.main import _resolve_model
from services.common.core import MANIFEST_NAME, open_model, prepare_core
from services.common.errors import ManifestError, UnsupportedError, ValidationError
from services.common.gguf import core as gguf_core_module
from services.common.gguf.core import gguf_core
from services.common.model_assets import PINNED_MODELS
from services.frontend.assets import load_assets
from tests.support.gguf_files import RawTensor, TinySpec, write_tiny_gguf
from tests.support.processes import REPO_ROOT


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(root))
    return root


@pytest.fixture
def tiny_gguf(tmp_path):
    path = tmp_path / "files" / "tiny-chat.gguf"
    path.parent.mkdir()
    write_tiny_gguf(path, TinySpec(pre="qwen2", metadata={
        "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                                   "{{ m['content'] }}<|im_end|>\n{% endfor %}"}))
    return path


def test_prepare_smollm2_core(tmp_path, smollm2_gguf):
    out = tmp_path / "core"
    manifest = prepare_core(smollm2_gguf, out, served_names=("smol",))
    assert manifest.model_id == "SmolLM2-135M-Instruct.Q4_1"
    assert (manifest.architecture, manifest.model_type) == ("LlamaForCausalLM", "llama")
    assert manifest.card_id == "smol"
    assert (manifest.max_model_len, manifest.vocab_size) == (8192, 49152)
    assert manifest.num_parameters == 134_515_008
    assert manifest.eos_token_ids == (2, 0)          # <|im_end|>, then <|endoftext|>
    assert manifest.dtype == "float32"
    assert manifest.chat_template_file == "tokenizer_config.json"
    assert not (manifest.capabilities.tools or manifest.capabilities.vision)
    roles = {f.path: f for f in manifest.files}
    weights = roles[smollm2_gguf.name]
    assert weights.role == "weights" and weights.sha256 == PINNED_MODELS["smollm2"].sha256
    assert manifest.weight_bytes == smollm2_gguf.stat().st_size
    assert {f.role for f in manifest.files} == {"weights", "config", "tokenizer",
                                                 "tokenizer_config", "generation_config"}
    source, copy = smollm2_gguf.stat(), (out / smollm2_gguf.name).stat()
    if source.st_dev == copy.st_dev:
        assert source.st_ino == copy.st_ino          # hard-linked, not copied
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "<|im_start|>" in json.loads((out / "tokenizer_config.json").read_text())[
        "chat_template"]
    opened = open_model(out)
    assert opened.is_core and opened.manifest == manifest
    assets = load_assets(opened)
    assert assets.default_template is not None
    assert assets.tokenizer.encode("<|im_start|>user") == [1, 4093]


def test_open_gguf_prepares_once_then_reuses(tiny_gguf, cache_dir, monkeypatch):
    first = open_model(tiny_gguf)
    assert first.is_core and first.root.parent == cache_dir / "gguf-cores"
    assert first.root.name.startswith("tiny-chat-")
    assert first.manifest.model_id == "tiny-chat"
    assert first.manifest.chat_template_file == "tokenizer_config.json"

    def refuse(*args, **kwargs):
        raise AssertionError("the cached core should be reused")

    monkeypatch.setattr(gguf_core_module, "prepare_gguf_core", refuse)
    second = open_model(str(tiny_gguf), verify=())
    assert second.root == first.root and second.manifest == first.manifest
    assert _resolve_model(str(tiny_gguf)) == str(first.root)    # helios run
    assert [p.name for p in (cache_dir / "gguf-cores").iterdir()] == [first.root.name]


def test_a_changed_file_gets_a_new_core_and_a_tampered_core_is_refused(tiny_gguf, cache_dir):
    first = open_model(tiny_gguf).root
    weights = first / tiny_gguf.name          # a hard link to the file (or a copy)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.unlink()
    weights.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="tiny-chat.gguf does not match its fingerprint"):
        open_model(first)
    write_tiny_gguf(tiny_gguf, TinySpec(pre="qwen2"), seed=1)    # new bytes and mtime
    os.utime(tiny_gguf, ns=(1, 2))
    second = open_model(tiny_gguf).root
    assert second != first and second.parent == first.parent


def test_concurrent_opens_share_one_core(tiny_gguf, cache_dir):
    roots, errors = [], []

    def open_it():
        try:
            roots.append(gguf_core(tiny_gguf))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(roots)) == 1
    assert (roots[0] / MANIFEST_NAME).is_file()
    assert not [p for p in roots[0].parent.iterdir() if p.name.startswith(".prepare-")]


def _text(path):
    path.write_text("not a model\n")


def _empty(path):
    path.write_bytes(b"")


def _cut_data(path):
    write_tiny_gguf(path, TinySpec())
    path.write_bytes(path.read_bytes()[:-100])


def _cut_header(path):
    write_tiny_gguf(path, TinySpec())
    path.write_bytes(path.read_bytes()[:40])


def _architecture(path):
    write_tiny_gguf(path, TinySpec(arch="mamba"))


def _tensor_type(path):
    q8k = RawTensor(np.zeros(292, dtype=np.uint8), "Q8_K")   # one Q8_K block: no dequantizer
    write_tiny_gguf(path, TinySpec(extra_tensors={"blk.1.ffn_norm.weight": q8k},
                                   drop_tensors=("blk.1.ffn_norm.weight",)))


@pytest.mark.parametrize(("make", "error", "message"), [
    (_text, ValidationError, "is not a GGUF file"),
    (_empty, ValidationError, "is not a GGUF file"),
    (_cut_data, ValidationError, r"bad.gguf \(\d[\d,]* bytes\) is truncated or malformed"),
    (_cut_header, ValidationError, r"\(40 bytes\) is truncated or malformed"),
    (_architecture, UnsupportedError, "GGUF architecture 'mamba' is not supported"),
    (_tensor_type, UnsupportedError, r"tensor blk\.1\.ffn_norm\.weight has type Q8_K"),
], ids=["text", "empty", "truncated-data", "truncated-header", "architecture", "tensor-type"])
def test_bad_files_are_refused_at_prepare_time(tmp_path, make, error, message):
    path = tmp_path / "bad.gguf"
    make(path)
    out = tmp_path / "core"
    with pytest.raises(error, match=message) as info:
        prepare_core(path, out)
    assert "bad.gguf" in str(info.value)
    assert not out.exists()                 # nothing half-written is left behind


def test_helios_prepare_command(tmp_path, tiny_gguf):
    out = tmp_path / "core"
    ok = subprocess.run([sys.executable, "-m", "services.cli.main", "prepare", str(tiny_gguf),
                         "--out", str(out), "--served-name", "tiny"],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "prepared tiny-chat (LlamaForCausalLM" in ok.stdout
    assert json.loads((out / MANIFEST_NAME).read_text())["served_names"] == ["tiny"]
    bad = tmp_path / "phi.gguf"
    write_tiny_gguf(bad, TinySpec(arch="phi3"))
    failed = subprocess.run([sys.executable, "-m", "services.cli.main", "prepare", str(bad),
                             "--out", str(tmp_path / "bad-core")],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2
    assert "unsupported" in failed.stderr and "'phi3'" in failed.stderr


def test_engine_serves_a_gguf_file_directly(tmp_path, tiny_gguf):
    """`helios serve engine --model x.gguf`: the engine opens the file's cached core."""
    import grpc

    from services.common.pb import engine_pb2, engine_pb2_grpc
    from tests.support.processes import ServiceProcess

    address = f"unix://{tmp_path}/engine.sock"
    args = ["serve", "engine", "--listen", address, "--model", str(tiny_gguf),
            "--kv-cache-bytes", str(4 << 20), "--max-num-seqs", "2", "--cpu-threads", "1"]
    env = {"HELIOS_CACHE_DIR": str(tmp_path / "cache")}
    with ServiceProcess.start(args, tmp_path / "engine.log", env=env) as engine:
        engine.wait_grpc_serving(address, timeout=180)
        with grpc.insecure_channel(address) as channel:
            info = engine_pb2_grpc.EngineStub(channel).GetModelInfo(
                engine_pb2.GetModelInfoRequest(), timeout=10)
        assert (info.model_id, info.architecture) == ("tiny-chat", "LlamaForCausalLM")
        assert info.vocab_size == 273 and info.num_parameters > 0
        assert engine.terminate() == 0, engine.output()[-4000:]
    assert len(list((tmp_path / "cache" / "gguf-cores").iterdir())) == 1
