"""Small synthetic GGUF files written with `gguf.GGUFWriter`, for the error cases and for the
conversions the two real files do not exercise (qwen2/qwen3, rope scaling, F16/BF16 data).

    spec = TinySpec(arch="llama")
    tensors = write_tiny_gguf(tmp_path / "m.gguf", spec)   # GGUF name -> array as written

The model is a complete decoder (embedding, `num_layers` blocks, final norm, optional lm_head)
with a byte-level BPE vocabulary (the 256 byte characters and a few merges) or a SentencePiece
one (byte pieces, letters and scored merges), so the file loads in transformers too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SPACE = "\u2581"


@dataclass
class TinySpec:
    arch: str = "llama"
    num_layers: int = 2
    hidden: int = 16
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 4
    ffn: int = 32
    tokenizer: str = "gpt2"                   # gpt2 (byte-level BPE) or llama (SentencePiece)
    pre: str = "default"
    tie_embeddings: bool = True
    qkv_bias: bool = False
    tensor_type: str = "F32"                  # F32, F16, BF16 or Q8_0 for the 2-D weights
    metadata: dict[str, Any] = field(default_factory=dict)      # extra / overriding keys
    extra_tensors: dict[str, Any] = field(default_factory=dict)  # name -> array or RawTensor
    drop_tensors: tuple[str, ...] = ()
    drop_metadata: tuple[str, ...] = ()


@dataclass(frozen=True)
class RawTensor:
    """Bytes stored under an explicit ggml type (the writer does not interpret them)."""

    data: np.ndarray      # uint8, the type's byte shape
    type_name: str


def gpt2_alphabet() -> list[str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def bpe_vocab() -> tuple[list[str], list[int], list[str]]:
    """Byte characters, a few merges, two control tokens and one user-defined token."""
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "Ġa n", "Ġan d", "e r", "Ġ w", "o r",
              "Ġw or", "l d", "Ġwor ld"]
    tokens = gpt2_alphabet() + [m.replace(" ", "") for m in merges]
    types = [1] * len(tokens)
    for text, kind in (("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3),
                       ("<think>", 4)):
        tokens.append(text)
        types.append(kind)
    return tokens, types, merges


def spm_vocab() -> tuple[list[str], list[int], list[float]]:
    """<unk> <s> </s>, byte pieces, ▁ and letters, then merged pieces by descending score."""
    tokens, types, scores = ["<unk>", "<s>", "</s>"], [2, 3, 3], [0.0, 0.0, 0.0]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)
        scores.append(0.0)
    pieces = [SPACE, *"abcdehilnorstw", f"{SPACE}t", "he", f"{SPACE}the", "in", f"{SPACE}a",
              "er", f"{SPACE}w", "or", f"{SPACE}wor", "ld", f"{SPACE}world", f"{SPACE}hello",
              "ll", "he" + "ll", "hell", f"{SPACE}s", "st"]
    for rank, piece in enumerate(dict.fromkeys(pieces)):
        tokens.append(piece)
        types.append(1)
        scores.append(-float(rank))
    return tokens, types, scores


def _tensor_data(values: np.ndarray, type_name: str) -> tuple[np.ndarray, Any]:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if type_name == "F32" or values.ndim == 1:
        return values.astype(np.float32), None
    if type_name == "F16":
        return values.astype(np.float16), None
    qtype = GGMLQuantizationType[type_name]
    return quantize(values.astype(np.float32), qtype), qtype


def tiny_tensors(spec: TinySpec, seed: int = 0) -> dict[str, np.ndarray]:
    """GGUF-named float32 arrays in numpy (HF) order, as a converter would write them."""
    rng = np.random.default_rng(seed)
    vocab = len(bpe_vocab()[0] if spec.tokenizer == "gpt2" else spm_vocab()[0])
    h, q, kv, f = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.ffn

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)

    tensors = {"token_embd.weight": matrix(vocab, h), "output_norm.weight": norm(h)}
    if not spec.tie_embeddings:
        tensors["output.weight"] = matrix(vocab, h)
    for i in range(spec.num_layers):
        p = f"blk.{i}."
        tensors.update({p + "attn_norm.weight": norm(h), p + "attn_q.weight": matrix(q, h),
                        p + "attn_k.weight": matrix(kv, h), p + "attn_v.weight": matrix(kv, h),
                        p + "attn_output.weight": matrix(h, q), p + "ffn_norm.weight": norm(h),
                        p + "ffn_gate.weight": matrix(f, h), p + "ffn_up.weight": matrix(f, h),
                        p + "ffn_down.weight": matrix(h, f)})
        if spec.qkv_bias:
            for part, size in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                tensors[p + part + ".bias"] = (0.1 * rng.standard_normal(size)).astype(np.float32)
        if spec.arch in ("qwen3", "gemma3"):
            tensors[p + "attn_q_norm.weight"] = norm(spec.head_dim)
            tensors[p + "attn_k_norm.weight"] = norm(spec.head_dim)
        if spec.arch == "gemma3":
            tensors[p + "post_attention_norm.weight"] = norm(h)
            tensors[p + "post_ffw_norm.weight"] = norm(h)
    return tensors


def tiny_metadata(spec: TinySpec) -> dict[str, Any]:
    a = spec.arch
    meta: dict[str, Any] = {
        f"{a}.block_count": spec.num_layers, f"{a}.context_length": 256,
        f"{a}.embedding_length": spec.hidden, f"{a}.feed_forward_length": spec.ffn,
        f"{a}.attention.head_count": spec.heads, f"{a}.attention.head_count_kv": spec.kv_heads,
        f"{a}.attention.key_length": spec.head_dim, f"{a}.attention.value_length": spec.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6, f"{a}.rope.freq_base": 10000.0,
        "tokenizer.ggml.model": spec.tokenizer,
    }
    if spec.tokenizer == "gpt2":
        tokens, types, merges = bpe_vocab()
        meta.update({"tokenizer.ggml.pre": spec.pre, "tokenizer.ggml.tokens": tokens,
                     "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
                     "tokenizer.ggml.bos_token_id": tokens.index("<|im_start|>"),
                     "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>")})
    else:
        tokens, types, scores = spm_vocab()
        meta.update({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                     "tokenizer.ggml.scores": scores, "tokenizer.ggml.bos_token_id": 1,
                     "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0})
    meta.update(spec.metadata)
    return {key: value for key, value in meta.items() if key not in spec.drop_metadata}


def _add_value(writer: Any, key: str, value: Any) -> None:
    from gguf import GGUFValueType

    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], float):
        writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT32)
    elif isinstance(value, list) and value and isinstance(value[0], int):
        writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
    else:
        writer.add_array(key, value)


def write_gguf(path: Path, arch: str, metadata: Mapping[str, Any],
               tensors: Mapping[str, Any]) -> Path:
    """A GGUF file with these metadata keys and tensors (arrays, or RawTensor)."""
    from gguf import GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        _add_value(writer, key, value)
    for name, tensor in tensors.items():
        if isinstance(tensor, RawTensor):
            writer.add_tensor(name, tensor.data, raw_dtype=GGMLQuantizationType[tensor.type_name])
        else:
            data, raw = _tensor_data(*tensor) if isinstance(tensor, tuple) else (tensor, None)
            writer.add_tensor(name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_gguf(path: Path, spec: TinySpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Write the tiny model; returns the float32 arrays as stored (before quantization)."""
    tensors = {name: values for name, values in tiny_tensors(spec, seed).items()
               if name not in spec.drop_tensors}
    written: dict[str, Any] = {name: (values, spec.tensor_type) for name, values in
                               tensors.items()}
    written.update(spec.extra_tensors)
    write_gguf(path, spec.arch, tiny_metadata(spec), written)
    return tensors
