"""Float64 references for the kernels, written from the definitions (independent of both the
kernels and the model's torch ops), plus the error measure the tests bound."""

from __future__ import annotations

import math

import torch

from tests.kernels.batch import PagedBatch


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| over the whole tensor."""
    out64, ref64 = out.double(), ref.double()
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30))


def row_rel_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """||out - ref|| / ||ref|| for each row of the last dim (catches one broken row among many)."""
    out64, ref64 = out.double(), ref.double()
    return (out64 - ref64).norm(dim=-1) / ref64.norm(dim=-1).clamp_min(1e-30)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def rotary(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """x [T, H, D]; cos_sin_cache [P, R] (cos | sin); rotates the first R dims of each head."""
    x64 = x.double().clone()
    rot = cos_sin_cache.shape[1]
    cos, sin = cos_sin_cache[positions.long()].double().chunk(2, dim=-1)  # [T, R/2]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if is_neox:
        x1, x2 = x64[..., : rot // 2].clone(), x64[..., rot // 2 : rot].clone()
        x64[..., : rot // 2] = x1 * cos - x2 * sin
        x64[..., rot // 2 : rot] = x2 * cos + x1 * sin
    else:
        x1, x2 = x64[..., 0:rot:2].clone(), x64[..., 1:rot:2].clone()
        x64[..., 0:rot:2] = x1 * cos - x2 * sin
        x64[..., 1:rot:2] = x2 * cos + x1 * sin
    return x64


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.double().chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (transformers' gelu_pytorch_tanh) of the gate times up."""
    gate, up = x.double().chunk(2, dim=-1)
    inner = math.sqrt(2.0 / math.pi) * (gate + 0.044715 * gate.pow(3))
    return 0.5 * gate * (1.0 + torch.tanh(inner)) * up


def paged_attention(batch: PagedBatch, scale: float, sliding_window: int = 0,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """[T, Hq, D] float64; padding rows are zero. Query position p sees KV [0, p], or with
    sliding_window W > 0 KV [p - W + 1, p]; only positions some row sees are gathered (a
    windowed batch may hold NaN below them). `sinks` [Hq] (gpt-oss): one more logit per head in
    the softmax denominator, its share dropped."""
    q, k_cache, v_cache, meta = batch.q, batch.k_cache, batch.v_cache, batch.meta
    num_q_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    page_size = k_cache.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    start = 0
    for i, (q_len, seq_len) in enumerate(zip(batch.q_lens, batch.seq_lens, strict=True)):
        if q_len == 0:
            continue
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        first = max(0, seq_len - q_len - sliding_window + 1) if sliding_window > 0 else 0
        pos = torch.arange(first, seq_len, device=q.device)
        pages = meta.page_table[i].long()[pos // page_size]
        k = k_cache[pages, pos % page_size].double().repeat_interleave(group, dim=1)  # [S, Hq, D]
        v = v_cache[pages, pos % page_size].double().repeat_interleave(group, dim=1)
        qi = q[start : start + q_len].double()  # [L, Hq, D]
        scores = torch.einsum("lhd,shd->hls", qi, k) * scale
        hidden = pos[None, :] > q_pos[:, None]  # [L, S]
        if sliding_window > 0:
            hidden |= pos[None, :] <= q_pos[:, None] - sliding_window
        scores = scores.masked_fill(hidden[None], float("-inf"))                  # [H, L, S]
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            sink = sinks.double()[:, None, None].expand(-1, q_len, 1)
            probs = torch.cat((scores, sink), dim=-1).softmax(-1)[..., :-1]
        out[start : start + q_len] = torch.einsum("hls,shd->lhd", probs, v)
        start += q_len
    return out
