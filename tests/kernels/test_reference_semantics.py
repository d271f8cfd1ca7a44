"""The float64 references these tests trust agree with the model's own torch ops
(`services.engine.model.ops.reference_*`), so a kernel that passes here computes what the
model means by each op. CPU only, float32 inputs."""

from __future__ import annotations

import pytest
import torch

from services.engine.model import ops
from tests.kernels import reference
from tests.kernels.batch import make_batch
from tests.kernels.test_rotary import cos_sin_cache


def test_rms_norm_and_residual() -> None:
    g = torch.Generator().manual_seed(1)
    x, res, w = torch.randn(7, 96, generator=g), torch.randn(7, 96, generator=g), torch.randn(96, generator=g)
    assert reference.rel_error(ops.reference_rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6)) < 1e-6
    normed, summed = ops.reference_fused_add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(summed, x + res)
    assert reference.rel_error(normed, reference.rms_norm(x + res, w, 1e-6)) < 1e-6


@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary(is_neox: bool) -> None:
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(5, 4, 64, generator=g), torch.randn(5, 2, 64, generator=g)
    positions = torch.tensor([0, 3, 17, 900, 4095])
    cache = cos_sin_cache(4096, 64)
    rq, rk = ops.reference_apply_rotary(q, k, positions, cache, is_neox)
    assert reference.rel_error(rq, reference.rotary(q, positions, cache, is_neox)) < 1e-6
    assert reference.rel_error(rk, reference.rotary(k, positions, cache, is_neox)) < 1e-6


def test_silu_and_mul() -> None:
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(3))
    assert reference.rel_error(ops.reference_silu_and_mul(x), reference.silu_and_mul(x)) < 1e-6


def test_write_kv_and_attention() -> None:
    g = torch.Generator().manual_seed(4)
    batch = make_batch([40, 9, 33], [7, 1, 33], num_q_heads=4, num_kv_heads=2, head_dim=32,
                       page_size=8, dtype=torch.float32, num_padding=2, generator=g)
    k = torch.randn(batch.q.shape[0], 2, 32, generator=g)
    caches = [batch.k_cache.clone(), batch.v_cache.clone()]
    ops.reference_write_kv(k, k, caches[0], caches[1], batch.meta.slot_mapping)
    real = batch.meta.slot_mapping >= 0
    assert torch.equal(caches[0].view(-1, 2, 32)[batch.meta.slot_mapping[real]], k[real])
    scale = 32 ** -0.5
    ref = reference.paged_attention(batch, scale)
    real_rows = sum(batch.q_lens)
    clean = [torch.nan_to_num(c) for c in (batch.k_cache, batch.v_cache)]  # the model's gather clamps
    for path in (ops.varlen_paged_attention, ops.reference_paged_attention):
        out = path(batch.q, clean[0], clean[1], batch.meta, scale)
        assert reference.rel_error(out[:real_rows], ref[:real_rows]) < 1e-5, path.__name__


@pytest.mark.parametrize("window", [1, 5, 16, 40])
def test_attention_window_is_transformers_sliding_window(window: int) -> None:
    """reference.paged_attention's window is transformers' sliding-window causal mask
    (`kv_idx > q_idx - sliding_window` and `kv_idx <= q_idx`), evaluated densely here."""
    from transformers import masking_utils

    mask_fn = masking_utils.sliding_window_causal_mask_function(window)
    g = torch.Generator().manual_seed(5)
    batch = make_batch([40, 9, 33, 70], [7, 1, 33, 20], num_q_heads=4, num_kv_heads=2,
                       head_dim=32, page_size=8, dtype=torch.float32, num_padding=2, generator=g)
    scale = 32 ** -0.5
    ref = reference.paged_attention(batch, scale, window)
    start = 0
    for i, (q_len, seq_len) in enumerate(zip(batch.q_lens, batch.seq_lens, strict=True)):
        pos = torch.arange(seq_len)
        pages = batch.meta.page_table[i].long()[pos // 8]
        k = batch.k_cache[pages, pos % 8].double().repeat_interleave(2, dim=1)   # [S, Hq, D]
        v = batch.v_cache[pages, pos % 8].double().repeat_interleave(2, dim=1)
        q_idx = torch.arange(seq_len - q_len, seq_len)
        allowed = mask_fn(torch.tensor(0), torch.tensor(0), q_idx[:, None], pos[None, :])  # [L, S]
        scores = torch.einsum("lhd,shd->hls", batch.q[start : start + q_len].double(), k) * scale
        dense = torch.einsum("hls,shd->lhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)
        assert reference.rel_error(ref[start : start + q_len], dense) < 1e-12
        start += q_len


@pytest.mark.parametrize("path", ["varlen_paged_attention", "reference_paged_attention"])
def test_windowed_attention_matches_the_model_ops(path: str) -> None:
    fn = getattr(ops, path)
    g = torch.Generator().manual_seed(6)
    batch = make_batch([40, 9, 33, 70], [7, 1, 33, 20], num_q_heads=4, num_kv_heads=2,
                       head_dim=32, page_size=8, dtype=torch.float32, num_padding=2, generator=g)
    clean = [torch.nan_to_num(c) for c in (batch.k_cache, batch.v_cache)]  # the model's gather clamps
    real_rows = sum(batch.q_lens)
    for window in (1, 6, 30, 100):
        ref = reference.paged_attention(batch, 32 ** -0.5, window)
        out = fn(batch.q, clean[0], clean[1], batch.meta, 32 ** -0.5, window)
        assert reference.rel_error(out[:real_rows], ref[:real_rows]) < 1e-5, (path, window)
