"""The primitive ops against the plainest possible implementations (and transformers' own)."""

from __future__ import annotations

import random
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from services.engine.model import build_metadata, ops


def dense_attention(q, k_cache, v_cache, query_lens, seq_lens, page_tables, scale):
    """Token by token, key by key: the definition of paged causal attention."""
    page_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    out = torch.zeros_like(q)
    row = 0
    for q_len, seq_len, pages in zip(query_lens, seq_lens, page_tables, strict=True):
        for j in range(q_len):
            position = seq_len - q_len + j
            for head in range(q.shape[1]):
                keys = torch.stack([k_cache[pages[p // page_size], p % page_size, head // group]
                                    for p in range(position + 1)])
                values = torch.stack([v_cache[pages[p // page_size], p % page_size,
                                              head // group] for p in range(position + 1)])
                weights = torch.softmax(keys @ q[row, head] * scale, dim=0)
                out[row, head] = weights @ values
            row += 1
    return out


def random_batch(seed: int, num_q_heads: int, num_kv_heads: int, page_size: int,
                 shapes: list[tuple[int, int]], num_padding_rows: int = 0):
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    head_dim = 8
    num_pages = sum(-(-s // page_size) for _, s in shapes) + 3
    free = list(range(num_pages))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-s // page_size))] for _, s in shapes]
    meta = build_metadata([q for q, _ in shapes], [s for _, s in shapes], tables, page_size,
                          num_padding_rows=num_padding_rows)
    cache_shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, generator=generator)
    v_cache = torch.randn(cache_shape, generator=generator)
    q = torch.randn(meta.num_tokens, num_q_heads, head_dim, generator=generator)
    return q, k_cache, v_cache, meta, tables


CASES = [
    # (q heads, kv heads, page size, [(query_len, seq_len), ...], padding rows)
    (4, 4, 4, [(5, 5)], 0),                                  # one prompt, MHA
    (4, 2, 3, [(1, 9), (1, 1), (1, 17)], 2),                 # decode batch, GQA, padding
    (8, 2, 16, [(7, 20), (1, 33), (12, 12), (3, 4)], 1),     # mixed prefill/decode
    (4, 1, 1, [(2, 6), (6, 6)], 0),                          # page size 1, MQA
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("attention", ["varlen", "graph_safe"])
def test_paged_attention_matches_dense_definition(case, attention) -> None:
    num_q_heads, num_kv_heads, page_size, shapes, padding = case
    q, k_cache, v_cache, meta, tables = random_batch(7, num_q_heads, num_kv_heads, page_size,
                                                      shapes, padding)
    fn = ops.varlen_paged_attention if attention == "varlen" else ops.reference_paged_attention
    out = fn(q, k_cache, v_cache, meta, 0.35)
    expected = dense_attention(q, k_cache, v_cache, [s[0] for s in shapes],
                               [s[1] for s in shapes], tables, 0.35)
    num_real = sum(s[0] for s in shapes)
    torch.testing.assert_close(out[:num_real], expected[:num_real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()   # padding rows: garbage, but finite
    assert out.shape == q.shape and out.dtype == q.dtype


def test_cpu_dispatch_uses_varlen_attention() -> None:
    q, k_cache, v_cache, meta, _ = random_batch(3, 4, 2, 4, [(3, 7), (1, 2)])
    torch.testing.assert_close(ops.paged_attention(q, k_cache, v_cache, meta, 0.5),
                               ops.varlen_paged_attention(q, k_cache, v_cache, meta, 0.5))


def test_write_kv_writes_slots_and_skips_padding() -> None:
    k_cache = torch.zeros(4, 2, 2, 3)
    v_cache = torch.zeros(4, 2, 2, 3)
    k = torch.arange(1, 4 * 6 + 1, dtype=torch.float32).view(4, 2, 3)
    v = -k
    slots = torch.tensor([5, -1, 0, -1])
    ops.write_kv(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(8, 2, 3), v_cache.view(8, 2, 3)
    assert torch.equal(flat_k[5], k[0]) and torch.equal(flat_k[0], k[2])
    assert torch.equal(flat_v[5], v[0]) and torch.equal(flat_v[0], v[2])
    untouched = [i for i in range(8) if i not in (0, 5)]
    assert not flat_k[untouched].any() and not flat_v[untouched].any()


def test_write_kv_all_padding_changes_nothing() -> None:
    k_cache = torch.randn(3, 2, 1, 4)
    v_cache = torch.randn(3, 2, 1, 4)
    before = (k_cache.clone(), v_cache.clone())
    ops.write_kv(torch.randn(2, 1, 4), torch.randn(2, 1, 4), k_cache, v_cache,
                 torch.tensor([-1, -1]))
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_rms_norm_matches_transformers() -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(16, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x, residual = torch.randn(5, 16), torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(ops.rms_norm(x, norm.weight, 1e-5), norm(x), rtol=0, atol=0)
        normed, new_residual = ops.fused_add_rms_norm(x, residual, norm.weight, 1e-5)
        assert torch.equal(new_residual, x + residual)
        torch.testing.assert_close(normed, norm(x + residual), rtol=0, atol=0)


def test_rms_norm_low_precision_computes_in_float32() -> None:
    x = torch.randn(3, 64) * 300
    weight = torch.rand(64) + 0.5
    out = ops.rms_norm(x.bfloat16(), weight.bfloat16(), 1e-6)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ops.rms_norm(x, weight, 1e-6), rtol=2e-2, atol=2e-2)


def test_apply_rotary_neox_matches_transformers() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    head_dim, positions = 8, torch.tensor([0, 3, 17, 4])
    angles = torch.outer(torch.arange(32, dtype=torch.float32), torch.rand(head_dim // 2))
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    q, k = torch.randn(4, 3, head_dim), torch.randn(4, 1, head_dim)
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1)[positions]    # [T, D]
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1)[positions]
    # transformers wants [B, H, T, D] and cos/sin [B, T, D]
    expected_q, expected_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                  cos[None], sin[None])
    out_q, out_k = ops.apply_rotary(q, k, positions, cache)
    torch.testing.assert_close(out_q, expected_q[0].transpose(0, 1), rtol=0, atol=1e-6)
    torch.testing.assert_close(out_k, expected_k[0].transpose(0, 1), rtol=0, atol=1e-6)


def test_apply_rotary_interleaved_is_complex_multiplication() -> None:
    head_dim, positions = 6, torch.tensor([1, 5])
    angles = torch.outer(torch.arange(8, dtype=torch.float32), torch.rand(head_dim // 2))
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    q, k = torch.randn(2, 2, head_dim), torch.randn(2, 2, head_dim)
    rotation = torch.polar(torch.ones_like(angles), angles)[positions][:, None]  # [T, 1, D/2]
    out_q, out_k = ops.apply_rotary(q, k, positions, cache, is_neox=False)
    for x, out in ((q, out_q), (k, out_k)):
        expected = torch.view_as_real(torch.view_as_complex(x.view(2, 2, 3, 2)) * rotation)
        torch.testing.assert_close(out, expected.flatten(-2), rtol=1e-6, atol=1e-6)


def test_silu_and_mul() -> None:
    x = torch.randn(3, 10)
    assert torch.equal(ops.silu_and_mul(x), F.silu(x[:, :5]) * x[:, 5:])


def test_kernel_dispatch_table(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("services.engine.kernels")
    fake.rms_norm = lambda x, w, eps: x          # type: ignore[attr-defined]
    fake.paged_attention = "not callable"        # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "services.engine.kernels", fake)
    monkeypatch.delenv("HELIOS_KERNELS", raising=False)
    ops.kernel_ops.cache_clear()
    try:
        assert set(ops.kernel_ops()) == {"rms_norm"}
        x = torch.randn(2, 4)   # CPU tensors never dispatch to kernels
        assert not torch.equal(ops.rms_norm(x, torch.full((4,), 2.0), 1e-6), x)
        monkeypatch.setenv("HELIOS_KERNELS", "torch")
        ops.kernel_ops.cache_clear()
        assert ops.kernel_ops() == {}
    finally:
        ops.kernel_ops.cache_clear()
