"""iter_hf_tensors: the real files against transformers' GGUF weight loading (float32 state
dict), exactly; synthetic files for the conversions undone, the data types and bad tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.common.errors import UnsupportedError
from services.common.gguf.reader import open_gguf
from services.common.gguf.tensors import check_tensors, count_parameters, iter_hf_tensors
from tests.common.conftest import REAL_MODELS
from tests.support.gguf_files import (
    RawTensor,
    TinySpec,
    tiny_metadata,
    tiny_tensors,
    write_gguf,
    write_tiny_gguf,
)


@pytest.mark.parametrize("name", REAL_MODELS)
def test_tensors_equal_transformers_state_dict(name, real_ggufs, transformers_gguf):
    """Same names (transformers also lists the tied lm_head), shapes and values, exactly: both
    dequantize with gguf.quants and undo the conversion in float32, so there is no rounding
    difference to allow for."""
    model = transformers_gguf.model(name)
    expected = model.state_dict()
    gguf_file = real_ggufs.file(name)
    names = []
    for hf_name, tensor in iter_hf_tensors(gguf_file):
        names.append(hf_name)
        assert tensor.dtype == torch.float32, hf_name
        assert tensor.shape == expected[hf_name].shape, hf_name
        assert torch.equal(tensor, expected[hf_name]), hf_name
    assert len(names) == len(set(names))
    assert set(expected) - set(names) == {"lm_head.weight"}    # tied to the embedding
    assert model.config.tie_word_embeddings
    assert count_parameters(gguf_file) == sum(p.numel() for p in model.parameters())


def test_iter_hf_tensors_takes_a_path(tmp_path):
    path = tmp_path / "m.gguf"
    written = write_tiny_gguf(path, TinySpec(arch="qwen3", pre="qwen2"))
    tensors = dict(iter_hf_tensors(str(path)))
    assert len(tensors) == len(written)
    assert next(iter(tensors)) == "model.embed_tokens.weight"


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter for llama q/k: per head, HF's (first half, second half) rotary
    rows become interleaved pairs."""
    head_dim = weights.shape[0] // num_heads
    return (weights.reshape(num_heads, 2, head_dim // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _write(tmp_path, spec, transform=None):
    """Write a tiny model whose stored tensors are `transform(name, hf_array)`; return the HF
    arrays (what iter_hf_tensors must give back)."""
    hf = tiny_tensors(spec)
    stored = {name: (transform(name, a) if transform else a, spec.tensor_type)
              for name, a in hf.items()}
    path = write_gguf(tmp_path / "m.gguf", spec.arch, tiny_metadata(spec), stored)
    return path, hf


def test_llama_q_and_k_rows_are_put_back(tmp_path):
    spec = TinySpec(arch="llama", heads=4, kv_heads=2, head_dim=8, hidden=32, qkv_bias=True)

    def convert(name, array):
        if ".attn_q." in name:
            return llama_cpp_permute(array, spec.heads)
        if ".attn_k." in name:
            return llama_cpp_permute(array, spec.kv_heads)
        return array

    path, hf = _write(tmp_path, spec, convert)
    ours = dict(iter_hf_tensors(path))
    q = "model.layers.1.self_attn.q_proj."
    assert not np.array_equal(convert("blk.1.attn_q.weight", hf["blk.1.attn_q.weight"]),
                              hf["blk.1.attn_q.weight"])          # the permutation is not trivial
    assert np.array_equal(ours[q + "weight"].numpy(), hf["blk.1.attn_q.weight"])
    assert np.array_equal(ours[q + "bias"].numpy(), hf["blk.1.attn_q.bias"])
    assert np.array_equal(ours["model.layers.0.self_attn.k_proj.weight"].numpy(),
                          hf["blk.0.attn_k.weight"])
    assert np.array_equal(ours["model.layers.0.self_attn.v_proj.weight"].numpy(),
                          hf["blk.0.attn_v.weight"])


def test_qwen3_tensors_are_stored_as_is(tmp_path):
    path, hf = _write(tmp_path, TinySpec(arch="qwen3", pre="qwen2"))
    ours = dict(iter_hf_tensors(path))
    assert np.array_equal(ours["model.layers.0.self_attn.q_proj.weight"].numpy(),
                          hf["blk.0.attn_q.weight"])
    assert np.array_equal(ours["model.layers.1.self_attn.k_norm.weight"].numpy(),
                          hf["blk.1.attn_k_norm.weight"])


def test_gemma3_norms_lose_their_one_and_get_gemma_names(tmp_path):
    spec = TinySpec(arch="gemma3", tokenizer="llama")
    path, hf = _write(tmp_path, spec)
    ours = dict(iter_hf_tensors(path))
    pairs = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
             "ffn_norm": "pre_feedforward_layernorm",
             "post_ffw_norm": "post_feedforward_layernorm", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm"}
    for gguf_part, hf_part in pairs.items():
        stored = hf[f"blk.1.{gguf_part}.weight"]
        assert np.array_equal(ours[f"model.layers.1.{hf_part}.weight"].numpy(),
                              stored - np.float32(1)), gguf_part
    assert np.array_equal(ours["model.norm.weight"].numpy(),
                          hf["output_norm.weight"] - np.float32(1))
    assert np.array_equal(ours["model.layers.0.mlp.down_proj.weight"].numpy(),
                          hf["blk.0.ffn_down.weight"])


@pytest.mark.parametrize("tensor_type", ["F16", "BF16", "Q8_0", "Q4_0"])
def test_stored_types_dequantize_like_the_gguf_package(tmp_path, tensor_type):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    spec = TinySpec(arch="qwen2", pre="qwen2", hidden=32, head_dim=8, ffn=64,
                    tensor_type=tensor_type, tie_embeddings=False)
    path, hf = _write(tmp_path, spec)
    gguf_file = open_gguf(path)
    assert {t.type_name for t in gguf_file.tensors} == {"F32", tensor_type}
    ours = dict(iter_hf_tensors(gguf_file))
    original = hf["output.weight"]
    if tensor_type == "F16":
        expected = original.astype(np.float16).astype(np.float32)
    else:
        qtype = GGMLQuantizationType[tensor_type]
        expected = dequantize(quantize(original, qtype), qtype)
    got = ours["lm_head.weight"].numpy()
    assert got.shape == original.shape
    assert np.array_equal(got, expected)
    assert np.abs(got - original).max() < 0.05    # and it is the weight, not noise


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path):
    spec = TinySpec(extra_tensors={"blk.0.attn_norm.weight": RawTensor(
        np.zeros(292, dtype=np.uint8), "Q8_K")}, drop_tensors=("blk.0.attn_norm.weight",))
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, spec)
    gguf_file = open_gguf(path)
    with pytest.raises(UnsupportedError, match=r"blk\.0\.attn_norm\.weight has type Q8_K"):
        check_tensors(gguf_file)
    with pytest.raises(UnsupportedError, match="Q8_K"):
        list(iter_hf_tensors(gguf_file))


def test_unknown_tensor_is_refused(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, TinySpec(extra_tensors={
        "blk.0.ffn_gate_exps.weight": np.zeros((2, 4), dtype=np.float32)}))
    with pytest.raises(UnsupportedError, match="'blk.0.ffn_gate_exps.weight'"):
        check_tensors(open_gguf(path))


def test_parameter_count_is_the_table_sum(tmp_path):
    path = tmp_path / "m.gguf"
    written = write_tiny_gguf(path, TinySpec(tie_embeddings=False))
    assert count_parameters(open_gguf(path)) == sum(a.size for a in written.values())
